"""Characters the vocabulary lacks (<unk>) come back from the source instead of being dropped."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from aggdec.runtime.generator import Generator
from aggdec.runtime.tokenizer import TextCodec
from tests.support.tiny import default_words

RECIPE = Path(__file__).resolve().parents[2] / "benchmarks" / "models" / "uagec"
RARE = ["Площа 5 км³ і 😀 тут.", "³ на початку", "два ³ і ⁴ символи", "знак 🜁 тут", "кінець ⁂"]


@pytest.fixture(scope="module")
def codec(tmp_path_factory) -> TextCodec:
    """The reference recipe's BPE *without* byte fallback, trained on real UA-GEC sentences
    (seconds): characters outside its pieces become <unk>. (The committed reference model's
    own tokenizer has byte fallback and never produces <unk>.)"""
    pytest.importorskip("ua_gec")
    sys.path.insert(0, str(RECIPE))
    import data  # the recipe's modules are scripts beside their data, not a package
    import train

    pairs = data.load_pairs("train")[:1500]
    out = tmp_path_factory.mktemp("bpe-without-byte-fallback")
    train.train_tokenizer([p.source for p in pairs] + [p.target for p in pairs], 2000, out)
    return TextCodec(out / "tokenizer.json")


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


@pytest.fixture(scope="module")
def unk_writing_bundle(random_checkpoint, tmp_path_factory) -> Path:
    """A tiny Marian whose output bias makes it write <unk> first: a model that emits <unk>."""
    from transformers import MarianMTModel

    from aggdec.export import export_bundle

    checkpoint = tmp_path_factory.mktemp("unk-writer") / "model"
    shutil.copytree(random_checkpoint("marian"), checkpoint)
    model = MarianMTModel.from_pretrained(checkpoint)
    unk = TextCodec(checkpoint / "tokenizer.json").unk_id
    model.final_logits_bias[0, unk] = 1e4
    model.save_pretrained(checkpoint)
    out = checkpoint.parent / "bundle"
    export_bundle(checkpoint, out, progress=None)
    return out


def test_generate_restores_the_sources_text_for_an_unk_it_outputs(unk_writing_bundle):
    """Through Generator: an output <unk> takes the source text it stands for, in every mode."""
    generator = Generator(unk_writing_bundle)
    first, second = default_words()[:2]
    text = f"{first} zzqx {second}"
    source_ids = generator.encode([text])[0]
    assert source_ids.count(generator.codec.unk_id) == 1  # the one unknown word
    for mode in ("greedy", "iad"):
        result = generator.generate([text], mode=mode, max_new_tokens=1)[0]
        assert list(result.ids) == [generator.codec.unk_id]
        assert generator.codec.decode(list(result.ids)) == ""  # what plain decoding would give
        assert result.text == "zzqx"


@pytest.mark.parametrize("text", ["знак e\u0303 тут", "знак qe\u0303\u0301 тут", "км³ e\u0301x"])
def test_a_mark_the_normalizer_composes_into_an_unknown_letter_comes_back_with_it(codec, tmp_path, text):
    """Under NFC, "e" + U+0303 is one unknown "ẽ" whose offsets cover the "e" alone: the mark
    was lost from the restored text. Marks a later token covers are not taken twice."""
    from tokenizers import Tokenizer, normalizers

    tokenizer = Tokenizer.from_file(codec._path)  # the fixture's tokenizer, with a composing normalizer
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    composing = TextCodec(tmp_path / "tokenizer.json")
    for each in (codec, composing):
        ids = each.encode([text])[0]
        assert each.unk_id in ids
        assert each.decode_restoring(ids, text) == text
