"""Plain beam N with an older commit's host code against this checkout's, in one process.

The older commit's ``runtime/decoding/beam.py`` (``BeamGroup.step``, ``Selected``) and
``runtime/bundle_probe.py`` (``check_ids``) are loaded beside this checkout's, and the two
sides alternate sentence by sentence (chunk by chunk when batched) on one Generator, so that
the machine's drift hits both alike. Prints each side's seconds (total, inside onnxruntime,
outside it) and checks that both decode the same hypotheses with the same scores.

    python benchmarks/results/beam-host-cpu/ab_host.py BUNDLE [--old main] [--limit 200] [--batch-size 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aggdec.runtime import bundle_probe
from aggdec.runtime.decoding import beam, verifier
from aggdec.runtime.generator import Generator
from aggdec.sentences import load_examples


def old_module(commit: str, path: str, name: str):
    """``path`` at ``commit``, loaded as a module of the package ``name`` sits in (its relative
    imports resolve to this checkout's siblings)."""
    text = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True, check=True).stdout
    file = Path(tempfile.mkdtemp()) / Path(path).name
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--old", default="main")
    parser.add_argument("--data", default="uagec-test")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="passes; the first warms up")
    args = parser.parse_args()

    old_beam = old_module(args.old, "runtime/decoding/beam.py", "aggdec.runtime.decoding.old_beam")
    old_probe = old_module(args.old, "runtime/bundle_probe.py", "aggdec.runtime.old_bundle_probe")
    sides = {
        "old": (old_beam.BeamGroup.step, old_probe.check_ids),
        "new": (beam.BeamGroup.step, bundle_probe.check_ids),
    }
    sources = [example.source for example in load_examples(args.data, args.limit)]
    generator = Generator(args.bundle, threads=1)
    chunks = [sources[i : i + args.batch_size] for i in range(0, len(sources), args.batch_size)]
    seconds = dict.fromkeys(sides, 0.0)
    graph = dict.fromkeys(sides, 0.0)
    outputs: dict[str, list] = {side: [] for side in sides}
    for repeat in range(args.repeats):
        last = repeat == args.repeats - 1
        for index, chunk in enumerate(chunks):
            order = list(sides) if index % 2 == 0 else list(sides)[::-1]
            for side in order:
                beam.BeamGroup.step, verifier.check_ids = sides[side]
                before, started = generator.graph_seconds, time.perf_counter()
                results = generator.generate(chunk, num_beams=args.beams, batch_size=args.batch_size,
                                             num_return_sequences=args.beams)
                if last:
                    seconds[side] += time.perf_counter() - started
                    graph[side] += generator.graph_seconds - before
                    outputs[side] += [[(h.ids, h.score) for h in r.sequences] for r in results]
    beam.BeamGroup.step, verifier.check_ids = sides["new"]
    print(json.dumps({
        "sentences": len(sources), "beams": args.beams, "batch_size": args.batch_size, "old": args.old,
        "identical": outputs["old"] == outputs["new"],
        "seconds": {side: round(value, 3) for side, value in seconds.items()},
        "onnxruntime_seconds": {side: round(value, 3) for side, value in graph.items()},
        "outside_seconds": {side: round(seconds[side] - graph[side], 3) for side in sides},
        "new_over_old_time": round(seconds["new"] / seconds["old"], 4),
        "new_over_old_outside": round((seconds["new"] - graph["new"]) / (seconds["old"] - graph["old"]), 4),
    }, indent=1))


if __name__ == "__main__":
    main()
