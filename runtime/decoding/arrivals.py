"""Work for the decode loop: sources that may keep arriving while rows decode.

One queue serves every caller of the loop. ``generate`` fills it with a whole list and closes
it; the CLI's reader thread feeds it line by line while stdin is open; a server feeds it from
requests and never closes it. The loop takes sources when slots are free (waiting only when it
has no row at all), so a text that arrives mid-batch joins the running batch, and a lone text
typed on a terminal is decoded at once instead of waiting for a batch to fill.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from .beam import BeamRules
from .common import DecodeLimits


@dataclass(frozen=True)
class Work:
    """One source to decode: the caller's index, its ids, its own limits and its own beam
    scoring (None: the loop's). ``beams`` changes only how the source's hypotheses are scored
    and returned (length_penalty, early_stopping, num_return_sequences): its ``num_beams`` and
    rule family are the loop's, which sized its batch, so that requests differing only in
    those share one loop."""

    index: int
    source: list[int]
    limits: DecodeLimits | None = None
    beams: BeamRules | None = None


# takes a queued source may be passed over for shorter ones before it goes first: without it,
# a long text could wait forever behind a stream of short ones (and hold up in-order output)
PATIENCE = 4


class Closed(Exception):
    """Raised by :meth:`Arrivals.put` once the queue is closed."""


class Arrivals:
    """A thread-safe queue of :class:`Work`, taken shortest source first within a window.

    ``lookahead``: how many of the oldest queued sources the loop picks the shortest among
    (similar lengths in a batch waste less padding). None: every queued source. A source
    passed over :data:`PATIENCE` times goes before any shorter one.
    ``capacity``: :meth:`put` blocks while this many sources wait (a producer faster than the
    decoder, such as a large file on stdin, is held back instead of filling memory). None: no
    bound.
    """

    def __init__(self, lookahead: int | None = None, capacity: int | None = None) -> None:
        if lookahead is not None and lookahead < 1:
            raise ValueError(f"lookahead must be at least 1, got {lookahead}.")
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}.")
        self.lookahead = lookahead
        self.capacity = capacity
        self._queue: deque[Work] = deque()
        self._cancelled: set[int] = set()
        self._live: set[int] = set()  # queued or decoding: what cancel can still reach
        self._passed: dict[int, int] = {}  # index -> takes that chose shorter sources over it
        self._closed = False
        self._abandoned = False
        self._ascending = True  # queued in order of length: the shortest are simply the oldest
        self._changed = threading.Condition()

    @classmethod
    def of(cls, sources: list[list[int]]) -> Arrivals:
        """A closed queue holding ``sources`` (indexed by position), taken shortest first."""
        arrivals = cls()
        for index in sorted(range(len(sources)), key=lambda i: len(sources[i])):
            arrivals.put(Work(index, sources[index]))
        arrivals.close()
        return arrivals

    def put(self, work: Work, timeout: float | None = None) -> bool:
        """Queue ``work``; False if the queue stayed full for ``timeout`` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._closed or self.capacity is None
                                          or len(self._queue) < self.capacity, timeout):
                return False
            if self._closed:
                raise Closed("no more work is taken: the queue is closed.")
            if self._queue and len(work.source) < len(self._queue[-1].source):
                self._ascending = False
            self._queue.append(work)
            self._live.add(work.index)
            self._changed.notify_all()
            return True

    def close(self) -> None:
        """No more work will come: the loop ends once the queued work is done."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def abandon(self) -> None:
        """Stop everything: queued work is dropped, the loop returns after its current call."""
        with self._changed:
            self._closed = self._abandoned = True
            self._queue.clear()
            self._passed.clear()
            self._live.clear()
            self._cancelled.clear()
            self._changed.notify_all()

    @property
    def abandoned(self) -> bool:
        with self._changed:
            return self._abandoned

    def cancel(self, index: int) -> None:
        """Drop work ``index``: removed from the queue at once if still waiting (it no longer
        counts in ``len``: a server's queue-full check and queue-depth gauge read it), from its
        batch at the loop's next call if decoding."""
        with self._changed:
            if index not in self._live:  # a finished one has nothing left to drop
                return
            for position, work in enumerate(self._queue):
                if work.index == index:
                    del self._queue[position]  # what is left stays in order of length if it was
                    self._live.discard(index)
                    self._passed.pop(index, None)
                    break
            else:
                self._cancelled.add(index)
            self._changed.notify_all()

    def cancelled(self) -> set[int]:
        """Cancelled indexes not yet dropped (:meth:`forget` them once dropped)."""
        with self._changed:
            return set(self._cancelled)

    def forget(self, index: int) -> None:
        """Work ``index`` has left the loop (finished or dropped)."""
        with self._changed:
            self._cancelled.discard(index)
            self._live.discard(index)

    def __len__(self) -> int:
        with self._changed:
            return len(self._queue)

    @property
    def closed(self) -> bool:
        with self._changed:
            return self._closed

    @property
    def finished(self) -> bool:
        """Closed and empty: nothing more will ever be taken."""
        with self._changed:
            return self._closed and not self._queue

    def take(self, count: int, wait: bool, linger: float = 0.0) -> list[Work]:
        """Up to ``count`` sources, shortest first within the lookahead window.

        ``wait``: block until at least one source is queued or the queue is closed (the caller
        has nothing else to do). ``linger``: after the first source, keep waiting up to this
        many seconds for ``count`` of them (a server gathering a batch); 0: take what is there.
        """
        with self._changed:
            if wait:
                self._changed.wait_for(lambda: self._queue or self._closed)
            if linger > 0 and self._queue:
                deadline = time.monotonic() + linger
                self._changed.wait_for(lambda: len(self._queue) >= count or self._closed,
                                       max(0.0, deadline - time.monotonic()))
            if self._ascending:  # shortest first is oldest first: no search
                chosen = [self._queue.popleft() for _ in range(min(count, len(self._queue)))]
            else:
                window = list(self._queue) if self.lookahead is None else [
                    self._queue[i] for i in range(min(self.lookahead, len(self._queue)))]
                overdue = [work for work in window if self._passed.get(work.index, 0) >= PATIENCE]
                chosen = (overdue + sorted((work for work in window if self._passed.get(work.index, 0) < PATIENCE),
                                           key=lambda work: len(work.source)))[:count]
                picked = {id(work) for work in chosen}
                self._queue = deque(work for work in self._queue if id(work) not in picked)
                for work in window:
                    if id(work) in picked:
                        self._passed.pop(work.index, None)
                    else:
                        self._passed[work.index] = self._passed.get(work.index, 0) + 1
            if not self._queue:
                self._ascending = True
            if chosen:
                self._changed.notify_all()  # room for a waiting producer
            return chosen
