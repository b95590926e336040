"""Output text, not only ids, is transformers': a checkpoint whose tokenizer config sets
``clean_up_tokenization_spaces`` (many T5, mT5, mBART and Pegasus checkpoints saved by
transformers 4) has transformers' ``decode`` remove the space before punctuation, and the
bundle's text does too (runtime/detokenization.py); the export checks the bundle's tokenizer
against the checkpoint's in both directions (export/codec_check.py) and refuses a difference."""

from __future__ import annotations

import json
import shutil

import pytest

from aggdec import Generator
from aggdec.export import export_bundle
from aggdec.export.codec_check import check_codec
from aggdec.runtime.errors import ExportError
from aggdec.runtime.tokenizer import TextCodec
from tests.support import tiny

PUNCTUATION = [".", ",", "!", "?"]


@pytest.fixture(scope="module")
def cleaning_checkpoint(tmp_path_factory):
    """A tiny random T5 whose word-level vocabulary has punctuation, saved with the clean-up on."""
    out = tmp_path_factory.mktemp("cleaning") / "ckpt"
    tiny.build_random_checkpoint("t5", out, seed=3, vocab_words=tiny.default_words(60) + PUNCTUATION)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["clean_up_tokenization_spaces"] = True
    config_path.write_text(json.dumps(config))
    return out


def test_a_cleaning_tokenizer_s_text_is_transformers_text(cleaning_checkpoint, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cleaning_checkpoint)
    assert tokenizer.clean_up_tokenization_spaces
    manifest = export_bundle(cleaning_checkpoint, tmp_path / "bundle", progress=None)
    assert manifest.clean_up_tokenization_spaces is True
    generator = Generator(tmp_path / "bundle", threads=1)
    ids = tokenizer("w1 , w2 ! w3 .").input_ids
    assert generator.codec.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True) == "w1, w2! w3."

    words = tiny.default_words(60)
    texts = [" ".join(words[(7 * i + j) % 60] if j % 3 else PUNCTUATION[(i + j) % 4] for j in range(2 + i % 9))
             for i in range(40)]
    results = generator.generate(texts, max_new_tokens=24)
    cleaned = 0
    for result in results:
        raw = tokenizer.backend_tokenizer.decode(list(result.ids), skip_special_tokens=True)
        assert result.text == tokenizer.decode(list(result.ids), skip_special_tokens=True)
        cleaned += raw != result.text
    assert cleaned  # the clean-up changed some outputs: the comparison above could have failed


def test_the_export_refuses_a_bundle_tokenizer_that_decodes_otherwise(cleaning_checkpoint, tmp_path):
    """The check itself: the same tokenizer.json read without the clean-up decodes the probe of
    spaced punctuation differently from transformers, and is refused naming the ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cleaning_checkpoint)
    backend = tokenizer.backend_tokenizer.to_str().encode("utf-8")
    words = list(tokenizer.get_vocab())
    check_codec(tokenizer, TextCodec(tmp_path / "tokenizer.json", backend, clean_up=True), words,
                len(words), "ckpt")
    with pytest.raises(ExportError, match=r"decodes \[.*\] as .*whose outputs would differ") as error:
        check_codec(tokenizer, TextCodec(tmp_path / "tokenizer.json", backend), words, len(words), "ckpt")
    assert "\n" not in str(error.value)


def test_an_older_bundle_without_the_field_decodes_as_before(cleaning_checkpoint, tmp_path):
    """A manifest without clean_up_tokenization_spaces (bundles from before the field) loads and
    decodes without the clean-up, as it did."""
    bundle = tmp_path / "bundle"
    export_bundle(cleaning_checkpoint, bundle, progress=None)
    old = tmp_path / "old"
    shutil.copytree(bundle, old)
    data = json.loads((old / "manifest.json").read_text())
    del data["clean_up_tokenization_spaces"]
    (old / "manifest.json").write_text(json.dumps(data))
    ids = Generator(bundle, threads=1).codec.encode(["w1 , w2 ."])[0]
    assert Generator(old, threads=1).codec.decode(ids) == "w1 , w2 ."


def test_a_checkpoint_that_splits_special_tokens_reads_their_strings_as_text(tmp_path):
    """transformers' split_special_tokens (the tokenizers library's encode_special_tokens, which
    tokenizer.json does not keep): "</s>" in a text is text, not the end token, in the bundle too."""
    from transformers import AutoTokenizer

    checkpoint = tmp_path / "ckpt"
    tiny.build_random_checkpoint("t5", checkpoint, seed=4, vocab_words=tiny.default_words(40))
    config_path = checkpoint / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["split_special_tokens"] = True
    config_path.write_text(json.dumps(config))
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    manifest = export_bundle(checkpoint, tmp_path / "bundle", progress=None)
    assert manifest.split_special_tokens is True and manifest.clean_up_tokenization_spaces is None
    generator = Generator(tmp_path / "bundle", threads=1)
    eos = tokenizer.convert_tokens_to_ids("</s>")
    for text in ("w1 </s> w2", "</s>", "w3</s><pad>"):
        expected = tokenizer(text).input_ids
        assert expected.count(eos) == 1  # only the one the post-processor appends
        assert generator.encode([text])[0] == expected, text
