"""Text <-> ids with the bundle's tokenizer.json (the `tokenizers` library, no transformers)."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from tokenizers import Tokenizer

from .detokenization import clean_up_tokenization
from .errors import AggdecError, BundleError, InputError
from .segmentation import MARIAN_SENTENCEPIECE, SENTENCEPIECE, SENTENCEPIECE_FILE, MarianSentencePiece
from .sentencepiece import PieceTokenizer


# How many times longer the tokenizer's normalizer (or decoder) may make a text: the product of
# its replacements' growth. A tokenizer is part of an untrusted bundle, and three chained
# Replace normalizers of "w" -> 100,000 w's turn one character into 10**15: the process is
# killed for memory on its first text. The tokenizers aggdec exports grow a text by 1
# (Metaspace's " " -> "\u2581"); the bound leaves room for a few regex replacements.
MAX_GROWTH = 64


def text_growth(step: object) -> float:
    """How many times longer the normalizer or decoder ``step`` (tokenizer.json's JSON) can make a
    text through its Replace steps, at most: a Replace of a string pattern grows it by
    len(content) / len(pattern), one of a regex (which may match nothing, between every two
    characters) by len(content) + 1, a Sequence by the product of its steps'. Other steps map a
    character to a few at most (NFKC's longest is 18, once however often it is applied) and are
    counted as 1: they cannot compound."""
    if not isinstance(step, dict):
        return 1.0
    kind = step.get("type")
    if kind == "Sequence":
        growth = 1.0
        for child in step.get("normalizers") or step.get("decoders") or ():
            growth *= text_growth(child)
        return growth
    if kind == "Replace":
        content, pattern = step.get("content"), step.get("pattern")
        length = len(content) if isinstance(content, str) else 0
        if isinstance(pattern, dict) and isinstance(pattern.get("String"), str) and pattern["String"]:
            return max(1.0, length / len(pattern["String"]))
        return float(length + 1)
    return 1.0


def _panicked(exc: BaseException) -> bool:
    """A panic inside the tokenizers library (pyo3's PanicException, a BaseException so that
    ``except Exception`` misses it): Oniguruma's retry limit on a regular expression that
    backtracks without bound, ``(a+)+$`` on forty a's and a "!". Not Ctrl-C or SystemExit."""
    return type(exc).__name__ == "PanicException"


# how a text longer than the bundle takes is refused, after its length
SPLIT_OR_REEXPORT = "(split the text, or re-export with a larger --max-source-len)."


class TextCodec:
    def __init__(self, path: Path, contents: bytes | None = None, segmentation: str | None = None,
                 vocab_size: int | None = None, pieces: bytes | None = None, clean_up: bool = False,
                 split_special: bool = False) -> None:
        """``contents``: the tokenizer file's bytes, as read and hashed (manifest.BundleFiles);
        without them it is read from ``path``. ``segmentation`` (Manifest.segmentation): None
        segments as the tokenizer does; "marian_sentencepiece" as Marian's SentencePiece does
        (segmentation.py), for a bundle made from a Marian model; "sentencepiece" as a slow
        transformers SentencePiece tokenizer does (sentencepiece.py), from ``pieces``, the bundle's
        sentencepiece.json (read beside ``path`` when not given). ``vocab_size``: the manifest's;
        every id :meth:`encode` returns is checked to lie below it (a post-processor's special
        token is not counted in the tokenizer's own vocabulary size, and can name any id).
        ``clean_up`` (Manifest.clean_up_tokenization_spaces): decoded text gets transformers'
        clean-up of spaces before punctuation (detokenization.py); a "sentencepiece" bundle's
        own file says so for its decoding instead. ``split_special`` (Manifest.split_special_tokens):
        a special token's string in a text is text, segmented as any other."""
        self._vocab_limit = vocab_size
        self._clean_up = clean_up
        self._path = str(path)
        try:
            text = (path.read_bytes() if contents is None else contents).decode("utf-8")
            self._tokenizer = Tokenizer.from_str(text)
        except UnicodeDecodeError as exc:
            raise BundleError(f"the tokenizer {str(path)!r} is not UTF-8 text (invalid byte at offset "
                              f"{exc.start}).") from None
        except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
            raise BundleError(f"could not read the tokenizer {str(path)!r}: {exc}") from exc
        spec = json.loads(text)  # valid JSON: tokenizers parsed it
        for part in ("normalizer", "decoder"):
            growth = text_growth(spec.get(part) if isinstance(spec, dict) else None)
            if growth > MAX_GROWTH:
                raise BundleError(f"the tokenizer {str(path)!r}'s {part} can make a text up to {growth:.3g} times "
                                  f"longer (its Replace steps), more than the {MAX_GROWTH} allowed: one text could "
                                  "take all memory; re-export the bundle with its model's own tokenizer.")
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._tokenizer.encode_special_tokens = bool(split_special)
        unk = self._tokenizer.token_to_id("<unk>")
        self._unk_id: int | None = unk
        # The word-start marker of SentencePiece-style tokenizers, where the decoder turns it into
        # a space; a restored word-initial text takes it. Found by behaviour, not by component
        # names: other tokenizers (word level, byte-level BPE) would print it literally.
        decoder = self._tokenizer.decoder
        marked = decoder is not None and decoder.decode(["a", "\u2581b"]) == "a b"
        self._word_marker = "\u2581" if marked else None
        self._special_ids = frozenset(i for i, t in self._tokenizer.get_added_tokens_decoder().items() if t.special)
        self._segmenter: MarianSentencePiece | PieceTokenizer | None = None
        if segmentation == MARIAN_SENTENCEPIECE:
            self._segmenter = MarianSentencePiece.from_json(self._tokenizer, text, str(path))
        elif segmentation == SENTENCEPIECE:
            where = str(path.parent / SENTENCEPIECE_FILE)
            try:
                spec = json.loads((path.parent / SENTENCEPIECE_FILE).read_bytes() if pieces is None else pieces)
            except (OSError, ValueError) as exc:
                raise BundleError(f"could not read {where!r}: {exc}") from None
            self._segmenter = PieceTokenizer(spec, self._tokenizer, where)
        elif segmentation is not None:  # the manifest's schema allows only the names above
            raise BundleError(f"{str(path)!r}: unknown segmentation {segmentation!r}.")

    @property
    def unk_id(self) -> int | None:
        return self._unk_id

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of the tokens the tokenizer marks special (decoding skips them)."""
        return self._special_ids

    @property
    def vocab_size(self) -> int:
        """One past the largest id the tokenizer can produce, added tokens included (for
        bundle_checks.check_consistency): not the count of its tokens, which a vocabulary whose
        ids skip past the model's (123 tokens, ids up to 249) keeps within the model's size
        while its words encode to ids the graphs lack."""
        return max(self._tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    def encode(self, texts: list[str], first_index: int = 0, most: int | None = None) -> list[list[int]]:
        """Token ids with the special tokens the checkpoint's tokenizer adds (e.g. EOS).
        ``first_index``: the index of ``texts[0]`` among the caller's, for messages. ``most``:
        the caller refuses texts of more tokens (the bundle's max_source_len); a segmenter in
        Python stops as soon as a text is certain to exceed it, an ``InputError`` (its cost
        then grows with ``most``, not with the text: a megabyte took seconds)."""
        try:
            encoded = self._encode(texts, first_index, most)
        except BaseException as exc:  # a panic is a BaseException; anything else goes on as it is
            if not _panicked(exc):
                raise
            for index, text in enumerate(texts):  # which text: the others may be fine
                try:
                    self._encode([text], first_index + index, most)
                except BaseException as again:
                    if not _panicked(again):
                        raise
                    raise InputError(f"text {first_index + index} cannot be tokenized: the bundle's tokenizer gave up "
                                     f"on it ({again}); one of its regular expressions backtracks without bound on "
                                     "such text.") from None
            raise InputError(f"the bundle's tokenizer gave up on a text ({exc}).") from None
        if self._vocab_limit is not None:
            for ids in encoded:
                if ids and max(ids) >= self._vocab_limit:
                    raise BundleError(f"the tokenizer gave token id {max(ids)}, outside the manifest's vocabulary of "
                                      f"{self._vocab_limit} (its post-processor or added tokens name ids the graphs "
                                      "lack): the bundle's files do not belong together; re-run `aggdec export`.")
        return encoded

    def _encode(self, texts: list[str], first_index: int, most: int | None) -> list[list[int]]:
        try:
            if self._segmenter is not None:
                encoded = [self._segmenter.encode(text, most) for text in texts]
                for index, ids in enumerate(encoded):
                    if ids is None:
                        raise InputError(f"text {first_index + index} is more than {most} tokens long; this bundle "
                                         f"accepts at most {most} {SPLIT_OR_REEXPORT}")
                return encoded  # type: ignore[return-value]
            return [encoding.ids for encoding in self._tokenizer.encode_batch(texts, add_special_tokens=True)]
        except Exception as exc:  # tokenizers raises a bare Exception (a WordLevel model without its [UNK] token)
            if isinstance(exc, AggdecError):
                raise
            raise BundleError(f"the tokenizer {self._path!r} cannot encode a text: {exc}; re-export the bundle with "
                              "its model's own tokenizer.") from None

    def decode(self, ids: list[int]) -> str:
        if isinstance(self._segmenter, PieceTokenizer):  # the slow tokenizer's own rules (sentencepiece.py)
            special = self.special_ids
            tokens = (self._tokenizer.id_to_token(token) for token in ids if token not in special)
            return self._segmenter.decode([token for token in tokens if token is not None])
        try:
            text = self._tokenizer.decode(ids, skip_special_tokens=True)
        except BaseException as exc:
            if not isinstance(exc, Exception) and not _panicked(exc):
                raise
            raise BundleError(f"the tokenizer {self._path!r} cannot decode an output: {exc}; re-export the bundle "
                              "with its model's own tokenizer.") from None
        return clean_up_tokenization(text) if self._clean_up else text

    def decode_restoring(self, ids: list[int], source: str) -> str:
        """``decode``, with each ``<unk>`` of the output given back the source text it stands for.

        A tokenizer without byte fallback maps characters outside its vocabulary to ``<unk>``,
        and decoding drops it: ``км³`` would come out as ``км``. A correction tool must not
        damage what it cannot represent, so the k-th ``<unk>`` of the output takes the text of
        the k-th ``<unk>`` of the source (found by the tokenizer's own offsets) when both hold
        the same number; when they do not, every output ``<unk>`` takes the source's only
        unknown text if there is just one, and otherwise the output is decoded as is (no
        alignment is certain). Spacing follows the source: a restored text that began a word
        there begins one here.
        """
        unk = self._unk_id
        if unk is None or unk not in ids or isinstance(self._segmenter, PieceTokenizer):  # no offsets into the source
            return self.decode(ids)
        encoding = self._tokenizer.encode(source, add_special_tokens=False)
        spans = []
        for index, (token, (start, end)) in enumerate(zip(encoding.ids, encoding.offsets)):
            if token == unk:
                # a normalizer that composes (NFC, NFKC) maps "e" + U+0301 to one "é" whose offsets
                # cover the "e" alone: the marks after it that no later token covers are its text too
                following = encoding.offsets[index + 1][0] if index + 1 < len(encoding.offsets) else len(source)
                while end < min(following, len(source)) and unicodedata.combining(source[end]):
                    end += 1
                word_start = start == 0 or source[start - 1].isspace()
                after_marker = index > 0 and encoding.tokens[index - 1] == self._word_marker
                marker = self._word_marker if self._word_marker and word_start and not after_marker else ""
                spans.append(marker + source[start:end])
        wanted = ids.count(unk)
        if len(spans) != wanted:
            if len(set(spans)) != 1:
                return self.decode(ids)
            spans = spans[:1] * wanted
        restored = iter(spans)
        special = self._special_ids
        tokens = [next(restored) if token == unk else self._tokenizer.id_to_token(token)
                  for token in ids if token == unk or token not in special]
        # an id past the tokenizer (a model's padded embedding rows: T5's 32128 for 32100 tokens)
        # has no text; decode() drops it too
        tokens = [token for token in tokens if token is not None]
        decoder = self._tokenizer.decoder
        try:
            # without a decoder, tokenizers joins tokens with spaces (as `decode` does)
            text = " ".join(tokens) if decoder is None else decoder.decode(tokens)
        except BaseException as exc:
            if not isinstance(exc, Exception) and not _panicked(exc):
                raise
            raise BundleError(f"the tokenizer {self._path!r} cannot decode an output: {exc}; re-export the bundle "
                              "with its model's own tokenizer.") from None
        return clean_up_tokenization(text) if self._clean_up else text
