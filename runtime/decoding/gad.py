"""Generalized Aggressive Decoding (GAD, and GAD++ with relaxed verification).

Each iteration the drafter proposes k tokens after the output so far, in one
non-autoregressive pass; the verifier scores them in one pass; the leading drafts that pass
:class:`Verification` are kept, plus the verifier's own top token at the first one that does
not (so every iteration yields at least one token). With ``beta = 1`` that is exactly greedy
decoding (section 3.2 of "Lossless Acceleration for Seq2seq Generation with Aggressive
Decoding"; SpecDec's Spec-Verification for ``beta > 1``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ..session import Session
from .loop import Row
from .verifier import Batch


class Drafter:
    """drafter.onnx: k tokens after each row's output so far, in one non-autoregressive pass."""

    def __init__(self, session: Session, k: int, mask_id: int) -> None:
        self.session = session
        self.k = k
        self.mask_id = mask_id

    def draft(self, prefixes: Sequence[list[int]], hidden: np.ndarray, mask: np.ndarray, pad_id: int) -> np.ndarray:
        """[rows, k] drafts after each prefix (the output, decoder start included)."""
        width = max(len(p) for p in prefixes) + self.k
        ids = np.full((len(prefixes), width), pad_id, dtype=np.int64)
        attention = np.zeros((len(prefixes), width), dtype=np.int64)
        for row, prefix in enumerate(prefixes):
            ids[row, : len(prefix)] = prefix
            ids[row, len(prefix) : len(prefix) + self.k] = self.mask_id
            attention[row, : len(prefix) + self.k] = 1
        out = self.session.run({
            "input_ids": ids,
            "attention_mask": attention,
            "slot_start": np.array([len(p) for p in prefixes], dtype=np.int64),
            "encoder_hidden_states": hidden,
            "encoder_attention_mask": mask,
        })
        return out["draft_ids"]


class DrafterDraft:
    """GAD's draft source: one drafter call for the whole batch, up to ``k`` tokens a row."""

    def __init__(self, drafter: Drafter, pad_id: int, k: int | None = None) -> None:
        self.drafter = drafter
        self.pad_id = pad_id
        self.k = drafter.k if k is None else min(k, drafter.k)
        self.seconds = 0.0

    def start(self, row: Row) -> None:
        pass

    def propose(self, batch: Batch, rows: Sequence[Row], rooms: Sequence[int]) -> list[np.ndarray]:
        empty = np.zeros(0, dtype=np.int64)
        if not any(rooms):
            return [empty] * len(rows)
        started = time.perf_counter()
        drafted = self.drafter.draft([row.trace.tokens for row in rows], batch.buffers.hidden(),
                                     batch.buffers.source_mask(), self.pad_id)
        self.seconds += time.perf_counter() - started
        return [drafted[slot, : min(self.k, room)] for slot, room in enumerate(rooms)]

    def observe(self, row: Row, drafted: int, accepted: int, appended: int) -> None:
        pass
