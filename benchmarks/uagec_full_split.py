"""IAD and GAD against greedy on the whole UA-GEC test split: speed and exact equality.

Exports the committed reference model (with its drafter) if ``--work`` has no bundle yet,
decodes all 2,696 test sources one at a time (batch 1, the online setting) with greedy, IAD,
GAD and GAD++ (beta 3, tau 1), one mode after the other, and prints each mode's wall time,
tokens per verifier call, speedup over greedy, and how many outputs differ from greedy's (the
promise: 0 for IAD and GAD; GAD++ trades exactness for speed).

    pip install ua-gec
    python benchmarks/uagec_full_split.py [--threads 1] [--limit N] [--work uagec-work]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UAGEC = ROOT / "benchmarks" / "models" / "uagec"
sys.path.insert(0, str(UAGEC))  # data.py: the corpus reader of the recipe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, help="only the first N test sentences")
    parser.add_argument("--work", type=Path, default=ROOT / "uagec-work", help="where the bundle is (or goes)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()

    from data import load_pairs

    from aggdec import Generator

    bundle = args.work / "bundle"
    if not (bundle / "manifest.json").is_file():
        from aggdec.export import export_bundle

        export_bundle(UAGEC / "model", bundle, force=True, drafter_dir=UAGEC / "drafter",
                      progress=lambda m: print(m, file=sys.stderr))
    generator = Generator(bundle, threads=args.threads)
    sources = [pair.source for pair in load_pairs("test")][: args.limit]
    modes = ["greedy", "iad"] + (["gad", "gad++"] if generator.drafter is not None else [])
    generator.generate(sources[:10], mode="greedy", batch_size=1)  # warm-up
    results, seconds = {}, {}
    for mode in modes:
        started = time.perf_counter()
        options = {"beta": 3, "tau": 1.0} if mode == "gad++" else {}
        results[mode] = generator.generate(sources, mode=mode, batch_size=1, max_new_tokens=255, **options)
        seconds[mode] = time.perf_counter() - started
    report = {"sentences": len(sources), "threads": args.threads, "modes": {}}
    for mode in modes:
        calls = sum(r.stats.iterations for r in results[mode])
        report["modes"][mode] = {
            "seconds": round(seconds[mode], 2),
            "tokens_per_call": round(sum(len(r.ids) for r in results[mode]) / calls, 2),
            "speedup_over_greedy": round(seconds["greedy"] / seconds[mode], 2),
            "outputs_differing_from_greedy": sum(a.ids != b.ids for a, b in zip(results[mode], results["greedy"])),
        }
        row = report["modes"][mode]
        print(f"{mode:6s} {row['seconds']:8.1f}s  {row['tokens_per_call']:5.2f} tokens/call  "
              f"{row['speedup_over_greedy']:.2f}x  differing from greedy: {row['outputs_differing_from_greedy']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    exact = [report["modes"][mode] for mode in modes if mode != "gad++"]
    return 0 if all(m["outputs_differing_from_greedy"] == 0 for m in exact) else 1


if __name__ == "__main__":
    raise SystemExit(main())
