"""BeamGroup.step's own time, an earlier version's against this checkout's, on the same steps.

    git show 9d91d68:runtime/decoding/beam.py > /tmp/old_beam.py
    python benchmarks/results/beam-adaptive-cpu/step_microbench.py /tmp/old_beam.py

24 steps of beam 4 over synthetic top-8 candidates (sorted log-probs, random ids, no EOS), run
100 times per repeat, 7 repeats interleaved; prints the best microseconds per step of each
and checks that both select the same hypotheses with the same scores.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from aggdec.runtime.decoding import beam as new_beam
from aggdec.runtime.decoding.common import DecodeLimits


def load_old(path: str):
    text = Path(path).read_text().replace("from .common import", "from aggdec.runtime.decoding.common import")
    module_path = Path(tempfile.mkdtemp()) / "old_beam.py"
    module_path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_beam", module_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_beam"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def main() -> None:
    old_beam = load_old(sys.argv[1])
    rng = np.random.default_rng(0)
    limits = DecodeLimits(start_ids=(0,), eos_id=1, max_new_tokens=10**6)
    inputs = []
    for _ in range(24):
        logprobs = -np.sort(rng.exponential(3, size=(4, 8)), axis=1).astype(np.float32)
        inputs.append((logprobs, rng.integers(2, 8000, size=(4, 8)).astype(np.int64)))

    def run(module):
        group = module.BeamGroup(module.BeamRules(4), limits)
        chosen = [[(s.parent, s.token) for s in group.step(lp, ids)] for lp, ids in inputs]
        return chosen, group.scores.tolist()

    assert run(old_beam) == run(new_beam), "the two versions select differently"
    best: dict[str, float] = {}
    for _ in range(7):
        for name, module in (("old", old_beam), ("new", new_beam)):
            started = time.perf_counter()
            for _ in range(100):
                run(module)
            per_step = (time.perf_counter() - started) / (100 * len(inputs)) * 1e6
            best[name] = min(best.get(name, float("inf")), per_step)
    print({name: f"{value:.1f} us/step" for name, value in best.items()})


if __name__ == "__main__":
    main()
