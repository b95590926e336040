"""Generalized Aggressive Decoding (GAD, and GAD++ with relaxed verification).

Each iteration the drafter proposes k tokens after the output so far, in one
non-autoregressive pass; the verifier scores them in one pass; the leading drafts that pass
:class:`Verification` are kept, plus the verifier's own top token at the first one that does
not (so every iteration yields at least one token). With ``beta = 1`` that is exactly greedy
decoding (section 3.2 of "Lossless Acceleration for Seq2seq Generation with Aggressive
Decoding"; SpecDec's Spec-Verification for ``beta > 1``).

The drafter reads only the last ``window`` output tokens (at their absolute positions: the
output's, or for a drafter trained with source positions, those of the source tokens they are
aligned with), so a call costs the same at the end of a long output as at its start. How many
of its k tokens a row's verifier call checks is chosen per iteration from the row's acceptance
history and the measured cost of a drafter call (:class:`BlockSizer`).

A row whose output has started repeating itself (a model stuck in a loop: ``для для для``, a
clause over and over) drafts the continuation of the repetition instead (:func:`repeated_tail`),
without a drafter call: a drafter that reads the source and a window of the output cannot see
the loop, and accepted about 1.4 tokens per iteration on such outputs.

Beam search (:class:`HypothesisDrafterDraft`): each hypothesis gets the drafter's draft of its
own prefix, and the loop replays beam steps over the block's scores while every selected
hypothesis lies on a drafted path (``loop._select_beams``): plain beam search's output.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..bundle_probe import check_ids
from ..session import Session
from .alignment import MIN_REPEAT, source_position_offsets
from .hypothesis_drafts import HypothesisDraft
from .loop import NO_DRAFT, Row
from .repetition import RepeatDrafts
from .sizing import MAX_REST, AcceptancePrior, BlockOptions, BlockSizer, CallCost, DraftGate
from .verifier import Batch


class Drafter:
    """drafter.onnx: k tokens after each row's output so far, in one non-autoregressive pass.

    ``source``: drafter_source.onnx, the drafter-only encoder layers of a bundle whose drafter
    has them; :meth:`memory` runs it once per source, and every :meth:`draft` reads its output."""

    def __init__(self, session: Session, k: int, mask_id: int, window: int = 0, source: Session | None = None,
                 source_positions: bool = False, vocab_size: int | None = None, takes_output_ids: bool = False
                 ) -> None:
        """``vocab_size``: the verifier's; a draft outside it is refused (BundleError), as the
        verifier could not embed it (None: not checked). ``takes_output_ids``: a shortlist
        bundle's drafter, which drafts among each row's allowed ids (the verifier's
        ``output_ids``)."""
        self.session = session
        self.k = k
        self.mask_id = mask_id
        self.window = window  # output tokens read before the slots; 0: all of them
        self.source = source
        # read tokens at their aligned source positions, not their output positions (as trained:
        # the manifest's draft_positions)
        self.source_positions = source_positions
        self.vocab_size = vocab_size
        self.takes_output_ids = takes_output_ids

    def memory(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """What :meth:`draft` reads of sources whose encoder output is ``hidden`` [m, S, d]: the
        output itself, or the drafter-only layers over it."""
        if self.source is None:
            return hidden
        return self.source.run({"encoder_hidden_states": hidden, "encoder_attention_mask": mask})["drafter_memory"]

    def draft(self, prefixes: Sequence[list[int]], sources: Sequence[Sequence[int]], memory: np.ndarray,
              mask: np.ndarray, pad_id: int, output_ids: np.ndarray | None = None) -> np.ndarray:
        """[rows, k] drafts after each prefix (the output, decoder start included) of a row with
        ``sources`` (token ids); ``memory``: :meth:`memory` of those sources; ``output_ids``
        (a drafter that takes them): the rows' allowed ids, [rows or 1, L], -1 padded."""
        seen = [prefix[-self.window:] if self.window else prefix for prefix in prefixes]
        width = max(len(p) for p in seen) + self.k
        ids = np.full((len(seen), width), pad_id, dtype=np.int64)
        attention = np.zeros((len(seen), width), dtype=np.int64)
        for row, prefix in enumerate(seen):
            ids[row, : len(prefix)] = prefix
            ids[row, len(prefix) : len(prefix) + self.k] = self.mask_id
            attention[row, : len(prefix) + self.k] = 1
        offsets = np.array([len(full) - len(p) for full, p in zip(prefixes, seen)], dtype=np.int64)
        if self.source_positions:
            offsets = source_position_offsets(offsets.tolist(), prefixes, sources, self.window)
        feeds = {
            "input_ids": ids,
            "attention_mask": attention,
            "slot_start": np.array([len(p) for p in seen], dtype=np.int64),
            "position_offset": offsets,
            "encoder_hidden_states": memory,
            "encoder_attention_mask": mask,
        }
        if self.takes_output_ids:
            if output_ids is None:
                raise ValueError("this drafter drafts over each row's shortlist: pass output_ids")
            if output_ids.shape[0] != len(seen):  # one row for every row (the whole vocabulary)
                output_ids = np.ascontiguousarray(np.broadcast_to(output_ids, (len(seen), output_ids.shape[1])))
            feeds["output_ids"] = output_ids
        out = self.session.run(feeds)
        if self.vocab_size is not None:
            check_ids(out["draft_ids"], self.vocab_size, "the drafter")
        return out["draft_ids"]


# How fast a GAD row's acceptance estimate forgets (BlockOptions.decay; IAD keeps 0.8). A drafter
# that tracked a long stretch often fails for good when the output turns repetitive; with 0.8
# a row kept drafting k for five to eight failed calls after a run of successes. Measured with
# benchmarks/gad_decay_ab.py (now `benchmarks/ab.py --set mode=gad --a gad_decay=0.8`; 1,500
# sentences, one process): 0.5 against 0.8 took 0.962x the GAD time, 0.922x on outputs over 64
# tokens (0.8 against itself, the noise: 0.996x, 1.004x). A Generator's Tuning.gad_decay.
DECAY = 0.5

# The shortest rest (DraftGate) for which a batch's cache, sized for the drafted blocks, is cut
# back to what one-token steps need: its extra span costs every plain step (reference model,
# CPU, 8 and 32 rows: a one-token call over a 128-position cache 1.2-1.4x one over 32,
# benchmarks/call_after_block.py), a cut costs a copy of the cache, and a short rest ends in a
# drafted try that grows it again.
SHRINK_REST = 8


@dataclass
class _Drafting:
    """A GAD row's draft lengths: one estimate for the drafter's proposals, one for repeats."""

    drafter: BlockSizer
    repeats: RepeatDrafts


def call_drafter(drafter: Drafter, batch: Batch, rows: Sequence[Row], drafting: Sequence[int],
                 pad_id: int) -> tuple[np.ndarray, float]:
    """One drafter call for the rows at ``drafting`` (slots of ``rows``): their drafts, one row
    each in that order, and the call's seconds."""
    started = time.perf_counter()
    hidden, mask = batch.drafter_inputs()
    # the verifier's per-row shortlists (or one row of every id): a row drafts among its own
    output_ids = batch.output_ids() if drafter.takes_output_ids else None
    if len(drafting) < len(rows):
        hidden, mask = hidden[drafting], mask[drafting]
        if output_ids is not None and output_ids.shape[0] > 1:
            output_ids = output_ids[drafting]
    drafted = drafter.draft([rows[slot].trace.tokens for slot in drafting], [rows[slot].source for slot in drafting],
                            hidden, mask, pad_id, output_ids)
    return drafted, time.perf_counter() - started


class DrafterDraft:
    """GAD's draft source: one drafter call for the whole batch, a draft length chosen per row.

    A row's draft length weighs its acceptance history against measured costs (``costs``, a
    :class:`CallCost` the Generator keeps across requests): a verifier call's cost per extra
    position and the drafter call's cost, both in one-token verifier calls. A row whose drafts
    keep failing takes plain greedy steps, as a drafter call is not free.

    ``gate``: whether a batch drafts at all, from its iterations measured, drafted against plain
    (:class:`DraftGate`, the Generator's, shared); where drafted ones took longer per token at
    the batch's width class, the batch takes plain steps (no drafter call, no repetition draft),
    whatever its rows' sizing says, and tries drafting after rests. None: each row's sizing
    alone decides.

    ``repeats``: a row whose output repeats itself drafts the repetition's continuation, with
    a draft length of its own, and no drafter call (module docstring)."""

    def __init__(self, drafter: Drafter, pad_id: int, k: int | None = None, cost_ratio: float = 0.05,
                 adaptive: bool = True, costs: CallCost | None = None, prior: AcceptancePrior | None = None,
                 repeats: bool = True, decay: float = DECAY, max_rest: int = MAX_REST,
                 min_repeat: int = MIN_REPEAT, gate: DraftGate | None = None) -> None:
        self.drafter = drafter
        self.pad_id = pad_id
        self.k = drafter.k if k is None else min(k, drafter.k)
        self.options = BlockOptions(max_block=self.k, adaptive=adaptive, cost_ratio=cost_ratio, decay=decay,
                                    max_rest=max_rest, min_repeat=min_repeat)
        self.costs = CallCost(cost_ratio) if costs is None else costs
        self.prior = prior  # where a row's acceptance estimate starts (the Generator's, shared)
        self.repeats = repeats
        self.seconds = 0.0
        self._last_call: tuple[int, float, int] | None = None
        self.memory = drafter.memory  # the batch keeps it per row (Batch): once per source
        self.gate = gate
        self._iterations: dict[int, _Iteration] = {}  # per batch: its last iteration, as measured
        self._current: _Iteration | None = None  # the iteration the loop's observe() calls are about
        self._resting = False  # the current iteration is a plain step inside the gate's rest

    def start(self, row: Row) -> None:
        row.state = _Drafting(BlockSizer(self.options, self.prior), RepeatDrafts(self.options))

    def propose(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int]) -> list[np.ndarray]:
        if batch.last_call is not None and batch.last_call is not self._last_call:  # the call since the last proposal
            self._last_call = batch.last_call
            self.costs.observe(*batch.last_call)
        self._resting = self.gate is not None and self.gate.rests(len(rows)) is True
        if self._resting:  # a plain step nothing times: each row's rest counts it (observe)
            self._measured(batch)  # the step before it, the rest's first (then nothing to measure)
            self._iterations.pop(id(batch), None)
            self._current = None
            return [NO_DRAFT] * len(rows)
        if self.gate is not None:
            previous = self._measured(batch)
            after_drafted = previous is not None and previous.drafted
            current = self._current = self._iterations[id(batch)] = _Iteration(
                time.perf_counter(), len(rows), after_drafted=after_drafted)
            if not self.gate.drafts(len(rows)):  # a plain step: no draft, no sizer asked
                current.gated = True
                if after_drafted and self.gate.resting(len(rows)) >= SHRINK_REST:
                    batch.shrink(width=1)  # the cache's span as plain steps need it, for the rest
                return [NO_DRAFT] * len(rows)
        _one_token, ratio = self.costs.fit(len(rows))  # at this batch's width: a loaded batch drafts less
        fixed = self.costs.drafter_cost(len(rows))
        block_cost = self.costs.block_cost(ratio, self.k)  # once per iteration, shared by the rows
        drafts = [NO_DRAFT] * len(rows)
        drafting, sizes = [], []
        for slot, (row, room) in enumerate(zip(rows, rooms)):
            state: _Drafting = row.state
            repeat = state.repeats.draft(row.trace.tokens, room, block_cost) if self.repeats else None
            if repeat is not None:
                drafts[slot] = repeat
                continue
            size = min(state.drafter.size(fixed, allow_none=True, block_cost=block_cost), room)
            if size > 0:
                drafting.append(slot)
                sizes.append(size)
        if self._current is not None:  # a repetition draft widens the call as a drafter's does
            self._current.drafted = bool(drafting) or any(len(draft) for draft in drafts)
        if not drafting:
            return drafts
        drafted, elapsed = call_drafter(self.drafter, batch, rows, drafting, self.pad_id)
        self.seconds += elapsed
        self.costs.observe_drafter(elapsed, len(rows))
        for place, (slot, size) in enumerate(zip(drafting, sizes)):
            drafts[slot] = drafted[place, :size]
        return drafts

    def _measured(self, batch: Batch) -> _Iteration | None:
        """The batch's last iteration, from its proposal to its last row's selection (its encoder
        calls and other cohorts' calls left out), for ``gate``; returned.

        It counts as drafted if any row drafted, or if it is the plain step right after a
        drafted one: a one-token call just after a block as wide as a draft costs 1.2-1.9x one
        after another one-token call (reference model, CPU, 1 to 32 rows, bound in place:
        benchmarks/call_after_block.py), a cost of having drafted that a run of plain steps
        does not pay."""
        done = self._iterations.get(id(batch))
        if done is not None and done.ended is not None and self.gate is not None:
            self.gate.observe(done.rows, done.drafted or done.after_drafted, done.ended - done.started, done.tokens)
        return done

    def observe(self, row: Row, drafted: int, accepted: int, appended: int) -> None:
        state: _Drafting = row.state
        if self._resting:
            state.drafter.skipped()
            return
        current = self._current
        if current is not None:
            current.tokens += appended
            current.ended = time.perf_counter()
            if current.gated:  # neither source drafted: the row's rest counts the plain step
                state.drafter.skipped()
                return
        if state.repeats.observe(drafted, accepted):
            return
        if drafted:
            state.drafter.observe(drafted, accepted)
        else:
            state.drafter.skipped()


@dataclass
class _Iteration:
    """One of a batch's iterations, as far as measured: when its proposal began, its rows,
    whether the gate made it a plain step, whether any row drafted, the tokens its rows
    appended, and when its last row's selection ended."""

    started: float
    rows: int
    after_drafted: bool = False  # the batch's iteration before it drafted
    gated: bool = False
    drafted: bool = False
    tokens: int = 0
    ended: float | None = None


class HypothesisDrafterDraft(HypothesisDraft):
    """GAD's draft source for beam search: each row's hypothesis (its tokens so far, the decoder
    start included) gets the drafter's draft after it, one drafter call for the batch's rows,
    as many tokens as the batch's draft length (:class:`HypothesisDraft`: the sizing, rests and
    gate every beam draft source shares).

    The drafter reads each row's own prefix, so the N rows of a group get N drafts, each after
    its own hypothesis: a step replays while every hypothesis it selects continues one of them.
    Where the batch takes a plain beam step there is no drafter call. The drafter call's cost,
    measured as GAD's is (``costs``: :meth:`CallCost.observe_drafter`, in one-token iterations),
    weighs against drafting at all; with a caller's options (no ``costs``) it is not counted,
    so the same options draft the same blocks whatever the timings."""

    def __init__(self, drafter: Drafter, pad_id: int, options: BlockOptions, prior: AcceptancePrior | None = None,
                 costs: CallCost | None = None, gate: DraftGate | None = None) -> None:
        """``options.max_block``: at most the drafter's k (a draft longer than it drafts k)."""
        super().__init__(options, prior, costs, gate)
        self.drafter = drafter
        self.pad_id = pad_id
        self.memory = drafter.memory  # the batch keeps it per row (Batch): once per source, for its N rows

    def _fixed_cost(self, rows: int) -> float:
        return 0.0 if self.costs is None else self.costs.drafter_cost(rows)

    def _drafts(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int], size: int) -> list[np.ndarray]:
        size = min(size, self.drafter.k)
        drafting = [slot for slot, room in enumerate(rooms) if room > 0]
        drafts = [NO_DRAFT] * len(rows)
        if not drafting:
            return drafts
        drafted, elapsed = call_drafter(self.drafter, batch, rows, drafting, self.pad_id)
        self.seconds += elapsed
        if self.costs is not None:
            self.costs.observe_drafter(elapsed, len(rows))
        for place, slot in enumerate(drafting):
            drafts[slot] = drafted[place, : min(size, rooms[slot])]
        return drafts

