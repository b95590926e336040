"""SentencePiece's unigram encoding, as the ``sentencepiece`` library computes it, in Python.

For bundles whose tokenizer is a SentencePiece model that the ``tokenizers`` library cannot
stand in for: OPUS-MT checkpoints (transformers' ``MarianTokenizer``, whose source ``.spm``
segments a text and whose ``vocab.json`` gives the pieces the model's ids) and Marian folders.
The runtime may not depend on ``sentencepiece``, and a ``tokenizers`` Unigram model converted
from the same ``.spm`` segments differently (9,605-10,707 of 48,353 texts per model, 0-52 of
the 15,353 natural ones: benchmarks/results/sentencepiece-copy-cpu): its ``Precompiled``
normalizer works on grapheme clusters where SentencePiece matches its rules on bytes (a
combining accent is dropped), and it breaks ties between segmentations of equal score
("Hmmm" as "m" + "mm" or "mm" + "m") the other way.

What is reproduced (SentencePiece 0.2, ``normalizer.cc`` and ``unigram_model.cc``):

- the normalizer: at each position the longest rule of the model's precompiled character map
  (a darts-clone double array over UTF-8 bytes, and the replacement strings after it), else one
  character unchanged; with ``remove_extra_whitespaces`` leading spaces are dropped, a space
  after a space is dropped, and trailing spaces are dropped; ``add_dummy_prefix`` puts one
  space in front; ``escape_whitespaces`` writes spaces as U+2581;
- the search (``EncodeOptimized``): the best path score ending at each position in float32,
  a piece's score added in float32, a position's best replaced only by a strictly greater
  candidate, start positions left to right and pieces shortest first; a character no piece
  covers is an unknown scoring (lowest normal piece's score - 10), and a run of unknowns is one
  piece whose text is the run's (normalized) text.

Two things are this module's own and change no result: the normalizer keeps its answer at a
position by the bytes that answer depended on (mostly a character and the byte after it), and a
caller that refuses texts of more than ``most`` pieces is told so (None) as soon as that is
certain (``Pieces.fewest``), before the search and often before all of the text is normalized:
a megabyte took seconds to be refused.

The search can instead compare a candidate unrounded, as the SentencePiece built into Marian
1.12 does (``arithmetic`` "marian", decision 035): Marian folders that carry their ``.spm``.

The model's JSON form (written at export from the ``.spm``'s protobuf, which the runtime cannot
read): ``{"pieces": [[piece, score, type], ...], "unk_id": int, "precompiled_charsmap": base64,
"add_dummy_prefix": bool, "remove_extra_whitespaces": bool, "escape_whitespaces": bool,
"arithmetic": "sentencepiece" | "marian"}``; types as SentencePiece's (1 normal, 2 unknown,
3 control, 5 unused). User-defined and byte pieces are refused at export (their rules are not
reproduced here).
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from array import array
from typing import Any

from .detokenization import clean_up_tokenization
from .errors import BundleError

NORMAL, UNKNOWN, CONTROL, UNUSED = 1, 2, 3, 5
PIECE_TYPES = (NORMAL, UNKNOWN, CONTROL, UNUSED)
# whose search: "sentencepiece" (the library, 0.2: a candidate rounded to float32 before it is
# compared) or "marian" (the SentencePiece built into Marian 1.12: compared unrounded, decision 035)
ARITHMETIC = ("sentencepiece", "marian")
# how ids become text: "joined" (transformers' MarianTokenizer, OPUS-MT's postprocess.sh: the
# pieces joined, U+2581 read as a space, both ends stripped) or "sentencepiece" (SentencePiece's
# own decoding, as Marian writes its output: only the first piece's leading space dropped)
DECODINGS = ("joined", "sentencepiece")
UNK_PENALTY = 10.0  # SentencePiece's kUnkPenalty
# SentencePiece's trainer allows no longer piece (max_sentencepiece_length); a longer one is not a
# SentencePiece vocabulary, and would make every start position's walk that long
LONGEST_PIECE = 512
# a node of the search's trie costs about 250 bytes of Python dictionary: this many are half a
# gigabyte, where long hostile pieces of a small file could otherwise take all memory
MAX_TRIE_NODES = 2_000_000
# a text is split at its added tokens by one regular expression that tries each of them at every
# position: a hostile list of 30,000 took 0.7 s on 10,000 characters
MAX_ADDED_TOKENS = 256
SPACE_SYMBOL = "\u2581"
REPLACEMENT_CHARACTER = "\ufffd".encode("utf-8")
LONGEST_REPLACEMENT = 256  # bytes a normalization rule may write (see CharacterMap)
# SentencePiece keeps the first 32 rules a position's bytes match (kMaxTrieResultsSize)
MAX_RULES_PER_POSITION = 32
# normalize's answers kept (a few bytes each; natural text has a few thousand distinct ones, a
# hostile one may have a new one at every position), and how often (output bytes) a normalize
# asked to stop counts its pieces-alone characters
SEEN_PREFIXES = 1 << 16
COUNT_EVERY = 1 << 12
_FLOAT32 = struct.Struct("<f")


def float32(value: float) -> float:
    """``value`` rounded to float32 (as a Python float, which holds it exactly)."""
    return _FLOAT32.unpack(_FLOAT32.pack(value))[0]


class Pieces:
    """The pieces a unigram search looks for: a trie by character (a node's piece, (id, float32
    score), under the key None; SentencePiece's trie keeps the first of two equal pieces), with
    what bounds a segmentation's length: the longest piece, and the characters that are pieces
    alone."""

    def __init__(self) -> None:
        self.trie: dict = {}
        self.nodes = 0  # below the root
        self.lowest: float | None = None  # the lowest score
        self.longest = 0
        self._alone: set[str] = set()

    def add(self, piece: str, index: int, score: float, where: str) -> None:
        if not piece or len(piece) > LONGEST_PIECE:
            raise BundleError(f"{where}: piece {index} has {len(piece)} characters; a SentencePiece piece has 1 to "
                              f"{LONGEST_PIECE}.")
        node = self.trie
        for character in piece:
            child = node.get(character)
            if child is None:
                child = node[character] = {}
                self.nodes += 1
            node = child
        if self.nodes > MAX_TRIE_NODES:
            raise BundleError(f"{where}: the pieces up to piece {index} make more than {MAX_TRIE_NODES:,} trie "
                              "nodes; a real vocabulary makes far fewer (32,000 pieces: about 77,000).")
        node.setdefault(None, (index, score))
        self.lowest = score if self.lowest is None else min(self.lowest, score)
        self.longest = max(self.longest, len(piece))
        if len(piece) == 1:
            self._alone.add(piece)

    @property
    def unk_score(self) -> float:
        """What an unknown character scores: the lowest piece's score less SentencePiece's penalty."""
        assert self.lowest is not None, "no pieces"
        return float32(self.lowest - UNK_PENALTY)

    def alone_in(self, text: str) -> int:
        """The characters of ``text`` that are pieces alone."""
        return sum(map(self._alone.__contains__, text))

    def fewest(self, text: str) -> int:
        """At least as many pieces as :func:`best_path` makes of ``text``: the search makes an
        unknown only of a character that is no piece alone, so each one that is lies in a known
        piece, of at most :attr:`longest` characters (a run of unknowns, one piece, is not counted)."""
        return -(-self.alone_in(text) // self.longest) if self.longest else 0


class CharacterMap:
    """SentencePiece's precompiled normalization rules: a darts-clone double array whose leaves
    hold offsets into a block of NUL-terminated replacement strings, matched on UTF-8 bytes."""

    def __init__(self, blob: bytes, where: str) -> None:
        if len(blob) < 4:
            raise BundleError(f"{where}: the precompiled character map is {len(blob)} bytes, too short.")
        (trie_bytes,) = struct.unpack_from("<I", blob)
        if trie_bytes % 4 or 4 + trie_bytes > len(blob) or trie_bytes == 0:
            raise BundleError(f"{where}: the precompiled character map's trie size {trie_bytes} does not fit its "
                              f"{len(blob)} bytes.")
        self._units = array("I", blob[4 : 4 + trie_bytes])
        if array("I").itemsize != 4:  # pragma: no cover - every platform CPython runs on
            raise BundleError("unsigned int is not 4 bytes here")
        if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian hosts
            self._units.byteswap()
        self._strings = blob[4 + trie_bytes :]
        # a replacement is what one matched sequence becomes: NFKC's longest is 18 characters. A
        # bundle is untrusted, and one rule of a megabyte would make every text that long
        for replacement in self._strings.split(b"\0"):
            if len(replacement) > LONGEST_REPLACEMENT:
                raise BundleError(f"{where}: a rule of the precompiled character map replaces with "
                                  f"{len(replacement)} bytes, more than the {LONGEST_REPLACEMENT} allowed.")
            try:
                replacement.decode("utf-8")
            except UnicodeDecodeError:
                raise BundleError(f"{where}: a rule of the precompiled character map replaces with bytes that "
                                  "are not UTF-8.") from None

    def _unit(self, position: int) -> int:
        if not 0 <= position < len(self._units):
            raise IndexError(position)
        return self._units[position]

    def longest_rule(self, data: bytes, start: int) -> tuple[tuple[int, bytes] | None, int]:
        """The longest rule matching ``data`` from ``start`` ((bytes matched, replacement), or
        None), and how many bytes from ``start`` the walk read to find it: the same bytes
        anywhere give the same answer."""
        units = self._unit
        read = len(data) - start
        try:
            unit = units(0)
            node = (unit >> 10) << ((unit & (1 << 9)) >> 6)
            found, count = None, 0
            for index in range(start, len(data)):
                byte = data[index]
                node ^= byte
                unit = units(node)
                if (unit & ((1 << 31) | 0xFF)) != byte:
                    read = index + 1 - start
                    break
                node ^= (unit >> 10) << ((unit & (1 << 9)) >> 6)
                if (unit >> 8) & 1:
                    if count < MAX_RULES_PER_POSITION:
                        found = (index + 1 - start, units(node) & ((1 << 31) - 1))
                    count += 1
        except IndexError:
            raise BundleError("the precompiled character map's trie points outside itself.") from None
        if found is None:
            return None, read
        length, offset = found
        end = self._strings.find(b"\0", offset)
        if offset >= len(self._strings) or end < 0:
            raise BundleError("the precompiled character map names a replacement outside its strings.")
        return (length, self._strings[offset:end]), read


class SentencePieceModel:
    """Text -> pieces (strings) as ``SentencePieceProcessor.encode(text, out_type=str)`` gives them."""

    def __init__(self, spec: Any, where: str) -> None:
        if not isinstance(spec, dict):
            raise BundleError(f"{where}: not a SentencePiece model (a JSON object is expected).")
        flags = ("add_dummy_prefix", "remove_extra_whitespaces", "escape_whitespaces")
        for name in flags:
            if not isinstance(spec.get(name), bool):
                raise BundleError(f"{where}: {name} must be true or false.")
        self.add_dummy_prefix, self.remove_extra_whitespaces, self.escape_whitespaces = (spec[n] for n in flags)
        arithmetic = spec.get("arithmetic")
        if arithmetic not in ARITHMETIC:
            raise BundleError(f"{where}: arithmetic must be one of {', '.join(ARITHMETIC)}, not {arithmetic!r}.")
        self._round_sums = arithmetic == "sentencepiece"
        charsmap = spec.get("precompiled_charsmap")
        if not isinstance(charsmap, str):
            raise BundleError(f"{where}: precompiled_charsmap must be a base64 string (empty for none).")
        try:
            blob = base64.b64decode(charsmap, validate=True)
        except (binascii.Error, ValueError):
            raise BundleError(f"{where}: precompiled_charsmap is not base64.") from None
        self._rules = CharacterMap(blob, where) if blob else None
        pieces = spec.get("pieces")
        if not isinstance(pieces, list) or not pieces:
            raise BundleError(f"{where}: pieces must be a non-empty list of [piece, score, type].")
        unk = spec.get("unk_id")
        if not isinstance(unk, int) or isinstance(unk, bool) or not 0 <= unk < len(pieces):
            raise BundleError(f"{where}: unk_id must name one of the {len(pieces)} pieces.")
        self.pieces = Pieces()
        for index, entry in enumerate(pieces):
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                    and isinstance(entry[1], (int, float)) and not isinstance(entry[1], bool)
                    and entry[2] in PIECE_TYPES and not isinstance(entry[2], bool)):
                raise BundleError(f"{where}: piece {index} is not [piece, score, type] with a type of "
                                  f"{', '.join(map(str, PIECE_TYPES))}.")
            piece, kind = entry[0], entry[2]
            try:
                score = float32(float(entry[1]))
            except OverflowError:
                raise BundleError(f"{where}: piece {index}'s score is outside float32.") from None
            if score != score or score in (float("inf"), float("-inf")):
                raise BundleError(f"{where}: piece {index}'s score is not finite.")
            if (index == unk) != (kind == UNKNOWN):
                raise BundleError(f"{where}: piece {index} is {'not ' if index == unk else ''}the unknown piece but "
                                  f"its type says {'so' if kind == UNKNOWN else 'otherwise'}.")
            if kind != NORMAL:
                continue  # unknown and control pieces are not searched; unused ones are skipped
            self.pieces.add(piece, index, score, where)
        if self.pieces.lowest is None:
            raise BundleError(f"{where}: the SentencePiece model has no normal pieces.")
        self.unk_id = unk
        # normalize's answers by the bytes they depend on (see there), kept across texts
        self._seen: dict[bytes, tuple[bytes, int]] = {}

    def normalize(self, text: str, most_known: int | None = None) -> str | None:
        """SentencePiece's ``Normalizer::Normalize`` of ``text``. ``most_known``: give up (None)
        once the normalized text is certain to hold more characters that are pieces alone
        (:attr:`pieces`) than that, which no segmentation of at most ``most_known / longest
        piece`` pieces can cover."""
        data = text.encode("utf-8")  # the caller has refused lone surrogates (generator.py)
        position, size = 0, len(data)
        remove_extra = self.remove_extra_whitespaces
        rules, seen = self._rules, self._seen

        def prefix(at: int) -> tuple[bytes, int]:
            # what the bytes from ``at`` begin with (a rule's replacement, else one character)
            # depends only on the bytes the rule's walk read, and on the character: the same
            # character and next byte give the same answer wherever the walk read no further
            length = _utf8_length(data[at])
            key = data[at : at + length + 1]
            answer = seen.get(key)
            if answer is not None:
                return answer
            rule, read = rules.longest_rule(data, at) if rules is not None else (None, 1)
            if rule is not None:
                answer = rule[1], rule[0]
            else:
                chunk = data[at : at + length]
                answer = chunk, length
                if length > 1:  # after a rule that ended inside a character (a hostile map): U+FFFD for
                    try:        # one byte, as SentencePiece reads malformed UTF-8
                        chunk.decode("utf-8")
                    except UnicodeDecodeError:
                        answer = REPLACEMENT_CHARACTER, 1
            if read <= len(key):
                if len(seen) >= SEEN_PREFIXES:
                    seen.clear()
                seen[key] = answer
            return answer

        if remove_extra:
            while position < size:
                replacement, consumed = prefix(position)
                if replacement != b" ":
                    break
                position += consumed
        if position >= size:
            return ""
        out = bytearray()
        space = SPACE_SYMBOL.encode("utf-8") if self.escape_whitespaces else b" "
        if self.add_dummy_prefix:
            out += space
        previous_space = remove_extra
        known, counted = 0, 0  # pieces-alone characters in out[:counted]
        while position < size:
            replacement, consumed = prefix(position)
            if previous_space:
                replacement = replacement.lstrip(b" ")
            if replacement:
                out += replacement.replace(b" ", space) if self.escape_whitespaces else replacement
                previous_space = replacement.endswith(b" ")
            position += consumed
            if not remove_extra:
                previous_space = False
            if most_known is not None and len(out) - counted >= COUNT_EVERY:
                known += self.pieces.alone_in(out[counted:].decode("utf-8"))  # whole characters: every
                counted = len(out)                                           # append is UTF-8
                if known > most_known + 1:  # the end may lose one trailing space
                    return None
        if remove_extra:
            while out.endswith(space):
                del out[-len(space) :]
        return out.decode("utf-8")

    def encode(self, text: str, most: int | None = None) -> list[str] | None:
        """The pieces of ``text``: a known piece's string, or an unknown run's own text.
        ``most``: None, without segmenting, where ``text`` is certain to need more pieces."""
        normalized = self.normalize(text, None if most is None else most * self.pieces.longest)
        if normalized is None or (most is not None and self.pieces.fewest(normalized) > most):
            return None
        return self.segment(normalized)

    def segment(self, normalized: str) -> list[str]:
        """SentencePiece's ``EncodeOptimized`` over a normalized text (see the module docstring)."""
        pieces: list[str] = []
        previous_unknown = False
        for start, end, found in best_path(normalized, self.pieces.trie, self.pieces.unk_score, self._round_sums):
            if found is None and previous_unknown:  # SentencePiece merges a run of unknowns into one piece
                pieces[-1] += normalized[start:end]
            else:
                pieces.append(normalized[start:end])
            previous_unknown = found is None
        return pieces


def best_path(text: str, trie: dict, unk_score: float, round_sums: bool) -> list[tuple[int, int, int | None]]:
    """The best segmentation of ``text`` under SentencePiece's unigram search, as (start, end,
    piece id or None for an unknown character) spans. ``trie``: by character, a node's piece
    (id, float32 score) under the key None. The best path score ending at each position is
    stored in float32; a candidate replaces it only when strictly greater (on a tie the path
    whose last piece starts first wins), start positions left to right, pieces shortest first.
    ``round_sums``: the candidate is rounded to float32 before the comparison (SentencePiece
    0.2's float addition); without, it is compared unrounded (Marian's build adds in double:
    segmentation.py). A character no piece covers is an unknown scoring ``unk_score``."""
    size = len(text)
    best = array("f", bytes(4 * (size + 1)))  # each value written is rounded to float32
    begins = [-1] * (size + 1)  # where the best path's last piece begins (-1: no path yet)
    ids: list[int | None] = [None] * (size + 1)
    rounded = array("f", [0.0])
    for start in range(size):
        reached = best[start]
        single = False
        node = trie
        for end in range(start + 1, size + 1):
            node = node.get(text[end - 1])
            if node is None:
                break
            found = node.get(None)
            if found is None:
                continue
            score = found[1] + reached
            if round_sums:
                rounded[0] = score
                score = rounded[0]
            if begins[end] < 0 or score > best[end]:
                best[end], begins[end], ids[end] = score, start, found[0]
            if end == start + 1:
                single = True
        if not single:
            score = unk_score + reached
            if round_sums:
                rounded[0] = score
                score = rounded[0]
            if begins[start + 1] < 0 or score > best[start + 1]:
                best[start + 1], begins[start + 1], ids[start + 1] = score, start, None
    spans: list[tuple[int, int, int | None]] = []
    end = size
    while end > 0:
        spans.append((begins[end], end, ids[end]))
        end = begins[end]
    spans.reverse()
    return spans


def _utf8_length(lead: int) -> int:
    """Bytes in the UTF-8 character starting with byte ``lead`` (valid UTF-8: Python's encoder)."""
    return 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


class PieceTokenizer:
    """Text <-> ids as a slow transformers SentencePiece tokenizer with a separate piece vocabulary
    computes them (``MarianTokenizer``, OPUS-MT's), or Marian reading a SentencePiece or a .yml
    vocabulary, for the manifest's segmentation "sentencepiece". The bundle's
    ``sentencepiece.json`` holds the source model (above) and the tokenizer's rules;
    tokenizer.json holds the model's vocabulary (piece -> id, the special tokens), which both
    directions look pieces up in.

    Encoding (``PreTrainedTokenizer.tokenize`` and ``MarianTokenizer._tokenize``): the text is
    split at its added tokens' strings (leftmost, longest first; a token marked ``lstrip`` or
    ``rstrip`` takes the whitespace beside it); each other chunk loses a leading ``>>code<<``
    language code (kept as a token of its own) and is encoded by the SentencePiece model; each
    token is looked up among the added tokens, then in the vocabulary, else it is ``<unk>``; the
    end-of-sentence id is appended (Bergamot: no added tokens, no language codes). Decoding,
    special tokens skipped: "joined" (``convert_tokens_to_string``, ``postprocess.sh``) joins the
    pieces' texts, reads U+2581 as a space and strips the ends; "sentencepiece" (Marian's output)
    drops only the leading U+2581 of pieces while nothing is written; both with the decoding
    model's control pieces silent and its unknown piece as " \u2047 ".
    """

    def __init__(self, spec: Any, vocabulary: Any, where: str) -> None:
        if not isinstance(spec, dict):
            raise BundleError(f"{where}: not a JSON object.")
        self.model = SentencePieceModel(spec.get("model"), f"{where} (model)")
        self._vocabulary = vocabulary  # tokenizers.Tokenizer: token_to_id / id_to_token
        added = spec.get("added_tokens")
        if not isinstance(added, list):
            raise BundleError(f"{where}: added_tokens must be a list.")
        if len(added) > MAX_ADDED_TOKENS:  # every text is searched for each of them
            raise BundleError(f"{where}: {len(added):,} added tokens, more than the {MAX_ADDED_TOKENS} allowed (a "
                              "MarianTokenizer has its special tokens: a handful).")
        self._strip: dict[str, tuple[bool, bool]] = {}
        for entry in added:
            if not (isinstance(entry, dict) and isinstance(entry.get("content"), str) and entry["content"]
                    and isinstance(entry.get("lstrip"), bool) and isinstance(entry.get("rstrip"), bool)):
                raise BundleError(f"{where}: an added token is not {{content, lstrip, rstrip}}.")
            if vocabulary.token_to_id(entry["content"]) is None:
                raise BundleError(f"{where}: the added token {entry['content']!r} is not in tokenizer.json.")
            self._strip[entry["content"]] = (entry["lstrip"], entry["rstrip"])
        # the leftmost match, and there the longest token, as transformers' Trie splits
        longest_first = sorted(self._strip, key=len, reverse=True)
        self._added = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None
        for name in ("language_codes", "clean_up_tokenization_spaces"):
            if not isinstance(spec.get(name), bool):
                raise BundleError(f"{where}: {name} must be true or false.")
        self._language_codes = spec["language_codes"]
        self._clean_up = spec["clean_up_tokenization_spaces"]
        eos = spec.get("eos_token")
        unk = spec.get("unk_token")
        for name, token in (("eos_token", eos), ("unk_token", unk)):
            if not isinstance(token, str) or vocabulary.token_to_id(token) is None:
                raise BundleError(f"{where}: {name} must name a token of tokenizer.json.")
        self._eos_id = vocabulary.token_to_id(eos)
        self._unk_id = vocabulary.token_to_id(unk)
        silent, unknown = spec.get("silent_pieces"), spec.get("unknown_piece")
        if not (isinstance(silent, list) and all(isinstance(p, str) for p in silent)) or not isinstance(unknown, str):
            raise BundleError(f"{where}: silent_pieces must be a list of strings and unknown_piece a string.")
        self._silent = frozenset(silent)
        self._unknown_piece = unknown
        if spec.get("decode") not in DECODINGS:
            raise BundleError(f"{where}: decode must be one of {', '.join(DECODINGS)}.")
        self._joined = spec["decode"] == "joined"

    def _split(self, text: str) -> list[tuple[str, bool]]:
        """``text`` cut at its added tokens: (chunk, is an added token), in order."""
        chunks: list[tuple[str, bool]] = []
        start = 0
        for match in self._added.finditer(text) if self._added is not None else ():
            chunks += [(text[start : match.start()], False), (match.group(), True)]
            start = match.end()
        chunks.append((text[start:], False))
        for index, (chunk, is_added) in enumerate(chunks):
            if not is_added:
                continue
            lstrip, rstrip = self._strip[chunk]
            if rstrip and index + 1 < len(chunks) and chunks[index + 1][0]:
                chunks[index + 1] = (chunks[index + 1][0].lstrip(), False)
            if lstrip and index > 0 and chunks[index - 1][0]:
                chunks[index - 1] = (chunks[index - 1][0].rstrip(), chunks[index - 1][1])
        return [(chunk, is_added) for chunk, is_added in chunks if chunk]

    def encode(self, text: str, most: int | None = None) -> list[int] | None:
        """``text``'s ids, the end of sentence included. ``most``: None where they are certain to
        be more than that (found before the search, often before normalizing all of ``text``)."""
        tokens: list[str] = []
        for chunk, is_added in self._split(text):
            if is_added:
                tokens.append(chunk)
                continue
            if self._language_codes and chunk.startswith(">>") and (end := chunk.find("<<")) != -1:
                tokens.append(chunk[: end + 2])
                chunk = chunk[end + 2 :]
            pieces = self.model.encode(chunk, None if most is None else max(0, most - 1 - len(tokens)))
            if pieces is None:
                return None
            tokens.extend(pieces)
        lookup = self._vocabulary.token_to_id
        return [self._unk_id if (found := lookup(token)) is None else found for token in tokens] + [self._eos_id]

    def _surface(self, token: str) -> str:
        """A token's text before U+2581 is read: control pieces empty, the unknown piece " \u2047 "."""
        return "" if token in self._silent else " \u2047 " if token == self._unknown_piece else token

    def _sentencepiece_text(self, tokens: list[str]) -> str:
        """SentencePiece's decoding: each piece's U+2581 a space, control pieces empty, and while
        nothing has been written a piece's leading U+2581 dropped (the normalizer's dummy prefix)."""
        text = ""
        for token in tokens:
            surface = self._surface(token)
            if not text and self.model.add_dummy_prefix and surface.startswith(SPACE_SYMBOL):
                surface = surface[1:]
            text += surface.replace(SPACE_SYMBOL, " ")
        return text

    def decode(self, tokens: list[str]) -> str:
        """The text of ``tokens`` (the ids' tokens, special ones already left out)."""
        if not self._joined:
            return self._sentencepiece_text(tokens)
        text = "".join(map(self._surface, tokens)).replace(SPACE_SYMBOL, " ").strip()
        return clean_up_tokenization(text) if self._clean_up else text
