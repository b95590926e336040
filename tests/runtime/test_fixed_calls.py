"""Static batches whose every verifier input and output is bound once, at fixed addresses
(decoding/fixed_calls.py: what ``Generator(cuda_graphs=True)`` runs on CUDA), on the CPU.

The CUDA graphs themselves need a GPU (tests/runtime/test_gpu.py); here the same calls run
with CPU onnxruntime values, from the same pool (graph ids given, which a CPU session
ignores), and must give exactly the static path's outputs, which binds ids and lengths from
the host: every exact mode, the tiny models of every family.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from aggdec.runtime.decoding.fixed_calls import FixedCalls
from aggdec.runtime.errors import InputError, ProviderError
from aggdec.runtime.generator import Generator
from aggdec.runtime.session import providers_for
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - a session fixture, shared with its tests
from tests.runtime.test_lossless import random_texts
from tests.support.tiny import FAMILIES

MAX_NEW = 24
MODES = (("greedy", {}), ("iad", {}), ("gad", {}), ("gad++", {"beta": 1, "tau": 5.0}))


def _ids(results) -> list[tuple[int, ...]]:
    return [result.ids for result in results]


def _fixed(generator: Generator) -> FixedCalls:
    """Make ``generator``'s static batches run through fixed calls (as cuda_graphs does on CUDA)."""
    generator.verifier.fixed_calls = FixedCalls()
    return generator.verifier.fixed_calls


@pytest.mark.parametrize("family", FAMILIES)
def test_fixed_calls_equal_the_static_path(family, gad_bundle):  # noqa: F811
    """Mixed lengths (rows finish and others take their slots), batch 1, 3 and 8, every exact
    mode: the same tokens as the static path; the buffers are made once per shape and reused
    by the next decode of that shape (a pooled call's slots hold the last decode's rows)."""
    texts = random_texts(seed=80 + FAMILIES.index(family), count=14)
    static = Generator(gad_bundle(family), static_shapes=True)
    fixed = Generator(gad_bundle(family), static_shapes=True)
    pool = _fixed(fixed)
    for batch_size in (1, 3, 8):
        expected = _ids(static.generate(texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=batch_size))
        for mode, extra in MODES:
            if mode != "greedy":
                assert _ids(static.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size,
                                            **extra)) == expected, (mode, batch_size)
            got = _ids(fixed.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size, **extra))
            assert got == expected, (mode, batch_size)
    assert len({len(ids) for ids in expected}) > 1  # rows of several lengths: they finished at different steps
    # one call per (graph, slots, whether the rows keep an encoder output): greedy reads the best
    # id (the argmax graph where the bundle has one), IAD the top-K, GAD keeps encoder outputs
    assert 3 <= pool.made <= 4 * 3, pool.made
    made = pool.made
    again = _ids(fixed.generate(texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=8))
    assert again == expected and pool.made == made  # reused: no new buffers, no new graph


@pytest.mark.parametrize("family", ["bart", "marian", "t5"])
def test_fixed_beams_equal_static_beams(family, bundle):
    texts = random_texts(seed=81, count=6)
    static = Generator(bundle(family), static_shapes=True)
    fixed = Generator(bundle(family), static_shapes=True)
    _fixed(fixed)
    for mode in ("greedy", "iad"):
        for _ in range(2):  # the second decode reuses the first's buffers
            options = dict(mode=mode, num_beams=3, num_return_sequences=2, max_new_tokens=MAX_NEW, batch_size=2)
            expected = static.generate(texts, **options)
            got = fixed.generate(texts, **options)
            assert [[h.ids for h in r.sequences] for r in got] == [[h.ids for h in r.sequences] for r in expected]


def _count_plain_runs(session, monkeypatch) -> list[int]:
    """A list that grows by one at each run of ``session`` with host inputs (``run``)."""
    runs: list[int] = []
    real = session.run

    def counted(inputs):
        runs.append(1)
        return real(inputs)

    monkeypatch.setattr(session, "run", counted)
    return runs


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_the_fixed_encoder_writes_its_rows_on_the_device(family, gad_bundle, monkeypatch):  # noqa: F811
    """With the buffers as onnxruntime values (``cache.ORT_BUFFERS_ON_CPU``: CUDA's path on the
    CPU), a fixed call's encoder outputs go into the rows' slots by the edit graphs' copies
    (``SlotBuffers.write_cross``), never through the host: every exact mode, GAD's encoder
    output kept, and beams (one source copied into several slots) give the static path's tokens."""
    from aggdec.runtime.decoding import cache
    from aggdec.runtime.decoding.device_edits import edit_graphs

    texts = random_texts(seed=86, count=10)
    static = Generator(gad_bundle(family), static_shapes=True)

    def run(generator):
        runs = [_ids(generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=3, **extra))
                for mode, extra in MODES]
        beams = generator.generate(texts[:4], num_beams=3, max_new_tokens=MAX_NEW, batch_size=2)
        return runs, [[h.ids for h in r.sequences] for r in beams]

    expected = run(static)
    monkeypatch.setattr(cache, "ORT_BUFFERS_ON_CPU", True)
    fixed = Generator(gad_bundle(family), static_shapes=True)
    _fixed(fixed)
    copies = edit_graphs("cpu").copy_runs
    encoder_runs = _count_plain_runs(fixed.verifier.encoder, monkeypatch)
    assert run(fixed) == expected
    assert encoder_runs == [] and edit_graphs("cpu").copy_runs > copies
    assert all(mode == expected[0][0] for mode in expected[0])


def test_every_input_is_bound_once(bundle, monkeypatch):
    """The point of a fixed call: over a whole decode, the binding is made once and never
    bound again (a captured graph replays the addresses it was captured with), and the ids and
    lengths reach the graph only through their buffers' contents."""
    import onnxruntime

    generator = Generator(bundle("marian"), static_shapes=True)
    _fixed(generator)
    bound: list[str] = []
    real = onnxruntime.IOBinding
    for method in ("bind_ortvalue_input", "bind_ortvalue_output", "bind_input", "bind_output", "bind_cpu_input"):
        original = getattr(real, method)

        def spy(self, name, *args, _original=original, **kwargs):
            bound.append(name)
            return _original(self, name, *args, **kwargs)

        monkeypatch.setattr(real, method, spy)
    texts = random_texts(seed=82, count=9)
    expected = _ids(Generator(bundle("marian"), static_shapes=True).generate(texts, max_new_tokens=MAX_NEW,
                                                                            batch_size=4))
    bound.clear()
    encoder_runs = _count_plain_runs(generator.verifier.encoder, monkeypatch)
    assert _ids(generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=4)) == expected
    # the verifier's ids and the encoder's (FixedEncoderCall), each bound once; the encoder's
    # plain run (host inputs and outputs) is never taken
    assert bound.count("input_ids") == 2 and bound.count("past_lengths") == 1
    assert bound.count("encoder_attention_mask") == 1 and bound.count("attention_mask") == 1
    assert encoder_runs == []
    bound.clear()
    assert _ids(generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=4)) == expected
    assert bound == []  # the second decode of that shape binds nothing at all


def test_concurrent_decodes_take_their_own_calls(bundle):
    """Two threads decoding at one shape at once: two calls, two graph ids (a graph's buffers
    are its own), both outputs right."""
    texts = random_texts(seed=83, count=8)
    expected = _ids(Generator(bundle("t5"), static_shapes=True).generate(texts, max_new_tokens=MAX_NEW,
                                                                         batch_size=4))
    generator = Generator(bundle("t5"), static_shapes=True)
    pool = _fixed(generator)
    results: list = [None, None]
    started = threading.Barrier(2)

    def run(index: int) -> None:
        started.wait()
        results[index] = _ids(generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=4))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected, expected]
    calls = [call for free in pool._free.values() for call in free]
    assert len(calls) == pool.made
    ids = [call.graph_id for call in calls]
    assert len(set(ids)) == len(ids) and all(graph_id >= 1 for graph_id in ids)


def test_a_refused_graph_falls_back(bundle):
    """A graph onnxruntime will not run (here: the pool is told so, as FixedCall is when the
    session's run with a graph id fails) leaves the calls made after it without graph ids, and
    says why once."""
    generator = Generator(bundle("bart"), static_shapes=True)
    pool = _fixed(generator)
    with pytest.warns(RuntimeWarning, match="decoding goes on without CUDA graphs: a node on the CPU"):
        pool.refuse("a node on the CPU")
    texts = random_texts(seed=84, count=3)
    generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=3)
    assert pool.made and all(call.graph_id is None for free in pool._free.values() for call in free)


def test_cuda_graphs_option_is_refused_where_it_cannot_run(bundle):
    path = bundle("bart")
    with pytest.raises(InputError, match="cuda_graphs needs device 'cuda'"):
        Generator(path, static_shapes=True, cuda_graphs=True)
    with pytest.raises(InputError, match="cuda_graphs needs static_shapes=True"):
        Generator(path, device="cuda", cuda_graphs=True)
    with pytest.raises(InputError, match="cuda_graphs needs io_binding"):
        Generator(path, device="cuda", static_shapes=True, io_binding=False, cuda_graphs=True)
    for value in ("yes", 1, None):
        with pytest.raises(InputError, match="cuda_graphs must be True or False"):
            Generator(path, static_shapes=True, cuda_graphs=value)
    with pytest.raises(ProviderError, match="CUDA graphs apply to device 'cuda' only"):
        providers_for("cpu", cuda_graph=True)
    options = providers_for("cuda", cuda_graph=True)[0][1]
    assert options["enable_cuda_graph"] == "1" and options["use_tf32"] == "0"
    assert "enable_cuda_graph" not in providers_for("cuda")[0][1]


def test_fixed_call_candidates_have_the_batch_shape(bundle):
    """Straight through the batch: one call's candidates are the rows' blocks, cut from the
    [slots, width] outputs the fixed buffers hold."""
    generator = Generator(bundle("mbart"), static_shapes=True)
    _fixed(generator)
    batch = generator.verifier.batch(3, bound=True, static_width=generator.static_width)
    try:
        batch.admit(generator.encode(["w1 w2", "w3 w4 w5"]), generator.manifest.pad_token_id)
        start = generator.manifest.decoder_start_token_id
        logprobs, ids = batch.verify(np.full((2, 2), start, dtype=np.int64))
        assert logprobs.shape == ids.shape == (2, 2, generator.manifest.top_k)
        assert batch._call is not None and batch._call.candidates[0].shape() == [3, generator.static_width,
                                                                                 generator.manifest.top_k]
    finally:
        batch.close()
    assert batch._call is None
