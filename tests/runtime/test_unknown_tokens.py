"""Characters the vocabulary lacks (<unk>) come back from the source instead of being dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggdec.runtime.generator import Generator
from aggdec.runtime.tokenizer import TextCodec

REFERENCE_TOKENIZER = Path(__file__).resolve().parents[2] / "benchmarks/models/uagec/model/tokenizer.json"
RARE = ["Площа 5 км³ і 😀 тут.", "³ на початку", "два ³ і ⁴ символи", "знак 🜁 тут", "кінець ⁂"]


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec(REFERENCE_TOKENIZER)


@pytest.mark.parametrize("text", RARE)
def test_a_copied_source_decodes_to_itself(codec, text):
    ids = codec.encode([text])[0]
    assert codec.unk_id in ids  # the case this is for: plain decoding loses characters
    assert codec.decode(ids) != text
    assert codec.decode_restoring(ids, text) == text


def test_restoring_follows_the_output_not_the_source(codec):
    source = "два ³ і ⁴ символи"
    edited = codec.encode(["три ³ і ⁴ символи"])[0]  # a word changed before the <unk>s
    assert codec.decode_restoring(edited, source) == "три ³ і ⁴ символи"
    dropped = [i for n, i in enumerate(edited) if not (i == codec.unk_id and n == edited.index(codec.unk_id))]
    # one <unk> of two dropped: no certain alignment, so nothing is invented
    assert codec.decode_restoring(dropped, source) == codec.decode(dropped)
    one = codec.encode(["а ³ б"])[0]
    u = one.index(codec.unk_id)
    twice = one[: u + 1] + one[u:]  # the output repeats the only unknown text
    assert codec.decode_restoring(twice, "а ³ б").count("³") == 2
    plain = codec.encode(["без рідкісних знаків"])[0]
    assert codec.decode_restoring(plain, "без рідкісних знаків") == codec.decode(plain)


def test_generate_restores_the_sources_text_for_an_unk_it_outputs(reference_bundle):
    """Through Generator: the result's text is decoded with the source at hand. (The reference
    model itself never emits <unk>: it was trained on targets without it and writes some other
    token instead, e.g. `км³` -> `кмбій`; only a byte-fallback tokenizer fixes that model.)"""
    generator = Generator(reference_bundle)
    text = "Площа становить 5 км³ ."
    result = generator.generate([text])[0]
    assert result.text == generator.codec.decode_restoring(list(result.ids), text)
    copied = generator.encode([text])[0]
    assert generator.codec.decode_restoring(copied, text) == text
