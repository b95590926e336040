"""What every decoding loop shares: stopping rules and the per-row record of a decode."""

from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np


@dataclass(frozen=True)
class DecodeLimits:
    """When a row stops, with transformers' greedy semantics.

    ``start_ids`` is the decoder prefix (the start token, and the forced BOS where the
    checkpoint forces one). ``max_new_tokens`` counts every token after the decoder start
    token, the forced BOS and the EOS included, like ``generate(max_new_tokens=...)``. When
    ``forced_eos_id`` is set, the token that reaches the limit is replaced by it, as
    transformers' ForcedEOSTokenLogitsProcessor does.
    """

    start_ids: tuple[int, ...]
    eos_id: int
    max_new_tokens: int
    forced_eos_id: int | None = None


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


GREEDY = Verification()
