"""Configurations of real checkpoints that aggdec cannot reproduce are refused at export, clearly
(one line naming the thing, nothing written), and the opt-in keeps the lossless promise for what
it does decode. benchmarks/config_sweep.py is the wider sweep these come from."""

from __future__ import annotations

import json
import shutil

import pytest

from aggdec.export import export_bundle
from aggdec.runtime.errors import ExportError, UnsupportedModelError


def _copy_with_generation(src, dst, **settings):
    shutil.copytree(src, dst)
    config = json.loads((dst / "generation_config.json").read_text())
    config.update(settings)
    (dst / "generation_config.json").write_text(json.dumps(config))
    return dst


def _assert_nothing_written(tmp_path, *kept):
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)  # no OUT_DIR, no temporary directory


def test_separate_source_and_target_vocabularies_are_refused_before_loading(tmp_path):
    """Marian with decoder_vocab_size != vocab_size (some OPUS-MT models): a bundle has one
    tokenizer; only the config is needed to refuse it."""
    from transformers import MarianConfig

    MarianConfig(vocab_size=60, decoder_vocab_size=70, share_encoder_decoder_embeddings=False, d_model=16,
                 encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                 encoder_ffn_dim=16, decoder_ffn_dim=16, pad_token_id=59).save_pretrained(tmp_path / "ckpt")
    with pytest.raises(UnsupportedModelError) as error:
        export_bundle(tmp_path / "ckpt", tmp_path / "out", progress=None)
    message = str(error.value)
    assert "decoder_vocab_size 70" in message and "vocab_size 60" in message and "\n" not in message
    _assert_nothing_written(tmp_path, "ckpt")


def test_generation_settings_that_change_greedy_are_refused_unless_ignored(random_checkpoint, tmp_path):
    """bart-large-cnn's generation config: n-gram blocking and a minimum length change greedy
    output, and aggdec does not apply them. Refused by default, naming both; with
    ignore_generation_settings the bundle equals transformers' generate with them neutral, and the
    forced BOS/EOS it also sets are still applied."""
    from aggdec.runtime.continuous import RowDecoder
    from aggdec.runtime.decoding.arrivals import Arrivals, Work
    from aggdec.runtime.generator import Generator
    from tests.runtime.test_beam import transformers_beam
    from tests.runtime.test_lossless import random_texts, transformers_greedy

    src = _copy_with_generation(random_checkpoint("bart"), tmp_path / "ckpt", forced_bos_token_id=0,
                                forced_eos_token_id=2, no_repeat_ngram_size=3, min_length=56, length_penalty=2.0,
                                num_beams=4, early_stopping=True, max_length=142)
    with pytest.raises(ExportError) as error:
        export_bundle(src, tmp_path / "out", progress=None)
    message = str(error.value)
    assert "no_repeat_ngram_size=3" in message and "min_length=56" in message
    assert "--ignore-generation-settings" in message and "\n" not in message
    _assert_nothing_written(tmp_path, "ckpt")

    notes: list[str] = []
    manifest = export_bundle(src, tmp_path / "out", ignore_generation_settings=True, progress=notes.append)
    assert any("no_repeat_ngram_size=3" in line and "ignores it" in line for line in notes)
    assert any("num_beams=4" in line and "length_penalty=2.0" in line for line in notes)
    assert (manifest.forced_bos_token_id, manifest.forced_eos_token_id) == (0, 2)
    texts = random_texts(seed=5, count=8)
    expected = transformers_greedy(src, texts, 12, no_repeat_ngram_size=0, min_length=0)
    assert all(ids[0] == 0 for ids in expected)  # the forced BOS
    got = [r.ids for r in Generator(tmp_path / "out").generate(texts, mode="iad", max_new_tokens=12, batch_size=4)]
    assert got == expected
    assert [r.ids for r in Generator(tmp_path / "out").generate(texts, max_new_tokens=2)] == \
        transformers_greedy(src, texts, 2, no_repeat_ngram_size=0, min_length=0)
    # one new token is the forced BOS alone in transformers (the forced EOS here); it gave two
    # tokens. Every mode, and beams, with their score; nothing is decoded for it
    expected_one = transformers_greedy(src, texts, 1, no_repeat_ngram_size=0, min_length=0)
    assert expected_one == [(2,)] * len(texts)
    generator = Generator(tmp_path / "out")
    for mode in ("greedy", "iad"):
        results = generator.generate(texts, mode=mode, max_new_tokens=1, batch_size=3)
        assert [r.ids for r in results] == expected_one
        assert all(r.stats.iterations == 0 for r in results)
    # a server's rows each carry their own limits: rows answered at admission among decoded ones
    rows = RowDecoder(generator)
    work = Arrivals()
    for index, text in enumerate(texts):
        work.put(Work(index, rows.prepare(text)[1], rows.limits(1 if index % 2 else 12)))
    work.close()
    got = {done.index: rows.result(done).ids for done in rows.rows(work, "iad", 4)}
    assert [got[index] for index in range(len(texts))] == [
        expected_one[index] if index % 2 else expected[index] for index in range(len(texts))]
    beams = generator.generate(texts[:3], max_new_tokens=1, num_beams=3, length_penalty=1.0)
    assert [(r.ids, r.score) for r in beams] == [
        (ids, score) for ((ids, score),) in transformers_beam(src, texts[:3], 1, 3, no_repeat_ngram_size=0,
                                                              min_length=0)]
    # more sequences: the forced one again from the other beams' -1e9 start (docs/beam-search.md)
    (several,) = generator.generate(texts[:1], max_new_tokens=1, num_beams=3, num_return_sequences=3)
    assert [(h.ids, h.score) for h in several.sequences] == [((2,), 0.0), ((2,), -1e9), ((2,), -1e9)]
    # the refusal was not for nothing: transformers with the checkpoint's settings differs
    assert transformers_greedy(src, texts, 12) != expected


def test_a_checkpoint_that_samples_by_default_is_exported_with_a_note(random_checkpoint, tmp_path):
    """do_sample True in the generation config: aggdec decodes greedily (the search comes from
    each call), and the export says so rather than passing over it."""
    src = _copy_with_generation(random_checkpoint("t5"), tmp_path / "ckpt", do_sample=True, top_p=0.9)
    notes: list[str] = []
    export_bundle(src, tmp_path / "out", progress=notes.append)
    assert any("do_sample=True" in line and "from each generate call" in line for line in notes), notes


def test_several_end_tokens_are_refused(random_checkpoint, tmp_path):
    """transformers stops at any of a list of eos_token_id; aggdec at one."""
    src = _copy_with_generation(random_checkpoint("t5"), tmp_path / "ckpt", eos_token_id=[1, 9])
    with pytest.raises(ExportError, match=r"eos_token_id=\[1, 9\] \(several end tokens\)"):
        export_bundle(src, tmp_path / "out", progress=None)
    _assert_nothing_written(tmp_path, "ckpt")


def test_a_forced_bos_the_tokenizer_does_not_mark_special_is_refused_at_export(random_checkpoint, tmp_path):
    """mBART-50 forces a language code, a special token of its tokenizer. Forcing an ordinary
    token used to export a bundle that the runtime then refused to load (bundle_checks); the
    export now says so itself, naming the field and the token."""
    src = _copy_with_generation(random_checkpoint("mbart"), tmp_path / "ckpt", forced_bos_token_id=50)
    with pytest.raises(ExportError, match=r"forced_bos_token_id is 50 \('w46'\).*add_special_tokens"):
        export_bundle(src, tmp_path / "out", progress=None)
    _assert_nothing_written(tmp_path, "ckpt")


def test_t5_buckets_transformers_cannot_compute_are_refused_before_loading(tmp_path):
    """max_distance at num_buckets // 2: transformers' bucket formula divides by log(1), and the
    export used to crash with an IndexError traceback while tracing."""
    from transformers import T5Config

    T5Config(vocab_size=40, d_model=16, d_kv=8, d_ff=16, num_layers=1, num_heads=2, relative_attention_num_buckets=16,
             relative_attention_max_distance=8, decoder_start_token_id=0).save_pretrained(tmp_path / "ckpt")
    with pytest.raises(UnsupportedModelError, match="relative_attention_max_distance 8 is not above "
                                                    "relative_attention_num_buckets 16 // 2"):
        export_bundle(tmp_path / "ckpt", tmp_path / "out", progress=None)
    _assert_nothing_written(tmp_path, "ckpt")


def test_an_export_never_publishes_a_bundle_its_runtime_refuses(random_checkpoint, tmp_path, monkeypatch):
    """The last step before the bundle is moved into place opens it with the runtime: with the
    export's own special-id check switched off, the forced BOS above is still caught there."""
    from aggdec.export import pipeline

    monkeypatch.setattr(pipeline, "_check_special_ids", lambda tokenizer, ids: None)
    src = _copy_with_generation(random_checkpoint("mbart"), tmp_path / "ckpt", forced_bos_token_id=50)
    with pytest.raises(ExportError, match="would be refused by aggdec's runtime .*forced_bos_token_id is 50"):
        export_bundle(src, tmp_path / "out", progress=None)
    _assert_nothing_written(tmp_path, "ckpt")


def test_the_generation_configs_decoder_start_is_the_one_decoded_from(random_checkpoint, tmp_path):
    """generate() starts from generation_config.json's decoder_start_token_id; the export took
    config.json's, and where the two differ every output differed (12 of 20 in the sweep)."""
    from aggdec.runtime.generator import Generator
    from tests.runtime.test_lossless import random_texts, transformers_greedy

    src = _copy_with_generation(random_checkpoint("bart"), tmp_path / "ckpt", decoder_start_token_id=0)
    assert json.loads((src / "config.json").read_text())["decoder_start_token_id"] == 2
    manifest = export_bundle(src, tmp_path / "out", progress=None)
    assert manifest.decoder_start_token_id == 0
    texts = random_texts(seed=6, count=8)
    expected = transformers_greedy(src, texts, 12)
    generator = Generator(tmp_path / "out")
    for mode in ("greedy", "iad"):
        assert [r.ids for r in generator.generate(texts, mode=mode, max_new_tokens=12, batch_size=4)] == expected
