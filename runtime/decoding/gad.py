"""Generalized Aggressive Decoding (GAD, and GAD++ with relaxed verification).

Each iteration the drafter proposes k tokens after the output so far, in one
non-autoregressive pass; the verifier scores them in one pass; the leading drafts that pass
:class:`Verification` are kept, plus the verifier's own top token at the first one that does
not (so every iteration yields at least one token). With ``beta = 1`` that is exactly greedy
decoding (section 3.2 of "Lossless Acceleration for Seq2seq Generation with Aggressive
Decoding"; SpecDec's Spec-Verification for ``beta > 1``).

The drafter reads only the last ``window`` output tokens (at their absolute positions), so a
call costs the same at the end of a long output as at its start. How many of its k tokens a
row's verifier call checks is chosen per iteration from the row's acceptance history and the
measured cost of a drafter call (:class:`BlockSizer`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ..session import Session
from .loop import Row
from .sizing import BlockOptions, BlockSizer
from .verifier import Batch


class Drafter:
    """drafter.onnx: k tokens after each row's output so far, in one non-autoregressive pass."""

    def __init__(self, session: Session, k: int, mask_id: int, window: int = 0) -> None:
        self.session = session
        self.k = k
        self.mask_id = mask_id
        self.window = window  # output tokens read before the slots; 0: all of them

    def draft(self, prefixes: Sequence[list[int]], hidden: np.ndarray, mask: np.ndarray, pad_id: int) -> np.ndarray:
        """[rows, k] drafts after each prefix (the output, decoder start included)."""
        seen = [prefix[-self.window:] if self.window else prefix for prefix in prefixes]
        width = max(len(p) for p in seen) + self.k
        ids = np.full((len(seen), width), pad_id, dtype=np.int64)
        attention = np.zeros((len(seen), width), dtype=np.int64)
        for row, prefix in enumerate(seen):
            ids[row, : len(prefix)] = prefix
            ids[row, len(prefix) : len(prefix) + self.k] = self.mask_id
            attention[row, : len(prefix) + self.k] = 1
        out = self.session.run({
            "input_ids": ids,
            "attention_mask": attention,
            "slot_start": np.array([len(p) for p in seen], dtype=np.int64),
            "position_offset": np.array([len(full) - len(p) for full, p in zip(prefixes, seen)], dtype=np.int64),
            "encoder_hidden_states": hidden,
            "encoder_attention_mask": mask,
        })
        return out["draft_ids"]


class DrafterDraft:
    """GAD's draft source: one drafter call for the whole batch, a draft length chosen per row."""

    reads_encoder_output = True

    def __init__(self, drafter: Drafter, pad_id: int, k: int | None = None, cost_ratio: float = 0.05,
                 adaptive: bool = True) -> None:
        self.drafter = drafter
        self.pad_id = pad_id
        self.k = drafter.k if k is None else min(k, drafter.k)
        self.options = BlockOptions(max_block=self.k, adaptive=adaptive, cost_ratio=cost_ratio)
        self.seconds = 0.0
        # running means of a drafter call and of a verifier call, for the sizers' cost model
        self._drafter_call = self._verifier_call = 0.0
        self._verifier_seen: float | None = None

    def start(self, row: Row) -> None:
        row.state = BlockSizer(self.options)

    def propose(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int]) -> list[np.ndarray]:
        empty = np.zeros(0, dtype=np.int64)
        if self._verifier_seen is not None:  # the verifier call since the last proposal
            self._verifier_call = _mean(self._verifier_call, batch.verifier_seconds - self._verifier_seen)
        self._verifier_seen = batch.verifier_seconds
        fixed = self._drafter_call / self._verifier_call if self._verifier_call > 0 else 0.0
        # rows whose drafts keep failing take plain greedy steps: a drafter call is not free
        sizes = [min(row.state.size(fixed, allow_none=True), room) for row, room in zip(rows, rooms)]
        drafting = [slot for slot, size in enumerate(sizes) if size > 0]
        if not drafting:
            return [empty] * len(rows)
        started = time.perf_counter()
        hidden, mask = batch.buffers.hidden(), batch.buffers.source_mask()
        if len(drafting) < len(rows):
            hidden, mask = hidden[drafting], mask[drafting]
        drafted = self.drafter.draft([rows[slot].trace.tokens for slot in drafting], hidden, mask, self.pad_id)
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        self._drafter_call = _mean(self._drafter_call, elapsed)
        drafts = [empty] * len(rows)
        for place, slot in enumerate(drafting):
            drafts[slot] = drafted[place, : sizes[slot]]
        return drafts

    def observe(self, row: Row, drafted: int, accepted: int, appended: int) -> None:
        if drafted:
            row.state.observe(drafted, accepted)
        else:
            row.state.skipped()


def _mean(mean: float, value: float, weight: float = 0.2) -> float:
    return value if mean == 0.0 else (1 - weight) * mean + weight * value
