"""How far int8 bundles' greedy outputs are from their fp32 bundle's: corpus chrF and BLEU
(sacrebleu's defaults, as `aggdec bench --task translation` scores them) and identical outputs.

    python benchmarks/int8_quality.py FP32_BUNDLE INT8_BUNDLE [INT8_BUNDLE ...] \\
        --data benchmarks/data/marian/web-bench.en.txt [--start 0] [--limit 300]

Greedy, one thread; the fp32 outputs are decoded once. Speed is ab.py's job (it interleaves).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fp32", help="the fp32 bundle (the reference)")
    parser.add_argument("bundles", nargs="+", help="bundles quantized from it")
    parser.add_argument("--data", required=True, help="sources, one per line")
    parser.add_argument("--start", type=int, default=0, help="first line (0-based)")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16, help="greedy outputs do not depend on it")
    args = parser.parse_args()

    import sacrebleu

    from aggdec import Generator

    lines = Path(args.data).read_text(encoding="utf-8").splitlines()[args.start:args.start + args.limit]
    reference = [r.text for r in Generator(args.fp32, threads=1).generate(lines, batch_size=args.batch_size)]
    print(f"{len(lines)} lines of {args.data} from line {args.start}; reference: {args.fp32} greedy")
    print("| bundle | chrF | BLEU | identical |")
    print("|---|---|---|---|")
    for bundle in args.bundles:
        outputs = [r.text for r in Generator(bundle, threads=1).generate(lines, batch_size=args.batch_size)]
        same = sum(a == b for a, b in zip(outputs, reference))
        print(f"| {bundle} | {sacrebleu.corpus_chrf(outputs, [reference]).score:.2f} | "
              f"{sacrebleu.corpus_bleu(outputs, [reference]).score:.2f} | {same}/{len(lines)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
