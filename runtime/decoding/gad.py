"""Generalized Aggressive Decoding (GAD, and GAD++ with relaxed verification).

Each iteration the drafter proposes k tokens after the output so far, in one
non-autoregressive pass; the verifier scores them in one pass; the leading drafts that pass
:class:`Verification` are kept, plus the verifier's own top token at the first one that does
not (so every iteration yields at least one token). With ``beta = 1`` that is exactly greedy
decoding (section 3.2 of "Lossless Acceleration for Seq2seq Generation with Aggressive
Decoding"; SpecDec's Spec-Verification for ``beta > 1``).
"""

from __future__ import annotations

import numpy as np

from ..session import Session
from .common import DecodeLimits, RowTrace, Verification, verify_draft
from .verifier import DecodeState


class Drafter:
    """drafter.onnx over one request's encoder output (batch 1)."""

    def __init__(self, session: Session, k: int, mask_id: int) -> None:
        self.session = session
        self.k = k
        self.mask_id = mask_id

    def draft(self, state: DecodeState, tokens: list[int]) -> np.ndarray:
        """The k tokens the drafter expects after ``tokens`` (the output, decoder start included)."""
        ids = np.array([tokens + [self.mask_id] * self.k], dtype=np.int64)
        out = self.session.run({
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "slot_start": np.array([len(tokens)], dtype=np.int64),
            "encoder_hidden_states": state.encoder_hidden,
            "encoder_attention_mask": state.mask,
        })
        return out["draft_ids"][0]


def gad(state: DecodeState, drafter: Drafter, limits: DecodeLimits, verification: Verification,
        k: int | None = None) -> RowTrace:
    """Decode one row (``state`` of batch 1) with drafts from ``drafter``; ``k`` caps the draft."""
    trace = RowTrace(tokens=list(limits.start_ids))
    per_call = drafter.k if k is None else min(k, drafter.k)
    while not trace.done:
        size = min(per_call, trace.draft_room(limits))
        draft = drafter.draft(state, trace.tokens)[:size] if size > 0 else np.zeros(0, dtype=np.int64)
        verify_draft(state, trace, draft, verification, limits)
    return trace
