"""What tokenizing costs a bundle's runtime: ms a text over a file, and how long a text far
beyond ``max_source_len`` takes to be refused, for each of several source trees.

    python benchmarks/tokenize_cost.py BUNDLE --texts FILE --trees OLD_TREE NEW_TREE [--rounds 3]

Each tree (a checkout: ``git worktree add``) runs in a child process that imports ``aggdec``
from that tree (as ``host_ab.py``'s children do), one tree after the other, ``--rounds`` times
in alternating order. A child encodes the file's lines one ``Generator.encode`` call each (the
best of three passes, after a warm-up pass), then English text of 10 kB, 100 kB and 1 MB (the
server's default body limit) at once, each refused as too long; it prints the time of each,
and a hash of the file's ids, which must be equal between trees.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tree_import import PREAMBLE, check_from_tree

CHILD = PREAMBLE + check_from_tree("aggdec.runtime.generator") + r"""
import hashlib, json, time
from aggdec.runtime.errors import InputError
from aggdec.runtime.generator import Generator
bundle, path = sys.argv[1], sys.argv[2]
texts = [line.strip() for line in open(path, encoding="utf-8") if line.strip()]
generator = Generator(bundle, threads=1)
ids = [generator.encode([text])[0] for text in texts]
passes = []
for _ in range(3):
    started = time.perf_counter()
    for text in texts:
        generator.encode([text])
    passes.append(time.perf_counter() - started)
line = "The weather was cold and rainy, so we stayed inside and read books all afternoon. "
refusals = {}
for size in (10_000, 100_000, 1_000_000):
    started = time.perf_counter()
    try:
        generator.encode([(line * (size // len(line) + 1))[:size]])
        refusals[size] = None
    except InputError as exc:
        refusals[size] = [time.perf_counter() - started, str(exc)[:60]]
print(json.dumps({"ms_a_text": 1e3 * min(passes) / len(texts), "texts": len(texts), "refusals": refusals,
                  "ids": hashlib.sha256(json.dumps(ids).encode()).hexdigest()}))
"""


def child(tree: Path, bundle: str, texts: str) -> dict:
    env = dict(os.environ, AGGDEC_TREE=str(tree), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, bundle, texts], env=env, check=True, capture_output=True,
                         text=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--texts", required=True)
    parser.add_argument("--trees", nargs="+", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    bundle, texts = str(Path(args.bundle).resolve()), str(Path(args.texts).resolve())
    hashes = set()
    print("| round | tree | ms a text | refused after: 10 kB / 100 kB / 1 MB (s) |")
    print("|---|---|---|---|")
    for round_ in range(args.rounds):
        trees = args.trees if round_ % 2 == 0 else list(reversed(args.trees))
        for tree in trees:
            result = child(tree, bundle, texts)
            hashes.add(result["ids"])
            refused = " / ".join("not refused" if r is None else f"{r[0]:.3f}" for r in result["refusals"].values())
            print(f"| {round_ + 1} | {tree} | {result['ms_a_text']:.3f} | {refused} |", flush=True)
    print(f"\n{result['texts']} texts; the trees' ids {'agree' if len(hashes) == 1 else 'DIFFER'}; last refusal: "
          f"{list(result['refusals'].values())[-1]}")
    return 0 if len(hashes) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
