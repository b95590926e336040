"""Work that arrives while rows decode: the queue, `Generator.stream`, cancellation.

A text that joins a running batch, or is dropped from it, must leave every other row's
output exactly as greedy decodes it alone.
"""

from __future__ import annotations

import threading
import time

import pytest

from aggdec.runtime.decoding.arrivals import Arrivals, Closed, Work
from aggdec.runtime.decoding.common import GREEDY
from aggdec.runtime.decoding.loop import NoDraft, decode
from aggdec.runtime.errors import InputError
from aggdec.runtime.generator import Generator
from tests.runtime.test_batched import ragged_texts

MAX_NEW = 16


def test_queue_takes_shortest_first_within_its_window_and_holds_producers_back():
    queue = Arrivals(lookahead=3, capacity=4)
    for index, length in enumerate([5, 4, 3, 1]):
        queue.put(Work(index, [7] * length))
    assert queue.put(Work(9, [7]), timeout=0.05) is False  # full: the producer is held back
    # the shortest of the 3 oldest (the 1-token one is outside the window)
    assert [w.index for w in queue.take(1, wait=False)] == [2]
    assert [w.index for w in queue.take(5, wait=False)] == [3, 1, 0]
    queue.put(Work(4, [7]))
    queue.cancel(4)
    assert queue.take(5, wait=False) == [] and queue.cancelled() == set()
    queue.close()
    assert queue.take(5, wait=True) == [] and queue.finished
    with pytest.raises(Closed):
        queue.put(Work(5, [7]))


def test_a_waiting_taker_wakes_when_work_arrives_and_lingers_for_more():
    queue = Arrivals()
    threading.Timer(0.05, queue.put, args=(Work(0, [1]),)).start()
    threading.Timer(0.10, queue.put, args=(Work(1, [1, 2]),)).start()
    started = time.monotonic()
    taken = queue.take(2, wait=True, linger=5.0)
    assert [w.index for w in taken] == [0, 1]
    assert time.monotonic() - started < 4.0  # it stopped lingering once it had two


@pytest.mark.parametrize("mode", ["greedy", "iad"])
def test_texts_that_arrive_mid_batch_decode_as_alone(bundle, mode):
    generator = Generator(bundle("marian"))
    texts = ragged_texts(seed=3, count=11)
    expected = [r.ids for r in generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=1)]

    def slowly():
        for number, text in enumerate(texts):
            if number % 3 == 0:
                time.sleep(0.03)  # a batch is running when the next ones arrive
            yield text

    got = dict(generator.stream(slowly(), mode=mode, max_new_tokens=MAX_NEW, batch_size=4))
    assert sorted(got) == list(range(len(texts)))
    assert [got[i].ids for i in range(len(texts))] == expected


def test_a_bad_item_is_its_own_error_and_the_others_go_on(bundle):
    generator = Generator(bundle("marian"))
    items = ["w1 w2", "", b"w3 \xff", "w4 \ud800", 7, b"w5 w6", " ".join(["w1"] * 500), "w7"]
    got = dict(generator.stream(iter(items), max_new_tokens=MAX_NEW, batch_size=2))
    assert sorted(got) == list(range(len(items)))
    errors = {i: str(r) for i, r in got.items() if isinstance(r, InputError)}
    assert sorted(errors) == [1, 2, 3, 4, 6]
    assert "empty" in errors[1] and "UTF-8" in errors[2] and "surrogate" in errors[3]
    assert errors[4] == "text 4 is a number, not a string." and "tokens long" in errors[6]
    good = ["w1 w2", "w5 w6", "w7"]
    expected = [r.ids for r in generator.generate(good, max_new_tokens=MAX_NEW)]
    assert [got[0].ids, got[5].ids, got[7].ids] == expected


def test_the_iterables_own_error_comes_after_the_texts_before_it(bundle):
    generator = Generator(bundle("marian"))

    def broken():
        yield "w1 w2"
        yield "w3"
        raise RuntimeError("the source went away")

    seen = []
    with pytest.raises(RuntimeError, match="went away"):
        for index, _ in generator.stream(broken(), max_new_tokens=MAX_NEW):
            seen.append(index)
    assert sorted(seen) == [0, 1]


def _stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aggdec-stream") and t.is_alive()]


def test_stopping_early_stops_reading_and_decoding(bundle):
    generator = Generator(bundle("marian"))
    read = []

    def endless():
        while True:
            read.append(1)
            yield "w1 w2 w3"

    for _ in generator.stream(endless(), max_new_tokens=MAX_NEW, batch_size=2):
        break
    deadline = time.monotonic() + 10
    while _stream_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _stream_threads()
    count = len(read)
    time.sleep(0.1)
    # held back by the window (8 queued, the decoding rows, the one waiting to be queued, those
    # that finished before the first came back), then stopped
    assert len(read) == count and count <= 3 * 8


def test_options_are_refused_when_stream_is_called_not_when_iterated(bundle):
    generator = Generator(bundle("marian"))
    for options in ({"batch_size": 0}, {"lookahead": 0}, {"mode": "nope"}, {"max_new_tokens": 0}):
        with pytest.raises(InputError):
            generator.stream(["w1"], **options)
    with pytest.raises(InputError, match="one string"):
        generator.stream("w1 w2")


def test_a_cancelled_row_is_dropped_and_the_others_are_untouched(bundle):
    generator = Generator(bundle("marian"))
    texts = ragged_texts(seed=5, count=9)
    expected = [r.ids for r in generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=1)]
    encoded = generator.encode(texts)
    work = Arrivals()
    for index, ids in enumerate(encoded):
        work.put(Work(index, ids))
    work.cancel(2)  # still queued
    work.close()
    limits = generator._limits(MAX_NEW)
    finished = {}
    for done in decode(generator.verifier, work, limits, NoDraft(), GREEDY, 4, generator.manifest.pad_token_id,
                       bound=True):
        finished[done.index] = done.trace.tokens[1:]
        if len(finished) == 1:  # some rows are mid-decode now: drop them all but one
            for index in range(len(texts)):
                if index not in finished and index != 8:
                    work.cancel(index)
    assert 2 not in finished and 8 in finished
    assert len(finished) < len(texts) - 1  # rows that were decoding were dropped too
    for index, ids in finished.items():
        assert ids == list(expected[index])


def test_a_long_source_is_not_passed_over_forever():
    from aggdec.runtime.decoding.arrivals import PATIENCE

    queue = Arrivals(lookahead=4)
    queue.put(Work(0, [7] * 50))
    taken: list[int] = []
    for index in range(1, 40):  # a stream of short sources, one taken per arrival
        queue.put(Work(index, [7]))
        taken += [w.index for w in queue.take(1, wait=False)]
    assert 0 in taken and taken.index(0) <= PATIENCE


def test_cancelling_finished_or_unknown_work_leaves_nothing_behind():
    queue = Arrivals()
    queue.put(Work(0, [1]))
    (taken,) = queue.take(1, wait=False)
    queue.forget(taken.index)  # the loop reports it finished
    queue.cancel(0)
    queue.cancel(99)
    assert queue.cancelled() == set()


def test_cancelled_waiting_work_leaves_the_queue_at_once():
    """A queued source that is cancelled stops counting in ``len`` at once (a server's queue-full
    check and queue-depth gauge read it): it stayed until the loop next took work, and while
    long rows held the batch, texts of clients long gone made others' requests 429s. One being
    decoded is dropped by the loop (``cancelled``); a full queue's producer gets the room."""
    queue = Arrivals(capacity=3)
    for index, length in enumerate((1, 2, 3)):
        queue.put(Work(index, [7] * length))
    (decoding,) = queue.take(1, wait=False)
    queue.put(Work(3, [7] * 4))
    assert len(queue) == 3 and queue.put(Work(4, [7]), timeout=0.01) is False
    queue.cancel(2)
    assert len(queue) == 2 and queue.cancelled() == set()
    queue.cancel(decoding.index)
    assert len(queue) == 2 and queue.cancelled() == {decoding.index}
    assert queue.put(Work(4, [7] * 5), timeout=0.01) is True
    assert [work.index for work in queue.take(5, wait=False)] == [1, 3, 4]  # still shortest first
