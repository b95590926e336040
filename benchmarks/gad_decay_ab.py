"""GAD's draft-length memory (``aggdec.runtime.decoding.gad.DECAY``, the sizer's decay) at two
values, in one process, alternating sentence by sentence so machine drift hits both alike.

    python benchmarks/gad_decay_ab.py BUNDLE [--decay-a 0.8] [--decay-b 0.5] [--limit 1500] [--threads 1]

Sentences: the UA-GEC test split, batch 1, CPU. Prints B's GAD time over A's, on all sentences
and on those whose output is over 64 tokens, and whether the outputs are the same (they must
be: the decay changes draft lengths, never an output; exit status 1 if not).
"""

from __future__ import annotations

import argparse

from alternate import alternate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--decay-a", type=float, default=0.8)
    parser.add_argument("--decay-b", type=float, default=0.5)
    parser.add_argument("--limit", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    from aggdec import Generator
    from aggdec.bench.uagec import load_pairs
    from aggdec.runtime.decoding import gad

    sources = [pair.source for pair in load_pairs("test")][: args.limit]
    # one Generator per side: each keeps its own measured costs
    sides = {"A": (Generator(args.bundle, threads=args.threads), args.decay_a),
             "B": (Generator(args.bundle, threads=args.threads), args.decay_b)}
    for generator, decay in sides.values():
        gad.DECAY = decay  # read when a decode's draft source is made
        generator.warm_up("gad")

    def side(generator, decay):
        def run(source):
            gad.DECAY = decay
            return generator.generate([source], mode="gad")[0]
        return run

    done = alternate({name: side(*pair) for name, pair in sides.items()}, sources)
    long_seconds = {name: sum(t for t, ids in zip(d.seconds, d.outputs) if len(ids) > 64) for name, d in done.items()}
    same = done["A"].outputs == done["B"].outputs
    print(f"{len(sources)} UA-GEC test sentences, batch 1, CPU, {args.threads} thread(s); A: decay {args.decay_a}, "
          f"B: decay {args.decay_b}")
    a, b = done["A"].total, done["B"].total
    print(f"  GAD time B/A {b / a:.3f} (A {a:.2f} s, B {b:.2f} s); "
          f"outputs over 64 tokens B/A {long_seconds['B'] / max(long_seconds['A'], 1e-9):.3f}; "
          f"B = A outputs: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
