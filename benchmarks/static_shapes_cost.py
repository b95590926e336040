"""Where static shapes' time goes on the CPU: encoder and verifier seconds, static against dynamic.

    python benchmarks/static_shapes_cost.py BUNDLE [--limit 200] [--batch-sizes 1 8] [--modes greedy iad]
                                           [--repeats 3] [--threads 1]

One process, two Generators (``static_shapes`` off and on) over the same bundle; each (batch,
mode) decodes the sentences with both, alternating ``--repeats`` times (machine drift hits both
alike), and prints the summed ``DecodeStats`` seconds of the faster repeat: total, encoder,
verifier, outside the graphs, with static over dynamic. Outputs must be equal (exit 1 if not).
The timed ratio with sentences interleaved one by one is ``benchmarks/ab.py --a
static_shapes=false --b static_shapes=true``; this script says which graph the time goes to.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--modes", nargs="+", default=["greedy", "iad"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", default="uagec-test")
    args = parser.parse_args(argv)

    from aggdec import Generator
    from aggdec.sentences import load_examples

    sources = [example.source for example in load_examples(args.data, limit=args.limit)]
    generators = {static: Generator(args.bundle, threads=args.threads, static_shapes=static)
                  for static in (False, True)}
    print(f"{len(sources)} sentences of {args.data}, CPU, {args.threads} thread(s); static width "
          f"{generators[True].static_width}, source width {generators[True].manifest.max_source_len}")
    failed = False
    for batch in args.batch_sizes:
        for mode in args.modes:
            for generator in generators.values():
                generator.warm_up(mode, batch_size=batch)
            best: dict[bool, dict[str, float]] = {}
            outputs: dict[bool, list] = {}
            for _ in range(args.repeats):
                for static, generator in generators.items():
                    started = time.perf_counter()
                    results = generator.generate(sources, mode=mode, batch_size=batch)
                    wall = time.perf_counter() - started
                    figures = {"wall": wall,
                               "encoder": sum(r.stats.encoder_seconds for r in results),
                               "verifier": sum(r.stats.verifier_seconds for r in results)}
                    figures["outside"] = wall - figures["encoder"] - figures["verifier"]
                    if static not in best or wall < best[static]["wall"]:
                        best[static] = figures
                    outputs[static] = [r.ids for r in results]
            same = sum(a == b for a, b in zip(outputs[False], outputs[True]))
            failed |= same != len(sources)
            print(f"batch {batch} {mode}: outputs equal {same}/{len(sources)}")
            for part in ("wall", "encoder", "verifier", "outside"):
                dynamic, static = best[False][part], best[True][part]
                print(f"  {part:9s} dynamic {dynamic:7.3f} s  static {static:7.3f} s  static/dynamic "
                      f"{static / max(dynamic, 1e-9):6.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
