"""The engine's decode loops (lanes) under load, over a real socket: which requests share a loop,
what a request that needs one more gets, queued rows of clients gone, and how the latency
metric counts a request nobody answers.

Each test holds the loops it needs inside a verifier call with the engine's own per-call hook
(a lane takes the hook when it is made), so that what is busy is decided by the test, never by
timing; the timeouts below are bounds on a hang, not performance checks.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from aggdec.runtime.generator import Generator  # noqa: E402
from aggdec.serve import engine as engine_module  # noqa: E402
from tests.serve.running import Running  # noqa: E402
from tests.serve.test_api import MAX_NEW, greedy, metrics  # noqa: E402

HANG = 120  # seconds: a bound on a hang


@pytest.fixture(scope="module")
def generator(bundle):
    return Generator(bundle("marian"), threads=1)


class Held:
    """A per-call hook that holds every call it sees until released, counting the calls held."""

    def __init__(self, observe) -> None:
        self.observe, self.release, self.calls = observe, threading.Event(), 0
        self._lock = threading.Lock()

    def __call__(self, rows: int) -> None:
        self.observe(rows)
        with self._lock:
            self.calls += 1
        self.release.wait(10 * HANG)  # past every bound below: a check never passes by the hold ending

    def wait_for(self, calls: int) -> None:
        give_up = time.monotonic() + HANG
        while self.calls < calls and time.monotonic() < give_up:
            time.sleep(0.005)
        assert self.calls >= calls


def in_thread(running: Running, answers: dict, key, body: dict) -> threading.Thread:
    def post() -> None:
        with httpx.Client(base_url=running.url, timeout=HANG) as own:
            answers[key] = own.post("/v1/generate", json=body)

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def until(condition) -> None:
    give_up = time.monotonic() + HANG
    while not condition() and time.monotonic() < give_up:
        time.sleep(0.005)
    assert condition()


def test_beam_requests_differing_only_in_scoring_share_one_loop(generator):
    """length_penalty, early_stopping and num_return_sequences travel with each text: every
    mix of them over one mode and num_beams is one lane (each made its own, and 8 distinct
    penalties filled the server's lanes), and each text still gets generate's answer for its
    own options."""
    scorings = [dict(length_penalty=penalty, early_stopping=stopping, num_return_sequences=count)
                for penalty, stopping, count in ((0.5, "never", 2), (1.0, True, 1), (2.0, False, 3), (-0.5, True, 2),
                                                 (0.1, False, 1), (3.0, "never", 3), (0.7, True, 1), (1.3, False, 2),
                                                 (0.0, "never", 1))]
    texts = ["w1 w2 w3", "w4 w5", "w9 w8 w7 w6"]
    with Running(generator, max_batch=6, max_queue=64) as running:
        answers: dict = {}
        threads = [in_thread(running, answers, index, {"texts": texts, "mode": "greedy", "num_beams": 3,
                                                       "max_new_tokens": MAX_NEW, **scoring})
                   for index, scoring in enumerate(scorings)]
        for thread in threads:
            thread.join(HANG)
        lanes = running.state.engine._lanes
        assert len([config for config in lanes if config.num_beams]) == 1
        for index, scoring in enumerate(scorings):
            assert answers[index].status_code == 200, answers[index].text
            want = generator.generate(texts, mode="greedy", num_beams=3, max_new_tokens=MAX_NEW, **scoring)
            assert [[(s["ids"], s["score"]) for s in item["sequences"]] for item in answers[index].json()["outputs"]] \
                == [[(list(h.ids), h.score) for h in w.sequences] for w in want]


def test_a_request_needing_one_loop_too_many_gets_429_naming_it_and_the_default_is_always_served(
        generator, monkeypatch):
    monkeypatch.setattr(engine_module, "MAX_LANES", 2)
    with Running(generator, max_batch=4, max_queue=64, mode="iad") as running:
        engine = running.state.engine
        held = engine.hooks.on_call = Held(engine.hooks.on_call)  # the default lane (warm-up) keeps the plain hook
        answers: dict = {}
        busy = [{"mode": "greedy"}, {"mode": "greedy", "num_beams": 2}]
        threads = [in_thread(running, answers, index, {"texts": ["w1 w2"], "max_new_tokens": MAX_NEW, **options})
                   for index, options in enumerate(busy)]
        try:
            held.wait_for(2)  # both lanes are in a call
            response = running.generate(["w3"], mode="iad", num_beams=3, max_new_tokens=MAX_NEW)
            assert response.status_code == 429, response.text
            assert response.headers["Retry-After"] == "1"
            message = response.json()["error"]["message"]
            assert "configuration (mode iad, num_beams 3)" in message and "the 2 that the server runs" in message
            assert engine.queued == 0 and len(engine._lanes) == 3
            # the server's default configuration has a loop of its own, whatever the others do
            default = running.generate(["w4 w5"], max_new_tokens=MAX_NEW)
            assert default.status_code == 200
            assert default.json()["outputs"][0]["ids"] == greedy(generator, ["w4 w5"])[0]
            # another scoring of a busy beam configuration joins its loop
            threads.append(in_thread(running, answers, "scored", {"texts": ["w6"], "mode": "greedy", "num_beams": 2,
                                                                  "length_penalty": 0.3, "max_new_tokens": MAX_NEW}))
            until(lambda: engine.queued == 1)
        finally:
            held.release.set()
            for thread in threads:
                thread.join(HANG)
        assert answers[0].json()["outputs"][0]["ids"] == greedy(generator, ["w1 w2"])[0]
        (want,) = generator.generate(["w6"], num_beams=2, length_penalty=0.3, max_new_tokens=MAX_NEW)
        assert answers["scored"].json()["outputs"][0]["ids"] == list(want.ids)
        # once a loop is idle it makes room: the refused configuration is served
        again = running.generate(["w3"], mode="iad", num_beams=3, max_new_tokens=MAX_NEW)
        assert again.status_code == 200, again.text
        (want,) = generator.generate(["w3"], num_beams=3, max_new_tokens=MAX_NEW)
        assert again.json()["outputs"][0]["ids"] == list(want.ids)


def test_queued_texts_of_a_client_gone_leave_the_queue_at_once(generator):
    """They kept their place until the loop next took work, while long rows held the batch:
    the queue-depth gauge counted them and another request was refused a queue it had room in."""
    texts = [f"w{i + 1} w{i + 2}" for i in range(6)]
    with Running(generator, max_batch=1, max_queue=8, max_texts=8) as running:
        engine = running.state.engine
        held = engine.hooks.on_call = Held(engine.hooks.on_call)
        body = json.dumps({"texts": texts, "mode": "greedy", "max_new_tokens": MAX_NEW}).encode()
        host, port = running.url.removeprefix("http://").split(":")
        client = socket.create_connection((host, int(port)))
        try:
            client.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            held.wait_for(1)  # one row in the held call, five wait
            until(lambda: engine.queued == 5)
            assert metrics(running)["aggdec_queue_depth{}"] == 5
            client.close()
            until(lambda: engine.queued == 0)  # while the call is still held
            assert metrics(running)["aggdec_queue_depth{}"] == 0 and held.calls == 1
        finally:
            held.release.set()
        until(lambda: engine.active == 0 and running.state.in_flight == 0)
        assert metrics(running)["aggdec_request_duration_seconds_count{status=499}"] == 1
        ok = running.generate(texts[:2], mode="greedy", max_new_tokens=MAX_NEW)
        assert [item["ids"] for item in ok.json()["outputs"]] == greedy(generator, texts[:2])


def test_requests_nobody_is_answered_count_as_499_not_500(generator):
    """A client that leaves before its body is read, and a handler cancelled by the server in
    front (Ray Serve's proxy cancels it when the client goes): both were counted as status 500,
    firing 5xx alerts for hang-ups. The second drives the app's ASGI callable directly, as a
    proxy does, and cancels it while its row decodes; the row is dropped."""
    with Running(generator, max_batch=2) as running:
        before = metrics(running).get("aggdec_request_duration_seconds_count{status=499}", 0)
        host, port = running.url.removeprefix("http://").split(":")
        client = socket.create_connection((host, int(port)))
        client.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 1000\r\n\r\n{\"texts\": [")
        until(lambda: running.state.in_flight == 1)
        client.close()
        until(lambda: running.state.in_flight == 0)
        assert metrics(running)["aggdec_request_duration_seconds_count{status=499}"] == before + 1

        engine = running.state.engine
        held = engine.hooks.on_call = Held(engine.hooks.on_call)
        body = json.dumps({"texts": ["w1 w2"], "mode": "greedy", "max_new_tokens": MAX_NEW}).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/generate", "raw_path": b"/v1/generate", "query_string": b"",
                 "root_path": "", "headers": [(b"content-type", b"application/json"),
                                               (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        sent: list[dict] = []

        async def proxy() -> None:
            delivered = asyncio.Event()

            async def receive() -> dict:
                if not delivered.is_set():
                    delivered.set()
                    return {"type": "http.request", "body": body, "more_body": False}
                await asyncio.Event().wait()  # the client never leaves on its own
                return {}

            async def send(message: dict) -> None:
                sent.append(message)

            task = asyncio.ensure_future(running.app(scope, receive, send))
            while held.calls < 1:
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        try:
            asyncio.run(asyncio.wait_for(proxy(), HANG))
        finally:
            held.release.set()
        assert sent == []
        until(lambda: engine.active == 0)
        after = metrics(running)
        assert after["aggdec_request_duration_seconds_count{status=499}"] == before + 2
        assert after.get("aggdec_request_duration_seconds_count{status=500}", 0) == 0


def test_retry_after_comes_from_the_last_seconds_completions(generator, monkeypatch):
    """A 429's Retry-After is the queue over the completion rate of the last RETRY_WINDOW_S
    seconds up to now: completions long before (the warm-up, an idle spell) do not slow it.
    Over the last 256 completions whatever their age, a queue draining at 8 texts a second was
    told to come back in 49 seconds."""
    engine = engine_module.Engine(generator, max_batch=4)
    monkeypatch.setattr(engine_module.Engine, "queued", property(lambda self: 20))
    assert engine.retry_after(now=0.0) == 1  # nothing finished yet
    engine._finished.extend([0.0, 0.5])  # the warm-up
    assert engine.retry_after(now=100.0) == 1  # nothing in the last seconds: no rate to go by
    engine._finished.extend(95.0 + 0.1125 * i for i in range(40))  # 40 texts in the last 5 s
    assert engine.retry_after(now=100.0) == 3  # 20 queued at 8 a second
    assert engine_module.RETRY_WINDOW_S < 95.0
