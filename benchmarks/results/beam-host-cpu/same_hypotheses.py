"""Two bundles decode the same beam hypotheses with bitwise the same scores?

Decodes the first sentences with plain beam N on each bundle, returning all N hypotheses, and
compares every hypothesis's ids and its float32 sequence score exactly (no tolerance): what a
graph rewrite that leaves the values alone (export/shape_folding.py) must give.

    python benchmarks/results/beam-host-cpu/same_hypotheses.py BUNDLE_A BUNDLE_B [--limit 200] [--beams 4]
"""

from __future__ import annotations

import argparse
import json

from aggdec.runtime.generator import Generator
from aggdec.sentences import load_examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--data", default="uagec-test")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    sources = [example.source for example in load_examples(args.data, args.limit)]
    decoded = []
    for bundle in (args.a, args.b):
        results = Generator(bundle, threads=1).generate(sources, num_beams=args.beams, batch_size=args.batch_size,
                                                        num_return_sequences=args.beams)
        decoded.append([[(h.ids, h.score) for h in r.sequences] for r in results])
    same = sum(x == y for x, y in zip(*decoded))
    print(json.dumps({"sentences": len(sources), "beams": args.beams, "batch_size": args.batch_size,
                      "identical_sentences": same, "hypotheses": sum(len(x) for x in decoded[0])}, indent=1))
    raise SystemExit(0 if same == len(sources) else 1)


if __name__ == "__main__":
    main()
