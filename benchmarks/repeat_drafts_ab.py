"""Drafting a looping output's repetition (``aggdec.runtime.decoding.alignment.repeated_tail``),
off (A) and on (B), in one process, alternating sentence by sentence so machine drift hits both
alike.

    python benchmarks/repeat_drafts_ab.py BUNDLE [--modes iad gad] [--limit 2696] [--threads 1]
                                          [--min-repeat-a OFF] [--min-repeat-b MIN_REPEAT]

Sentences: the UA-GEC test split, batch 1, CPU. Prints, per mode, B's time over A's on all
sentences and on those whose output is over 64 and over 128 tokens, tokens per verifier call,
and whether the outputs are the same (they must be: a draft changes speed, never an output;
exit status 1 if not).
"""

from __future__ import annotations

import argparse

from alternate import alternate

OFF = 10**9  # a match no output reaches: repetition drafts never made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--modes", nargs="+", default=["iad", "gad"], choices=["iad", "gad"])
    parser.add_argument("--limit", type=int, default=2696)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-repeat-a", type=int, default=OFF, help="A's shortest match (default: off)")
    parser.add_argument("--min-repeat-b", type=int, default=None, help="B's shortest match (default: MIN_REPEAT)")
    args = parser.parse_args(argv)

    from aggdec import Generator
    from aggdec.bench.uagec import load_pairs
    from aggdec.runtime.decoding import alignment

    a_min = args.min_repeat_a
    b_min = alignment.MIN_REPEAT if args.min_repeat_b is None else args.min_repeat_b
    sources = [pair.source for pair in load_pairs("test")][: args.limit]
    # one Generator per side: each keeps its own measured costs and acceptance priors
    sides = {"A": (Generator(args.bundle, threads=args.threads), a_min),
             "B": (Generator(args.bundle, threads=args.threads), b_min)}
    for generator, min_repeat in sides.values():
        alignment.MIN_REPEAT = min_repeat
        for mode in args.modes:
            generator.warm_up(mode)

    def side(generator, mode, min_repeat):
        def run(source):
            alignment.MIN_REPEAT = min_repeat  # read at every draft
            return generator.generate([source], mode=mode)[0]
        return run

    done = alternate({(name, mode): side(generator, mode, min_repeat)
                      for name, (generator, min_repeat) in sides.items() for mode in args.modes}, sources)
    shown = {name: "off" if value == OFF else value for name, value in (("A", a_min), ("B", b_min))}
    print(f"{len(sources)} UA-GEC test sentences, batch 1, CPU, {args.threads} thread(s); "
          f"repetition drafts after a match of: A {shown['A']}, B {shown['B']} tokens or more")
    failed = False
    for mode in args.modes:
        a, b = done["A", mode], done["B", mode]
        same = a.outputs == b.outputs
        failed |= not same
        print(f"  {mode}: time B/A {b.total / a.total:.3f} (A {a.total:.2f} s, B {b.total:.2f} s); "
              f"tokens/call A {a.tokens_per_call():.2f}, B {b.tokens_per_call():.2f}; B = A outputs: {same}")
        for over in (64, 128):
            long = [i for i, ids in enumerate(a.outputs) if len(ids) > over]
            ta, tb = (sum(side.seconds[i] for i in long) for side in (a, b))
            print(f"    {len(long)} outputs over {over} tokens: B/A {tb / max(ta, 1e-9):.3f} "
                  f"(A {ta:.2f} s, B {tb:.2f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
