"""Greedy decoding: one token per verifier call (T = 1). The reference IAD and GAD must equal."""

from __future__ import annotations

import numpy as np

from .common import DecodeLimits, RowTrace
from .verifier import DecodeState


def greedy(state: DecodeState, limits: DecodeLimits, pad_id: int) -> list[RowTrace]:
    """Decode every row of ``state`` greedily, as one batch.

    Finished rows stay in the batch (their cache length frozen, fed padding) until all rows
    are done: dropping them would need a device-side gather of every buffer for a saving
    that only matters for large, uneven batches.
    """
    batch = len(state.lengths)
    rows = [RowTrace(tokens=list(limits.start_ids)) for _ in range(batch)]
    pending = np.tile(np.asarray(limits.start_ids, dtype=np.int64), (batch, 1))
    active = np.ones(batch, dtype=bool)
    while active.any():
        _, top_ids = state.verify(pending)
        state.keep(np.where(active, pending.shape[1], 0))
        choices = top_ids[:, -1, 0]
        for row in np.flatnonzero(active):
            trace = rows[row]
            trace.drafted.append(0)
            trace.accepted.append(trace.extend([int(choices[row])], limits))
            if trace.done:
                active[row] = False
        pending = np.where(active, choices, pad_id).astype(np.int64)[:, None]
    return rows
