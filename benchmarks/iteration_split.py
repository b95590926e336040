"""Where a batched iteration's time goes, per mode: the drafter call, the verifier call and the
host work around them, and the tokens each row gets per iteration, split into the iterations
that drafted (some row's block held a draft) and those that did not, overall and per width
class (the rows a call served, in powers of two). The modes decode the same chunks in one
process, their order swapped every other chunk (as ``ab.py``), so their ratios survive a
shared machine's noise.

A second table splits each mode's whole ``generate`` time (summed over the chunks) into the
encoder, the iterations (verifier, drafter, host) and the rest (admission, tokenizing, results),
and gives the block positions the verifier computed (rows x width, padding included) per
output token: with ``--chunk`` equal to ``--batch-size``, as ``aggdec bench`` calls
``generate``, each chunk's batch runs until its slowest row ends, which the width classes show.

    python benchmarks/iteration_split.py BUNDLE --batch-size 32 [--limit 1000] [--chunk 64]
                                         [--modes greedy gad] [--tuning draft_payoff=false]

Timing wraps the decode loop's one-iteration function (``loop._step``): a measurement aid
only, the same wrapper for every mode. Exits 1 if a mode's outputs differ from the first's.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict

from ab import parse_value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", metavar="BUNDLE")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--chunk", type=int, default=64, help="sentences per generate call (as ab.py)")
    parser.add_argument("--modes", nargs="+", default=["greedy", "gad"])
    parser.add_argument("--tuning", nargs="*", default=[], metavar="KEY=VALUE", help="Tuning fields, every mode")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    from aggdec import Generator
    from aggdec.runtime.decoding import loop
    from aggdec.runtime.tuning import Tuning, tuning_for
    from aggdec.sentences import load_examples

    defaults = {name: getattr(Tuning(), name) for name in Tuning.__dataclass_fields__}
    fields = {}
    for pair in args.tuning:
        key, _, value = pair.partition("=")
        fields[key] = parse_value(value, defaults.get(key))
    generator = Generator(args.bundle, threads=args.threads, tuning=tuning_for("cpu").replace(**fields))
    # (mode, width class or None for all, drafted) -> sums
    sums: dict[tuple[str, int | None, bool], Counter] = defaultdict(Counter)
    current = {"mode": ""}
    step = loop._step

    def timed_step(cohort, work, drafts, verification, pad_id, width_quantile):
        batch, rows = cohort.batch, list(cohort.rows)
        before = [len(row.trace.tokens) for row in rows]
        verifier, drafter = batch.verifier_seconds, drafts.seconds
        started = time.perf_counter()
        finished = list(step(cohort, work, drafts, verification, pad_id, width_quantile))
        seconds = time.perf_counter() - started
        drafted = any(row.trace.drafted and row.trace.drafted[-1] > 0 for row in rows)
        point = {"iterations": 1, "rows": len(rows), "seconds": seconds,
                 "verifier": batch.verifier_seconds - verifier, "drafter": drafts.seconds - drafter,
                 "tokens": sum(len(row.trace.tokens) - b for row, b in zip(rows, before)),
                 "width": batch.last_call[0] if batch.last_call else 1}
        point["positions"] = point["rows"] * point["width"]  # what the call computed, padding included
        for klass in (None, len(rows).bit_length()):
            sums[current["mode"], klass, drafted].update(point)
        yield from finished

    loop._step = timed_step
    sources = [example.source for example in load_examples("uagec-test", limit=args.limit)]
    for mode in args.modes:
        generator.warm_up(generator.resolve_options(mode), batch_size=args.batch_size)
    outputs: dict[str, list] = defaultdict(list)
    whole: dict[str, Counter] = defaultdict(Counter)  # per mode: wall, encoder seconds, output tokens
    for turn, first in enumerate(range(0, len(sources), args.chunk)):
        for mode in args.modes if turn % 2 == 0 else args.modes[::-1]:
            current["mode"] = mode
            started = time.perf_counter()
            results = generator.generate(sources[first : first + args.chunk], mode, batch_size=args.batch_size)
            whole[mode]["wall"] += time.perf_counter() - started
            whole[mode]["encoder"] += sum(r.stats.encoder_seconds for r in results)
            whole[mode]["tokens"] += sum(len(r.ids) for r in results)
            outputs[mode].extend(r.ids for r in results)

    print(f"{len(sources)} sentences, batch {args.batch_size}, chunks of {args.chunk}, tuning {fields or 'default'}")
    print("mode    class  kind      iters  ms/iter  drafter verifier   host  rows  width  tokens/row  ms/token")
    classes = sorted({klass for _, klass, _ in sums if klass is not None})
    for mode in args.modes:
        for klass in (None, *classes):
            for kind, keys in (("all", (False, True)), ("drafted", (True,)), ("plain", (False,))):
                s = sum((sums[mode, klass, key] for key in keys), Counter())
                if not s["iterations"]:
                    continue
                n = s["iterations"]
                host = s["seconds"] - s["verifier"] - s["drafter"]
                print(f"{mode:7} {'all' if klass is None else klass:>5}  {kind:8} {n:6d} {1e3 * s['seconds'] / n:8.2f} "
                      f"{1e3 * s['drafter'] / n:7.2f} {1e3 * s['verifier'] / n:8.2f} {1e3 * host / n:6.2f} "
                      f"{s['rows'] / n:5.1f} {s['width'] / n:6.2f} {s['tokens'] / s['rows']:11.2f} "
                      f"{1e3 * s['seconds'] / max(s['tokens'], 1):9.4f}")
    print("\nmode    sentences/s  encoder  verifier  drafter  host  rest   (shares of generate's time)  positions/token")
    for mode in args.modes:
        w, s = whole[mode], sum((sums[mode, None, key] for key in (False, True)), Counter())
        loop_host = s["seconds"] - s["verifier"] - s["drafter"]
        rest = w["wall"] - w["encoder"] - s["seconds"]
        shares = [w["encoder"], s["verifier"], s["drafter"], loop_host, rest]
        print(f"{mode:7} {len(sources) / w['wall']:11.1f} " + " ".join(f"{x / w['wall']:8.3f}" for x in shares)
              + f"  {s['positions'] / w['tokens']:31.2f}")
    same = all(outputs[mode] == outputs[args.modes[0]] for mode in args.modes)
    print(f"outputs identical across modes: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
