"""One batched draft-then-verify loop for every mode; the draft source is a strategy.

Each iteration, every row of the batch proposes a draft of its own length (greedy: none;
IAD: the next tokens of its source; GAD: the drafter's guess), the verifier scores each row's
block (the output tokens its cache lacks, then its draft; blocks are right-padded to one
width) in one call, and each row keeps the leading drafts that pass :class:`Verification`
plus the verifier's own token after them. With ``beta = 1`` every kept token is the
verifier's argmax after the row's true prefix: the row's greedy output, whatever the other
rows, the draft or its length.

Rows leave and join (continuous batching): a finished row frees its slot at once (the last
row moves into it, so the verifier always runs on exactly the live rows; with static shapes,
verifier.StaticBatch, only its index moves and its slot becomes a padding row) and queued sources
take free slots, including sources that arrive while the batch runs (:class:`Arrivals`).
Sources are taken shortest first, so that rows of a batch have similar lengths; results are
yielded as rows finish, with the caller's index. Where sources come in arrival order (a
server), rows can also be split by source length into cohorts, each with a batch of its own,
that take turns (``decode``'s ``classes``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from .arrivals import Arrivals, Work
from .beam import BeamGroup, BeamRules, Hypothesis
from .common import DecodeLimits, RowTrace, Verification
from .marian_beam import MarianBeamGroup
from .verifier import Batch, Verifier

# A row's empty draft, shared: drafts are only read (concatenated after the row's tokens)
NO_DRAFT = np.zeros(0, dtype=np.int64)
NO_DRAFT.flags.writeable = False

WIDTH_QUANTILE = 0.5
COSTS = ("encoder", "verifier", "drafter", "total")  # what a row's ``seconds`` splits its time into
# a beam request's state, by whose rules it searches (BeamRules.family; the manifest's beam_rules)
BEAM_GROUPS: dict[str, type[BeamGroup] | type[MarianBeamGroup]] = {"transformers": BeamGroup,
                                                                  "marian": MarianBeamGroup}


@dataclass
class Row:
    """A text being decoded: its source, its output so far, its draft source's state, its costs."""

    index: int  # position in the caller's list
    source: list[int]
    trace: RowTrace
    limits: DecodeLimits
    state: Any = None  # the draft source's per-row state
    # a beam request's rows share its group; ``beam``: the hypothesis this row holds (its rank)
    group: BeamGroup | MarianBeamGroup | None = None
    beam: int = 0
    # this row's share of each cost: a call's time is split evenly among the rows it served
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COSTS, 0.0))
    # its cohort's per-row shares (Cohort.shares) when it joined: the calls' shares it got since
    # are the difference, added to ``seconds`` when it leaves (:func:`_settle`)
    joined: dict[str, float] = field(default_factory=dict)


class DraftSource(Protocol):
    """Where drafts come from."""

    # What the batch keeps of each row's encoder output for the draft source, computed once when
    # the row is encoded: (hidden [m, S, d], mask [m, S]) -> [m, S, d]. None: it reads none.
    memory: Callable[[np.ndarray, np.ndarray], np.ndarray] | None

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
    memory = None

    def start(self, row: Row) -> None:
        pass

    def propose(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int]) -> list[np.ndarray]:
        return [NO_DRAFT] * len(rows)

    def observe(self, row: Row, drafted: int, accepted: int, appended: int) -> None:
        pass


@dataclass(frozen=True)
class Finished:
    index: int
    trace: RowTrace
    seconds: dict[str, float]
    # beam search: the finished hypotheses returned, best first (``trace.tokens`` is the first)
    hypotheses: tuple[Hypothesis, ...] = ()


@dataclass
class Cohort:
    """The rows of one length class and the batch (buffers, binding) whose calls they share."""

    batch: Batch
    rows: list[Row] = field(default_factory=list)  # rows[slot]
    seconds: float = 0.0  # time its calls took, since it last had no row, on the loop's clock
    # each call's cost divided by its rows, summed over the cohort's calls: a row's share of the
    # calls it was in is the growth of these while it was here (one sum a call, not one a row)
    shares: dict[str, float] = field(default_factory=lambda: {"verifier": 0.0, "drafter": 0.0, "total": 0.0})


def length_class(length: int, bounds: Sequence[int]) -> int:
    """Which class a source of ``length`` tokens belongs to: the number of bounds below it."""
    return bisect.bisect_left(bounds, length)


def next_cohort(cohorts: Sequence[Cohort]) -> Cohort:
    """The cohort with rows whose calls have taken the least time: classes get fair shares of
    time, not of calls (fair queuing), so a class of a few long rows, whose calls are cheap,
    gets more of them than the crowded class of short rows, and a long text is not held back
    a turn of every other class per token."""
    return min((cohort for cohort in cohorts if cohort.rows), key=lambda cohort: cohort.seconds)


def decode(verifier: Verifier, work: Arrivals, limits: DecodeLimits, drafts: DraftSource,
           verification: Verification, slots: int, pad_id: int, bound: bool,
           linger: float = 0.0, classes: Sequence[int] = (), width_quantile: float = WIDTH_QUANTILE,
           beams: BeamRules | None = None, static_width: int | None = None) -> Iterator[Finished]:
    """Decode the sources of ``work`` as they arrive, at most ``slots`` rows at once; yields
    rows as they finish, and returns once ``work`` is closed and done. A row's own limits
    (``Work.limits``) replace ``limits``, each capped by its own source's length where the
    limits say so (``DecodeLimits.for_source``); a cancelled row is dropped without a result.
    ``linger``: when no row is decoding, seconds to wait for more sources after the first.

    ``classes``: source lengths (ascending) that split the rows into cohorts by length, each
    with a batch of its own; one cohort takes each verifier call (:func:`next_cohort`). A call
    attends over its longest row's cache and source for every row, so a long text among short
    ones multiplies their cost. An offline run avoids that by sorting its texts; a server gets
    them in arrival order. Empty: one batch.

    ``beams``: beam search; each source takes ``num_beams`` rows (``slots`` counts rows), which
    join together and leave together (:class:`BeamGroup`). None: each source is one row.

    ``static_width``: every batch's calls at one shape (:class:`~.verifier.StaticBatch`)."""
    per_source = 1 if beams is None else beams.num_beams
    if per_source > slots:
        raise ValueError(f"{per_source} beams do not fit in {slots} rows")
    arrived = work.take(slots // per_source, wait=True, linger=linger)
    if not arrived:
        return
    # a closed queue's size is known: no more buffer rows than it can ever fill
    size = min(slots, (len(arrived) + len(work)) * per_source) if work.closed else slots
    cohorts: dict[int, Cohort] = {}
    try:
        yield from _cohorts(verifier, work, limits, drafts, verification, slots, pad_id, bound, linger, classes,
                            width_quantile, beams, static_width, per_source, arrived, size, cohorts)
    finally:  # however the decode ends: a pooled batch gives its buffers back (fixed_calls.py)
        for cohort in cohorts.values():
            cohort.batch.close()


def _finished_at_admission(work: Work, limits: DecodeLimits, beams: BeamRules | None) -> Finished | None:
    """transformers' answer for a source whose decoder prefix already fills its
    ``max_new_tokens`` (a forced BOS, and one new token); None for any other source.

    transformers forces that token with a logits processor at the first step; here it is the
    prefix rows start from, so a row cannot give fewer tokens than the prefix. The forced tokens
    are played as steps whose only finite candidate (log-prob 0) is that token, through the
    same rules as decoded ones: a forced EOS takes the last one's place (``RowTrace.extend``),
    and a beam group scores its hypotheses as transformers' search does (the first at 0, the
    others from their -1e9 start)."""
    row_limits = (work.limits or limits).for_source(len(work.source))
    start = row_limits.start_ids
    if len(start) - 1 < row_limits.max_new_tokens:
        return None
    forced = replace(row_limits, start_ids=start[:1])
    seconds = dict.fromkeys(COSTS, 0.0)
    rules = _row_rules(work, beams)
    if rules is None:
        trace = RowTrace(tokens=list(forced.start_ids))
        trace.extend(list(start[1:]), forced)
        return Finished(work.index, trace, seconds)
    group = BEAM_GROUPS[rules.family](rules, forced)
    n = rules.num_beams
    for token in start[1:]:
        if group.done:
            break
        group.step(np.zeros((n, 1), dtype=np.float32), np.full((n, 1), token, dtype=np.int64))
    return _group_finished(work.index, group, seconds)


def _row_rules(work: Work, beams: BeamRules | None) -> BeamRules | None:
    """The beam rules ``work``'s hypotheses are scored by: its own, or the loop's ``beams``
    (None: one row a source, greedy). Its own may change the scoring only: the loop's batch
    holds ``num_beams`` rows a source, and a source's beams in a loop without would be ignored."""
    if work.beams is None:
        return beams
    if beams is None or (work.beams.num_beams, work.beams.family) != (beams.num_beams, beams.family):
        loop = "a loop without beams" if beams is None else f"a loop of {beams.num_beams} ({beams.family} rules)"
        raise ValueError(f"source {work.index} asks for {work.beams.num_beams} beams ({work.beams.family} rules) "
                         f"in {loop}")
    return work.beams


def _cohorts(verifier: Verifier, work: Arrivals, limits: DecodeLimits, drafts: DraftSource,
             verification: Verification, slots: int, pad_id: int, bound: bool, linger: float,
             classes: Sequence[int], width_quantile: float, beams: BeamRules | None, static_width: int | None,
             per_source: int, arrived: list[Work], size: int, cohorts: dict[int, Cohort]) -> Iterator[Finished]:
    """:func:`decode`'s loop, over the batches it keeps in ``cohorts``."""
    clock = 0.0  # the seconds of the cohort that took the last call: where a cohort that was empty starts
    while True:
        live = sum(len(cohort.rows) for cohort in cohorts.values())
        free = (slots - live) // per_source  # sources that fit
        if not arrived and free and len(work) and (
                free >= max(1, slots // per_source // 4) or (work.closed and len(work) <= free)):
            # refill in groups: a quarter of the slots, or whatever is left
            arrived = work.take(free, wait=False)
        if not live and not arrived:
            if work.finished:
                return
            arrived = work.take(slots // per_source, wait=True, linger=linger)
            continue
        if arrived:
            joining: dict[int, list[Work]] = {}
            for item in arrived:
                done = _finished_at_admission(item, limits, beams)
                if done is not None:  # no slot, no encoding: its answer needs no verifier call
                    work.forget(item.index)
                    yield done
                    continue
                joining.setdefault(length_class(len(item.source), classes), []).append(item)
            for klass, group in joining.items():
                cohort = cohorts.get(klass)
                if cohort is None:  # its buffers are made on first use and kept
                    # beam search sums log-probs: the top-K graph; the others may read only the best id
                    top_k = verification.reads_log_probs or beams is not None
                    cohort = cohorts[klass] = Cohort(verifier.batch(size, bound, drafts.memory, top_k=top_k,
                                                                    static_width=static_width))
                if not cohort.rows:  # no credit and no debt from before it was empty
                    cohort.seconds = clock
                _admit(cohort.batch, group, cohort.rows, cohort.shares, limits, drafts, pad_id, beams)
            arrived = []
            if not joining:  # every source that arrived was answered at admission
                continue
        cohort = next_cohort(list(cohorts.values()))
        clock = cohort.seconds
        yield from _step(cohort, work, drafts, verification, pad_id, width_quantile)
        if work.abandoned:
            return


def _step(cohort: Cohort, work: Arrivals, drafts: DraftSource, verification: Verification,
          pad_id: int, width_quantile: float) -> Iterator[Finished]:
    """One draft-then-verify call for the rows of ``cohort``; yields those that finish."""
    batch, rows = cohort.batch, cohort.rows
    started = time.perf_counter()
    verifier_before, drafter_before = batch.verifier_seconds, drafts.seconds
    lengths = batch.lengths[: len(rows)].tolist()
    pendings = [row.trace.tokens[lengths[slot]:] for slot, row in enumerate(rows)]
    # a row's block is its pending tokens plus its draft; every padded block must fit the cache
    limit = batch.block_limit()
    rooms = [max(0, min(row.trace.draft_room(row.limits), limit - len(pend))) for row, pend in zip(rows, pendings)]
    proposed = drafts.propose(batch, rows, rooms)
    widths = [len(pend) + len(draft) for pend, draft in zip(pendings, proposed)]
    if len(rows) > 1 and width_quantile < 1.0 and max(widths) > min(widths):  # equal widths: nothing to cut
        # Blocks are padded to the widest: one row's long draft would make every row pay for
        # it. The width is capped at a quantile of the rows' wishes; longer drafts are cut
        # (a shorter draft changes speed, never the output).
        cap = max(2, int(_quantile(widths, width_quantile)))
        proposed = [draft[: max(0, cap - len(pend))] for pend, draft in zip(pendings, proposed)]
        widths = [min(w, max(cap, len(pend))) for w, pend in zip(widths, pendings)]
    width = max(widths)
    tokens = batch.block(width, pad_id)
    if width == 1:  # one pending token a row, no drafts (greedy, plain beam): one write
        tokens[:, 0] = [pend[0] for pend in pendings]
    else:
        for slot, (pend, draft) in enumerate(zip(pendings, proposed)):
            tokens[slot, : len(pend)] = pend
            tokens[slot, len(pend) : len(pend) + len(draft)] = draft
    # the argmax graph computes each row's block alone, not the padding after it (decision 050)
    top_logprobs, top_ids = batch.verify(tokens, widths)

    kept = [0] * len(rows)
    groups: dict[int, list[int]] = {}  # a beam group's slots, by the group's id
    # where only each position's best id counts (beta = 1), every row's are read as one list:
    # a row then costs Python list work, not several numpy calls of ~1 us each (at batch 32
    # those were a tenth of the loop's host time)
    best = None if verification.reads_log_probs else top_ids[:, :, 0].tolist()
    for slot, (row, pend, draft) in enumerate(zip(rows, pendings, proposed)):
        if row.group is not None:  # its cache length is set by its group's selection
            groups.setdefault(id(row.group), []).append(slot)
            continue
        if best is not None:
            kept[slot] = _verify_row_best(row, pend, draft, best[slot], verification, drafts, len(rows))
        else:
            kept[slot] = _verify_row(row, pend, draft, top_ids[slot], top_logprobs[slot], verification, drafts,
                                     len(rows))
    batch.keep(np.array(kept, dtype=np.int64))
    for slots in groups.values():
        _select_beams(batch, rows, slots, pendings, proposed, top_ids, top_logprobs, drafts)

    elapsed = time.perf_counter() - started
    cohort.seconds += elapsed
    shares = cohort.shares
    shares["verifier"] += (batch.verifier_seconds - verifier_before) / len(rows)
    shares["drafter"] += (drafts.seconds - drafter_before) / len(rows)
    shares["total"] += elapsed / len(rows)
    if work.abandoned:
        return
    cancelled = work.cancelled()
    before = len(rows)
    finished: dict[int, Finished] = {}  # by the caller's index: a beam group's rows leave together
    for row in reversed(rows):  # the order rows were always yielded in: from the last slot
        if row.index not in cancelled and row.index not in finished and _done(row):
            request = [other for other in rows if other.index == row.index]
            for other in request:
                _settle(other, shares)
            finished[row.index] = _finished(row, request)
    for slot in reversed(range(len(rows))):  # from the end: a moved row is never one still to check
        row = rows[slot]
        if row.index in cancelled or row.index in finished:
            work.forget(row.index)  # before the yield: a cancel from now on has nothing to drop
        else:
            continue
        if batch.remove(slot) is not None:
            rows[slot] = rows[-1]
        rows.pop()
    yield from finished.values()
    if len(rows) < before:
        batch.shrink()


def _quantile(values: list[int], q: float) -> float:
    """``np.quantile(values, q)`` (its default, linear interpolation) for a short list, in
    Python: numpy's costs about 100 us a call, a tenth of a small model's verifier call."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _verify_row(row: Row, pend: list[int], draft: np.ndarray, top_ids: np.ndarray, top_logprobs: np.ndarray,
                verification: Verification, drafts: DraftSource, batch_rows: int) -> int:
    """An independent row's selection: keep its draft's verified prefix and the verifier's own
    token after it. Returns the block positions the row keeps in its cache."""
    first = len(pend) - 1  # the position scoring draft[0]: after the last pending token
    end = first + len(draft) + 1
    accepted = verification.accepted(draft, top_ids[first:end], top_logprobs[first:end])
    tokens = [*draft[:accepted].tolist(), int(top_ids[first + accepted, 0])]
    return _take(row, pend, tokens, len(draft), accepted, drafts, batch_rows)


def _verify_row_best(row: Row, pend: list[int], draft: np.ndarray, best: list[int], verification: Verification,
                     drafts: DraftSource, batch_rows: int) -> int:
    """:func:`_verify_row` where only each position's best id counts (``best``: the row's, per
    block position, as a list); the same selection, token for token."""
    first = len(pend) - 1
    if not len(draft):  # greedy, or a row without a draft this call: the verifier's token alone
        return _take(row, pend, [best[first]], 0, 0, drafts, batch_rows)
    proposal = draft.tolist()
    accepted = verification.accepted_best(proposal, best[first : first + len(proposal)])
    return _take(row, pend, [*proposal[:accepted], best[first + accepted]], len(draft), accepted, drafts, batch_rows)


def _take(row: Row, pend: list[int], tokens: list[int], drafted: int, accepted: int, drafts: DraftSource,
          batch_rows: int) -> int:
    """Append a row's selected ``tokens`` (its accepted draft, then the verifier's token) and
    record the call; returns the block positions the row keeps in its cache."""
    appended = row.trace.extend(tokens, row.limits)
    row.trace.drafted.append(drafted)
    row.trace.accepted.append(appended)
    row.trace.rows.append(batch_rows)
    drafts.observe(row, drafted, accepted, appended)
    return len(pend) + accepted


def _select_beams(batch: Batch, rows: list[Row], slots: list[int], pendings: list[list[int]],
                  drafts: list[np.ndarray], top_ids: np.ndarray, top_logprobs: np.ndarray,
                  source: DraftSource) -> None:
    """A beam group's selection after a verifier call: beam steps replayed over the block's
    scores, then each row takes one of the resulting hypotheses.

    Each row's block was its pending tokens and a draft (none in plain beam search). A
    hypothesis lies on its row's drafted path after t steps when its last t tokens are the
    draft's first t: the block then holds its next scores, at the position after them. Steps
    are replayed (:meth:`BeamGroup.step`, with exactly the candidates a plain step would have)
    while every hypothesis a step selects lies on a drafted path; the first step that selects
    one off every path is still exact (its own candidates were in the block) and ends the call.

    A hypothesis stays in its parent's row where it can; the others' rows get their parent
    row's cache by a row copy (only the rows that change). A row keeps its cache up to its
    hypothesis's last token but one; that token is pending for the next call.

    ``source`` hears once per group what became of its drafts: the longest, and the steps
    replayed past the first (each stood on one more draft position)."""
    group = rows[slots[0]].group
    assert group is not None and group.trace is not None
    ranked = sorted(slots, key=lambda slot: rows[slot].beam)  # the group's rows in hypothesis order
    base = batch.lengths[ranked].tolist()  # cached positions before this call
    firsts = [len(pendings[slot]) - 1 for slot in ranked]  # each row's position after its pending tokens
    # where each running hypothesis is: (its row's rank, steps along that row's draft)
    where = [(rank, 0) for rank in range(len(ranked))]
    steps = 0
    while True:
        # one fancy index for the N hypotheses' candidates (np.stack of N slices costs more)
        at_slots = [ranked[r] for r, _ in where]
        at_positions = [firsts[r] + t for r, t in where]
        selected = group.step(top_logprobs[at_slots, at_positions], top_ids[at_slots, at_positions])
        steps += 1
        if group.done:
            break
        after = []
        for choice in selected:
            r, t = where[choice.parent]
            draft = drafts[ranked[r]]
            after.append((r, t, t < len(draft) and choice.token == int(draft[t])))
        if not all(on_path for _, _, on_path in after):
            break
        where = [(r, t + 1) for r, t, _ in after]
    draft_tokens = sum(len(drafts[slot]) for slot in ranked)
    source.observe(rows[ranked[0]], max(len(drafts[slot]) for slot in ranked), steps - 1, steps)
    group.trace.drafted.append(draft_tokens)
    group.trace.accepted.append(steps)
    group.trace.rows.append(len(rows))
    if group.done:
        return
    # each new hypothesis: the row whose cache it continues and how much of that cache is its own
    claimed: dict[int, int] = {}  # slot -> the rank of the hypothesis it now holds
    homeless: list[int] = []
    for rank, (r, _, _) in enumerate(after):
        if ranked[r] in claimed:
            homeless.append(rank)
        else:
            claimed[ranked[r]] = rank
    free = [slot for slot in ranked if slot not in claimed]
    sources, targets = [], []
    for rank, slot in zip(homeless, free):
        sources.append(ranked[after[rank][0]])
        targets.append(slot)
        claimed[slot] = rank
    if targets:
        batch.copy_rows(sources, targets)
    for slot, rank in claimed.items():
        r, t, _ = after[rank]
        batch.lengths[slot] = base[r] + firsts[r] + 1 + t
        rows[slot].beam = rank
        rows[slot].trace.tokens = group.running[rank]  # shared, not copied: BeamGroup.step makes new lists


def _settle(row: Row, shares: dict[str, float]) -> None:
    """Add to ``row.seconds`` its share of the calls since it joined (``shares``: its cohort's)."""
    for name, value in shares.items():
        row.seconds[name] += value - row.joined[name]


def _done(row: Row) -> bool:
    return row.trace.done if row.group is None else row.group.done


def _finished(row: Row, rows: list[Row]) -> Finished:
    """The result of the request ``row`` decodes (``rows``: all of its rows: a beam group's N)."""
    if row.group is None:
        return Finished(row.index, row.trace, row.seconds)
    seconds = {name: sum(other.seconds[name] for other in rows) for name in row.seconds}
    return _group_finished(row.index, row.group, seconds)


def _group_finished(index: int, group: BeamGroup | MarianBeamGroup, seconds: dict[str, float]) -> Finished:
    """A done beam group's result: its returned hypotheses, the best one as its trace's tokens."""
    assert group.trace is not None
    hypotheses = tuple(group.results())
    group.trace.tokens = list(hypotheses[0].tokens)
    group.trace.done = True
    return Finished(index, group.trace, seconds, hypotheses)


def _admit(batch: Batch, arrived: list[Work], rows: list[Row], shares: dict[str, float], limits: DecodeLimits,
           drafts: DraftSource, pad_id: int, beams: BeamRules | None = None) -> None:
    """Encode the arrived sources and give each a free slot (shortest first: the encoder calls
    group similar lengths); with ``beams``, ``num_beams`` slots, its encoding replicated."""
    arrived = sorted(arrived, key=lambda work: len(work.source))
    copies = 1 if beams is None else beams.num_beams
    before = batch.encoder_seconds
    started = time.perf_counter()
    batch.admit([work.source for work in arrived], pad_id, copies)
    share = (batch.encoder_seconds - before) / len(arrived) / copies
    wall = (time.perf_counter() - started) / len(arrived) / copies
    for work in arrived:
        # a per-source cap (Marian's max-length-factor) is set here, from the row's own source
        row_limits = (work.limits or limits).for_source(len(work.source))
        rules = _row_rules(work, beams)
        group = None if rules is None else BEAM_GROUPS[rules.family](rules, row_limits)
        for beam in range(copies):
            row = Row(index=work.index, source=work.source, trace=RowTrace(tokens=list(row_limits.start_ids)),
                      limits=row_limits, group=group, beam=beam)
            row.seconds["encoder"] += share
            row.seconds["total"] += wall
            row.joined = dict(shares)
            drafts.start(row)
            rows.append(row)
