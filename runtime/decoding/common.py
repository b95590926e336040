"""What every decoding loop shares: stopping rules and the per-row record of a decode."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    done: bool = False

    @property
    def generated(self) -> int:
        return len(self.tokens) - 1

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
