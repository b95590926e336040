"""Input-guided Aggressive Decoding (IAD): the source sentence is the draft.

Algorithm 1 of "Lossless Acceleration for Seq2seq Generation with Aggressive Decoding"
(Ge et al.): the output is aligned with the source, the source tokens after the aligned
position are verified as one block, the prefix that equals the verifier's argmax is kept
together with the verifier's own token at the first disagreement (the bifurcation), and
the output is re-aligned by the shortest suffix of the output that occurs exactly once in
the source. Without such a match the loop takes plain greedy steps until one appears.
Every kept token is the verifier's argmax given the true prefix, so the output is greedy's.

IAD is a :class:`SourceDraft` for the batched loop in ``loop.py``: each row aligns and drafts
from its own source. A row whose output has started repeating itself (a model stuck in a loop)
drafts the continuation of the repetition instead, when that match is longer than its match
with the source (:func:`repeated_tail`): the source cannot draft a loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .alignment import MAX_REPEAT_MATCH, SENTINEL as _SENTINEL, align
from .sizing import AcceptancePrior, BlockOptions, BlockSizer, CallCost, ReplayPayoff
from .loop import Row
from .repetition import RepeatDrafts
from .verifier import Batch

@dataclass
class _Alignment:
    """An IAD row's view of its source: where the output has got to in it."""

    source: np.ndarray  # sentinel, then the source ids
    output: np.ndarray  # sentinel, the decoder prefix after the start token, then the output
    length: int  # valid entries of ``output``
    sizer: BlockSizer
    repeats: RepeatDrafts
    expected: int | None = None  # where in the source the output has got to, as far as known
    at: int | None = None  # the source position the last draft started after


class SourceDraft:
    """IAD's draft source: each row's own source, after the position its output is aligned with."""

    seconds = 0.0  # no graph of its own
    memory = None  # IAD's drafts are the source's tokens: it reads no encoder output

    def __init__(self, options: BlockOptions, prior: AcceptancePrior | None = None,
                 costs: CallCost | None = None) -> None:
        """``costs``: the verifier's measured call costs (the Generator's, shared), which size
        the blocks at the batch's width; None: the options' ``cost_ratio`` at every width."""
        self.options = options
        self.prior = prior  # where a row's acceptance estimate starts (the Generator's, shared)
        self.costs = costs
        self._last_call: tuple[int, float, int] | None = None

    def start(self, row: Row) -> None:
        start = row.limits.start_ids  # the row's own limits: its source may cap its length
        output = np.empty(row.limits.max_new_tokens + len(start) + 1, dtype=np.int64)
        output[0] = _SENTINEL
        output[1 : len(start)] = start[1:]
        source = np.concatenate([[_SENTINEL], np.asarray(row.source, dtype=np.int64)])
        row.state = _Alignment(source, output, len(start), BlockSizer(self.options, self.prior),
                               RepeatDrafts(self.options))

    def propose(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int]) -> list[np.ndarray]:
        block_cost = None
        if self.costs is not None:
            if batch.last_call is not None and batch.last_call is not self._last_call:
                self._last_call = batch.last_call
                self.costs.observe(*batch.last_call)
            block_cost = self.costs.block_cost(self.costs.fit(len(rows))[1], self.options.max_block)
        drafts = []
        for row, room in zip(rows, rooms):
            a: _Alignment = row.state
            output = a.output[: a.length]
            a.at = align(output, a.source, a.expected)
            # the repetition is looked for after the sentinel; it must beat the source's match
            repeat = a.repeats.draft(output[1:], room, rival=lambda: _source_match(output, a.source, a.at))
            if repeat is not None:
                a.at = None
                drafts.append(repeat)
                continue
            k = 0 if a.at is None else min(len(a.source) - a.at - 1, room, a.sizer.size(block_cost=block_cost))
            drafts.append(a.source[a.at + 1 : a.at + 1 + k] if k > 0 else a.source[:0])
        return drafts

    def observe(self, row: Row, drafted: int, accepted: int, appended: int) -> None:
        a: _Alignment = row.state
        if not a.repeats.observe(drafted, accepted) and drafted:
            a.sizer.observe(drafted, accepted)
        # the token after the accepted drafts took the place of source[at + accepted + 1]
        a.expected = a.at + accepted + 1 if a.at is not None else (a.expected + 1 if a.expected is not None else None)
        a.output[a.length : a.length + appended] = row.trace.tokens[-appended:]
        a.length += appended


def _source_match(output: np.ndarray, source: np.ndarray, at: int | None) -> int:
    """How many of the output's last tokens equal the source's up to ``source[at]`` (0 without
    an alignment), the sentinels excluded, counted up to the longest repetition match (a
    repetition never beats more)."""
    if at is None:
        return 0
    length, most = 0, min(len(output), at + 1, MAX_REPEAT_MATCH)
    while length < most and output[-1 - length] == source[at - length] != _SENTINEL:
        length += 1
    return length


# A batch whose drafts do not pay rests this many plain beam steps before its first retry
# (doubling after each failed one, up to ``max_rest``). Not 1 as for a greedy row: a beam call
# must keep all N hypotheses on drafted paths, so tries mostly fail (reference model, CPU: a
# 1-token draft replays a second step on 37% of calls, where it pays only above 20-60%), and
# a short rest would spend a fifth of the calls trying.
FIRST_REST = 4


class HypothesisSourceDraft:
    """IAD's draft source for beam search: each row's hypothesis, aligned afresh with its source
    at every call, drafts the source tokens after the aligned position.

    A beam row's hypothesis changes from call to call (a step may give the row another
    hypothesis), so no per-row alignment carries over. A row whose hypothesis has left its
    source (no alignment) drafts nothing.

    How long the drafts are is decided once a call for the whole batch: every row pays for the
    widest block (the other groups' rows too), so the draft length k maximises the beam steps
    the call is expected to replay, summed over its groups, per unit of the cost of an
    iteration k positions wider (``costs``: whole iterations measured at the batch's rows, see
    :meth:`_measured`; else the options' ``cost_ratio``), unless ``payoff`` measured drafted
    iterations slower per step than plain ones. Each group's expected steps
    come from a :class:`BlockSizer` of its own: replay holds while every hypothesis a step
    selects lies on a drafted path, so a group's "acceptance" is the steps its calls replayed
    past the first (reported by the loop through :meth:`observe`), starting from what earlier
    groups saw (``prior``). Where no k beats a plain step, the batch takes plain beam steps (no
    draft, no alignment: a plain iteration's work) and tries 1-token drafts once after a rest
    of :data:`FIRST_REST` steps, doubling with each failed try (as GAD's rows do). Drafts
    change how many beam steps a call replays, never the output (loop._select_beams)."""

    seconds = 0.0  # no graph of its own
    memory = None

    def __init__(self, options: BlockOptions, prior: AcceptancePrior | None = None,
                 costs: CallCost | None = None, payoff: ReplayPayoff | None = None) -> None:
        """``options``: ``max_block`` caps a draft; with ``adaptive`` False every aligned row
        drafts ``max_block`` tokens (what the tests use to replay as much as they can).
        ``payoff``: drafted against plain iterations' time per step, measured; where drafted
        ones were the slower, the batch rests as where the cost model says drafts do not pay."""
        self.options = options
        self.prior = prior  # replayed steps of the groups before (the Generator's, shared)
        self.costs = costs
        self.payoff = payoff
        self._iterations: dict[int, _Iteration] = {}  # per batch: its last iteration
        self._current: _Iteration | None = None  # the iteration the loop's observe() calls are about
        self._rests: dict[int, _Rests] = {}  # per batch: its plain-step schedule
        self._costs_prior = 1.0 + options.cost_ratio * np.arange(1, options.max_block + 1, dtype=np.float64)

    def _measured(self, batch: Batch) -> None:
        """The batch's last iteration, from its proposal to its last group's selection (its
        encoder calls and other cohorts' calls left out), as the cost of its call's width, and
        its time per beam step for ``payoff``. A replaying call's host work (alignment, a beam
        step per replayed step, a rebinding for a new width) is a sizeable part of a small
        model's step (reference model, CPU, batch 1: plain beam 4 spends about a third of its
        time outside onnxruntime), and a drafted call must pay for it too."""
        last, done = batch.last_call, self._iterations.get(id(batch))
        if last is None or done is None or done.ended is None or not done.groups:
            return
        seconds = done.ended - done.started
        if self.costs is not None:
            self.costs.observe(last[0], seconds, last[2])
        if self.payoff is not None:
            self.payoff.observe(last[2], last[0] > 1, seconds, done.steps / done.groups)

    def start(self, row: Row) -> None:
        row.state = np.concatenate([[_SENTINEL], np.asarray(row.source, dtype=np.int64)])
        group = row.group
        if group is not None and group.draft_state is None:  # the group's first row
            group.draft_state = BlockSizer(self.options, self.prior)

    def _size(self, batch: Batch, rows: Sequence[Row]) -> int:
        """The batch's draft length for this call (0: a plain beam step)."""
        if not self.options.adaptive:
            return self.options.max_block
        rests = self._rests.setdefault(id(batch), _Rests())
        if rests.left > 0:  # resting: nothing to weigh
            rests.left -= 1
            return 0
        if self.costs is not None:
            cost = self.costs.block_cost(self.costs.fit(len(rows))[1], self.options.max_block)
        else:
            cost = self._costs_prior
        groups = {id(row.group): row.group for row in rows if row.group is not None}
        expected = sum(group.draft_state.expected() for group in groups.values())
        value = expected / cost  # beam steps per unit of cost; a plain step: one per group
        best = int(np.argmax(value))
        if value[best] >= len(groups) and (self.payoff is None or self.payoff.pays(len(rows)) is not False):
            rests.length = FIRST_REST
            rests.probe = False
            return best + 1
        if rests.probe:  # a rest is over: one cheap try, whose replay the groups observe
            rests.probe = False
            return 1
        rests.left, rests.length = rests.length - 1, min(2 * rests.length, self.options.max_rest)
        rests.probe = True
        return 0

    def propose(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int]) -> list[np.ndarray]:
        if self.costs is not None or self.payoff is not None:  # else nothing reads the timings
            self._measured(batch)
            self._current = self._iterations[id(batch)] = _Iteration(time.perf_counter())
        size = self._size(batch, rows)
        if size == 0:
            return [_EMPTY] * len(rows)
        drafts = []
        for row, room in zip(rows, rooms):
            k = min(size, room)
            source: np.ndarray = row.state
            output = np.asarray([_SENTINEL, *row.trace.tokens[1:]], dtype=np.int64)
            at = None if k == 0 else align(output, source)
            k = 0 if at is None else min(len(source) - at - 1, k)
            drafts.append(source[at + 1 : at + 1 + k] if k > 0 else _EMPTY)  # type: ignore[operator]
        return drafts

    def observe(self, row: Row, drafted: int, accepted: int, appended: int) -> None:
        """A beam group's call (``row``: one of its rows): its longest draft, and the steps
        replayed past the first (each stood on one more draft position)."""
        if row.group is not None and drafted:
            row.group.draft_state.observe(drafted, accepted)
        if self._current is not None:
            self._current.steps += appended
            self._current.groups += 1
            self._current.ended = time.perf_counter()


@dataclass
class _Iteration:
    """One of a batch's iterations, as far as measured: when its proposal began, its groups'
    beam steps, and when its last group's selection ended."""

    started: float
    steps: int = 0
    groups: int = 0
    ended: float | None = None


@dataclass
class _Rests:
    """A batch's run of plain beam steps while drafts do not pay."""

    left: int = 0  # plain steps left
    length: int = FIRST_REST  # the next rest's length
    probe: bool = False  # the rest just ended: try drafting once


_EMPTY = np.zeros(0, dtype=np.int64)
