"""Kill a Ray Serve replica under load: do requests fail cleanly or get retried, does any hang,
is the replica replaced? (Issue 13's last target.)

    python benchmarks/ray_replica_kill.py BUNDLE [--replicas 2] [--concurrency 8] [--duration 60]
                                         [--kill-after 15] [--timeout-s 30] [--port 8123] [--out DIR]

Starts `aggdec serve BUNDLE --ray --replicas N` (a local Ray instance, loopback only), computes
offline greedy for the sentences, runs closed-loop clients (the load test's own loop: every
answer checked against greedy), and ``--kill-after`` seconds into the load sends SIGKILL to one
replica's worker process (found through Ray's state API). It then polls until N replicas are
alive again. Writes ``replica_kill.json`` and prints it: statuses, ok/wrong/lost, latency
percentiles and the longest request, the killed PID, and the seconds until the replacement
replica was up. Exit status 1 if any answer was wrong or any request outlived the client
timeout (a hang).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPLICA_CLASS = "ServeReplica:aggdec:AggdecServer"


def _alive_replicas() -> list[int]:
    """The PIDs of the live replica actors. From the GCS actor table: Ray's state API needs the
    dashboard, which `aggdec serve --ray` does not start."""
    from ray._private.state import actors

    return [info["Pid"] for info in actors(actor_state_name="ALIVE").values()
            if info["ActorClassName"] == REPLICA_CLASS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--kill-after", type=float, default=15.0)
    parser.add_argument("--timeout-s", type=float, default=30.0, help="client timeout: a request past it hung")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--limit", type=int, default=256, help="distinct sentences cycled through")
    parser.add_argument("--out", default="replica-kill-out")
    args = parser.parse_args(argv)

    import httpx
    import ray

    from aggdec.sentences import load_examples
    from aggdec.runtime.generator import Generator
    from aggdec.serve.loadtest import run_step

    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen([sys.executable, "-m", "aggdec", "serve", args.bundle, "--ray", "--replicas",
                               str(args.replicas), "--port", str(args.port), "--threads", "1"],
                              env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},  # a local Ray
                              start_new_session=True)
    try:
        generator = Generator(args.bundle, threads=1)
        texts = [e.source for e in load_examples("uagec-test", limit=args.limit) if generator.check(e.source) is None]
        want = [list(r.ids) for r in generator.generate(texts, mode="greedy", batch_size=32)]
        del generator
        deadline = time.monotonic() + 300
        while True:  # Ray, Serve's controller and proxy, then the replicas (each loads and warms the bundle)
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not come up (exit status {server.poll()})")
            time.sleep(1)
        ray.init(address="auto", log_to_driver=False)  # the instance `aggdec serve --ray` started
        while len(_alive_replicas()) < args.replicas:
            time.sleep(1)
        events: dict = {}

        def kill_one() -> None:
            time.sleep(args.kill_after)
            victim = _alive_replicas()[0]
            events["killed_pid"] = victim
            events["killed_at_s"] = args.kill_after
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            while True:  # the controller notices the dead actor and starts another
                alive = [pid for pid in _alive_replicas() if pid != victim]
                if len(alive) >= args.replicas:
                    events["replaced_after_s"] = round(time.monotonic() - killed, 1)
                    return
                if time.monotonic() - killed > 180:
                    events["replaced_after_s"] = None
                    return
                time.sleep(0.5)

        killer = threading.Thread(target=kill_one, daemon=True)
        killer.start()
        step = asyncio.run(run_step(url, texts, want, args.concurrency, args.duration, 10**9, 1, {"mode": "iad"},
                                    args.timeout_s))
        killer.join(timeout=200)
        summary = step.summary()
        report = {"bundle": args.bundle, "replicas": args.replicas, "concurrency": args.concurrency,
                  "duration_s": args.duration, "client_timeout_s": args.timeout_s, **events, "load": summary,
                  "longest_ms": round(max(step.latencies_ms), 1) if step.latencies_ms else None,
                  "hung": summary["statuses"].get("ReadTimeout", 0) + summary["statuses"].get("TimeoutException", 0)}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "replica_kill.json").write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
        return 1 if step.wrong or report["hung"] else 0
    finally:
        try:
            ray.shutdown()
        except Exception:  # not connected
            pass
        os.killpg(server.pid, signal.SIGTERM)  # the server deletes the app and stops its local Ray
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    raise SystemExit(main())
