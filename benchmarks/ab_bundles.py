"""Two bundles against each other on the same sentences, in one process, alternating sentence by
sentence so machine drift hits both alike: what changed between two exports (a graph rewrite, a
retrained drafter, int8 against fp32) costs or gains, and whether the outputs are the same.

    python benchmarks/ab_bundles.py BUNDLE_A BUNDLE_B [--modes greedy iad] [--limit 300] [--threads 1]
                                    [--fp32-drafter A|B] [--batch-size 1]

``--fp32-drafter A``: side A runs the float drafter instead of the bundle's int8 copy (the CPU's
default); with the same bundle on both sides, that compares the two drafters.

``--batch-size N`` (N > 1): each side decodes chunks of 64 sentences (or N, if more) at batch N,
the sides alternating chunk by chunk; "tokens/call" is then per row iteration.

Sentences: the UA-GEC test split (the ``ua-gec`` package), batch 1, CPU. Prints, per bundle and
mode, the summed decode time and tokens per verifier call; then B's time over A's per mode, each
mode's output against the same bundle's greedy, and B's outputs against A's. Exit status 1 if a
mode with beta 1 ever differs from its own bundle's greedy (a bug).
"""

from __future__ import annotations

import argparse

from alternate import alternate

CHUNK = 64  # sentences per alternation when batched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", metavar="BUNDLE_A")
    parser.add_argument("b", metavar="BUNDLE_B")
    parser.add_argument("--modes", nargs="+", default=["greedy", "iad"], choices=["greedy", "iad", "gad"])
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fp32-drafter", choices=["A", "B"], action="append", default=[],
                        help="this side runs the float drafter (GAD), not the bundle's int8 copy")
    parser.add_argument("--batch-size", type=int, default=1)
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")

    from aggdec import Generator
    from aggdec.bench.uagec import load_pairs

    modes = ["greedy"] + [m for m in args.modes if m != "greedy"]  # greedy is every mode's reference
    sources = [pair.source for pair in load_pairs("test")][: args.limit]
    bundles = {side: Generator(path, threads=args.threads, int8_drafter=False if side in args.fp32_drafter else None)
               for side, path in (("A", args.a), ("B", args.b))}
    for generator in bundles.values():  # warm-up: arenas and kernel choice out of the timings
        for mode in modes:
            generator.generate(sources[:4], mode=mode)
    if args.batch_size == 1:
        units, run = sources, (lambda g, m, source: g.generate([source], mode=m)[0])
    else:
        size = max(CHUNK, args.batch_size)
        units = [sources[i : i + size] for i in range(0, len(sources), size)]
        run = (lambda g, m, texts: g.generate(texts, mode=m, batch_size=args.batch_size))
    done = alternate({(name, mode): (lambda unit, g=generator, m=mode: run(g, m, unit))
                      for name, generator in bundles.items() for mode in modes}, units)
    n, failed = len(sources), False
    sides = {side: f"{path} ({bundles[side].drafter_graph or 'no drafter'})" for side, path in (("A", args.a), ("B", args.b))}
    print(f"{n} UA-GEC test sentences, batch {args.batch_size}, CPU, {args.threads} thread(s); "
          f"A = {sides['A']}, B = {sides['B']}")
    for mode in modes:
        for name in bundles:
            side = done[name, mode]
            same = sum(x == y for x, y in zip(side.outputs, done[name, "greedy"].outputs))
            failed |= same != n
            print(f"  {name} {mode:6s} {side.total:8.2f} s  {side.tokens_per_call():5.2f} "
                  f"tokens/call  = own greedy {same}/{n}  over own greedy "
                  f"{done[name, 'greedy'].total / side.total:.2f}x")
        print(f"  B/A time {mode}: {done['B', mode].total / done['A', mode].total:.3f}   "
              f"B = A outputs: {sum(x == y for x, y in zip(done['A', mode].outputs, done['B', mode].outputs))}/{n}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
