"""The A/B loop of benchmarks/ab.py: every side decodes the same sentences in one process, one
sentence at a time, the sides' order reversed every other sentence, so machine drift and cache
warmth hit all sides alike. A side is a function of one source text that returns the runtime's
GenerationResult (a Generator of its own, with its own options and tuning).
For batched decoding a unit may instead be a list of texts, and its side return their list of
results (``calls`` then counts rows' iterations, not verifier calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Side:
    """What one side did, sentence by sentence."""

    seconds: list[float] = field(default_factory=list)
    outputs: list[tuple[int, ...]] = field(default_factory=list)
    calls: int = 0  # verifier calls

    @property
    def total(self) -> float:
        return sum(self.seconds)

    def tokens_per_call(self) -> float:
        return sum(len(ids) for ids in self.outputs) / max(self.calls, 1)


def alternate(sides: dict[Any, Callable[[str], Any]], sources: Sequence[str]) -> dict[Any, Side]:
    """Run every side on every source, alternating; the results per side."""
    done = {key: Side() for key in sides}
    order = list(sides.items())
    for index, source in enumerate(sources):
        for key, run in (order if index % 2 == 0 else order[::-1]):
            started = time.perf_counter()
            result = run(source)
            done[key].seconds.append(time.perf_counter() - started)
            for one in result if isinstance(result, list) else [result]:
                done[key].outputs.append(one.ids)
                done[key].calls += one.stats.iterations
    return done
