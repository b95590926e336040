"""The batched draft-then-verify loop: every mode, any batch composition, rows leaving and joining.

Each row of a batch must come out exactly as that text's greedy output decoded alone (and so
as transformers' greedy), whatever else shares its verifier calls: other rows' lengths, their
drafts, when they finish, which slot a row is moved to when another leaves.
"""

from __future__ import annotations

import json
import random
import threading

import numpy as np
import pytest

from aggdec.runtime.decoding.cache import SlotBuffers, bucket
from aggdec.runtime.decoding.iad import BlockOptions
from aggdec.runtime.decoding.verifier import Batch
from aggdec.runtime.errors import AggdecError, BundleError, InputError
from aggdec.runtime.generator import Generator
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - the fixture
from tests.runtime.test_lossless import random_texts, transformers_greedy
from tests.support.tiny import FAMILIES, default_words

MAX_NEW = 24
MODES = (("greedy", {}), ("iad", {}), ("iad", {"block": BlockOptions(max_block=3, adaptive=False)}),
         ("gad", {}), ("gad", {"draft_k": 2}), ("gad++", {"beta": 1, "tau": 3.0}))


def ragged_texts(seed: int, count: int) -> list[str]:
    """Sources from 1 to 40 words, some copies of each other, in random order."""
    rng = random.Random(seed)
    words = default_words()
    texts = [" ".join(rng.choice(words) for _ in range(rng.choice([1, 2, 5, 12, 25, 40]))) for _ in range(count)]
    texts += rng.sample(texts, 3)  # duplicates must decode identically in any slot
    rng.shuffle(texts)
    return texts


@pytest.mark.parametrize("family", FAMILIES)
def test_every_mode_batched_equals_transformers(family, gad_bundle, random_checkpoint):  # noqa: F811
    texts = ragged_texts(seed=len(family), count=13)
    expected = transformers_greedy(random_checkpoint(family), texts, MAX_NEW)
    for binding in (True, False):
        generator = Generator(gad_bundle(family), io_binding=binding)
        for mode, options in MODES:
            for batch_size in (1, 4, 64):  # one row; rows leaving and joining; more slots than texts
                got = [r.ids for r in generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW,
                                                         batch_size=batch_size, **options)]
                assert got == expected, f"{mode} {options} at batch {batch_size} (binding {binding})"


def test_rows_leave_and_join_and_finished_rows_cost_nothing(bundle, monkeypatch):
    """Each row is in exactly as many verifier calls as its own iterations: a finished row's
    slot is freed at once, and never more rows than slots share a call."""
    generator = Generator(bundle("marian"))
    calls: list[int] = []
    original = Batch.verify

    def counting(self, tokens, widths=None):
        calls.append(tokens.shape[0])
        return original(self, tokens, widths)

    monkeypatch.setattr(Batch, "verify", counting)
    texts = ragged_texts(seed=3, count=20)
    for mode in ("greedy", "iad"):
        calls.clear()
        results = generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=5)
        assert max(calls) == 5
        assert sum(calls) == sum(r.stats.iterations for r in results)
        assert len(calls) < sum(r.stats.iterations for r in results) / 2  # rows did share calls


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_rows_at_the_length_limit_share_a_batch_with_new_ones(family, random_checkpoint, tmp_path):
    """A bundle with a short max_target_len: rows hit the limit (and the cache's end) while
    others start, so padded blocks reach past a long row's last position."""
    from aggdec.export import export_bundle

    root = tmp_path / "short"
    export_bundle(random_checkpoint(family), root, max_target_len=10, max_source_len=48, progress=None)
    generator = Generator(root)
    texts = ragged_texts(seed=8, count=10)
    alone = [r.ids for r in generator.generate(texts, mode="greedy", batch_size=1)]
    assert any(len(ids) == 9 for ids in alone)  # some rows run to the limit (max_target_len - 1)
    for mode in ("greedy", "iad"):
        for batch_size in (2, 3, 16):
            assert [r.ids for r in generator.generate(texts, mode=mode, batch_size=batch_size)] == alone


def test_a_bad_text_among_good_ones_is_refused_by_index_and_loses_nothing(bundle):
    generator = Generator(bundle("marian"))
    good = random_texts(seed=2, count=5)
    expected = [r.ids for r in generator.generate(good, mode="iad", batch_size=3)]
    for bad, reason in (("   ", "empty"), (" ".join(["w1"] * 600), "tokens long")):
        with pytest.raises(InputError, match=rf"text 2 .*{reason}"):
            generator.generate(good[:2] + [bad] + good[2:], mode="iad", batch_size=3)
    assert [r.ids for r in generator.generate(good, mode="iad", batch_size=3)] == expected
    assert generator.generate([], mode="iad") == []
    # any iterable of strings: a generator expression decodes like the list
    assert [r.ids for r in generator.generate((t for t in good), mode="iad", batch_size=3)] == expected


@pytest.mark.parametrize("binding", [True, False])
def test_eight_threads_share_one_generator(bundle, binding):
    generator = Generator(bundle("t5"), io_binding=binding)
    jobs = [(random_texts(seed=s, count=6), mode, size) for s in range(8)
            for mode, size in (("greedy", 3), ("iad", 2))]
    expected = [[r.ids for r in generator.generate(t, mode=m, max_new_tokens=MAX_NEW, batch_size=b)]
                for t, m, b in jobs]
    got: list = [None] * len(jobs)
    errors: list = []

    def work(i: int) -> None:
        try:
            texts, mode, size = jobs[i]
            got[i] = [r.ids for r in generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=size)]
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for thread in threads[:8]:  # eight at once, then the rest
        thread.start()
    for thread in threads[8:]:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert got == expected


def test_a_finished_batch_gives_its_buffers_to_the_next_of_its_shape(bundle, monkeypatch):
    """``generate`` makes a batch per call; the next batch of the same shape (slots, graph,
    binding) takes the buffers the last one gave back, emptied but with the values written
    before, and decodes exactly what a new Generator decodes, in any order of texts and modes."""
    texts = random_texts(seed=5, count=12)
    made: list[int] = []
    generator = Generator(bundle("marian"))
    original = generator.verifier.slot_buffers
    monkeypatch.setattr(generator.verifier, "slot_buffers", lambda *args: made.append(args[1]) or original(*args))
    runs = [(mode, part) for mode in ("greedy", "iad", "greedy") for part in (texts[:4], texts[4:8], texts[8:], texts[:4])]
    got = [[r.ids for r in generator.generate(part, mode=mode, max_new_tokens=MAX_NEW, batch_size=4)]
           for mode, part in runs]
    assert made == [4]  # greedy and IAD run the same graph: one set of buffers for every call
    for (mode, part), ids in zip(runs, got):
        assert ids == [r.ids for r in Generator(bundle("marian")).generate(part, mode=mode, max_new_tokens=MAX_NEW,
                                                                           batch_size=4)]
    buffers, key = generator.verifier.take_buffers(generator.verifier.session_for(False), 4, True, False)
    assert key is not None and buffers.rows == 0 and buffers.source_capacity == 0 and not buffers.mask.any()
    # a static batch's buffers (decision 034) are its own, never given to a dynamic batch
    static = generator.verifier.batch(4, bound=True, static_width=2)
    assert static.buffers.static and static._spare_key is None


def test_reused_buffers_of_a_recurrent_cache_decode_as_new_ones(tmp_path):
    """A Marian-native SSRU bundle (one recurrent state per position): batch after batch on
    buffers a finished batch gave back equals a fresh Generator's, greedy, IAD and beams."""
    from aggdec.export import export_bundle
    from tests.support.marian import WORDS, write_model

    texts = [" ".join(WORDS[(i * 7 + j * 2) % len(WORDS)] for j in range(1 + i % 8)) for i in range(9)]
    folder, _config, _weights = write_model(tmp_path / "model", "ssru")
    export_bundle(folder, tmp_path / "bundle", progress=None, max_source_len=32, max_target_len=32)
    reused = Generator(tmp_path / "bundle")
    assert reused.manifest.cache_kind == "recurrent"
    for mode in ("greedy", "iad"):
        for part in (texts[:4], texts[4:], texts[:4]):
            got = [r.ids for r in reused.generate(part, mode=mode, max_new_tokens=MAX_NEW, batch_size=4)]
            fresh = Generator(tmp_path / "bundle").generate(part, mode=mode, max_new_tokens=MAX_NEW, batch_size=4)
            assert got == [r.ids for r in fresh], mode
    for part in (texts[:2], texts[2:4]):
        got = reused.generate(part, num_beams=3, max_new_tokens=MAX_NEW, batch_size=2)
        fresh = Generator(tmp_path / "bundle").generate(part, num_beams=3, max_new_tokens=MAX_NEW, batch_size=2)
        assert [[h.ids for h in r.sequences] for r in got] == [[h.ids for h in r.sequences] for r in fresh]
    assert reused.verifier._spare


def test_cache_capacity_edges(bundle):
    generator = Generator(bundle("marian"))
    m = generator.manifest
    buffers = SlotBuffers(m.decoder_layers, m.num_heads, m.head_dim, m.d_model, slots=2, max_target=40,
                          max_source=8, device="cpu", bound=True, keep_hidden=False)
    with pytest.raises(AggdecError, match="cache positions"):
        buffers.ensure_capacity(41)
    assert bucket(1, 40) == 16 and bucket(17, 40) == 32 and bucket(33, 40) == 40
    batch = generator.verifier.batch(1, bound=True)
    batch.admit(generator.encode(["w1 w2"]), m.pad_token_id)
    with pytest.raises(AggdecError, match="cache positions"):
        batch.verify(np.full((1, m.max_target_len + 3), 5, dtype=np.int64))
    with pytest.raises(InputError, match="max_new_tokens"):
        generator.generate(["w1"], max_new_tokens=m.max_target_len)
    with pytest.raises(InputError, match="batch_size"):
        generator.generate(["w1"], batch_size=0)


def test_a_format_1_bundle_is_refused_with_advice_to_re_export(bundle, tmp_path):
    import shutil

    root = tmp_path / "old"
    shutil.copytree(bundle("marian"), root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["format_version"] = 1
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="(?s)format_version 1.*[Rr]e-export"):
        Generator(root)


class CountingBinding:
    """onnxruntime's own IOBinding, counting the bind calls made on it."""

    def __init__(self, binding) -> None:
        self.binding, self.binds = binding, 0

    def __getattr__(self, name):
        attribute = getattr(self.binding, name)
        if name.startswith("bind_"):
            def counted(*args, **kwargs):
                self.binds += 1
                return attribute(*args, **kwargs)
            return counted
        return attribute


@pytest.mark.parametrize("family", FAMILIES)
def test_steps_of_one_shape_bind_nothing_and_each_result_stays_its_own(family, bundle):
    generator = Generator(bundle(family))
    m = generator.manifest
    session = generator.verifier.verifier
    batch = generator.verifier.batch(2, bound=True)
    counting = batch._binding = CountingBinding(batch._binding)
    session.run_bound = (lambda run: lambda binding: run(binding.binding))(session.run_bound)
    batch.admit(generator.encode(["w1 w2 w3", "w4"]), m.pad_token_id)
    start = m.decoder_start_token_id
    first = batch.verify(np.full((2, 1), start, dtype=np.int64))
    batch.keep(np.ones(2, dtype=np.int64))
    held = tuple(array.copy() for array in first)
    binds = counting.binds
    second = batch.verify(first[1][:, :, 0])  # the same shape: nothing is bound again
    assert counting.binds == binds
    assert all(np.array_equal(a, b) for a, b in zip(first, held))  # not overwritten by the next call
    batch.keep(np.ones(2, dtype=np.int64))
    block = np.concatenate([second[1][:, :, 0], np.full((2, 2), 5, dtype=np.int64)], axis=1)
    batch.verify(block)  # a new width: ids, lengths and candidates are bound anew, the buffers are not
    assert counting.binds == binds + 4
    # and the steps gave what an unbound batch computes
    unbound = generator.verifier.batch(2, bound=False)
    unbound.admit(generator.encode(["w1 w2 w3", "w4"]), m.pad_token_id)
    again = unbound.verify(np.full((2, 1), start, dtype=np.int64))
    unbound.keep(np.ones(2, dtype=np.int64))
    assert np.array_equal(again[1], first[1])
    assert np.array_equal(unbound.verify(first[1][:, :, 0])[1], second[1])


def test_stats_batch_size_is_the_rows_decoded_together_not_the_maximum(bundle):
    """A text decoded alone reports 1 whatever batch size was allowed; rows report how many
    shared their calls, at most the configured maximum."""
    generator = Generator(bundle("marian"))
    texts = ragged_texts(seed=4, count=5)  # 8 texts with the duplicates
    (alone,) = generator.generate(texts[:1], max_new_tokens=MAX_NEW, batch_size=16)
    assert alone.stats.batch_size == 1
    together = generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=16)
    assert max(r.stats.batch_size for r in together) == len(texts)  # all of them joined the first call
    assert all(1 <= r.stats.batch_size <= len(texts) for r in together)
    capped = generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=3)
    assert max(r.stats.batch_size for r in capped) == 3
    streamed = dict(generator.stream(texts[:2], max_new_tokens=MAX_NEW, batch_size=16))
    assert all(r.stats.batch_size <= 2 for r in streamed.values())


def _buffer_bytes(buffers: SlotBuffers) -> int:
    """What a batch's buffers hold, counted from the arrays themselves."""
    flats = [*buffers._self, *buffers._cross, *([buffers._hidden] if buffers._hidden is not None else [])]
    return sum(flat._host.nbytes for flat in flats) + buffers.mask.nbytes + buffers._matrix_lens.nbytes


def test_a_batch_size_whose_buffers_cannot_fit_in_memory_is_refused_before_any_input_is_read(bundle):
    """A batch's cache buffers are made for all its rows at once. ``stream(slow_texts,
    batch_size=200000)`` asked numpy for 49 GiB at the first text (a MemoryError, nothing
    decoded), 2**62 for more than an array can hold (its bare ValueError), and the server's
    decode loops the same at their first request. Refused as an option now, by this machine's
    physical memory, before a text is read; a closed list's batch is sized by its texts."""
    from aggdec.runtime.continuous import RowDecoder
    from aggdec.runtime.decoding.arrivals import Arrivals
    from aggdec.runtime.decoding.cache import physical_memory

    generator = Generator(bundle("marian"))
    m = generator.manifest
    made = SlotBuffers(m.decoder_layers, m.num_heads, m.head_dim, m.d_model, 3, m.max_target_len + 2, m.max_source_len,
                       "cpu", False, True)
    assert _buffer_bytes(made) == 3 * SlotBuffers.slot_bytes(m.decoder_layers, m.num_heads, m.head_dim, m.d_model,
                                                             m.max_target_len + 2, m.max_source_len, True)
    row = generator.verifier.row_bytes(False)
    memory = physical_memory()
    assert memory is not None and memory > row  # Linux says
    too_many = memory // row + 1
    read: list[int] = []

    def texts():
        read.append(1)
        yield "w1 w2"

    for batch_size in (too_many, 2**62, np.uint64(2**64 - 1)):
        with pytest.raises(InputError, match=f"batch_size {int(batch_size):,} needs cache buffers for "
                                             f"{int(batch_size):,} rows at {row:,} bytes a row .*, more than this "
                                             f"machine's physical memory .*; batch_size can be at most "
                                             f"{too_many - 1:,} here"):
            generator.stream(texts(), batch_size=batch_size)
        with pytest.raises(InputError, match="needs cache buffers"):  # a server's decode loop
            RowDecoder(generator).rows(Arrivals(), "greedy", batch_size)
    assert read == []
    few = ["w1 w2", "w3"]
    expected = [r.ids for r in generator.generate(few)]
    for batch_size in (too_many, 2**62, np.uint64(2**64 - 1)):  # a closed list: as many rows as texts
        assert [r.ids for r in generator.generate(few, batch_size=batch_size)] == expected


def test_the_rows_a_batch_allocates_are_what_is_checked(bundle, monkeypatch):
    """With room for the buffers of two rows: ``generate`` takes a batch size of any size over
    two texts, refuses three texts at a batch of three; ``stream`` refuses a batch of three
    whatever it is given, as its buffers are made for all of them; a batch made directly is
    refused before numpy allocates. Where the system does not say its memory, numpy's largest
    array is the bound."""
    from aggdec.runtime.decoding import cache

    generator = Generator(bundle("marian"))
    row = generator.verifier.row_bytes(False)
    monkeypatch.setattr(cache, "physical_memory", lambda: 2 * row)
    three = ["w1 w2", "w3", "w4 w5 w6"]
    expected = [r.ids for r in generator.generate(three, batch_size=2)]
    assert [r.ids for r in generator.generate(three[:2], batch_size=1000)] == expected[:2]
    with pytest.raises(InputError, match=f"batch_size 3 needs cache buffers for 3 rows at {row:,} bytes a row .*; "
                                         "batch_size can be at most 2 here"):
        generator.generate(three, batch_size=3)
    with pytest.raises(InputError, match="batch_size 3 needs cache buffers for 3 rows"):
        generator.stream(three[:1], batch_size=3)
    assert sorted((i, r.ids) for i, r in generator.stream(three, batch_size=2)) == list(enumerate(expected))
    m = generator.manifest
    assert 3 * SlotBuffers.slot_bytes(m.decoder_layers, m.num_heads, m.head_dim, m.d_model, m.max_target_len + 2,
                                      m.max_source_len, False) > 2 * row
    with pytest.raises(InputError, match="rows 3 needs cache buffers for 3 rows"):
        generator.verifier.batch(3, bound=True)
    monkeypatch.undo()

    def unknown(name):
        raise ValueError(f"unrecognized configuration name {name!r}")

    monkeypatch.setattr(cache.os, "sysconf", unknown)
    assert cache.physical_memory() is None
    with pytest.raises(InputError, match="more than the largest array numpy can make"):
        generator.stream(three, batch_size=2**62)
    assert [r.ids for r in generator.generate(three, batch_size=1000)] == expected
