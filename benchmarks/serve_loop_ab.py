"""Two tunings of the decode loop fed like a server (closed loop, texts in arrival order, a queue
that is never closed), alternating in one process on the same sentences: texts per second,
each text's latency (put to finished) p50/p99, verifier calls and their mean rows, and every
output checked against greedy.

    python benchmarks/serve_loop_ab.py BUNDLE --a KEY=VALUE ... --b KEY=VALUE ...
                                      [--limit 512] [--concurrency 32 8] [--slots 32] [--rounds 4]

A KEY is a :class:`Tuning` field on top of the CPU profile (``length_classes=32,64``, ...), as in
``ab.py``. Each round runs A then B, or B then A (alternating), at each concurrency, one pass
over the sentences each. Exit status 1 if an output differs from greedy (a bug: tuning changes
speed, never an output).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import numpy as np

import aggdec.runtime.decoding.verifier as verifier_module
from aggdec import Generator
from aggdec.runtime.continuous import RowDecoder
from aggdec.runtime.decoding.arrivals import Arrivals, Work
from aggdec.runtime.tuning import Tuning, tuning_for
from aggdec.sentences import load_examples
from ab import parse_value, side_settings


class Calls:
    """Counts verifier calls and their rows (wraps Batch.verify, which runs as always)."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.by_batch: dict[int, list[int]] = {}  # rows of each call, by the batch (cohort) it served
        original = verifier_module.Batch.verify
        calls = self

        def verify(batch, tokens):
            calls.rows.append(tokens.shape[0])
            calls.by_batch.setdefault(id(batch), []).append(tokens.shape[0])
            return original(batch, tokens)

        verifier_module.Batch.verify = verify


def closed_loop(generator: Generator, ids: list[list[int]], concurrency: int, slots: int,
                linger: float) -> tuple[float, list[float], dict[int, tuple[int, ...]]]:
    """One pass over ``ids`` with ``concurrency`` texts in flight, each replaced by the next as
    it finishes: texts per second, each text's latency in seconds, each text's output ids."""
    work = Arrivals()
    decoder = RowDecoder(generator)
    rows = decoder.rows(work, "iad", slots, linger=linger)
    put_at: dict[int, float] = {}
    latency: list[float] = []
    outputs: dict[int, tuple[int, ...]] = {}
    sent = 0

    def send() -> None:
        nonlocal sent
        put_at[sent] = time.perf_counter()
        work.put(Work(sent, ids[sent]))
        sent += 1

    started = time.perf_counter()
    for _ in range(min(concurrency, len(ids))):
        send()
    for done in rows:
        latency.append(time.perf_counter() - put_at[done.index])
        outputs[done.index] = decoder.result(done).ids
        if len(outputs) == len(ids):
            break
        if sent < len(ids):
            send()
    seconds = time.perf_counter() - started
    work.abandon()
    for _ in rows:  # let the loop return (it stops after its current call)
        pass
    return len(ids) / seconds, latency, outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--a", nargs="*", default=[], help="KEY=VALUE tuning fields of side A")
    parser.add_argument("--b", nargs="*", default=[], help="KEY=VALUE tuning fields of side B")
    parser.add_argument("--limit", type=int, default=512)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 8])
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    defaults = {f.name: f.default for f in dataclasses.fields(Tuning)}
    sides = {}
    for name, pairs in (("A", args.a), ("B", args.b)):
        fields = {key: parse_value(value, defaults[key]) for key, value in side_settings(pairs).items()}
        sides[name] = (fields, Generator(args.bundle, threads=args.threads, tuning=tuning_for("cpu").replace(**fields)))
    texts = [e.source for e in load_examples("uagec-test", limit=args.limit)]
    ids = [RowDecoder(sides["A"][1]).prepare(text)[1] for text in texts]
    greedy = [r.ids for r in sides["A"][1].generate(texts, mode="greedy", batch_size=args.slots)]
    for _, generator in sides.values():
        generator.generate(texts[:8], mode="iad")  # warm-up
    calls = Calls()
    print(f"{len(texts)} UA-GEC test sentences, IAD, {args.threads} thread(s), {args.slots} slots, "
          f"{args.rounds} rounds; A: {sides['A'][0] or 'default'}; B: {sides['B'][0] or 'default'}")
    results: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    wrong = 0
    for round_ in range(args.rounds):
        order = ("A", "B") if round_ % 2 == 0 else ("B", "A")
        for concurrency in args.concurrency:
            for name in order:
                calls.rows.clear()
                calls.by_batch.clear()
                rate, latency, outputs = closed_loop(sides[name][1], ids, concurrency, args.slots, 0.005)
                wrong += sum(outputs[i] != tuple(greedy[i]) for i in range(len(ids)))
                lat = np.array(latency) * 1000
                p50, p99 = np.percentile(lat, 50), np.percentile(lat, 99)
                results.setdefault((name, concurrency), []).append((rate, p50, p99, float(np.mean(calls.rows))))
                print(f"round {round_ + 1} {name} c={concurrency:>2}: {rate:6.1f} texts/s, p50 {p50:6.1f} ms, "
                      f"p99 {p99:7.1f} ms, {len(calls.rows)} calls of {np.mean(calls.rows):.1f} rows; by batch: "
                      + ", ".join(f"{len(r)} of {np.mean(r):.1f}" for r in calls.by_batch.values()), flush=True)
    print("medians over rounds:")
    for concurrency in args.concurrency:
        med = {name: [statistics.median(v) for v in zip(*results[(name, concurrency)])] for name in ("A", "B")}
        for name in ("A", "B"):
            rate, p50, p99, rows = med[name]
            print(f"  c={concurrency:>2} {name}: {rate:6.1f} texts/s, p50 {p50:6.1f} ms, p99 {p99:7.1f} ms "
                  f"(p99/p50 {p99 / p50:.2f}), {rows:.1f} rows a call")
        ratios = [b[0] / a[0] for a, b in zip(results[("A", concurrency)], results[("B", concurrency)])]
        print(f"  c={concurrency:>2} B/A texts/s per round: {' '.join(f'{r:.3f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.3f}")
    print(f"outputs differing from greedy: {wrong} of {len(ids) * args.rounds * len(args.concurrency) * 2}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
