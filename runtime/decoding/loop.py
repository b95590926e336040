"""One batched draft-then-verify loop for every mode; the draft source is a strategy.

Each iteration, every row of the batch proposes a draft of its own length (greedy: none;
IAD: the next tokens of its source; GAD: the drafter's guess), the verifier scores each row's
block (the output tokens its cache lacks, then its draft; blocks are right-padded to one
width) in one call, and each row keeps the leading drafts that pass :class:`Verification`
plus the verifier's own token after them. With ``beta = 1`` every kept token is the
verifier's argmax after the row's true prefix: the row's greedy output, whatever the other
rows, the draft or its length.

Rows leave and join (continuous batching): a finished row frees its slot at once (the last
row moves into it, so the verifier always runs on exactly the live rows) and queued sources
take free slots, including sources that arrive while the batch runs (:class:`Arrivals`).
Sources are taken shortest first, so that rows of a batch have similar lengths; results are
yielded as rows finish, with the caller's index.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .arrivals import Arrivals, Work
from .common import DecodeLimits, RowTrace, Verification
from .verifier import Batch, Verifier

WIDTH_QUANTILE = 0.5


@dataclass
class Row:
    """A text being decoded: its source, its output so far, its draft source's state, its costs."""

    index: int  # position in the caller's list
    source: list[int]
    trace: RowTrace
    limits: DecodeLimits
    state: Any = None  # the draft source's per-row state
    # this row's share of each cost: a call's time is split evenly among the rows it served
    seconds: dict[str, float] = field(default_factory=lambda: {"encoder": 0.0, "verifier": 0.0, "drafter": 0.0,
                                                               "total": 0.0})


class DraftSource(Protocol):
    """Where drafts come from."""

    reads_encoder_output: bool  # the batch must keep the encoder's hidden states (a drafter reads them)

    def start(self, row: Row) -> None:
        """Set up ``row.state`` when the row joins."""

    def propose(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int]) -> list[np.ndarray]:
        """Each row's draft (int64, at most ``rooms[i]`` tokens)."""

    def observe(self, row: Row, drafted: int, accepted: int, appended: int) -> None:
        """What became of the row's last draft."""

    @property
    def seconds(self) -> float:
        """Time spent in graphs of its own (the drafter), summed."""


class NoDraft:
    """Greedy decoding: one token per row per call."""

    seconds = 0.0
    reads_encoder_output = False

    def start(self, row: Row) -> None:
        pass

    def propose(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int]) -> list[np.ndarray]:
        return [np.zeros(0, dtype=np.int64)] * len(rows)

    def observe(self, row: Row, drafted: int, accepted: int, appended: int) -> None:
        pass


@dataclass(frozen=True)
class Finished:
    index: int
    trace: RowTrace
    seconds: dict[str, float]


def decode(verifier: Verifier, work: Arrivals, limits: DecodeLimits, drafts: DraftSource,
           verification: Verification, slots: int, pad_id: int, bound: bool, keep_hidden: bool = False,
           linger: float = 0.0) -> Iterator[Finished]:
    """Decode the sources of ``work`` as they arrive, at most ``slots`` rows per verifier call;
    yields rows as they finish, and returns once ``work`` is closed and done. A row's own
    limits (``Work.limits``) replace ``limits``; a cancelled row is dropped without a result.
    ``linger``: when the batch is empty, seconds to wait for more sources after the first."""
    rows: list[Row] = []  # rows[slot]
    arrived = work.take(slots, wait=True, linger=linger)
    if not arrived:
        return
    # a closed queue's size is known: no more buffer rows than it can ever fill
    batch = verifier.batch(min(slots, len(arrived) + len(work)) if work.closed else slots, bound, keep_hidden)
    while True:
        free = batch.slots - len(rows)
        if not arrived and free and len(work) and (
                free >= max(1, batch.slots // 4) or (work.closed and len(work) <= free)):
            # refill in groups, one encoder call each: a quarter of the slots, or whatever is left
            arrived = work.take(free, wait=False)
        if not rows and not arrived:
            if work.finished:
                return
            arrived = work.take(batch.slots, wait=True, linger=linger)
            continue
        if arrived:
            _admit(batch, arrived, rows, limits, drafts, pad_id)
            arrived = []

        started = time.perf_counter()
        verifier_before, drafter_before = batch.verifier_seconds, drafts.seconds
        lengths = batch.lengths[: len(rows)]
        pendings = [row.trace.tokens[int(lengths[slot]):] for slot, row in enumerate(rows)]
        # a row's block is its pending tokens plus its draft; every padded block must fit the cache
        limit = batch.block_limit()
        rooms = [max(0, min(row.trace.draft_room(row.limits), limit - len(pend))) for row, pend in zip(rows, pendings)]
        proposed = drafts.propose(batch, rows, rooms)
        widths = [len(pend) + len(draft) for pend, draft in zip(pendings, proposed)]
        if len(rows) > 1 and WIDTH_QUANTILE < 1.0:
            # Blocks are padded to the widest: one row's long draft would make every row pay for
            # it. The width is capped at a quantile of the rows' wishes; longer drafts are cut
            # (a shorter draft changes speed, never the output).
            cap = max(2, int(np.quantile(widths, WIDTH_QUANTILE)))
            proposed = [draft[: max(0, cap - len(pend))] for pend, draft in zip(pendings, proposed)]
            widths = [min(w, max(cap, len(pend))) for w, pend in zip(widths, pendings)]
        width = max(widths)
        tokens = np.full((len(rows), width), pad_id, dtype=np.int64)
        for slot, (pend, draft) in enumerate(zip(pendings, proposed)):
            tokens[slot, : len(pend)] = pend
            tokens[slot, len(pend) : len(pend) + len(draft)] = draft
        top_logprobs, top_ids = batch.verify(tokens)

        kept = np.zeros(len(rows), dtype=np.int64)
        for slot, (row, pend, draft) in enumerate(zip(rows, pendings, proposed)):
            first = len(pend) - 1  # the position scoring draft[0]: after the last pending token
            end = first + len(draft) + 1
            accepted = verification.accepted(draft, top_ids[slot, first:end], top_logprobs[slot, first:end])
            kept[slot] = len(pend) + accepted
            appended = row.trace.extend([*draft[:accepted].tolist(), int(top_ids[slot, first + accepted, 0])],
                                        row.limits)
            row.trace.drafted.append(len(draft))
            row.trace.accepted.append(appended)
            drafts.observe(row, len(draft), accepted, appended)
        batch.keep(kept)

        shares = {"verifier": (batch.verifier_seconds - verifier_before) / len(rows),
                  "drafter": (drafts.seconds - drafter_before) / len(rows),
                  "total": (time.perf_counter() - started) / len(rows)}
        for row in rows:
            for name, value in shares.items():
                row.seconds[name] += value
        if work.abandoned:
            return
        cancelled = work.cancelled()
        for slot in reversed(range(len(rows))):  # from the end: a moved row is never one still to check
            row = rows[slot]
            if row.index in cancelled:
                work.forget(row.index)
            elif row.trace.done:
                work.forget(row.index)  # before the yield: a cancel from now on has nothing to drop
                yield Finished(row.index, row.trace, row.seconds)
            else:
                continue
            if batch.remove(slot) is not None:
                rows[slot] = rows[-1]
            rows.pop()


def _admit(batch: Batch, arrived: list[Work], rows: list[Row], limits: DecodeLimits, drafts: DraftSource,
           pad_id: int) -> None:
    """Encode the arrived sources in one call and give each a free slot."""
    before = batch.encoder_seconds
    started = time.perf_counter()
    batch.admit([work.source for work in arrived], pad_id)
    share = (batch.encoder_seconds - before) / len(arrived)
    wall = (time.perf_counter() - started) / len(arrived)
    for work in arrived:
        row_limits = work.limits or limits
        row = Row(index=work.index, source=work.source, trace=RowTrace(tokens=list(row_limits.start_ids)),
                  limits=row_limits)
        row.seconds["encoder"] += share
        row.seconds["total"] += wall
        drafts.start(row)
        rows.append(row)
