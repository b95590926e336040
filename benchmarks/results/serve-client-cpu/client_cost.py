"""The load generator's own CPU per request: httpx's async client (what `aggdec loadtest` used
before) against aiohttp's (what it uses now), the same closed loop against the same server,
alternating.

    aggdec serve BUNDLE --port 8731 --threads 1 --mode iad --max-batch 32 --max-wait-ms 5 &
    python client_cost.py [--url http://127.0.0.1:8731] [--rounds 2] [--duration 15] [--concurrency 32]

Each client posts one UA-GEC test sentence, reads the answer and posts the next; the process's
user+system CPU seconds over the step, divided by the requests answered, is the client's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

from aggdec.sentences import load_examples


async def with_httpx(url: str, texts: list[str], concurrency: int, duration: float) -> int:
    import httpx

    answered = 0
    state = {"next": 0}
    deadline = time.perf_counter() + duration
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:
        async def client() -> None:
            nonlocal answered
            while time.perf_counter() < deadline:
                i = state["next"]
                state["next"] = (i + 1) % len(texts)
                response = await http.post("/v1/generate", json={"texts": [texts[i]], "mode": "iad"})
                answered += len(response.json()["outputs"])

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return answered


async def with_aiohttp(url: str, texts: list[str], concurrency: int, duration: float) -> int:
    import aiohttp

    answered = 0
    state = {"next": 0}
    deadline = time.perf_counter() + duration
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        async def client() -> None:
            nonlocal answered
            while time.perf_counter() < deadline:
                i = state["next"]
                state["next"] = (i + 1) % len(texts)
                async with http.post(f"{url}/v1/generate", json={"texts": [texts[i]], "mode": "iad"}) as response:
                    answered += len((await response.json())["outputs"])

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return answered


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8731")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--limit", type=int, default=512)
    args = parser.parse_args()
    texts = [e.source for e in load_examples("uagec-test", limit=args.limit)]
    for _ in range(args.rounds):
        for name, step in (("httpx", with_httpx), ("aiohttp", with_aiohttp)):
            cpu, wall = cpu_seconds(), time.perf_counter()
            answered = asyncio.run(step(args.url, texts, args.concurrency, args.duration))
            cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
            print(f"{name:8s} {args.concurrency} clients: {answered} answered, {answered / wall:.1f} texts/s, "
                  f"client {1000 * cpu / answered:.2f} CPU ms per request; load average "
                  f"{open('/proc/loadavg').read().split()[0]}", flush=True)


if __name__ == "__main__":
    main()
