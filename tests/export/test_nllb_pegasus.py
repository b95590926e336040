"""M2M100/NLLB (``M2M100Config``: mBART's layers with sinusoidal positions that skip padding)
and Pegasus (``PegasusConfig``: mBART's layers with Marian's fixed sinusoids and embedding
scale) checkpoints, exported and decoded exactly as transformers decodes them: greedy, IAD,
beams, IO binding on and off; M2M100's position rule against transformers' own module."""

from __future__ import annotations

import pytest

from aggdec.export import export_bundle
from aggdec.runtime.generator import Generator
from tests.runtime.test_beam import assert_same, beam_outputs, transformers_beam
from tests.runtime.test_lossless import random_texts, transformers_greedy
from tests.support import tiny

MAX_NEW = 24
pytestmark = pytest.mark.xdist_group("nllb_pegasus")  # one worker builds the module's fixtures once


def _build(tmp_path_factory, family: str, embeddings: str):
    folder = tmp_path_factory.mktemp(f"{family}-{embeddings}")
    overrides = {"scale_embedding": True, "init_std": 0.2} if embeddings == "scaled" else {}
    checkpoint = tiny.build_random_checkpoint(family, folder / "checkpoint", seed=1, **overrides)
    export_bundle(checkpoint, folder / "bundle", progress=None)
    return checkpoint, folder / "bundle"


@pytest.fixture(scope="module", params=[("m2m100", "unscaled"), ("m2m100", "scaled"), ("pegasus", "unscaled"),
                                        ("pegasus", "scaled")], ids=lambda p: "-".join(p))
def checkpoint_and_bundle(request, tmp_path_factory):
    """A tiny random model with unscaled token embeddings (outputs of varied lengths) and with
    the real checkpoints' scaled ones (NLLB, m2m100_418M, pegasus-xsum); and its bundle."""
    return _build(tmp_path_factory, *request.param)


@pytest.fixture(scope="module")
def m2m100(tmp_path_factory):
    return _build(tmp_path_factory, "m2m100", "unscaled")


def test_greedy_and_iad_equal_transformers_greedy(checkpoint_and_bundle):
    checkpoint, bundle = checkpoint_and_bundle
    texts = random_texts(seed=31, count=16)
    expected = transformers_greedy(checkpoint, texts, MAX_NEW)
    if "-unscaled" in bundle.parent.name:
        assert len({len(ids) for ids in expected}) > 3  # EOS at several steps, not only at the limit
    for io_binding in (True, False):
        generator = Generator(bundle, io_binding=io_binding)
        for batch_size in (1, 5):
            for mode in ("greedy", "iad"):
                got = generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size)
                assert [r.ids for r in got] == expected, (mode, batch_size, io_binding)


def test_beams_equal_transformers_beams(checkpoint_and_bundle):
    checkpoint, bundle = checkpoint_and_bundle
    num_beams = 4
    texts = random_texts(seed=37, count=8)
    expected = transformers_beam(checkpoint, texts, MAX_NEW, num_beams, num_return_sequences=num_beams)
    generator = Generator(bundle)
    for batch_size in (1, 8):
        got = generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=batch_size, num_beams=num_beams,
                                 num_return_sequences=num_beams)
        assert_same(beam_outputs(got), expected, (num_beams, batch_size), 1e-4)


def test_a_decoder_position_is_the_tokens_own_and_a_pad_token_takes_the_pad_row(m2m100):
    """transformers numbers decoder tokens as they are fed one at a time: cache length + 1 + pad
    id, and a pad token the pad id (a zero row). The export's embedding gives each position of a
    block what that token gets alone, pad tokens included."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from aggdec.export.families import family_for

    checkpoint, _ = m2m100
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    decoder = model.model.decoder
    pad = model.config.pad_token_id
    ids = torch.tensor([[model.config.decoder_start_token_id, 7, pad, 9, pad, 11]])
    embed = family_for(model.config).decoder_parts(model).embed
    with torch.no_grad():
        ours = embed(ids, torch.arange(ids.shape[1]).unsqueeze(0))
        for step in range(ids.shape[1]):
            token = ids[:, step : step + 1]
            theirs = decoder.embed_tokens(token) + decoder.embed_positions(token, None, step)
            assert torch.equal(ours[:, step : step + 1], theirs), step


def test_a_checkpoint_with_the_slow_m2m100_tokenizer_is_refused_saying_why(tmp_path):
    """The Hub's M2M100 checkpoints ship the slow M2M100Tokenizer (sentencepiece.bpe.model and
    vocab.json), of which transformers has no fast version: refused, and the message does not
    advise a conversion that cannot be made."""
    import json

    sentencepiece = pytest.importorskip("sentencepiece")
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    from aggdec.runtime.errors import ExportError

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(tiny.default_words(30)[i : i + 8]) for i in range(20)), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sentencepiece.bpe"),
                                             vocab_size=60, model_type="bpe", hard_vocab_limit=False, minloglevel=2)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "sentencepiece.bpe.model"))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for index in range(processor.get_piece_size()):
        vocab.setdefault(processor.id_to_piece(index), len(vocab))
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    checkpoint = tmp_path / "checkpoint"
    M2M100Tokenizer(vocab_file=str(tmp_path / "vocab.json"), spm_file=str(tmp_path / "sentencepiece.bpe.model"),
                    src_lang="en", tgt_lang="de").save_pretrained(checkpoint)
    M2M100ForConditionalGeneration(M2M100Config(vocab_size=len(vocab) + 110, d_model=16, encoder_layers=1,
                                                decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                                                encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64)
                                   ).save_pretrained(checkpoint)
    with pytest.raises(ExportError, match="slow \\(M2M100Tokenizer\\).*no fast version") as refused:
        export_bundle(checkpoint, tmp_path / "bundle", progress=None)
    assert "use_fast=True" not in str(refused.value)
    assert not (tmp_path / "bundle").exists()


@pytest.fixture(scope="module")
def nllb(tmp_path_factory):
    """A tiny M2M100 with NLLB's own fast tokenizer (NllbTokenizerFast over a small vocabulary,
    its 200 language codes added by the class), saved as the Hub's NLLB checkpoints are."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizerFast

    folder = tmp_path_factory.mktemp("nllb") / "checkpoint"
    pieces = ["\u2581"] + [f"\u2581{word}" for word in tiny.default_words(40)] + list("w0123456789")
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{piece: 4 + i for i, piece in enumerate(pieces)}}
    tokenizer = NllbTokenizerFast(vocab=vocab, merges=[], src_lang="eng_Latn")
    config = M2M100Config(vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          max_position_embeddings=64, scale_embedding=True, init_std=0.2, dropout=0.0,
                          encoder_layerdrop=0.0, decoder_layerdrop=0.0, pad_token_id=1, eos_token_id=2, bos_token_id=0,
                          decoder_start_token_id=2)
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_nllb_source_and_target_languages_chosen_at_export(nllb, tmp_path):
    """--source-language / --target-language: the bundle encodes each text with the source code
    in front and starts decoding with the target code, as transformers does with src_lang and
    forced_bos_token_id; a code the tokenizer lacks, or a tokenizer without src_lang, is refused."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from aggdec.runtime.errors import ExportError

    export_bundle(nllb, tmp_path / "bundle", source_language="deu_Latn", target_language="fra_Latn", progress=None)
    tokenizer = AutoTokenizer.from_pretrained(nllb, src_lang="deu_Latn")
    model = AutoModelForSeq2SeqLM.from_pretrained(nllb, dtype=torch.float32).eval()
    french = tokenizer.convert_tokens_to_ids("fra_Latn")
    texts = [" ".join(tiny.default_words(40)[i : i + n]) for i, n in ((0, 3), (5, 9), (12, 1), (20, 14))]
    generator = Generator(tmp_path / "bundle")
    assert generator.encode(texts) == [tokenizer(text).input_ids for text in texts]
    assert generator.encode(texts)[0][0] == tokenizer.convert_tokens_to_ids("deu_Latn")
    for text, result in zip(texts, generator.generate(texts, max_new_tokens=12)):
        with torch.no_grad():
            expected = model.generate(**tokenizer([text], return_tensors="pt"), do_sample=False, num_beams=1,
                                      max_new_tokens=12, forced_bos_token_id=french)[0].tolist()
        assert expected[1] == french
        assert list(result.ids) == expected[1:], text  # the forced code included, as transformers gives it

    unknown = r"'xyz_Abcd' is not one of the tokenizer's special tokens \(its language codes include ace_Arab"
    with pytest.raises(ExportError, match=unknown):
        export_bundle(nllb, tmp_path / "other", target_language="xyz_Abcd", progress=None)
    with pytest.raises(ExportError, match="has no source language"):
        export_bundle(tiny.build_random_checkpoint("bart", tmp_path / "bart"), tmp_path / "other",
                      source_language="</s>", progress=None)
    from tests.support.marian import write_model

    folder, _, _ = write_model(tmp_path / "marian", "ssru")
    with pytest.raises(ExportError, match="apply to Hugging Face checkpoints"):
        export_bundle(folder, tmp_path / "other", target_language="fra_Latn", progress=None)
    assert not (tmp_path / "other").exists()
