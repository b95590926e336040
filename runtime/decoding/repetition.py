"""A row's repetition drafts, shared by IAD and GAD: when the output repeats itself, the draft
continues the repetition (:func:`~.alignment.repeated_tail`), with a draft length estimate of
its own, since a loop says nothing about how the mode's own source drafts, nor that source
about a loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .alignment import repeated_tail
from .sizing import BlockOptions, BlockSizer


class RepeatDrafts:
    def __init__(self, options: BlockOptions) -> None:
        self.sizer = BlockSizer(options)  # from the options' prior, not a mode's shared one
        self.drafting = False  # the row's last draft continued its repetition

    def draft(self, tokens: Sequence[int] | np.ndarray, room: int, block_cost: np.ndarray | None = None,
              rival: Callable[[], int] | None = None) -> np.ndarray | None:
        """The next draft if ``tokens`` (the output so far) repeats itself, else None (the mode
        drafts from its own source). ``rival``: the length of the mode's own match, asked only
        when a repetition is found; the repetition must match longer."""
        length, cycle = repeated_tail(tokens, self.sizer.options.min_repeat)
        self.drafting = cycle is not None and (rival is None or length > rival())
        if not self.drafting:
            return None
        return np.resize(cycle, max(0, min(room, self.sizer.size(block_cost=block_cost))))

    def observe(self, drafted: int, accepted: int) -> bool:
        """Whether the last draft was a repetition (then its estimate learns from it)."""
        if self.drafting and drafted:
            self.sizer.observe(drafted, accepted)
        return self.drafting
