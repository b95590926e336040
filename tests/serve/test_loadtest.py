"""`aggdec loadtest` against a real server: a clean run passes, a wrong answer fails it,
traffic to anything but loopback is refused, and what the command line names (bundle, data,
report directory) is checked before the server is asked anything."""

from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("fastapi")

from aggdec.cli import main  # noqa: E402
from aggdec.runtime.generator import Generator  # noqa: E402
from aggdec.runtime.errors import InputError  # noqa: E402
from aggdec.serve.loadtest import check_loopback, run_step, write_report  # noqa: E402
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
        # the load generator's own CPU: it did work for every request. Here the test's server
        # decodes in the same process, so its CPU counts too: at most the CPUs this process may
        # run on (one under the suite's pinned workers, both when run alone), a little over for
        # rounding
        cores = len(os.sched_getaffinity(0))
        assert step["client_cpu_ms_per_request"] > 0 and 0 < step["client_cores"] < cores + 0.5
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
    # the same report where it cannot be written any more (the directory turned into a file during
    # the run): one error naming it, not an OSError traceback
    with pytest.raises(InputError, match=r"cannot write the report to .*loadtest.md': Not a directory"):
        write_report(report, out / "loadtest.md")


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


def _one_error(capsys, argv: list[str], needle: str) -> None:
    """`aggdec ARGV` in this process: exit 2 and one `aggdec: error:` line that says ``needle``."""
    code = main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("aggdec: error:"), lines
    assert needle in lines[0], lines[0]


def _generate_requests(running) -> float:
    return sum(sample.value for family in running.state.metrics.registry.collect() for sample in family.samples
               if sample.name == "aggdec_request_duration_seconds_count")


@pytest.mark.parametrize("where, needle", [
    ("/proc/aggdec-loadtest", "No such file or directory"),  # /proc takes no new directory
    ("/dev/full", "it is not a directory"),
    ("FILE/report", "Not a directory"),  # under a regular file
])
def test_a_report_directory_that_cannot_be_written_is_refused_before_any_request(setup, tmp_path, capsys, where,
                                                                                 needle):
    """It was made only after every step had run (minutes with the defaults), and then failed
    with an OSError traceback: the whole run and its results lost."""
    root, _, data, running = setup
    if where.startswith("/") and not os.path.exists(where if where == "/dev/full" else "/proc/self"):
        pytest.skip(f"no {where} here")  # else it would be made: a directory where none belongs
    (tmp_path / "FILE").write_text("a file\n")
    out = where.replace("FILE", str(tmp_path / "FILE"))
    before = _generate_requests(running)
    _one_error(capsys, ["loadtest", running.url, "--bundle", str(root), "--data", str(data), "--concurrency", "1",
                        "--duration", "1", "--max-requests", "2", "--offline-batch", "0", "--out", out],
               f"cannot write to --out {out!r}: {needle}")
    assert _generate_requests(running) == before  # no step ran


def test_with_no_server_up_a_bad_bundle_data_or_out_is_named_not_the_server(setup, tmp_path, capsys):
    """The command line's own arguments are checked before the server is asked for /readyz: with
    no server up, a missing bundle was reported as "no server answers"."""
    root, _, data, _ = setup
    with socket.socket() as held:  # a port bound and not listening: a connection to it is refused
        held.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{held.getsockname()[1]}"
        good = ["--data", str(data), "--out", str(tmp_path / "out")]
        _one_error(capsys, ["loadtest", url, "--bundle", str(tmp_path / "nope"), *good],
                   f"bundle directory {str(tmp_path / 'nope')!r} does not exist")
        _one_error(capsys, ["loadtest", url, "--bundle", str(root), "--data", str(tmp_path / "none.txt"),
                            "--out", str(tmp_path / "out")], "data file")
        _one_error(capsys, ["loadtest", url, "--bundle", str(root), "--data", str(data), "--out", "/dev/full"],
                   "cannot write to --out '/dev/full'")
        _one_error(capsys, ["loadtest", url, "--bundle", str(root), *good], f"no server answers at {url}/readyz")
