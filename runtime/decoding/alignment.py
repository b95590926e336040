"""Where an output has got to in its source: the alignment IAD drafts from and GAD's drafter reads.

In editing tasks (grammar correction, post-editing) the output is the source with a few edits,
so each output token has a source position it copies or replaces. IAD drafts the source tokens
after that position (:func:`align`); a drafter trained with source positions
(``DrafterConfig.positions == "source"``) reads its output tokens at those positions
(:func:`source_shift`), so that an edit that changes the length (two source tokens become one)
does not leave every later draft one token off.

numpy only: the runtime uses it, and so does drafter training, which must compute exactly the
positions the runtime will feed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SENTINEL = -1  # stands for the decoder start token and the position before the source


def align(output: np.ndarray, source: np.ndarray, expected: int | None = None) -> int | None:
    """Index in ``source`` aligned with the end of ``output``, by a unique suffix match.

    Both arrays start with the sentinel. Returns i such that ``output[-q-1:] ==
    source[i-q:i+1]`` for the shortest q that makes i unique (Algorithm 1's rule).

    Where the paper would fall back to greedy steps, ``expected`` (the source position the
    previous draft had reached) breaks the tie: among the positions that matched the longest
    suffix the nearest to it wins, and if the last token occurs nowhere in the source (a
    replaced word) the output is taken to have replaced ``source[expected]``. The choice of
    draft only changes speed, never the output, so this heuristic is safe.
    """
    candidates = np.flatnonzero(source == output[-1])
    if len(candidates) == 0:
        return expected if expected is not None and expected < len(source) - 1 else None
    back = 1
    while len(candidates) > 1 and back < len(output):
        longer = candidates[candidates >= back]
        longer = longer[source[longer - back] == output[-1 - back]]
        if len(longer) == 0:
            break
        candidates = longer
        back += 1
    if len(candidates) == 1:
        return int(candidates[0])
    if expected is None:
        return None
    return int(candidates[np.argmin(np.abs(candidates - expected))])


def source_shift(prefix: Sequence[int], source: Sequence[int] | np.ndarray, lookback: int) -> int:
    """How many positions the output has drifted from its source: j - t for the last token
    ``prefix[t]`` (among the last ``lookback``) that occurs in ``source``, where j is the
    position :func:`align` gives it, both counted from the decoder start / the sentinel.

    ``prefix``: the decoder input so far, decoder start first (position 0). With no edit, or
    edits that keep the length, the shift is 0: ``prefix[t]`` stands where ``source[t - 1]``
    stood. A token that occurs nowhere in the source (a replacing word) is skipped, so the
    shift is that of the last token that does; with none in the last ``lookback``, 0 (an
    unrelated output, such as a translation, keeps its own positions). Ties go to the
    position nearest the unshifted one.
    """
    if len(prefix) < 2 or len(source) == 0:
        return 0
    # plain Python over the few tokens looked at: numpy's per-call overhead (isin, asarray of the
    # whole prefix) was most of this function's cost, paid on every drafter call
    in_source = set(source.tolist() if isinstance(source, np.ndarray) else source)
    first = max(1, len(prefix) - lookback)
    t = next((t for t in range(len(prefix) - 1, first - 1, -1) if prefix[t] in in_source), None)
    if t is None:
        return 0
    output = np.array([SENTINEL, *prefix[1 : t + 1]], dtype=np.int64)
    j = align(output, np.concatenate([[SENTINEL], np.asarray(source, dtype=np.int64)]), expected=t)
    return 0 if j is None else int(j) - t


def source_position_offsets(offsets: Sequence[int], prefixes: Sequence[Sequence[int]],
                            sources: Sequence[Sequence[int] | np.ndarray], window: int) -> np.ndarray:
    """The ``position_offset`` of a drafter that reads source positions, given the output
    positions' ``offsets`` (each row's first read token's output position): each shifted by
    :func:`source_shift` over the tokens the drafter reads (the last ``window``; 0: all), and
    never below 0. Drafter training and the runtime both call this, so they agree exactly."""
    shifted = [offset + source_shift(prefix, source, window or len(prefix))
               for offset, prefix, source in zip(offsets, prefixes, sources)]
    return np.maximum(np.asarray(shifted, dtype=np.int64), 0)


# How long a match of the output's tail with an earlier stretch of the output itself must be before
# what followed that stretch becomes the draft (:func:`repeated_tail`). Measured by drafting that
# way after every prefix of the reference model's greedy outputs of the UA-GEC test split
# (benchmarks/results/repeat-drafts-cpu/): on its 27 outputs of over 128 tokens, which repeat
# themselves, a match of 4 or more is found at a third of the positions and 7.65 of 20 drafts are
# accepted there on average; on the other outputs it is found at 0.4% of the positions (4.43
# accepted). A match of 2 or 3 is found often in ordinary text, where what follows differs as
# often as not.
MIN_REPEAT = 4
MAX_REPEAT_MATCH = 32  # the search stops there: a longer match changes nothing about the draft


def repeated_tail(tokens: Sequence[int] | np.ndarray, min_match: int = MIN_REPEAT) -> tuple[int, np.ndarray | None]:
    """Whether the output is repeating itself, and what it would repeat next.

    Returns ``(length, cycle)``: ``length``, the longest match (up to :data:`MAX_REPEAT_MATCH`)
    of the tail of ``tokens`` with an earlier stretch of ``tokens`` (the stretches may
    overlap); ``cycle``, the tokens after the latest such stretch up to the end, or None when
    the match is shorter than ``min_match`` (a Generator's ``Tuning.min_repeat``).
    Repeated (``np.resize(cycle, k)``), the cycle is the k tokens that continue the repetition:
    a model stuck in a loop (``для для для``, a clause over and over) emits exactly that. A
    draft from it changes speed only, never the output.
    """
    ids = np.asarray(tokens, dtype=np.int64)
    n = len(ids)
    if n < 2:
        return 0, None
    ends = np.flatnonzero(ids[: n - 1] == ids[n - 1])  # where an earlier stretch could end
    if len(ends) == 0:
        return 0, None
    length = 1
    while length < MAX_REPEAT_MATCH:
        longer = ends[ends >= length]
        longer = longer[ids[longer - length] == ids[n - 1 - length]]
        if len(longer) == 0:
            break
        ends, length = longer, length + 1
    if length < min_match:
        return length, None
    return length, ids[int(ends[-1]) + 1 :]
