"""`aggdec loadtest URL --bundle DIR`: closed-loop clients against `aggdec serve`, every answer
checked against offline greedy decoding of the same text with the same bundle.

Each step runs N clients for a fixed time; a client sends its next request as soon as the last
is answered (a closed loop: the offered load adapts to the server, as real callers' does). A
refused request (429, 503) is retried after a 10 ms pause, so that an overloaded server is not
hammered in a tight loop. Steps are bounded in time (``duration``, and the client timeout for
the requests in flight at its end) and in requests (``max_requests``). Traffic goes to loopback
only: the URL's host must resolve to loopback addresses.

Verdicts per response: *ok* (200, every output equals greedy's ids), *wrong* (200 with an output
that differs, or an item error), *lost* (no HTTP response: connection error or client timeout,
or a 500). Other statuses (413, 422, 429, 503, 504) are counted by status. The run fails (exit
status 1) on any wrong or lost response.

Everything given on the command line (the bundle, the data, the report's directory) is checked
before the server is contacted: a run takes minutes, and a report directory found unwritable
only at its end lost them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from aggdec.report_dir import report_dir
from aggdec.runtime.errors import InputError
from aggdec.runtime.options import Mode

LOSSLESS = (Mode.GREEDY, Mode.IAD, Mode.GAD)  # modes whose output must equal greedy's
REFUSED_PAUSE = 0.01


@dataclass
class Step:
    concurrency: int
    duration_s: float = 0.0  # from the first request sent to the last answer
    requests: int = 0
    ok: int = 0
    texts_ok: int = 0
    wrong: int = 0
    lost: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)  # of ok responses
    examples_wrong: list[str] = field(default_factory=list)
    # the load generator's own CPU (this process, user + system) over the step: on the server's
    # machine it is CPU the server does not get, so a report says how much it was
    client_cpu_s: float = 0.0

    @property
    def client_cores(self) -> float:
        """The load generator's CPU as a share of one core over the step."""
        return self.client_cpu_s / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def throughput(self) -> float:
        """Texts answered correctly per second."""
        return self.texts_ok / self.duration_s if self.duration_s > 0 else 0.0

    def percentile(self, q: float) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]

    def summary(self) -> dict:
        p50, p90, p99 = (self.percentile(q) for q in (50, 90, 99))
        return {"concurrency": self.concurrency, "duration_s": round(self.duration_s, 3), "requests": self.requests,
                "ok": self.ok, "texts_ok": self.texts_ok, "wrong": self.wrong, "lost": self.lost,
                "statuses": dict(sorted(self.statuses.items())), "throughput_texts_per_s": round(self.throughput, 2),
                "p50_ms": _round(p50), "p90_ms": _round(p90), "p99_ms": _round(p99),
                "p99_over_p50": _round(p99 / p50 if p50 else None, 2), "mean_ms": _round(
                    statistics.fmean(self.latencies_ms) if self.latencies_ms else None),
                "client_cpu_ms_per_request": _round(1000 * self.client_cpu_s / self.requests if self.requests else None,
                                                    2),
                "client_cores": round(self.client_cores, 3),
                "examples_wrong": self.examples_wrong[:5]}


def _offline(generator, texts: list[str], want: list[list[int]], args) -> dict:
    """Offline batched decoding of ``texts`` in the load test's mode: texts/s, and whether every
    output is greedy's."""
    started = time.perf_counter()
    results = generator.generate(texts, mode=args.mode, batch_size=args.offline_batch,
                                 max_new_tokens=args.max_new_tokens)
    seconds = time.perf_counter() - started
    return {"batch_size": args.offline_batch, "threads": args.threads, "seconds": round(seconds, 3),
            "texts_per_s": round(len(texts) / seconds, 2),
            "identical_to_greedy": sum(list(r.ids) == w for r, w in zip(results, want)) == len(want)}


def _spread(generator, texts: list[str], args) -> dict:
    """The spread of the work itself: each sentence decoded alone (batch 1), p50 and p99 of its
    decode time, of its output tokens (which no load changes) and of its verifier calls (which
    depend on draft lengths, sized from measured call costs, so a little on the machine). A
    served request's latency is its share of the calls that decode it, so no schedule that
    serves each text by its own work brings served p99/p50 far below these."""
    results = generator.generate(texts, mode=args.mode, batch_size=1, max_new_tokens=args.max_new_tokens)
    spread = {}
    # the time keys keep the names reports had before tokens and calls were added
    for unit, ratio, values in (("ms", "batch1_p99_over_p50", [1000 * r.stats.total_seconds for r in results]),
                                ("tokens", "batch1_tokens_p99_over_p50", [len(r.ids) for r in results]),
                                ("calls", "batch1_calls_p99_over_p50", [r.stats.iterations for r in results])):
        ordered = sorted(values)
        p50, p99 = (ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)] for q in (50, 99))
        spread[f"batch1_p50_{unit}"], spread[f"batch1_p99_{unit}"] = round(p50, 1), round(p99, 1)
        spread[ratio] = round(p99 / p50, 2) if p50 else None
    return spread


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """GET ``url``: its status and body (an HTTP error status is an answer, not an exception)."""
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        raise InputError(f"no server answers at {url}: {getattr(exc, 'reason', exc)}.") from None


def check_loopback(url: str) -> str:
    """``url`` without a trailing slash, if its host is loopback; InputError otherwise."""
    try:  # a port out of range or not a number, an unclosed "[": ValueError from urlsplit or .port
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InputError(f"URL must look like http://127.0.0.1:8000, got {url!r} ({exc}).") from None
    if parts.scheme not in ("http",) or not parts.hostname:
        raise InputError(f"URL must look like http://127.0.0.1:8000, got {url!r}.")
    try:
        infos = socket.getaddrinfo(parts.hostname, port or 80, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise InputError(f"cannot resolve {parts.hostname!r}: {exc.strerror}.") from None
    addresses = {info[4][0] for info in infos}
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise InputError(f"the load test sends traffic to loopback only; {parts.hostname!r} resolves to "
                         f"{', '.join(sorted(addresses))}.")
    return url.rstrip("/")


async def run_step(url: str, texts: list[str], want: list[list[int]], concurrency: int, duration: float,
                   max_requests: int, per_request: int, options: dict, timeout: float) -> Step:
    """One step: ``concurrency`` closed-loop clients for ``duration`` seconds (at most
    ``max_requests`` requests), every answer checked against ``want``.

    The clients share one aiohttp session. The load generator runs on the server's machine (the
    traffic is loopback), so its own CPU is taken from the server: httpx's async client spent
    about 6 CPU ms a request on the 2-core machine the project measures on, half a core at 80
    requests/s, and aiohttp's under 1 ms (benchmarks/results/serve-client-cpu)."""
    import aiohttp

    step = Step(concurrency)
    endpoint = f"{url}/v1/generate"
    state = {"next": 0, "sent": 0}
    cpu_before = time.process_time()
    started = time.perf_counter()
    deadline = started + duration
    last_answer = started

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal last_answer
        while time.perf_counter() < deadline and state["sent"] < max_requests:
            first = state["next"]
            state["next"] = (first + per_request) % len(texts)
            state["sent"] += 1
            chosen = [(first + j) % len(texts) for j in range(per_request)]
            sent = time.perf_counter()
            try:
                async with http.post(endpoint, json={"texts": [texts[i] for i in chosen], **options}) as response:
                    status = response.status
                    body = await response.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                step.requests += 1
                step.lost += 1
                kind = "Timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
                step.statuses[kind] = step.statuses.get(kind, 0) + 1
                continue
            answered = time.perf_counter()
            last_answer = max(last_answer, answered)
            step.requests += 1
            key = str(status)
            step.statuses[key] = step.statuses.get(key, 0) + 1
            if status == 500:
                step.lost += 1
            elif status != 200:
                if status in (429, 503):
                    await asyncio.sleep(REFUSED_PAUSE)
                continue
            else:
                try:
                    outputs = json.loads(body).get("outputs", [])
                    got = [item.get("ids") for item in outputs]
                except (ValueError, AttributeError):  # not JSON, or not the response's shape
                    step.lost += 1
                    continue
                if len(got) != len(chosen):
                    step.lost += 1
                elif got != [want[i] for i in chosen]:
                    step.wrong += 1
                    bad = next(j for j, i in enumerate(chosen) if got[j] != want[i])
                    step.examples_wrong.append(f"{texts[chosen[bad]]!r}: got {got[bad]}, greedy {want[chosen[bad]]}")
                else:
                    step.ok += 1
                    step.texts_ok += len(chosen)
                    step.latencies_ms.append(1000 * (answered - sent))

    # one connection per client, kept alive; aiohttp turns Nagle off on its sockets
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    step.duration_s = last_answer - started
    step.client_cpu_s = time.process_time() - cpu_before
    return step


def _markdown(report: dict) -> str:
    lines = [f"# aggdec load test: {report['url']}", "",
             f"Mode `{report['mode']}`, {report['texts_per_request']} text(s) per request, {report['sentences']} "
             f"distinct sentences ({report['data']}), {report['duration_s']:g} s per step, closed-loop clients. "
             f"Every 200 is checked against offline greedy on the same bundle. The load generator runs on the "
             f"server's machine: its CPU (last column) is CPU the server did not get.", "",
             "| clients | requests | ok | texts/s | p50 ms | p90 ms | p99 ms | p99/p50 | wrong | lost | statuses | "
             "load generator CPU ms / request (cores) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in report["steps"]:
        statuses = ", ".join(f"{k}: {v}" for k, v in s["statuses"].items())
        lines.append(f"| {s['concurrency']} | {s['requests']} | {s['ok']} | {s['throughput_texts_per_s']} | "
                     f"{s['p50_ms']} | {s['p90_ms']} | {s['p99_ms']} | {s['p99_over_p50']} | {s['wrong']} | "
                     f"{s['lost']} | {statuses} | {s['client_cpu_ms_per_request']} ({s['client_cores']}) |")
    offline = report.get("offline")
    if offline:
        lines += ["", f"Offline `{report['mode']}` at batch {offline['batch_size']} on the same {report['sentences']} "
                      f"sentences (Generator.generate, {offline['threads']} thread(s)): "
                      f"{offline['texts_per_s']} texts/s, identical to greedy: {offline['identical_to_greedy']}. Each "
                      f"sentence alone (batch 1): p50 {offline['batch1_p50_ms']} ms, p99 {offline['batch1_p99_ms']} ms, "
                      f"p99/p50 {offline['batch1_p99_over_p50']}; its output tokens: p50 {offline['batch1_p50_tokens']}, "
                      f"p99 {offline['batch1_p99_tokens']}, p99/p50 {offline['batch1_tokens_p99_over_p50']}; its verifier "
                      f"calls: p50 {offline['batch1_p50_calls']}, p99 {offline['batch1_p99_calls']}, p99/p50 "
                      f"{offline['batch1_calls_p99_over_p50']} (the spread of the work itself). Offline was timed "
                      f"before the steps ({offline['texts_per_s_before']} texts/s) and after them "
                      f"({offline['texts_per_s_after']}); served / offline is against their mean.", "",
                  "| clients | served / offline throughput |", "|---|---|"]
        for s in report["steps"]:
            lines.append(f"| {s['concurrency']} | {s['served_over_offline']}x |")
    lines += ["", f"Verdict: **{'PASS' if report['passed'] else 'FAIL'}** ({report['wrong']} wrong, "
                  f"{report['lost']} lost).", "", f"Command: `{report['command']}`", ""]
    return "\n".join(lines)


def _plot(report: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = [s for s in report["steps"] if s["p50_ms"] is not None]
    if not steps:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    x = [s["throughput_texts_per_s"] for s in steps]
    for key, style in (("p50_ms", "o-"), ("p90_ms", "s--"), ("p99_ms", "^:")):
        ax.plot(x, [s[key] for s in steps], style, label=key.replace("_ms", ""))
    for s in steps:
        ax.annotate(f"c={s['concurrency']}", (s["throughput_texts_per_s"], s["p50_ms"]),
                    textcoords="offset points", xytext=(4, -12), fontsize=8)
    if report.get("offline"):
        ax.axvline(report["offline"]["texts_per_s"], color="grey", lw=0.8,
                   label=f"offline batch {report['offline']['batch_size']}")
    ax.set_xlabel("throughput (texts/s, answered and correct)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"aggdec serve, mode {report['mode']}: latency against throughput")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(report: dict, out: Path) -> None:
    """loadtest.json, loadtest.md and loadtest.png in ``out``; an OSError (the disk filled, the
    directory went away during the run) is one InputError naming the directory."""
    try:
        (out / "loadtest.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (out / "loadtest.md").write_text(_markdown(report), encoding="utf-8")
        _plot(report, out / "loadtest.png")
    except OSError as exc:
        raise InputError(f"cannot write the report to {str(out)!r}: {exc.strerror or exc} (its table went to "
                         "stdout).") from None


def run_from_args(args) -> int:
    from aggdec.sentences import load_examples
    from aggdec.runtime.generator import Generator

    if args.mode not in LOSSLESS:
        raise InputError(f"mode {args.mode!r}: the load test checks every output against greedy, so it runs "
                         f"{', '.join(LOSSLESS)} only.")
    url = check_loopback(args.url)
    # what the command line names is checked before the server is asked anything: with no server
    # up, a missing bundle was reported as "no server answers"
    generator = Generator(args.bundle, threads=args.threads)
    examples = load_examples(args.data, limit=args.limit)
    out = report_dir(args.out)
    ready_status, ready_body = _get(f"{url}/readyz")
    if ready_status != 200:
        raise InputError(f"{url}/readyz answered {ready_status}: {ready_body[:200]}")
    import hashlib

    sha = hashlib.sha256((generator.root / "manifest.json").read_bytes()).hexdigest()
    try:
        served = json.loads(ready_body).get("manifest_sha256")
    except (ValueError, AttributeError):
        raise InputError(f"{url}/readyz is not aggdec's: it answered {ready_body[:200]!r}") from None
    if served and served != sha:
        raise InputError(f"the server runs another bundle (manifest sha256 {served[:12]}...) than {args.bundle!r} "
                         f"({sha[:12]}...); the greedy reference would not apply.")
    texts = [e.source for e in examples if generator.check(e.source) is None]
    skipped = len(examples) - len(texts)
    print(f"aggdec: loadtest: greedy reference for {len(texts)} sentences ({skipped} refused by the bundle)",
          file=sys.stderr, flush=True)
    want = [list(r.ids) for r in generator.generate(texts, mode="greedy", batch_size=32,
                                                    max_new_tokens=args.max_new_tokens)]
    offline = None
    if args.offline_batch > 0:
        offline = _offline(generator, texts, want, args)
        offline.update(_spread(generator, texts, args))
        print(f"aggdec: loadtest: offline {args.mode} at batch {args.offline_batch}: {offline['texts_per_s']} texts/s; "
              f"alone (batch 1): p50 {offline['batch1_p50_ms']} ms, p99 {offline['batch1_p99_ms']} ms",
              file=sys.stderr, flush=True)
    options = {"mode": args.mode}
    if args.max_new_tokens is not None:
        options["max_new_tokens"] = args.max_new_tokens
    steps = []
    for concurrency in args.concurrency:
        step = asyncio.run(run_step(url, texts, want, concurrency, args.duration, args.max_requests,
                                    args.texts_per_request, options, args.timeout_s))
        steps.append(step.summary())
        summary = steps[-1]
        print(f"aggdec: loadtest: {concurrency} clients: {summary['throughput_texts_per_s']} texts/s, p50 "
              f"{summary['p50_ms']} ms, p99 {summary['p99_ms']} ms, statuses {summary['statuses']}, "
              f"{step.wrong} wrong, {step.lost} lost; load generator {summary['client_cores']:.2f} of a core",
              file=sys.stderr, flush=True)
    if offline:
        # timed again after the steps: a shared machine's speed drifts over a run of minutes,
        # and served/offline would otherwise carry that drift; each step is compared with the
        # mean of the two offline runs, and both are reported
        again = _offline(generator, texts, want, args)
        offline["texts_per_s_before"], offline["texts_per_s_after"] = offline["texts_per_s"], again["texts_per_s"]
        offline["seconds_after"] = again["seconds"]  # "seconds" stays the run before the steps
        offline["identical_to_greedy"] = offline["identical_to_greedy"] and again["identical_to_greedy"]
        offline["texts_per_s"] = round((offline["texts_per_s_before"] + offline["texts_per_s_after"]) / 2, 2)
        for summary in steps:
            summary["served_over_offline"] = round(summary["throughput_texts_per_s"] / offline["texts_per_s"], 2)
    del generator
    wrong, lost = sum(s["wrong"] for s in steps), sum(s["lost"] for s in steps)
    report = {"url": url, "bundle": str(args.bundle), "manifest_sha256": sha, "mode": args.mode, "data": args.data,
              "sentences": len(texts), "refused_by_bundle": skipped, "texts_per_request": args.texts_per_request,
              "duration_s": args.duration, "offline": offline, "steps": steps, "wrong": wrong, "lost": lost,
              "passed": wrong == 0 and lost == 0,
              "command": "aggdec loadtest " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["loadtest"] else "",
              "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                          "cpus": os.cpu_count()}}
    print(_markdown(report), flush=True)  # first: if the files below cannot be written, the table is not lost
    write_report(report, out)
    return 0 if report["passed"] else 1
