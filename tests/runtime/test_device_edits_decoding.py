"""Every exact mode with the device edit path forced on equals the ordinary CPU path, token for token.

``cache.ORT_BUFFERS_ON_CPU`` keeps a bound batch's buffers as CPU onnxruntime values edited by
the same graphs and bindings as CUDA's (device_edits.py): rows joining and finishing mid-decode,
capacity growth (outputs past 16 positions), static shapes, beams plain and speculative. Each
test also checks that the graphs ran, so a path that silently fell back to numpy would fail.
"""

from __future__ import annotations

import random

import pytest

from aggdec.runtime.decoding import cache
from aggdec.runtime.decoding.device_edits import edit_graphs
from aggdec.runtime.decoding.sizing import BlockOptions
from aggdec.runtime.generator import Generator
from tests.runtime.test_batched import ragged_texts
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - a session fixture
from tests.runtime.test_lossless import random_texts
from tests.support.tiny import FAMILIES, make_editing_pair

MAX_NEW = 24  # past MIN_CAPACITY: the self-attention capacity grows mid-decode


def _ids(results):
    return [r.ids for r in results]


def _beams(results):
    return [[(h.ids, h.score) for h in r.sequences] for r in results]


def decode_both(monkeypatch, path, run, **options):
    """``run(generator)`` with numpy buffers, then with the graph-edited ones; both results,
    after checking that the second really went through the edit graphs."""
    plain = run(Generator(path, io_binding=True, **options))
    monkeypatch.setattr(cache, "ORT_BUFFERS_ON_CPU", True)
    graphs = edit_graphs("cpu")
    before = graphs.copy_runs
    edited = run(Generator(path, io_binding=True, **options))
    monkeypatch.setattr(cache, "ORT_BUFFERS_ON_CPU", False)
    assert graphs.copy_runs > before, "the device edit path was not taken"
    return plain, edited


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_iad_gad_equal_the_numpy_path(family, gad_bundle, monkeypatch):  # noqa: F811
    """Batch 1 and 5 over texts of mixed lengths: rows finish (the last row moves into the
    freed slot) and join (their cross keys and values uploaded) mid-decode."""
    texts = random_texts(seed=80 + FAMILIES.index(family), count=12)

    def run(generator):
        return [_ids(generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch, **extra))
                for batch in (1, 5)
                for mode, extra in (("greedy", {}), ("iad", {}), ("gad", {}), ("gad++", {"beta": 1}))]

    plain, edited = decode_both(monkeypatch, gad_bundle(family), run)
    assert edited == plain
    assert all(runs == plain[0] for runs in plain)  # every exact mode is greedy
    assert max(len(ids) for ids in plain[0]) > cache.MIN_CAPACITY  # the capacity grew


@pytest.mark.parametrize("family", ["bart", "marian", "t5"])
def test_beams_plain_and_speculative_equal_the_numpy_path(family, bundle, monkeypatch):
    """Beam search reorders its rows every step (copy_rows: swaps, one row to several)."""
    texts = random_texts(seed=90, count=6)
    options = dict(num_beams=4, num_return_sequences=3, max_new_tokens=MAX_NEW)

    def run(generator):
        return [_beams(generator.generate(texts, batch_size=batch, mode=mode, **extra, **options))
                for batch, mode, extra in ((2, "greedy", {}), (4, "iad", {"block": BlockOptions(max_block=5,
                                                                                                  adaptive=False)}))]

    plain, edited = decode_both(monkeypatch, bundle(family), run)
    assert edited == plain
    assert [[ids for ids, _ in r] for r in plain[1]] == [[ids for ids, _ in r] for r in plain[0]]


def test_gad_beams_equal_the_numpy_path(gad_bundle, monkeypatch):  # noqa: F811
    rng = random.Random(4)
    texts = [make_editing_pair(rng)[0] for _ in range(5)]

    def run(generator):
        return [_beams(generator.generate(texts, mode=mode, num_beams=3, num_return_sequences=3,
                                          max_new_tokens=MAX_NEW, batch_size=3)) for mode in ("greedy", "gad")]

    plain, edited = decode_both(monkeypatch, gad_bundle("marian"), run)
    assert edited == plain and [[i for i, _ in r] for r in plain[1]] == [[i for i, _ in r] for r in plain[0]]


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_static_shapes_equal_the_numpy_path(family, gad_bundle, monkeypatch):  # noqa: F811
    """Static buffers: joining rows written into the slots they are given (write_rows)."""
    texts = random_texts(seed=95, count=10)

    def run(generator):
        runs = [_ids(generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=3))
                for mode in ("greedy", "iad", "gad")]
        runs.append(_beams(generator.generate(texts[:4], num_beams=3, max_new_tokens=MAX_NEW, batch_size=2)))
        return runs

    plain, edited = decode_both(monkeypatch, gad_bundle(family), run, static_shapes=True)
    assert edited == plain and plain[0] == plain[1] == plain[2]


def test_rows_arriving_mid_batch_equal_the_numpy_path(bundle, monkeypatch):
    """A stream: texts arrive while a batch runs and join it (continuous batching)."""
    texts = ragged_texts(seed=7, count=11)

    def run(generator):
        return {index: result.ids for index, result in
                generator.stream(iter(texts), mode="iad", max_new_tokens=MAX_NEW, batch_size=4)}

    plain, edited = decode_both(monkeypatch, bundle("marian"), run)
    assert edited == plain and sorted(plain) == list(range(len(texts)))


def test_a_recurrent_cache_and_a_shortlist_equal_the_numpy_path(monkeypatch, tmp_path):
    """A Marian-native SSRU bundle (one recurrent state per position, one self buffer a layer)
    over its lexical shortlist (each row's output matrix kept on the host beside the buffers)."""
    from aggdec.export import export_bundle
    from tests.support.marian import WORDS, add_shortlist, write_model

    texts = [" ".join(WORDS[(i * 5 + j * 3) % len(WORDS)] for j in range(1 + i % 9)) for i in range(10)]
    folder, _config, _weights = write_model(tmp_path / "model", "ssru")
    add_shortlist(folder)
    export_bundle(folder, tmp_path / "bundle", progress=None, max_source_len=32, max_target_len=32)

    def run(generator):
        assert generator.manifest.cache_kind == "recurrent"
        return [_ids(generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=4))
                for mode in ("greedy", "iad")] + [
            _beams(generator.generate(texts[:4], num_beams=3, max_new_tokens=MAX_NEW, batch_size=2))]

    plain, edited = decode_both(monkeypatch, tmp_path / "bundle", run)
    assert edited == plain and plain[0] == plain[1] and len({len(ids) for ids in plain[0]}) > 1
