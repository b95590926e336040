"""The encoder + verifier pair as the decoding loops drive it.

:class:`Verifier` runs the encoder once per batch of sources and returns a
:class:`DecodeState`, which owns that batch's device-resident buffers (cross K/V, source
mask, self-attention cache) and per-row cache lengths. ``state.verify(tokens)`` scores a block
of tokens after each row's cache; ``state.keep(counts)`` tells it how many of those tokens
each row keeps. Rejected positions are never copied anywhere: the next call's
``past_lengths`` makes the graph overwrite them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..manifest import Manifest
from ..session import Session


class DecodeState:
    def __init__(self, verifier: Session, encoder_hidden: Any, cross: Any, mask: Any, empty_cache: np.ndarray) -> None:
        self._verifier = verifier
        self.encoder_hidden = encoder_hidden  # device handle: the drafter reads it too
        self._cross = cross
        self.mask = mask  # source mask, on the device
        self._cache: Any = empty_cache
        batch = empty_cache.shape[2]
        self.lengths = np.zeros(batch, dtype=np.int64)  # valid cached positions per row

    def verify(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top-K (log-probs, ids) for the position after each of ``tokens`` ([B, T])."""
        out = self._verifier.run(
            {
                "input_ids": tokens,
                "past_lengths": self.lengths,
                "past_key_values": self._cache,
                "cross_key_values": self._cross,
                "encoder_attention_mask": self.mask,
            },
            device_outputs=("present_key_values",),
        )
        self._cache = out["present_key_values"]
        return out["top_logprobs"], out["top_ids"]

    def keep(self, counts: np.ndarray | int) -> None:
        """Each row keeps the first ``counts[row]`` tokens of the block just verified."""
        self.lengths = self.lengths + counts


class Verifier:
    def __init__(self, encoder: Session, verifier: Session, manifest: Manifest) -> None:
        self.encoder = encoder
        self.verifier = verifier
        self.manifest = manifest

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> DecodeState:
        out = self.encoder.run({"input_ids": input_ids, "attention_mask": attention_mask},
                               device_outputs=("encoder_hidden_states", "cross_key_values"))
        m = self.manifest
        empty = np.zeros((m.decoder_layers, 2, input_ids.shape[0], m.num_heads, 0, m.head_dim), dtype=np.float32)
        return DecodeState(self.verifier, out["encoder_hidden_states"], out["cross_key_values"],
                           self.verifier.to_device(attention_mask), empty)

    @property
    def seconds(self) -> dict[str, float]:
        return {"encoder": self.encoder.seconds, "verifier": self.verifier.seconds}
