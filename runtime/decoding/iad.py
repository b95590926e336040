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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .alignment import MAX_REPEAT_MATCH, SENTINEL as _SENTINEL, align
from .hypothesis_drafts import FIRST_REST, HypothesisDraft  # noqa: F401 (FIRST_REST: where IAD's beam rests are read)
from .sizing import AcceptancePrior, BlockOptions, BlockSizer, CallCost
from .loop import NO_DRAFT, Row
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


class HypothesisSourceDraft(HypothesisDraft):
    """IAD's draft source for beam search: each row's hypothesis, aligned afresh with its source
    at every call, drafts the source tokens after the aligned position, as many as the batch's
    draft length (:class:`HypothesisDraft`: the sizing, rests and gate every beam draft
    source shares).

    A beam row's hypothesis changes from call to call (a step may give the row another
    hypothesis), so no per-row alignment carries over. A row whose hypothesis has left its
    source (no alignment) drafts nothing. Where the batch takes a plain beam step, nothing is
    aligned: a plain iteration's work."""

    def _start(self, row: Row) -> None:
        row.state = np.concatenate([[_SENTINEL], np.asarray(row.source, dtype=np.int64)])

    def _drafts(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int], size: int) -> list[np.ndarray]:
        drafts = []
        for row, room in zip(rows, rooms):
            k = min(size, room)
            source: np.ndarray = row.state
            output = np.asarray([_SENTINEL, *row.trace.tokens[1:]], dtype=np.int64)
            at = None if k == 0 else align(output, source)
            k = 0 if at is None else min(len(source) - at - 1, k)
            drafts.append(source[at + 1 : at + 1 + k] if k > 0 else NO_DRAFT)  # type: ignore[operator]
        return drafts

