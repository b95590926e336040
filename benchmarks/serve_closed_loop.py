"""Where served throughput goes, without HTTP: the decode loop fed like a server (closed loop,
texts in arrival order, never closed) against Generator.generate (all texts known, sorted by
length), on the same sentences, in one process.

    python benchmarks/serve_closed_loop.py BUNDLE [--limit 256] [--concurrency 32] [--slots 8 16 32]
"""

from __future__ import annotations

import argparse
import time

from aggdec import Generator
from aggdec.bench.data import load_examples
from aggdec.runtime.decoding.arrivals import Arrivals, Work


def closed_loop(generator: Generator, ids: list[list[int]], concurrency: int, slots: int, linger: float) -> float:
    """Texts per second with ``concurrency`` texts in flight, each replaced as it finishes."""
    work = Arrivals()
    rows = generator.decoder(work, "iad", slots, linger=linger)
    sent = 0
    started = time.perf_counter()
    for _ in range(min(concurrency, len(ids))):
        work.put(Work(sent, ids[sent]))
        sent += 1
    finished = 0
    for _ in rows:
        finished += 1
        if finished == len(ids):
            break
        if sent < len(ids):
            work.put(Work(sent, ids[sent]))
            sent += 1
    seconds = time.perf_counter() - started
    work.abandon()
    return len(ids) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--slots", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    generator = Generator(args.bundle, threads=args.threads)
    texts = [e.source for e in load_examples("uagec-test", limit=args.limit)]
    ids = [generator.prepare(text)[1] for text in texts]
    generator.generate(texts[:8], mode="iad")  # warm-up
    started = time.perf_counter()
    generator.generate(texts, mode="iad", batch_size=32)
    offline = len(texts) / (time.perf_counter() - started)
    print(f"offline iad, batch 32, sorted by length: {offline:.1f} texts/s")
    for slots in args.slots:
        rate = closed_loop(generator, ids, args.concurrency, slots, 0.005)
        print(f"closed loop, {args.concurrency} in flight, {slots} slots: {rate:.1f} texts/s ({rate / offline:.2f}x)")


if __name__ == "__main__":
    main()
