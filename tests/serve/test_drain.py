"""`aggdec serve` as a process: SIGTERM drains (requests in flight finish with their outputs,
new ones get 503, then exit 0); a missing bundle, or limits no request could meet, are one error
line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from aggdec.runtime.generator import Generator  # noqa: E402

TEXTS = [f"w{i % 9 + 1} w{(i * 3) % 9 + 1} w5 w6" for i in range(64)]


def start(*args: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-m", "aggdec", "serve", *args, "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = process.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not found:
        process.kill()
        raise AssertionError(f"no address in {line!r}: {process.stderr.read()}")
    return process, f"http://127.0.0.1:{found.group(1)}"


def wait_for(predicate, what: str, bound: float = 120) -> None:
    give_up = time.monotonic() + bound  # a bound on a hang, not a performance check
    while not predicate():
        assert time.monotonic() < give_up, f"never: {what}"
        time.sleep(0.01)


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0(bundle):
    root = bundle("marian")
    want = [list(r.ids) for r in Generator(root).generate(TEXTS, mode="greedy")]
    # one row per verifier call, so that the requests in flight take a while
    process, url = start(str(root), "--max-batch", "1", "--threads", "1", "--mode", "greedy")
    try:
        http = httpx.Client(base_url=url, timeout=120)
        wait_for(lambda: _ready(http), "ready")
        answers: list[httpx.Response] = []

        def long_request() -> None:
            with httpx.Client(base_url=url, timeout=120) as own:
                answers.append(own.post("/v1/generate", json={"texts": TEXTS}))

        clients = [threading.Thread(target=long_request) for _ in range(2)]
        for client in clients:
            client.start()
        wait_for(lambda: "aggdec_requests_in_flight 2.0" in http.get("/metrics").text, "2 requests in flight")
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: http.get("/readyz").status_code == 503, "readyz says draining")
        assert http.get("/readyz").json()["status"] == "draining"
        refused = httpx.post(f"{url}/v1/generate", json={"texts": ["w1"]}, timeout=60)
        assert refused.status_code == 503 and refused.json()["error"]["kind"] == "unavailable"
        assert refused.headers["Retry-After"] == "1"
        for client in clients:
            client.join(120)
        assert [a.status_code for a in answers] == [200, 200]
        for answer in answers:
            assert [item["ids"] for item in answer.json()["outputs"]] == want
        assert process.wait(timeout=60) == 0
        out = process.stdout.read()
        assert "draining (SIGTERM)" in out and "drained, 0 request(s) left" in out
    finally:
        process.kill()
        process.wait()


def _ready(http: httpx.Client) -> bool:
    try:
        return http.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def test_serve_refuses_a_missing_bundle_with_one_error_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "aggdec", "serve", str(tmp_path / "nope"), "--port", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("aggdec: error: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("missing, command", [("fastapi", ["serve", "B"]), ("uvicorn", ["serve", "B"]),
                                              ("aiohttp", ["loadtest", "http://127.0.0.1:1", "--bundle", "B"]),
                                              ("ray", ["serve", "B", "--ray"])])
def test_a_missing_extra_is_one_error_line(missing, command):
    script = (f"import sys; sys.modules[{missing!r}] = None\n"
              f"from aggdec.cli import main; raise SystemExit(main({command!r}))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("aggdec: error: `aggdec ") and result.stderr.count("\n") == 1
    assert f"({missing} is not installed)" in result.stderr


def test_the_listening_socket_says_tcp_so_that_asyncio_sets_tcp_nodelay():
    """With proto 0, asyncio leaves Nagle on, and each keep-alive response waited 40 ms for the
    client's delayed ACK."""
    import socket

    from aggdec.serve.server import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_serve_with_static_shapes_answers_greedys_tokens_in_every_lossless_mode(bundle):
    """`aggdec serve --static-shapes` (the Generator's static shapes, for GPUs: shared with
    `generate`) decodes every request's texts as greedy does; the process exits 0 on SIGTERM."""
    root = bundle("t5")
    texts = TEXTS[:6]
    want = [list(r.ids) for r in Generator(root).generate(texts, mode="greedy")]
    process, url = start(str(root), "--static-shapes", "--max-batch", "2", "--threads", "1", "--mode", "iad")
    try:
        http = httpx.Client(base_url=url, timeout=120)
        wait_for(lambda: _ready(http), "ready")
        assert http.get("/readyz").json()["static_shapes"] is True
        for mode in ("greedy", "iad"):
            answer = http.post("/v1/generate", json={"texts": texts, "mode": mode})
            assert answer.status_code == 200, answer.text
            assert [item["ids"] for item in answer.json()["outputs"]] == want, mode
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("args, needle", [(["--tf32"], "tf32 applies to device 'cuda'"),
                                          (["--cuda-graphs"], "unrecognized arguments: --cuda-graphs"),
                                          # its decode loops' buffers could never be made: the server started,
                                          # then answered 503 to everything (the warm-up's MemoryError)
                                          (["--max-batch", "1000000000"],
                                           "aggdec: error: --max-batch 1,000,000,000 needs cache buffers for")])
def test_serve_refuses_options_it_cannot_honour_before_listening(bundle, args, needle):
    result = subprocess.run([sys.executable, "-m", "aggdec", "serve", str(bundle("marian")), "--port", "0", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert needle in result.stderr and "serving" not in result.stdout


@pytest.mark.parametrize("ray", [False, True], ids=["uvicorn", "ray"])
def test_serve_refuses_max_texts_above_max_queue_before_loading_anything(tmp_path, ray):
    """A request of more texts than the queue holds could never be queued: its 429 told the client
    to retry for ever, even on an idle server. Refused at startup with one line naming both, `--ray`
    too, before the bundle is loaded (a missing one here: its own error would come first) or Ray
    is started."""
    result = subprocess.run([sys.executable, "-m", "aggdec", "serve", str(tmp_path / "nope"), "--port", "0",
                             "--max-queue", "10", "--max-texts", "12", *(["--ray"] if ray else [])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr == ("aggdec: error: --max-texts 12 is above --max-queue 10: a request of more texts than "
                             "the queue holds could never be admitted; give --max-texts 10 or less, or a larger "
                             "--max-queue.\n")
    assert "serving" not in result.stdout


def test_a_max_queue_below_the_default_max_texts_lowers_it(bundle):
    """`--max-queue 3` alone (the default --max-texts is 64): the server starts, and a request of
    4 texts is 413 naming the limit of 3, not a 429 to retry for ever."""
    root = bundle("marian")
    process, url = start(str(root), "--max-queue", "3", "--threads", "1", "--mode", "greedy")
    try:
        http = httpx.Client(base_url=url, timeout=120)
        wait_for(lambda: _ready(http), "ready")
        refused = http.post("/v1/generate", json={"texts": TEXTS[:4]})
        assert refused.status_code == 413, refused.text
        assert refused.json()["error"] == {"kind": "too_large", "message": "4 texts in one request; at most 3."}
        answer = http.post("/v1/generate", json={"texts": TEXTS[:3]})
        assert answer.status_code == 200, answer.text
        want = [list(r.ids) for r in Generator(root, threads=1).generate(TEXTS[:3], mode="greedy")]
        assert [item["ids"] for item in answer.json()["outputs"]] == want
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait()
