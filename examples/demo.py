"""The main job on a bundled example: train a tiny editing model, export it, correct with IAD.

A small Marian learns (in about a minute on a CPU) to copy its input while applying a few
rewrite rules ("uh" is deleted, "teh" becomes "the", "gonna" becomes "going to"): a toy
grammatical-error-correction task, where IAD's draft (the input itself) is mostly right.
The demo exports it with aggdec, decodes fresh sentences with greedy and with IAD, checks
that both give the same output, and prints the measured speedup.

    python examples/demo.py [--work DIR] [--sentences N]

Needs the [export] extra (torch, transformers) for training and export; decoding is torch-free.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.support: the same toy task the tests train on


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=ROOT / "demo-work", help="where the model and bundle go")
    parser.add_argument("--sentences", type=int, default=200, help="sentences to time (200)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from aggdec import Generator
    from aggdec.export import export_bundle
    from tests.support.tiny import make_editing_pair, train_editing_marian

    checkpoint, bundle = args.work / "editing-marian", args.work / "bundle"
    if not (checkpoint / "model.safetensors").is_file():
        print(f"training the toy editing model into {checkpoint} (about a minute) ...", file=sys.stderr)
        train_editing_marian(checkpoint)
    if not (bundle / "manifest.json").is_file():
        export_bundle(checkpoint, bundle, force=True, progress=lambda m: print(m, file=sys.stderr))

    generator = Generator(bundle, threads=args.threads)
    rng = random.Random(0)
    pairs = [make_editing_pair(rng) for _ in range(args.sentences)]
    sources = [source for source, _ in pairs]

    print("\nsource  ->  IAD output")
    for result, (source, _) in zip(generator.generate(sources[:5], mode="iad"), pairs[:5]):
        print(f"  {source}\n    -> {result.text}")

    generator.generate(sources[:10], mode="greedy", batch_size=1)  # warm-up
    timings = {}
    outputs = {}
    for mode in ("greedy", "iad"):
        started = time.perf_counter()
        results = generator.generate(sources, mode=mode, batch_size=1)
        timings[mode] = time.perf_counter() - started
        outputs[mode] = results
    same = sum(a.ids == b.ids for a, b in zip(outputs["greedy"], outputs["iad"]))
    correct = sum(r.text == target for r, (_, target) in zip(outputs["iad"], pairs))
    tokens = sum(len(r.ids) for r in outputs["iad"])
    iterations = {mode: sum(r.stats.iterations for r in outputs[mode]) for mode in outputs}
    per_sentence = [g.stats.total_seconds / i.stats.total_seconds for g, i in zip(outputs["greedy"], outputs["iad"])]
    print(f"\n{len(sources)} sentences, batch 1, {args.threads} thread(s):")
    print(f"  IAD output identical to greedy: {same}/{len(sources)}; equal to the rule-based target: {correct}")
    for mode in ("greedy", "iad"):
        print(f"  {mode:6s} {timings[mode]:.3f}s  {iterations[mode]} verifier calls  "
              f"{tokens / iterations[mode]:.2f} tokens per call")
    print(f"  speedup of IAD over greedy: {timings['greedy'] / timings['iad']:.2f}x overall, "
          f"{statistics.median(per_sentence):.2f}x median per sentence")
    return 0 if same == len(sources) else 1


if __name__ == "__main__":
    raise SystemExit(main())
