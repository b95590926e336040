"""Rows split by source length into cohorts, encoder calls split by length, and capacity given
back: what keeps a server's arrival-order batches as cheap as sorted ones, and changes no output.
"""

from __future__ import annotations

import itertools
import random
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggdec.runtime.continuous import RowDecoder
from aggdec.runtime.decoding.arrivals import Arrivals, Work
from aggdec.runtime.decoding.cache import SlotBuffers, cross_names, source_axis
from aggdec.runtime.decoding.loop import Cohort, length_class, next_cohort
from aggdec.runtime.decoding.verifier import Batch, length_groups
from aggdec.runtime.generator import Generator
from aggdec.runtime.tuning import tuning_for
from tests.runtime.test_batched import ragged_texts
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - the fixture
from tests.runtime.test_lossless import transformers_greedy
from tests.support.tiny import FAMILIES

MAX_NEW = 24


def in_arrival_order(generator: Generator, texts: list[str], mode: str, batch_size: int) -> list[tuple[int, ...]]:
    """``texts`` through the decode loop as a server feeds it (a queue, not a sorted list)."""
    work = Arrivals()
    rows = RowDecoder(generator)
    limits = rows.limits(MAX_NEW)
    for index, text in enumerate(texts):
        work.put(Work(index, rows.prepare(text)[1], limits))
    work.close()
    got = {done.index: rows.result(done).ids for done in rows.rows(work, mode, batch_size)}
    return [got[index] for index in range(len(texts))]


@pytest.fixture
def batches_used(monkeypatch) -> set[int]:
    """The batches that verifier calls went to (Batch.verify runs as always)."""
    used: set[int] = set()
    original = Batch.verify

    def verify(self, tokens, widths=None):
        used.add(id(self))
        return original(self, tokens, widths)

    monkeypatch.setattr(Batch, "verify", verify)
    return used


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("classes", [(), (2, 4, 8, 16)])
def test_rows_in_length_cohorts_equal_transformers(family, classes, gad_bundle, random_checkpoint,  # noqa: F811
                                                    batches_used):
    """Texts in arrival order, with the rows split into cohorts (here at 2, 4, 8 and 16 tokens,
    so that the ragged texts fall into five) or in one batch: every row is transformers' greedy
    output, and with classes the calls do go to several batches."""
    tuning = tuning_for("cpu").replace(length_classes=classes)
    texts = ragged_texts(seed=11 + len(family), count=14)
    expected = transformers_greedy(random_checkpoint(family), texts, MAX_NEW)
    for binding in (True, False):
        generator = Generator(gad_bundle(family), io_binding=binding, tuning=tuning)
        for mode in ("greedy", "iad", "gad"):
            for batch_size in (3, 64):
                batches_used.clear()
                got = in_arrival_order(generator, texts, mode, batch_size)
                assert got == expected, f"{mode} at batch {batch_size} (binding {binding}, classes {classes})"
                assert (len(batches_used) >= 3) == bool(classes)


def test_a_known_list_is_decoded_in_one_batch(bundle, batches_used):
    """generate() knows every text and takes them shortest first, so its batches already hold
    similar lengths: cohorts would only split its calls."""
    generator = Generator(bundle("marian"), tuning=tuning_for("cpu").replace(length_classes=(2, 4, 8, 16)))
    texts = ragged_texts(seed=4, count=12)
    results = generator.generate(texts, mode="iad", max_new_tokens=MAX_NEW, batch_size=4)
    assert len(batches_used) == 1
    assert [r.ids for r in results] == in_arrival_order(generator, texts, "iad", 4)


def test_texts_arriving_while_cohorts_decode_come_out_as_alone(bundle):
    """A server's pattern: texts of every length keep arriving (in random order, a few at a
    time) while the cohorts decode; each result equals that text decoded alone."""
    generator = Generator(bundle("marian"), tuning=tuning_for("cpu").replace(length_classes=(4, 12)))
    texts = ragged_texts(seed=5, count=30)
    alone = [r.ids for r in generator.generate(texts, mode="iad", batch_size=1)]
    rows = RowDecoder(generator)
    ids = [rows.prepare(text)[1] for text in texts]
    work = Arrivals()
    order = list(range(len(texts)))
    random.Random(1).shuffle(order)

    def feed() -> None:
        for start in range(0, len(order), 4):
            for index in order[start : start + 4]:
                work.put(Work(index, ids[index]))
            threading.Event().wait(0.01)
        work.close()

    feeder = threading.Thread(target=feed)
    feeder.start()
    got = {done.index: tuple(done.trace.tokens[1:]) for done in rows.rows(work, "iad", 6)}
    feeder.join()
    assert [got[i] for i in range(len(texts))] == alone


def test_the_cpu_default_splits_cohorts_at_48_source_tokens(bundle, batches_used):
    """The CPU profile's classes (decision 040): texts of up to 48 source tokens share a cohort,
    longer ones have another; in arrival order with the default tuning, the calls go to those
    two batches and every output equals the text decoded alone."""
    generator = Generator(bundle("marian"))
    assert generator.tuning.length_classes == (48,)
    texts = [" ".join(["w4"] * n) for n in (3, 60, 40, 5, 70, 12)]
    lengths = [len(ids) for ids in generator.encode(texts)]
    assert sum(n <= 48 for n in lengths) == 4 and sum(n > 48 for n in lengths) == 2
    alone = [r.ids for r in generator.generate(texts, mode="iad", max_new_tokens=MAX_NEW, batch_size=1)]
    batches_used.clear()
    assert in_arrival_order(generator, texts, "iad", 8) == alone
    assert len(batches_used) == 2


def test_the_cohort_whose_calls_took_least_time_goes_next():
    def cohort(seconds: float, rows: int) -> Cohort:
        return Cohort(batch=None, rows=[object()] * rows, seconds=seconds)  # type: ignore[arg-type]

    cheap, busy, empty = cohort(0.5, 1), cohort(2.0, 20), cohort(0.0, 0)
    assert next_cohort([busy, empty, cheap]) is cheap  # an empty cohort never takes a call
    assert next_cohort([busy]) is busy
    assert [length_class(n, (32, 64)) for n in (1, 32, 33, 64, 65, 500)] == [0, 0, 1, 1, 2, 2]
    assert length_class(500, ()) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=0, max_size=9), st.integers(0, 40))
def test_length_groups_are_the_cheapest_split_into_runs(lengths, call_tokens):
    """Consecutive runs covering every source once, in order, at the least cost
    (``call_tokens`` per run plus its size times its longest), against every split."""
    groups = length_groups(lengths, call_tokens)
    assert [i for group in groups for i in group] == list(range(len(lengths)))
    assert all(len(group) for group in groups)

    def cost(runs) -> int:
        return sum(call_tokens + len(run) * max(lengths[i] for i in run) for run in runs)

    best = None
    for cuts in itertools.product((False, True), repeat=max(0, len(lengths) - 1)):
        runs, start = [], 0
        for position, cut in enumerate(cuts, start=1):
            if cut:
                runs.append(range(start, position))
                start = position
        if lengths:
            runs.append(range(start, len(lengths)))
        best = cost(runs) if best is None else min(best, cost(runs))
    assert cost(groups) == (best or 0)


def test_mixed_lengths_are_encoded_in_separate_calls_with_the_same_result(bundle, monkeypatch):
    generator = Generator(bundle("marian"))
    m = generator.manifest
    sources = generator.encode(["w1", "w2 w3", " ".join(["w4"] * 40), "w5"])
    calls: list[tuple[int, int]] = []
    original = generator.verifier.encoder.run

    def run(feeds):
        calls.append(feeds["input_ids"].shape)
        return original(feeds)

    monkeypatch.setattr(generator.verifier.encoder, "run", run)
    batch = generator.verifier.batch(4, bound=True)
    order = sorted(range(4), key=lambda i: len(sources[i]))
    assert batch.admit([sources[i] for i in order], m.pad_token_id) == range(4)
    assert len(calls) == 2 and max(rows for rows, _ in calls) == 3  # the long source alone
    together = generator.verifier.batch(4, bound=True)
    together._encode([sources[i] for i in order], m.pad_token_id)  # one call, padded to the longest
    names = cross_names(m.decoder_layers)
    fed, same = batch.buffers.feeds([], names), together.buffers.feeds([], names)
    for name in names:
        axis = source_axis(name.startswith("cross_key"), m.cross_key_layout)
        cross, alike = np.moveaxis(fed[name], axis, 2), np.moveaxis(same[name], axis, 2)
        for slot, index in enumerate(order):
            length = len(sources[index])
            np.testing.assert_array_equal(cross[slot, :, :length], alike[slot, :, :length])


def test_capacity_is_given_back_when_the_longest_row_leaves(bundle):
    """A batch that never empties (a server's) would otherwise attend over the longest row it
    ever held; the rows that stay keep their cache and source values."""
    generator = Generator(bundle("marian"))
    m = generator.manifest
    buffers = SlotBuffers(m.decoder_layers, m.num_heads, m.head_dim, m.d_model, slots=3, max_target=130,
                          max_source=80, device="cpu", bound=True, keep_hidden=True)
    rng = np.random.default_rng(0)
    lengths = (3, 70)

    def rows(length):
        cross = [rng.standard_normal((1, m.num_heads, length, m.head_dim)).astype(np.float32)
                 for _ in range(2 * m.decoder_layers)]
        hidden = rng.standard_normal((1, length, m.d_model)).astype(np.float32)
        return cross, np.ones((1, length), dtype=np.int64), hidden

    short, long = rows(lengths[0]), rows(lengths[1])
    buffers.add_rows(*short)
    buffers.add_rows(*long)
    buffers.ensure_capacity(100)
    assert (buffers.capacity, buffers.source_capacity) == (128, 80)
    own = rng.standard_normal((m.num_heads, 10, m.head_dim)).astype(np.float32)
    buffers._self[0].view(buffers.self_shape())[0, :, :10] = own
    layout = buffers.layout
    buffers.remove_row(1)
    buffers.shrink(12)
    assert (buffers.capacity, buffers.source_capacity) == (16, 16)
    assert buffers.layout > layout  # bindings made before are stale
    np.testing.assert_array_equal(buffers._self[0].view(buffers.self_shape())[0, :, :10], own)
    np.testing.assert_array_equal(buffers._cross[0].view(buffers.cross_shape())[0, :, : lengths[0]], short[0][0][0])
    np.testing.assert_array_equal(buffers.hidden()[0, : lengths[0]], short[2][0])
    assert buffers.source_mask().tolist() == [[1] * lengths[0] + [0] * (16 - lengths[0])]
    buffers.shrink(40)  # never grows
    assert buffers.capacity == 16
