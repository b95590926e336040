"""How often an output's tail repeats an earlier stretch of the output, and how many of the tokens
that followed that stretch come next: the draft ``alignment.repeated_tail`` makes, scored after
every prefix of a file of outputs, without running a model.

    python benchmarks/repeat_scan.py [--outputs FILE] [--tokenizer FILE] [--k 20] [--long 128]

Defaults: the reference model's greedy outputs of the UA-GEC test split and its tokenizer. For
each shortest match considered, prints, separately for outputs over ``--long`` tokens and the
others, at how many positions a match of that length or more is found, and how many of the k
drafted tokens equal the output's next tokens there on average (and how often none does).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

MODEL = Path(__file__).parent / "models" / "uagec" / "model"
MATCHES = (2, 3, 4, 6, 8, 12, 16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outputs", default=str(MODEL / "test_hypotheses.txt"))
    parser.add_argument("--tokenizer", default=str(MODEL / "tokenizer.json"))
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--long", type=int, default=128)
    args = parser.parse_args(argv)

    from tokenizers import Tokenizer

    from aggdec.runtime.decoding.alignment import repeated_tail

    tokenizer = Tokenizer.from_file(args.tokenizer)
    lines = Path(args.outputs).read_text(encoding="utf-8").splitlines()
    found: dict[tuple[str, int], list[int]] = {}  # (group, match) -> [positions, accepted, none accepted]
    tokens = {"long": 0, "other": 0}
    for line in lines:
        ids = tokenizer.encode(line).ids
        group = "long" if len(ids) > args.long else "other"
        tokens[group] += len(ids)
        for n in range(2, len(ids)):
            length, cycle = repeated_tail(ids[:n], min_match=1)
            if cycle is None:
                continue
            draft, truth = np.resize(cycle, args.k).tolist(), ids[n : n + args.k]
            accepted = next((i for i, (d, t) in enumerate(zip(draft, truth)) if d != t), min(len(truth), args.k))
            for match in MATCHES:
                if length >= match:
                    counts = found.setdefault((group, match), [0, 0, 0])
                    counts[0] += 1
                    counts[1] += accepted
                    counts[2] += accepted == 0
    print(f"{len(lines)} outputs from {args.outputs}; tokens in outputs over {args.long} tokens: {tokens['long']}, "
          f"in the others: {tokens['other']}; k = {args.k}")
    print("| outputs | shortest match | positions found | drafts accepted (mean) | none accepted |")
    print("|---|---|---|---|---|")
    for (group, match), (positions, accepted, none) in sorted(found.items()):
        label = f"over {args.long} tokens" if group == "long" else "the others"
        print(f"| {label} | {match} | {positions} | {accepted / positions:.2f} | {none / positions:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
