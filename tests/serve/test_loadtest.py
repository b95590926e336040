"""`aggdec loadtest` against a real server: a clean run passes, a wrong answer fails it,
traffic to anything but loopback is refused."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("fastapi")

from aggdec.cli import main  # noqa: E402
from aggdec.runtime.generator import Generator  # noqa: E402
from aggdec.runtime.errors import InputError  # noqa: E402
from aggdec.serve.loadtest import check_loopback, run_step  # noqa: E402
from tests.serve.running import Running  # noqa: E402

TEXTS = [f"w{i % 9 + 1} w{(i * 7) % 9 + 1} w{(i * 5) % 9 + 1}" + " w3" * (i % 3) for i in range(12)]


@pytest.fixture(scope="module")
def setup(bundle, tmp_path_factory):
    root = bundle("marian")
    generator = Generator(root, threads=1)
    data = tmp_path_factory.mktemp("loadtest") / "sources.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    with Running(generator, max_batch=4) as running:
        yield root, generator, data, running


def test_a_clean_run_passes_and_writes_its_report(setup, tmp_path):
    root, _, data, running = setup
    out = tmp_path / "report"
    status = main(["loadtest", running.url, "--bundle", str(root), "--data", str(data), "--concurrency", "1", "3",
                   "--duration", "1", "--max-requests", "15", "--max-new-tokens", "6", "--offline-batch", "4",
                   "--texts-per-request", "2", "--out", str(out)])
    assert status == 0
    report = json.loads((out / "loadtest.json").read_text())
    assert report["passed"] and report["wrong"] == 0 and report["lost"] == 0
    assert [s["concurrency"] for s in report["steps"]] == [1, 3]
    for step in report["steps"]:
        assert 1 <= step["requests"] <= 15 and step["ok"] == step["requests"] == step["statuses"]["200"]
        assert step["texts_ok"] == 2 * step["ok"]
        # the load generator's own CPU: it did work for every request, and at most one core's worth
        # (one event loop; a little over for the process's other threads and rounding)
        assert step["client_cpu_ms_per_request"] > 0 and 0 < step["client_cores"] < 1.5
    offline = report["offline"]
    assert offline["identical_to_greedy"]
    # offline is timed before and after the steps, and each step is compared with their mean
    assert offline["texts_per_s"] == pytest.approx((offline["texts_per_s_before"] + offline["texts_per_s_after"]) / 2,
                                                   abs=0.01)
    for step in report["steps"]:
        assert step["served_over_offline"] == round(step["throughput_texts_per_s"] / offline["texts_per_s"], 2)
    # the work's own spread, in units no other load changes: each text alone, as generate gives it
    alone = Generator(root, threads=1).generate(TEXTS, mode="iad", batch_size=1, max_new_tokens=6)
    tokens = sorted(len(r.ids) for r in alone)
    assert offline["batch1_p50_tokens"] == tokens[5] and offline["batch1_p99_tokens"] == tokens[-1]
    assert offline["batch1_tokens_p99_over_p50"] == round(tokens[-1] / tokens[5], 2)
    assert 1 <= offline["batch1_p50_calls"] <= offline["batch1_p99_calls"]
    assert "| clients |" in (out / "loadtest.md").read_text()
    assert (out / "loadtest.png").stat().st_size > 0


def test_a_wrong_answer_is_counted(setup):
    _, generator, _, running = setup
    want = [list(r.ids) for r in generator.generate(TEXTS, max_new_tokens=6)]
    want[0] = want[0][:-1] + [want[0][-1] + 1]  # what the server must not answer
    step = asyncio.run(run_step(running.url, TEXTS, want, 2, 30.0, 12, 1, {"mode": "iad", "max_new_tokens": 6}, 60))
    assert step.requests == 12 and step.wrong == 1 and step.ok == 11 and step.lost == 0
    assert TEXTS[0] in step.examples_wrong[0]


def test_only_loopback_is_a_target(tmp_path):
    assert check_loopback("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert check_loopback("http://localhost:8000") == "http://localhost:8000"
    for url in ("http://10.1.2.3:8000", "http://192.168.0.1", "https://127.0.0.1:8000", "ftp://127.0.0.1",
                # ValueError tracebacks from urlsplit and .port before
                "http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://[::1:8000"):
        with pytest.raises(InputError):
            check_loopback(url)
    assert main(["loadtest", "http://10.1.2.3:8000", "--bundle", str(tmp_path)]) == 2


@pytest.mark.parametrize("reply", [b"", b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nContent-Type: application/json\r\n\r\nnot json!"])
def test_a_dropped_connection_or_a_body_that_is_not_the_answer_is_lost(reply):
    """A server that closes the connection without answering, or answers 200 with a body that is
    not JSON: every request is lost (never ok, never wrong), and the step still ends."""

    async def scenario():
        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")  # the request's head; the body is never read
            writer.write(reply)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await run_step(f"http://127.0.0.1:{port}", TEXTS, [[1]] * len(TEXTS), 2, 30.0, 6, 1,
                                  {"mode": "iad"}, 10)

    step = asyncio.run(scenario())
    assert step.requests == 6 and step.lost == 6 and step.ok == 0 and step.wrong == 0
    assert sum(step.statuses.values()) == 6
