"""Where served throughput goes, without HTTP: the decode loop fed like a server (closed loop,
texts in arrival order, a queue that is never closed) against Generator.generate (all texts
known, sorted by length), on the same sentences, in one process, with and without the loop's
measures for mixed lengths (cohorts by source length, encoder calls by length).

    python benchmarks/serve_closed_loop.py BUNDLE [--limit 512] [--concurrency 32] [--slots 32] [--passes 2]

For each variant it prints texts per second, the encoder's and the verifier's seconds, and the
verifier calls with their mean rows, cache span and source span (the positions every row of a
call attends over). "one batch" turns both measures off (the loop before them, except that
spans are given back in both: that cannot be turned off); "cohorts" is the default on the CPU.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import aggdec.runtime.decoding.verifier as verifier_module
from aggdec import Generator
from aggdec.sentences import load_examples
from aggdec.runtime.continuous import RowDecoder
from aggdec.runtime.decoding.arrivals import Arrivals, Work
from aggdec.runtime.tuning import tuning_for

VARIANTS = {
    # every joining text in one encoder call, one cohort
    "one batch": tuning_for("cpu").replace(length_classes=(), encoder_call_tokens=10**9),
    "cohorts": tuning_for("cpu"),
}


class Calls:
    """Records each verifier call's rows and spans (wraps Batch.verify, which runs as always)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int]] = []
        original = verifier_module.Batch.verify
        calls = self

        def verify(batch, tokens):
            out = original(batch, tokens)
            calls.rows.append((tokens.shape[0], batch.buffers.capacity, batch.buffers.source_capacity))
            return out

        verifier_module.Batch.verify = verify

    def summary(self) -> str:
        if not self.rows:
            return "no call"
        a = np.array(self.rows, dtype=np.float64)
        return (f"{len(a)} calls, {a[:, 0].mean():.1f} rows, cache span {a[:, 1].mean():.0f}, "
                f"source span {a[:, 2].mean():.0f} (means per call)")


def closed_loop(generator: Generator, ids: list[list[int]], concurrency: int, slots: int, passes: int,
                linger: float) -> float:
    """Texts per second with ``concurrency`` texts in flight, each replaced by the next (in order,
    ``passes`` times over the list) as it finishes."""
    total = passes * len(ids)
    work = Arrivals()
    rows = RowDecoder(generator).rows(work, "iad", slots, linger=linger)
    sent = 0
    started = time.perf_counter()
    for _ in range(min(concurrency, total)):
        work.put(Work(sent, ids[sent % len(ids)]))
        sent += 1
    finished = 0
    for _ in rows:
        finished += 1
        if finished == total:
            break
        if sent < total:
            work.put(Work(sent, ids[sent % len(ids)]))
            sent += 1
    seconds = time.perf_counter() - started
    work.abandon()
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--limit", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--passes", type=int, default=2, help="closed loop: times over the sentences")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    generators = {name: Generator(args.bundle, threads=args.threads, tuning=tuning) for name, tuning in VARIANTS.items()}
    texts = [e.source for e in load_examples("uagec-test", limit=args.limit)]
    ids = [RowDecoder(generators["cohorts"]).prepare(text)[1] for text in texts]
    for generator in generators.values():
        generator.generate(texts[:8], mode="iad")  # warm-up
    calls = Calls()
    print(f"{len(texts)} UA-GEC test sentences, IAD, {args.threads} thread(s); closed loop: {args.concurrency} in "
          f"flight, {args.slots} slots, {args.passes} passes")
    for name, generator in generators.items():
        for run in ("offline", "closed loop"):
            calls.rows.clear()
            before = dict(generator.verifier.seconds)
            started = time.perf_counter()
            if run == "offline":
                generator.generate(texts, mode="iad", batch_size=args.slots)
                rate = len(texts) / (time.perf_counter() - started)
            else:
                rate = closed_loop(generator, ids, args.concurrency, args.slots, args.passes, 0.005)
            texts_done = len(texts) * (1 if run == "offline" else args.passes)
            spent = {k: (v - before[k]) / texts_done * 1000 for k, v in generator.verifier.seconds.items()}
            print(f"{name:>9} {run:>11}: {rate:6.1f} texts/s; per text: encoder {spent['encoder']:.2f} ms, "
                  f"verifier {spent['verifier']:.2f} ms; {calls.summary()}")


if __name__ == "__main__":
    main()
