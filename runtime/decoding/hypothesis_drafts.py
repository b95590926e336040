"""Speculative beam search's drafting schedule, whatever the drafts come from.

A beam row's hypothesis changes from call to call (a step may give the row another
hypothesis), so a draft source for beams drafts each row's current hypothesis afresh at every
call: IAD its aligned source continuation (``iad.HypothesisSourceDraft``), GAD the drafter's
guess after it (``gad.HypothesisDrafterDraft``). What they share is here: how long the drafts
are, decided once a call for the whole batch, and when the batch takes plain beam steps
instead. Drafts change how many beam steps a call replays, never the output
(``loop._select_beams``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .loop import NO_DRAFT, Row
from .sizing import AcceptancePrior, BlockOptions, BlockSizer, CallCost, DraftGate
from .verifier import Batch

# A batch whose drafts do not pay rests this many plain beam steps before its first retry
# (doubling after each failed one, up to ``max_rest``). Not 1 as for a greedy row: a beam call
# must keep all N hypotheses on drafted paths, so tries mostly fail (reference model, CPU: a
# 1-token draft replays a second step on 37% of calls, where it pays only above 20-60%), and
# a short rest would spend a fifth of the calls trying.
FIRST_REST = 4


class HypothesisDraft:
    """A draft source for beam search: each call, each row's hypothesis gets a draft of the
    batch's draft length (subclasses say where the tokens come from: :meth:`_drafts`).

    How long the drafts are is decided once a call for the whole batch: every row pays for the
    widest block (the other groups' rows too), so the draft length k maximises the beam steps
    the call is expected to replay, summed over its groups, per unit of the cost of an
    iteration k positions wider (``costs``: whole iterations measured at the batch's rows, see
    :meth:`_measured`; else the options' ``cost_ratio``), plus what drafting costs besides the
    verifier call (:meth:`_fixed_cost`: GAD's drafter call), unless ``gate`` measured drafted
    iterations slower per step than plain ones. Each group's expected steps come from a
    :class:`BlockSizer` of its own: replay holds while every hypothesis a step selects lies on
    a drafted path, so a group's "acceptance" is the steps its calls replayed past the first
    (reported by the loop through :meth:`observe`), starting from what earlier groups saw
    (``prior``). Where no k beats a plain step, the batch takes plain beam steps (no draft: a
    plain iteration's work) and tries 1-token drafts once after a rest of :data:`FIRST_REST`
    steps, doubling with each failed try (as GAD's rows do), unless such a try costs at least
    the two plain steps it could at best replace. Where ``gate`` measured drafted
    iterations slower per step at the batch's width, its rests decide instead: shared by the
    Generator's decodes and sized so that a try costs at most a small share of the plain steps
    around it (:class:`DraftGate`): a batch's own rests start again with each decode (one
    sentence a call tried twice a sentence) and ignore what a try costs (GAD's calls the
    drafter), which made GAD beams far slower than plain ones while drafting almost nothing
    (benchmarks/results/beam-gate-cpu)."""

    memory = None  # what the batch keeps of each row's encoder output for the drafts (GAD: the drafter's)

    def __init__(self, options: BlockOptions, prior: AcceptancePrior | None = None,
                 costs: CallCost | None = None, gate: DraftGate | None = None) -> None:
        """``options``: ``max_block`` caps a draft; with ``adaptive`` False every row that can
        drafts ``max_block`` tokens (what the tests use to replay as much as they can).
        ``gate``: drafted against plain iterations' time per beam step, measured (the
        Generator's, shared); where drafted ones were the slower, its rests decide when to try."""
        self.options = options
        self.prior = prior  # replayed steps of the groups before (the Generator's, shared)
        self.costs = costs
        self.gate = gate
        self.seconds = 0.0  # time in graphs of its own (GAD's drafter)
        self._iterations: dict[int, _Iteration] = {}  # per batch: its last iteration
        self._current: _Iteration | None = None  # the iteration the loop's observe() calls are about
        self._rests: dict[int, _Rests] = {}  # per batch: its plain-step schedule
        self._costs_prior = 1.0 + options.cost_ratio * np.arange(1, options.max_block + 1, dtype=np.float64)

    # ------------------------------------------------------------------ what subclasses give

    def _start(self, row: Row) -> None:
        """Set up ``row.state`` (the row's own, kept while the row lives)."""

    def _drafts(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int], size: int) -> list[np.ndarray]:
        """Each row's draft after its hypothesis (``row.trace.tokens``), at most ``min(size,
        room)`` tokens; fewer, or none, where it has no more."""
        raise NotImplementedError

    def _fixed_cost(self, rows: int) -> float:
        """What drafting costs besides the verifier call's width, in one-token iterations of
        ``rows`` rows (0: nothing)."""
        return 0.0

    # ------------------------------------------------------------------ the DraftSource protocol

    def start(self, row: Row) -> None:
        self._start(row)
        group = row.group
        if group is not None and group.draft_state is None:  # the group's first row
            group.draft_state = BlockSizer(self.options, self.prior)

    def propose(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int]) -> list[np.ndarray]:
        if self._inside_a_rest(batch, len(rows)):  # a plain step nothing times or sizes
            self._measured(batch)  # the step before it, the rest's first (then nothing to measure)
            self._iterations.pop(id(batch), None)
            self._current = None
            return [NO_DRAFT] * len(rows)
        if self.costs is not None or self.gate is not None:  # else nothing reads the timings
            self._measured(batch)
            self._current = self._iterations[id(batch)] = _Iteration(time.perf_counter())
        size = self._size(batch, rows)
        if size == 0:
            return [NO_DRAFT] * len(rows)
        before = self.seconds
        drafts = self._drafts(batch, rows, rooms, size)
        if self._current is not None:
            self._current.drafting += self.seconds - before
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

    # ------------------------------------------------------------------ sizing

    def _measured(self, batch: Batch) -> None:
        """The batch's last iteration, from its proposal to its last group's selection (its
        encoder calls and other cohorts' calls left out), as the cost of its call's width (the
        drafts' own graph left out: :meth:`_fixed_cost` counts it), and its whole time per
        beam step for ``gate``. A replaying call's host work (alignment, a beam step per
        replayed step, a rebinding for a new width) is a sizeable part of a small model's step
        (reference model, CPU, batch 1: plain beam 4 spends about a third of its time outside
        onnxruntime), and a drafted call must pay for it too."""
        last, done = batch.last_call, self._iterations.get(id(batch))
        if last is None or done is None or done.ended is None or not done.groups:
            return
        seconds = done.ended - done.started
        if self.costs is not None:
            self.costs.observe(last[0], seconds - done.drafting, last[2])
        if self.gate is not None:
            self.gate.payoff.observe(last[2], last[0] > 1, seconds, done.steps / done.groups)

    def _inside_a_rest(self, batch: Batch, rows: int) -> bool:
        """Whether this call is a plain step inside a rest, the gate's (:meth:`DraftGate.rests`)
        or the batch's own, with more than one step left; it is counted down. Its timing and
        sizing would change nothing: a rest's first and last steps are measured, and a GAD beam
        batch whose drafter call costs two plain steps rests for good. That bookkeeping was
        GAD beam 4's 3% behind plain beam 4 on the CPU (benchmarks/results/beam-final-amx-cpu)."""
        if not self.options.adaptive:
            return False
        if self.gate is not None and (resting := self.gate.rests(rows)) is not None:
            return resting
        rests = self._rests.get(id(batch))
        if rests is None or rests.left <= 1:
            return False
        rests.left -= 1
        return True

    def _size(self, batch: Batch, rows: Sequence[Row]) -> int:
        """The batch's draft length for this call (0: a plain beam step)."""
        if not self.options.adaptive:
            return self.options.max_block
        if self.gate is not None and self.gate.payoff.pays(len(rows)) is False:
            return 1 if self.gate.drafts(len(rows)) else 0  # a try: one token, its replay observed
        rests = self._rests.setdefault(id(batch), _Rests())
        if rests.left > 0:  # the rest's last step (the ones before it: _inside_a_rest), nothing to weigh
            rests.left -= 1
            return 0
        if self.costs is not None:
            cost = self.costs.block_cost(self.costs.fit(len(rows))[1], self.options.max_block)
        else:
            cost = self._costs_prior
        groups = {id(row.group): row.group for row in rows if row.group is not None}
        expected = sum(group.draft_state.expected() for group in groups.values())
        fixed = self._fixed_cost(len(rows))
        value = expected / (cost + fixed)  # beam steps per unit of cost; a plain step: one per group
        best = int(np.argmax(value))
        if value[best] >= len(groups):
            rests.length = FIRST_REST
            rests.probe = False
            return best + 1
        if rests.probe:  # a rest is over: one cheap try, whose replay the groups observe
            rests.probe = False
            # unless it could only lose: a 1-token draft replays at most a second step a group,
            # and GAD's drafter call alone may cost more than that step (several, on the CPU)
            if cost[0] + fixed < 2.0:
                return 1
        rests.left, rests.length = rests.length - 1, min(2 * rests.length, self.options.max_rest)
        rests.probe = True
        return 0


@dataclass
class _Iteration:
    """One of a batch's iterations, as far as measured: when its proposal began, the seconds
    its drafts' own graph took, its groups' beam steps, and when its last group's selection
    ended."""

    started: float
    drafting: float = 0.0
    steps: int = 0
    groups: int = 0
    ended: float | None = None


@dataclass
class _Rests:
    """A batch's run of plain beam steps while drafts do not pay."""

    left: int = 0  # plain steps left
    length: int = FIRST_REST  # the next rest's length
    probe: bool = False  # the rest just ended: try drafting once

