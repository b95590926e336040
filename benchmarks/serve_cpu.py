"""Where CPU goes while closed-loop clients drive `aggdec serve` (Linux): per server thread, its
time on a CPU, waiting for one (the run queue) and off it (blocked: the GIL, a lock, no work),
and the load generator's own CPU; beside it, offline IAD's CPU per text in this process.

A served/offline throughput ratio on a shared machine mixes the server's own cost with how
much CPU its threads get: the decode thread competes with the event loop, the load generator
and whatever else runs. The scheduler's counters (/proc/PID/task/TID/schedstat) separate the
two: CPU milliseconds per text are the server's cost; a thread that waits for a CPU is starved
by the machine, one that is off CPU waits on something in the server.

    aggdec serve BUNDLE --port 8731 --threads 1 --mode iad --max-batch 32 --max-wait-ms 5 &
    python benchmarks/serve_cpu.py BUNDLE --pid $! [--url http://127.0.0.1:8731] [--concurrency 32]
                                   [--duration 20] [--limit 512]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import time

from aggdec import Generator
from aggdec.sentences import load_examples
from aggdec.serve.loadtest import check_loopback, run_step


def thread_times(pid: int) -> dict[str, tuple[float, float]]:
    """Per thread of ``pid``: (seconds on a CPU, seconds runnable and waiting for one)."""
    times = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                on_cpu, waiting, _ = handle.read().split()
        except FileNotFoundError:  # the thread ended
            continue
        times[tid] = (int(on_cpu) / 1e9, int(waiting) / 1e9)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", help="the bundle the server runs (greedy reference, offline timing)")
    parser.add_argument("--pid", type=int, required=True, help="the server's process id")
    parser.add_argument("--url", default="http://127.0.0.1:8731")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--limit", type=int, default=512)
    parser.add_argument("--mode", default="iad")
    args = parser.parse_args()
    url = check_loopback(args.url)
    generator = Generator(args.bundle, threads=1)
    texts = [e.source for e in load_examples("uagec-test", limit=args.limit) if generator.check(e.source) is None]
    want = [list(r.ids) for r in generator.generate(texts, mode="greedy", batch_size=32)]
    cpu, wall = time.process_time(), time.perf_counter()
    generator.generate(texts, mode=args.mode, batch_size=32)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"offline {args.mode} at batch 32, this process: {len(texts) / wall:.1f} texts/s, "
          f"{1000 * cpu / len(texts):.2f} CPU ms per text ({cpu / wall:.0%} of a core)")
    del generator

    before, own = thread_times(args.pid), resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    step = asyncio.run(run_step(url, texts, want, args.concurrency, args.duration, 10**6, 1, {"mode": args.mode}, 60))
    elapsed = time.perf_counter() - started
    after, own_after = thread_times(args.pid), resource.getrusage(resource.RUSAGE_SELF)
    done = max(step.texts_ok, 1)
    print(f"served, {args.concurrency} clients: {step.throughput:.1f} texts/s, {step.texts_ok} texts in {elapsed:.1f} s, "
          f"{step.wrong} wrong, {step.lost} lost")
    for tid, (on_cpu, waiting) in sorted(after.items(), key=lambda item: -item[1][0]):
        on_cpu -= before.get(tid, (0.0, 0.0))[0]
        waiting -= before.get(tid, (0.0, 0.0))[1]
        if on_cpu < 0.05:
            continue
        print(f"  server thread {tid}: on a CPU {on_cpu:.2f} s ({1000 * on_cpu / done:.2f} ms per text), waiting for "
              f"one {waiting:.2f} s, off CPU {max(0.0, elapsed - on_cpu - waiting):.2f} s")
    client = (own_after.ru_utime + own_after.ru_stime) - (own.ru_utime + own.ru_stime)
    print(f"  load generator: {client:.2f} CPU s ({1000 * client / done:.2f} ms per text)")
    with open("/proc/loadavg") as handle:
        print(f"  load average: {' '.join(handle.read().split()[:3])}")


if __name__ == "__main__":
    main()
