"""A/B of two source trees of aggdec on the batched decode loop's CPU time and host share.

    python benchmarks/host_ab.py BUNDLE --old OLD_TREE [--new NEW_TREE] [--modes greedy iad]
                                 [--batch-sizes 1 8 32] [--limit 1000] [--repeats 4] [--data uagec-test]
                                 [--chunk N]

``benchmarks/ab.py`` compares options of one tree in one process; two versions of the code
cannot share a process (one ``aggdec`` per interpreter). Here each side is a child process of
its own tree (``OLD_TREE``: a checkout, e.g. ``git worktree add`` or ``git archive`` of the old
commit; ``NEW_TREE``: this one by default), both run with this interpreter and its packages.
For each batch size and mode the sides run alternately, ``--repeats`` times each, old first
on even repeats and new first on odd ones, so that drift on a shared machine hits both alike.
A child loads the bundle (1 thread), warms up on ``4 x batch`` sentences, then decodes the
sentences once with ``Generator.generate`` (``--chunk N``: one call per N sentences, as ``aggdec
bench`` calls it with N the batch size, so each batch runs until its slowest row ends and
every batch admits its rows at once; 0, the default: one call, rows refilled as others end),
timing its thread's CPU seconds: the whole
``generate``, and inside it the onnxruntime calls (``InferenceSession.run`` and
``run_with_iobinding``, by ``host_share.py``'s own clock and split); host = the rest. It prints the
medians and new/old ratios, and refuses to print them when the two trees' token ids differ
for any sentence (every exact mode must give greedy's output, whatever the code version).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from tree_import import PREAMBLE

ROOT = Path(__file__).resolve().parents[1]

# The child: this tree's aggdec (tree_import.PREAMBLE), and host_share's clock
CHILD = PREAMBLE + r"""
import hashlib, json, time
sys.path.insert(0, os.environ["AGGDEC_BENCHMARKS"])  # host_share's clock (it imports aggdec only in main)
from host_share import OrtClock
sys.path.insert(0, top)  # again: host_share put its own root first, and this tree's aggdec goes before it
clock = OrtClock()
import aggdec
import aggdec.runtime.decoding.loop as loop
for module in (aggdec, loop):  # this tree's code, not the installed one
    assert os.path.realpath(module.__file__).startswith(os.path.realpath(tree) + os.sep), module.__file__
from aggdec import Generator
from aggdec.sentences import load_examples
bundle, mode, batch, limit, data = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
chunk = int(sys.argv[6]) or limit
texts = [example.source for example in load_examples(data, limit)]
generator = Generator(bundle, device="cpu", threads=1)
generator.generate(texts[: 4 * batch], mode=mode, batch_size=batch)
clock.reset()
started = time.thread_time()
results = [r for first in range(0, len(texts), chunk)
           for r in generator.generate(texts[first : first + chunk], mode=mode, batch_size=batch, max_new_tokens=255)]
total = time.thread_time() - started
host = total - sum(clock.seconds.values())
digest = hashlib.sha256(json.dumps([list(result.ids) for result in results]).encode()).hexdigest()
print(json.dumps({"total": total, "host": host, "ids": digest}))
"""


def child(tree: Path, bundle: str, mode: str, batch: int, limit: int, data: str, chunk: int = 0) -> dict:
    env = dict(os.environ, AGGDEC_TREE=str(tree), AGGDEC_BENCHMARKS=str(ROOT / "benchmarks"), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, bundle, mode, str(batch), str(limit), data, str(chunk)],
                         env=env, check=True, capture_output=True, text=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", metavar="BUNDLE")
    parser.add_argument("--old", required=True, type=Path, metavar="OLD_TREE")
    parser.add_argument("--new", type=Path, default=ROOT, metavar="NEW_TREE")
    parser.add_argument("--modes", nargs="+", default=["greedy"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--data", default="uagec-test")
    parser.add_argument("--chunk", type=int, default=0, help="sentences per generate call (0: all in one)")
    args = parser.parse_args(argv)
    calls = f"generate calls of {args.chunk} sentences" if args.chunk else "one generate call"
    print(f"{args.limit} sentences of {args.data}, CPU seconds of {calls}, 1 thread, medians of "
          f"{args.repeats}; old: {args.old}, new: {args.new}")
    print("| mode | batch | old total / host | new total / host | old host share | new host share "
          "| new/old total | new/old host |")
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    for batch in args.batch_sizes:
        for mode in args.modes:
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for repeat in range(args.repeats):
                order = ["old", "new"] if repeat % 2 == 0 else ["new", "old"]
                for side in order:
                    tree = args.old if side == "old" else args.new
                    runs[side].append(child(tree, args.bundle, mode, batch, args.limit, args.data, args.chunk))
            digests = {run["ids"] for side in runs.values() for run in side}
            if len(digests) != 1:
                print(f"| {mode} | {batch} | OUTPUTS DIFFER between the trees ({len(digests)} digests) |")
                failed = True
                continue
            m = {side: {key: statistics.median(run[key] for run in rows) for key in ("total", "host")}
                 for side, rows in runs.items()}
            old, new = m["old"], m["new"]
            print(f"| {mode} | {batch} | {old['total']:.3f} / {old['host']:.3f} "
                  f"| {new['total']:.3f} / {new['host']:.3f} "
                  f"| {old['host'] / old['total']:.1%} | {new['host'] / new['total']:.1%} "
                  f"| {new['total'] / old['total']:.3f}x | {new['host'] / old['host']:.3f}x |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
