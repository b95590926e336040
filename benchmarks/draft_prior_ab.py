"""Where a row's first draft length starts: the Generator's shared acceptance prior
(``aggdec.runtime.decoding.sizing.AcceptancePrior``, the default) against the fixed prior of
``BlockOptions`` alone, in one process, alternating sentence by sentence so that machine drift
hits both alike.

    python benchmarks/draft_prior_ab.py BUNDLE [--mode iad] [--limit 1000] [--threads 1] [--max-block N]

Sentences: the UA-GEC test split, batch 1, CPU. Prints the speedup of the shared prior, the
verifier calls per sentence of each side, the rate the shared prior learned, and whether the
outputs are the same (they must be: the prior changes draft lengths, never an output; exit
status 1 if not).
"""

from __future__ import annotations

import argparse

from alternate import alternate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--mode", default="iad", choices=("iad", "gad", "gad++"))
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-block", type=int, default=None, help="IAD's longest block (default: the device's)")
    args = parser.parse_args(argv)

    from aggdec import Generator
    from aggdec.bench.uagec import load_pairs
    from aggdec.runtime.decoding.sizing import BlockOptions

    sources = [pair.source for pair in load_pairs("test")][: args.limit]
    block = BlockOptions(max_block=args.max_block) if args.max_block and args.mode == "iad" else None
    sides = {side: Generator(args.bundle, threads=args.threads) for side in ("fixed", "shared")}
    for generator in sides.values():
        generator.warm_up(args.mode)
    sides["fixed"].draft_priors = dict.fromkeys(sides["fixed"].draft_priors)  # None: BlockOptions' prior only
    done = alternate({name: (lambda source, g=generator: g.generate([source], mode=args.mode, block=block)[0])
                      for name, generator in sides.items()}, sources)
    same = done["fixed"].outputs == done["shared"].outputs
    accepted, rejected = sides["shared"].draft_priors[args.mode].start(block or BlockOptions())
    print(f"{len(sources)} UA-GEC test sentences, {args.mode}, batch 1, CPU, {args.threads} thread(s), "
          f"max block {args.max_block or 'default'}")
    fixed, shared = done["fixed"], done["shared"]
    print(f"  shared prior: {fixed.total / shared.total:.3f}x the fixed prior's speed "
          f"(fixed {fixed.total:.2f} s, shared {shared.total:.2f} s); verifier calls per sentence "
          f"{fixed.calls / len(sources):.2f} fixed, {shared.calls / len(sources):.2f} shared; learned rate "
          f"{accepted / (accepted + rejected):.3f}; same outputs: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
