"""SentencePiece's unigram segmentation with the arithmetic of Marian's own build, for bundles
made from Marian models (the manifest's ``segmentation``: "marian_sentencepiece").

Why not the ``tokenizers`` library's Unigram model, which reads the same pieces and scores:
where two segmentations of a text score alike ("...." as "." + "..." or as "..." + ".", "!!!!",
runs of one letter), the winner is decided by rounding, and the two implementations round
differently. The SentencePiece built into Marian 1.12 (``EncodeOptimized``; read from
SentencePiece's source, and the only variant tried that reproduced pymarian 1.12.42) keeps
the best path score ending at each position in float32, adds a piece's score to it in double,
replaces a position's best only by a strictly greater candidate (so on an exact tie the path
whose last piece starts first wins), and visits start positions left to right and pieces
shortest first. ``tokenizers`` (and Python's sentencepiece 0.2) choose the other way on such
texts, and Marian's output changes with its source ids: upstream Marian decoded 22 of 22 such
sentences found in 46,000 as this module segments them, and none as ``tokenizers`` does
(docs/marian.md, "Segmentation").

Only the search over the pieces is done here: normalization and pre-tokenization (the
SentencePiece normalizer compiled into tokenizer.json, the word-start marker) are the
``tokenizers`` library's, and their output is the string SentencePiece searches. A run of
unknown characters is one ``<unk>``, as SentencePiece merges it.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import BundleError
from .sentencepiece import Pieces, best_path, float32

MARIAN_SENTENCEPIECE = "marian_sentencepiece"
# a slow transformers SentencePiece tokenizer (OPUS-MT's MarianTokenizer), from the bundle's
# SENTENCEPIECE_FILE: sentencepiece.py
SENTENCEPIECE = "sentencepiece"
SENTENCEPIECE_FILE = "sentencepiece.json"
SEGMENTATIONS = (MARIAN_SENTENCEPIECE, SENTENCEPIECE)


class MarianSentencePiece:
    """Text -> piece ids as Marian's SentencePiece gives them, from a ``tokenizers`` Tokenizer
    (for its normalizer and pre-tokenizer) and the Unigram model of its JSON."""

    def __init__(self, tokenizer: Any, spec: dict, where: str) -> None:
        model = spec.get("model") or {}
        if model.get("type") != "Unigram" or not isinstance(model.get("vocab"), list):
            raise BundleError(f"{where}: the manifest asks for Marian's SentencePiece segmentation, which needs a "
                              f"Unigram tokenizer; this one is {model.get('type')!r}.")
        unk = model.get("unk_id")
        special = {int(i) for i in tokenizer.get_added_tokens_decoder()}
        self._unk = unk if isinstance(unk, int) else None
        self._pieces = Pieces()
        for index, entry in enumerate(model["vocab"]):
            if index == self._unk or index in special:
                continue  # control and unknown pieces are not in SentencePiece's trie
            try:
                piece, score = str(entry[0]), float32(float(entry[1]))
            except (TypeError, ValueError, IndexError, OverflowError):
                raise BundleError(f"{where}: the Unigram vocabulary's entry {index} is not a [piece, score] pair.") \
                    from None
            self._pieces.add(piece, index, score, f"{where}: the Unigram vocabulary")
        if self._pieces.lowest is None or self._unk is None:
            raise BundleError(f"{where}: the tokenizer's Unigram model has no pieces or no unk_id.")
        self._tokenizer = tokenizer
        probe, plain = tokenizer.encode("a").ids, tokenizer.encode("a", add_special_tokens=False).ids
        at = next((i for i in range(len(probe) - len(plain) + 1) if probe[i : i + len(plain)] == plain), None)
        if at is None:
            raise BundleError(f"{where}: cannot tell where the tokenizer's special tokens go.")
        self._before, self._after = probe[:at], probe[at + len(plain) :]  # what the post-processor adds

    @classmethod
    def from_json(cls, tokenizer: Any, text: str, where: str) -> MarianSentencePiece:
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BundleError(f"{where}: not JSON ({exc}).") from None
        return cls(tokenizer, spec if isinstance(spec, dict) else {}, where)

    def encode(self, text: str, most: int | None = None) -> list[int] | None:
        """``text``'s ids, with the special tokens the tokenizer's post-processor adds. ``most``:
        None, without searching, where the ids are certain to be more than that."""
        normalizer, pre_tokenizer = self._tokenizer.normalizer, self._tokenizer.pre_tokenizer
        normalized = text if normalizer is None else normalizer.normalize_str(text)
        if pre_tokenizer is not None:
            normalized = "".join(word for word, _ in pre_tokenizer.pre_tokenize_str(normalized))
        extra = len(self._before) + len(self._after)
        if most is not None and self._pieces.fewest(normalized) + extra > most:
            return None
        return [*self._before, *self._segment(normalized), *self._after]

    def _segment(self, text: str) -> list[int]:
        merged: list[int] = []
        for _, _, found in best_path(text, self._pieces.trie, self._pieces.unk_score, round_sums=False):
            token = self._unk if found is None else found
            if not (token == self._unk and merged and merged[-1] == self._unk):  # a run of unknowns is one
                merged.append(token)
        return merged
