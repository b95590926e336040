"""The bundle's tokenizer, as the runtime reads it (runtime/tokenizer.py TextCodec), against the
checkpoint's transformers tokenizer, before anything is written: probe texts must encode to the
same ids and id sequences decode to the same text. The promise is string for string, so a
difference in either direction (a normalizer, a post-processor, transformers' clean-up of
spaces after decoding) refuses the export, naming the text or the ids."""

from __future__ import annotations

import random
from typing import Any

from ..runtime.errors import ExportError

# Texts whose tokenization exercises each rule the runtime reproduces (whitespace, the
# normalizer, unknown characters, added tokens and language codes, spaces before punctuation
# and English contractions, which transformers' clean-up removes); random ones are added.
PROBE_TEXTS = (
    "", " ", "Hello world.", "  two  spaces  ", "tab\tand\nnewline", "\u00a0nbsp\u3000ideographic",
    "ﬁ ligature, Ａ fullwidth, ① circled, ｶﾞ halfwidth", "e\u0301 combining", " \u0301 lone accent",
    "emoji 😀 and \u200b zero width", "</s> inside", "a</s>b", "<unk><pad>", ">>fra<< Bonjour", ">>fra<<",
    ">> not a code", "x >>deu<< later", "Hmmm ... wait!!!!", "1234567890", "\u2581 marker", "ß ü Ø ł ğ ş",
    "Hello , world ! It 's fine . Is n't it ? I 'm sure they 've said we 're ' quoted ' .",
)
PROBE_RANDOM_TEXTS = 200
PROBE_DECODES = 200


def probe_texts(pieces: list[str], rng: random.Random) -> list[str]:
    """:data:`PROBE_TEXTS` and texts of a vocabulary's own pieces, glued and spaced at random."""
    texts = list(PROBE_TEXTS)
    for _ in range(PROBE_RANDOM_TEXTS):
        words = [rng.choice(pieces).replace("\u2581", rng.choice(["", " ", "  "])) for _ in range(rng.randint(1, 8))]
        texts.append(rng.choice(["", " "]).join(words))
    return texts


def check_codec(tokenizer: Any, codec: Any, pieces: list[str], vocab_size: int, where: str, seed: int = 0) -> None:
    """``codec`` (the runtime's TextCodec, made from the files the bundle will hold) against
    ``tokenizer`` (transformers'): :func:`probe_texts` of ``pieces`` encoded, random id sequences
    below ``vocab_size`` and the probe texts' own ids decoded (skipping special tokens, as
    aggdec's outputs are)."""
    rng = random.Random(seed)
    sequences = []
    for text in probe_texts(pieces, rng):
        expected = list(tokenizer(text).input_ids)
        got = codec.encode([text])[0]
        if got != expected:
            raise ExportError(f"the bundle's tokenizer for {where!r} encodes {text!r} as {got}, the checkpoint's "
                              f"tokenizer as {expected}; refusing to export a bundle whose sources would differ.")
        sequences.append(expected)
    sequences += [[rng.randrange(vocab_size) for _ in range(rng.randint(1, 12))] for _ in range(PROBE_DECODES)]
    for ids in sequences:
        expected = tokenizer.decode(ids, skip_special_tokens=True)
        got = codec.decode(ids)
        if got != expected:
            raise ExportError(f"the bundle's tokenizer for {where!r} decodes {ids} as {got!r}, the checkpoint's "
                              f"tokenizer as {expected!r}; refusing to export a bundle whose outputs would differ.")
