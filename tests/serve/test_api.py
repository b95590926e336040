"""`aggdec serve`'s API over a real socket: contract, per-item errors, 413/422/429/504, concurrent
clients getting greedy's exact outputs, /metrics, OpenAPI."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from aggdec.runtime.generator import Generator  # noqa: E402
from tests.runtime.test_gad import K, gad_bundle  # noqa: E402, F401 - a fixture
from tests.serve.running import Running  # noqa: E402

MAX_NEW = 8
TEXTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9", "w3 w3 w3 w3", "w9 w8", "w2 w4 w6 w8 w1 w3"]


@pytest.fixture(scope="module")
def generator(bundle):
    return Generator(bundle("marian"), threads=1)


@pytest.fixture(scope="module")
def server(generator):
    with Running(generator, max_batch=4, max_wait_ms=2, max_queue=64, max_texts=16, max_body_bytes=4096) as running:
        yield running


def greedy(generator, texts, max_new_tokens=MAX_NEW):
    return [list(r.ids) for r in generator.generate(texts, mode="greedy", max_new_tokens=max_new_tokens)]


def metrics(server) -> dict[str, float]:
    """Every sample of /metrics, parsed by prometheus_client, by name and labels."""
    response = server.client.get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def test_generate_answers_in_order_with_greedys_tokens_in_every_lossless_mode(server, generator):
    want = greedy(generator, TEXTS)
    for mode in ("greedy", "iad"):
        response = server.generate(TEXTS, mode=mode, max_new_tokens=MAX_NEW)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["mode"] == mode
        assert [item["ids"] for item in body["outputs"]] == want
        for item, ids in zip(body["outputs"], want):
            assert item["error"] is None
            assert item["text"] == generator.codec.decode(ids)
            stats = item["stats"]
            assert stats["iterations"] == len(stats["accepted"]) == len(stats["drafted"]) >= 1
            assert sum(stats["accepted"]) == len(ids)


def test_the_servers_default_mode_and_the_bundles_length_limit_apply(server, generator):
    response = server.generate(["w1 w2 w3"])
    assert response.status_code == 200
    assert response.json()["mode"] == "iad"
    assert response.json()["outputs"][0]["ids"] == [list(r.ids) for r in generator.generate(["w1 w2 w3"])][0]


def test_a_bad_item_gets_its_own_error_and_the_others_are_decoded(server, generator):
    too_long = " ".join(["w1"] * (generator.manifest.max_source_len + 5))
    texts = ["w1 w2", "", too_long, 5, None, "   ", "w4 w5"]
    response = server.generate(texts, max_new_tokens=MAX_NEW)
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    assert len(outputs) == len(texts)
    want = greedy(generator, ["w1 w2", "w4 w5"])
    assert outputs[0]["ids"] == want[0] and outputs[6]["ids"] == want[1]
    for index in (1, 2, 3, 4, 5):
        item = outputs[index]
        assert item["text"] is None and item["ids"] is None and item["stats"] is None
        assert item["error"]["kind"] == "input"
        assert item["error"]["message"].startswith(f"text {index} ")
    assert "empty" in outputs[1]["error"]["message"]
    assert "tokens long" in outputs[2]["error"]["message"]
    assert outputs[3]["error"]["message"] == "text 3 is a number, not a string."  # JSON's words, not "a int"
    assert outputs[4]["error"]["message"] == "text 4 is null (None), not a string."


@pytest.mark.parametrize("body", [
    b'{"texts": ["w1"',  # malformed JSON
    b'not json at all',
    b'["w1"]',  # not an object
    b'{"texts": "w1 w2"}',  # a string, not a list
    b'{"texts": []}',  # nothing to decode
    b'{}',
    b'{"texts": ["w1"], "mode": "beam"}',
    b'{"texts": ["w1"], "max_new_tokens": "5"}',
    b'{"texts": ["w1"], "max_new_tokens": 0}',
    b'{"texts": ["w1"], "max_new_tokens": 1.5}',
    b'{"texts": ["w1"], "max_new_tokens": 100000}',  # above the bundle's limit
    b'{"texts": ["w1"], "tau": -1, "mode": "gad++"}',
    b'{"texts": ["w1"], "beta": 2, "mode": "iad"}',  # beta applies to gad++ only
    b'{"texts": ["w1"], "mode": "gad"}',  # this bundle has no drafter
    b'{"texts": ["w1"], "temperature": 0.7}',  # unknown field
])
def test_malformed_or_mistyped_requests_get_422_and_the_server_keeps_serving(server, generator, body):
    before = metrics(server)["aggdec_errors_total{kind=invalid}"]
    response = server.client.post("/v1/generate", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["kind"] == "invalid" and error["message"]
    assert metrics(server)["aggdec_errors_total{kind=invalid}"] == before + 1
    ok = server.generate(["w1 w2 w3"], mode="greedy", max_new_tokens=MAX_NEW)
    assert ok.status_code == 200 and ok.json()["outputs"][0]["ids"] == greedy(generator, ["w1 w2 w3"])[0]


def test_oversized_requests_get_413(server):
    # a body over max_body_bytes (4096), with and without a Content-Length header
    big = json.dumps({"texts": ["w1 " * 2000]}).encode()
    response = server.client.post("/v1/generate", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["kind"] == "too_large"

    def chunks():
        for start in range(0, len(big), 1000):
            yield big[start:start + 1000]

    response = server.client.post("/v1/generate", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    # more texts than max_texts (16)
    response = server.generate(["w1"] * 17)
    assert response.status_code == 413 and "at most 16" in response.json()["error"]["message"]
    assert server.generate(["w1"] * 16, max_new_tokens=2).status_code == 200


def test_health_readiness_docs(server):
    assert server.client.get("/healthz").json() == {"status": "alive"}
    ready = server.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert len(ready.json()["manifest_sha256"]) == 64
    schema = server.client.get("/openapi.json").json()
    post = schema["paths"]["/v1/generate"]["post"]
    assert {"200", "413", "422", "429", "503", "504"} <= set(post["responses"])
    request_schema = schema["components"]["schemas"]["GenerateRequest"]
    assert {"texts", "mode", "max_new_tokens", "beta", "tau"} <= set(request_schema["properties"])
    assert server.client.get("/docs").status_code == 200


def test_concurrent_clients_each_get_greedys_output_for_their_own_texts(server, generator):
    """Clients with different texts, modes and length limits share batches; bad requests run
    beside them; every good answer is greedy's, token for token."""
    texts = [f"w{1 + i % 9} w{1 + (i * 7) % 9} w{1 + (i * 5) % 9}" + " w2" * (i % 4) for i in range(24)]
    limits = {4: greedy(generator, texts, 4), MAX_NEW: greedy(generator, texts, MAX_NEW)}
    failures: list[str] = []

    def client(worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            for round_ in range(4):
                chosen = [(worker * 5 + round_ * 3 + j) % len(texts) for j in range(1 + (worker + round_) % 3)]
                limit = 4 if (worker + round_) % 2 else MAX_NEW
                mode = "iad" if worker % 2 else "greedy"
                response = http.post("/v1/generate", json={"texts": [texts[i] for i in chosen], "mode": mode,
                                                           "max_new_tokens": limit})
                if response.status_code != 200:
                    failures.append(f"{worker}: {response.status_code} {response.text}")
                    continue
                got = [item["ids"] for item in response.json()["outputs"]]
                if got != [limits[limit][i] for i in chosen]:
                    failures.append(f"{worker}: {chosen} {mode} {limit}: {got}")
                # a bad request beside the good ones
                bad = http.post("/v1/generate", json={"texts": ["w1", ""], "max_new_tokens": "x"})
                if bad.status_code != 422:
                    failures.append(f"{worker}: bad request got {bad.status_code}")

    threads = [threading.Thread(target=client, args=(worker,)) for worker in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:5]
    assert server.state.engine.active == 0


def test_metrics_parse_and_count_what_happened(server):
    before = metrics(server)
    response = server.generate(["w1 w2 w3", "w4 w5", ""], mode="iad", max_new_tokens=MAX_NEW)
    assert response.status_code == 200
    after = metrics(server)
    assert after["aggdec_texts_total{}"] == before["aggdec_texts_total{}"] + 2
    assert after["aggdec_errors_total{kind=input}"] == before["aggdec_errors_total{kind=input}"] + 1
    # a status's series appears with its first request: none before where this test is the
    # worker's first on this server (test order under xdist is not fixed)
    assert after["aggdec_request_duration_seconds_count{status=200}"] == \
        before.get("aggdec_request_duration_seconds_count{status=200}", 0.0) + 1
    tokens = sum(len(item["ids"]) for item in response.json()["outputs"] if item["ids"])
    calls = sum(item["stats"]["iterations"] for item in response.json()["outputs"] if item["stats"])
    assert after["aggdec_generated_tokens_total{}"] == before["aggdec_generated_tokens_total{}"] + tokens
    assert after["aggdec_verifier_row_calls_total{}"] == before["aggdec_verifier_row_calls_total{}"] + calls
    assert after["aggdec_tokens_per_verifier_call_count{}"] == before["aggdec_tokens_per_verifier_call_count{}"] + 2
    assert after["aggdec_batch_rows_count{}"] > before["aggdec_batch_rows_count{}"]
    assert after["aggdec_batch_rows_sum{}"] >= before["aggdec_batch_rows_sum{}"] + calls  # every row of every call
    assert after["aggdec_queue_depth{}"] == 0 and after["aggdec_rows_active{}"] == 0
    for kind in ("input", "invalid", "too_large", "overloaded", "timeout", "unavailable", "internal"):
        assert f"aggdec_errors_total{{kind={kind}}}" in after


def test_a_full_queue_gives_429_saying_what_room_is_left_and_queues_nothing(generator):
    """A request that does not fit the room left gets 429 with Retry-After, and the message says
    how many texts wait, the room left and the request's own count (it said "the queue is full
    (0 texts wait, at most 10)" even when the queue was empty). The decode loop is held in its
    first verifier call, by the engine's own per-call hook, so that the queue stays full for as
    long as the test needs it (no timing decides the outcome)."""
    texts = ["w1 w2", "w3", "w4 w5", "w6"]
    entered, release = threading.Event(), threading.Event()
    with Running(generator, max_batch=1, max_queue=4) as running:
        engine = running.state.engine
        observe = engine.hooks.on_call

        def held(rows: int) -> None:
            observe(rows)
            entered.set()
            release.wait(120)

        # a lane takes the hook when it is made: the greedy lane, made by the first request below
        # (the warm-up made the default mode's, which keeps the metrics hook)
        engine.hooks.on_call = held
        answers: list[httpx.Response] = []

        def filling_client() -> None:
            with httpx.Client(base_url=running.url, timeout=120) as own:
                answers.append(own.post("/v1/generate", json={"texts": texts, "mode": "greedy",
                                                               "max_new_tokens": MAX_NEW}))

        thread = threading.Thread(target=filling_client)
        thread.start()
        try:
            assert entered.wait(120)
            give_up = time.monotonic() + 60  # a bound on a hang, not a performance check
            while engine.queued != 3 and time.monotonic() < give_up:  # one row in the held call, three wait
                time.sleep(0.005)
            assert engine.queued == 3
            for mode in ("greedy", "iad"):  # the queue is shared by every mode
                response = running.generate(["w7", "w8"], mode=mode, max_new_tokens=MAX_NEW)
                assert response.status_code == 429, response.text
                assert response.json()["error"] == {
                    "kind": "overloaded", "message": "the queue is full: 3 texts wait, room for 1 more of at most 4; "
                                                     "this request has 2. Retry later."}
                assert int(response.headers["Retry-After"]) >= 1
                assert engine.queued == 3 and engine.active == 4  # nothing of it was queued
        finally:
            release.set()
            thread.join(120)
        assert answers[0].status_code == 200
        assert [item["ids"] for item in answers[0].json()["outputs"]] == greedy(generator, texts)
        # and it recovers: the same request is served once there is room
        ok = running.generate(["w7", "w8"], mode="greedy", max_new_tokens=MAX_NEW)
        assert ok.status_code == 200
        assert [item["ids"] for item in ok.json()["outputs"]] == greedy(generator, ["w7", "w8"])


def test_more_texts_than_the_queue_holds_is_413_not_a_429_to_retry_forever(generator):
    """An app whose max_texts is above max_queue (`aggdec serve` refuses one; create_app and Ray's
    application take any Settings): a request of more texts than the whole queue holds can never
    be queued, so it is 413 naming the limit, without Retry-After, even on an idle server (it was
    429 "retry later" for ever). Items refused on their own take no place in the queue."""
    with Running(generator, max_batch=2, max_queue=3, max_texts=16) as running:
        for _ in range(2):  # the same answer every time: nothing was queued
            response = running.generate(["w1", "w2", "w3", "w4"], max_new_tokens=MAX_NEW)
            assert response.status_code == 413, response.text
            assert response.json()["error"] == {
                "kind": "too_large", "message": "this request has 4 texts to decode, more than the server's queue "
                                                "holds at once (3); send at most 3 a request."}
            assert "Retry-After" not in response.headers
            assert running.state.engine.active == 0 and running.state.engine.queued == 0
        assert metrics(running)["aggdec_errors_total{kind=too_large}"] == 2
        mixed = running.generate(["w1", "", "w2", "   ", "w3"], max_new_tokens=MAX_NEW)  # 3 texts to decode
        assert mixed.status_code == 200, mixed.text
        outputs = mixed.json()["outputs"]
        assert [outputs[i]["ids"] for i in (0, 2, 4)] == greedy(generator, ["w1", "w2", "w3"])
        assert outputs[1]["error"]["kind"] == outputs[3]["error"]["kind"] == "input"


def test_past_the_deadline_504_and_the_rows_are_dropped(generator):
    # a deadline shorter than any decode: the rows are still queued or decoding when it passes
    with Running(generator, max_batch=2, timeout_s=1e-6) as running:
        texts = [f"w{i % 9 + 1} w{(i * 3) % 9 + 1}" for i in range(8)]
        response = running.generate(texts, max_new_tokens=64)
        assert response.status_code == 504, response.text
        assert response.json()["error"]["kind"] == "timeout"
        engine = running.state.engine
        assert engine.active == 0  # no result is waited for any more
        (lane,) = engine._lanes.values()
        give_up = time.monotonic() + 60  # the loop drops the cancelled rows at its next step
        while lane.work.cancelled() and time.monotonic() < give_up:
            time.sleep(0.01)
        assert not lane.work.cancelled() and lane.queued == 0
        assert metrics(running)["aggdec_errors_total{kind=timeout}"] == 1
    # the decode loop went on: a server with a sane deadline on the same generator answers
    with Running(generator, max_batch=2) as running:
        ok = running.generate(texts, mode="greedy", max_new_tokens=MAX_NEW)
        assert [item["ids"] for item in ok.json()["outputs"]] == greedy(generator, texts)


def test_a_client_that_disconnects_has_its_rows_dropped_and_the_server_keeps_serving(generator):
    """The request's rows are cancelled when its connection closes. They were decoded to the end
    for nobody: the framework does not cancel a handler whose client left."""
    import socket

    texts = [f"w{i % 9 + 1} w{(i * 5) % 9 + 1} w{(i * 7) % 9 + 1}" for i in range(16)]
    with Running(generator, max_batch=1, max_texts=16) as running:
        engine, before = running.state.engine, metrics(running)["aggdec_texts_total{}"]
        longest = generator.manifest.max_target_len - 1  # as much work as the bundle allows
        body = json.dumps({"texts": texts, "mode": "greedy", "max_new_tokens": longest}).encode()
        host, port = running.url.removeprefix("http://").split(":")
        client = socket.create_connection((host, int(port)))
        client.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        give_up = time.monotonic() + 60  # bounds on a hang, not performance checks
        while engine.active == 0 and time.monotonic() < give_up:
            time.sleep(0.005)
        client.close()
        while (engine.active or engine.queued or running.state.in_flight) and time.monotonic() < give_up:
            time.sleep(0.01)
        assert engine.active == 0 and engine.queued == 0 and running.state.in_flight == 0
        assert metrics(running)["aggdec_texts_total{}"] - before < len(texts)  # not all decoded
        ok = running.generate(texts[:2], mode="greedy", max_new_tokens=MAX_NEW)
        assert [item["ids"] for item in ok.json()["outputs"]] == greedy(generator, texts[:2])


@pytest.mark.parametrize("method, path, body, headers, status, kind, needle", [
    ("POST", "/v1/generate", b'{"texts": ["\xff\xfe"]}', {"content-type": "application/json"}, 422, "invalid",
     "the body is not UTF-8 (byte 0xff at offset 12); send UTF-8 JSON."),  # FastAPI's own 400 {"detail": ...} before
    # JSON that Python's parser gives up on: it said "send UTF-8 JSON", which the client had done
    # (within the fixture's 4096-byte bodies; a number over 4,300 digits: test_a_number_too_long_to_parse...)
    ("POST", "/v1/generate", b'{"texts": ' + b"[" * 2000 + b"]" * 2000 + b"}", {"content-type": "application/json"},
     422, "invalid", "the body nests arrays or objects too deeply to parse"),
    ("POST", "/v1/generate", b'{"texts": ["w1"', {"content-type": "application/json"}, 422, "invalid",
     "the body is not valid JSON: Expecting ',' delimiter (at character 15)."),
    # a union's branches named once, not as "tau.float: ..." (the first of them)
    ("POST", "/v1/generate", b'{"texts": ["w1"], "mode": "gad++", "tau": "x"}', {"content-type": "application/json"},
     422, "invalid", "tau: Input should be a valid number or a valid integer"),
    ("POST", "/v1/generate", b'{"texts": ["w1"], "num_beams": 2, "early_stopping": "sometimes"}',
     {"content-type": "application/json"}, 422, "invalid", "early_stopping: Input should be a valid boolean or 'never'"),
    ("POST", "/v1/generate", b'{"texts": ["w1"]}', {}, 422, "invalid", "this request has no Content-Type"),
    ("POST", "/v1/generate", b'{"texts": ["w1"]}', {"content-type": "text/plain"}, 422, "invalid",
     "send the body as JSON with Content-Type: application/json (this request has 'text/plain')"),
    ("GET", "/v2/generate", None, {}, 404, "not_found", "no endpoint /v2/generate; this API serves POST /v1/generate"),
    ("GET", "/v1/generate", None, {}, 405, "method_not_allowed", "/v1/generate does not take GET; use POST"),
    ("DELETE", "/healthz", None, {}, 405, "method_not_allowed", "/healthz does not take DELETE; use GET"),
])
def test_every_error_has_the_documented_shape_and_is_counted(server, method, path, body, headers, status, kind,
                                                             needle):
    """Errors the framework answers itself (404, 405, a body it cannot read, a body not sent as
    JSON) too: {"error": {kind, message}} and one more in aggdec_errors_total{kind}."""
    before = metrics(server)[f"aggdec_errors_total{{kind={kind}}}"]
    response = server.client.request(method, path, content=body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["kind"] == kind and needle in error["message"], error
    assert set(response.json()) == {"error"}
    if status == 405:
        assert response.headers["allow"]
    assert metrics(server)[f"aggdec_errors_total{{kind={kind}}}"] == before + 1


def test_a_number_too_long_to_parse_is_named_as_such(generator):
    """Python's JSON parser refuses integers of over 4,300 digits; the 422 said "send UTF-8 JSON",
    which the client had done."""
    with Running(generator, max_batch=2) as running:
        response = running.client.post("/v1/generate", content=b'{"texts": ["w1"], "max_new_tokens": 1' + b"0" * 5000
                                       + b"}", headers={"content-type": "application/json"})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["message"] == (
            "the body holds a number of more than 4,300 digits, more than the server's JSON parser reads; options "
            "are small numbers.")


def test_draft_k_over_http_is_checked_against_the_drafter(gad_bundle):  # noqa: F811
    generator = Generator(gad_bundle("marian"), threads=1)
    want = greedy(generator, TEXTS)
    with Running(generator, max_batch=4, max_wait_ms=2) as running:
        for draft_k in (1, 4, K):
            response = running.generate(TEXTS, mode="gad", draft_k=draft_k, max_new_tokens=MAX_NEW)
            assert response.status_code == 200, response.text
            assert [item["ids"] for item in response.json()["outputs"]] == want
        refused = running.generate(TEXTS, mode="gad", draft_k=K + 1)
        assert refused.status_code == 422
        assert f"drafter's k ({K}), got {K + 1}" in refused.json()["error"]["message"]
        wrong_mode = running.generate(TEXTS, mode="iad", draft_k=2)
        assert wrong_mode.status_code == 422 and "draft_k applies to modes" in wrong_mode.json()["error"]["message"]


def test_beam_search_over_http_equals_the_generator_and_takes_num_beams_rows(server, generator):
    options = dict(num_beams=3, length_penalty=0.6, early_stopping="never", num_return_sequences=2)
    want = generator.generate(TEXTS, max_new_tokens=MAX_NEW, **options)
    response = server.generate(TEXTS, mode="greedy", max_new_tokens=MAX_NEW, **options)
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    assert [item["ids"] for item in outputs] == [list(w.ids) for w in want]
    assert [item["score"] for item in outputs] == [w.score for w in want]
    assert [[(s["ids"], s["score"]) for s in item["sequences"]] for item in outputs] == \
        [[(list(h.ids), h.score) for h in w.sequences] for w in want]
    # the server's batch is 4 rows: one text of 3 beams at a time
    assert all(item["stats"]["batch_size"] == 3 for item in outputs)
    plain = server.generate(TEXTS[:1], mode="greedy", max_new_tokens=MAX_NEW).json()["outputs"][0]
    assert plain.get("sequences") is None and plain.get("score") is None


@pytest.mark.parametrize("options, needle", [
    (dict(num_beams=5), "re-export with --top-k 10"),
    (dict(num_beams=0), "greater than or equal to 1"),
    (dict(num_beams=2, num_return_sequences=3), "num_return_sequences (3) must be at most num_beams (2)"),
    (dict(num_beams=2, early_stopping="sometimes"), "early_stopping"),
    (dict(length_penalty=2.0), "length_penalty applies to beam search only"),
    # length ** 500 overflowed (an internal item error), ** -500 made every score -inf (a 500: no JSON holds it)
    (dict(num_beams=2, length_penalty=500), "length_penalty must be between"),
    (dict(num_beams=2, length_penalty=-500), "length_penalty must be between"),
])
def test_bad_beam_options_over_http_get_422(server, options, needle):
    response = server.generate(["w1"], mode="greedy", **options)
    assert response.status_code == 422, response.text
    assert needle in response.text
    assert server.generate(["w1"], mode="greedy").status_code == 200


def test_more_beams_than_the_servers_rows_get_422(generator):
    with Running(generator, max_batch=2, max_wait_ms=2, max_queue=8, max_texts=4, max_body_bytes=4096) as running:
        response = running.generate(["w1"], mode="greedy", num_beams=3)
        assert response.status_code == 422, response.text
        assert "num_beams 3 takes more rows than the server's batch of 2" in response.text
        ok = running.generate(["w1", "w2 w3"], mode="greedy", num_beams=2, max_new_tokens=MAX_NEW)
        assert ok.status_code == 200
        assert [item["ids"] for item in ok.json()["outputs"]] == \
            [list(r.ids) for r in generator.generate(["w1", "w2 w3"], num_beams=2, max_new_tokens=MAX_NEW)]


# ------------------------------------------------------------------ hostile numbers, slow tokenizing

BIG = b"1" + b"0" * 400  # an integer no float holds


@pytest.mark.parametrize("raw, field", [
    (b'{"texts": ["w1"], "mode": "gad++", "tau": NaN}', "tau"),
    (b'{"texts": ["w1"], "mode": "gad++", "tau": Infinity}', "tau"),
    (b'{"texts": ["w1"], "mode": "gad++", "tau": -Infinity}', "tau"),
    (b'{"texts": ["w1"], "mode": "gad++", "tau": 1e400}', "tau"),  # Python's JSON reads it as inf
    (b'{"texts": ["w1"], "mode": "gad++", "tau": ' + BIG + b'}', "tau"),
    (b'{"texts": ["w1"], "num_beams": 2, "length_penalty": NaN}', "length_penalty"),
    (b'{"texts": ["w1"], "num_beams": 2, "length_penalty": ' + BIG + b'}', "length_penalty"),
    (b'{"texts": ["w1"], "max_new_tokens": NaN}', "max_new_tokens"),
    (b'{"texts": ["w1"], "max_new_tokens": -Infinity}', "max_new_tokens"),
])
def test_non_finite_numbers_get_422_naming_the_field_and_the_connection_keeps_serving(server, generator, raw, field):
    """These were 500s: the 422 echoed the number into strict JSON, which cannot hold it, and
    pydantic's own finiteness check raised OverflowError on the big integer. uvicorn then closed
    the keep-alive connection, and the client's next request on it was reset."""
    before = metrics(server)
    response = server.client.post("/v1/generate", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    error = json.loads(response.text, parse_constant=lambda name: pytest.fail(f"{name} in the answer"))["error"]
    assert error["kind"] == "invalid" and error["message"].startswith(f"{field}: "), error
    if field != "max_new_tokens":
        assert "should be a finite number that fits a float" in error["message"]
    # the same client, so the same connection: it must still be open
    ok = server.generate(["w1 w2 w3"], mode="greedy", max_new_tokens=MAX_NEW)
    assert ok.status_code == 200 and ok.json()["outputs"][0]["ids"] == greedy(generator, ["w1 w2 w3"])[0]
    after = metrics(server)
    assert after["aggdec_errors_total{kind=internal}"] == before["aggdec_errors_total{kind=internal}"]
    assert after["aggdec_errors_total{kind=invalid}"] == before["aggdec_errors_total{kind=invalid}"] + 1


def test_a_text_being_tokenized_leaves_the_server_answering_others(server, generator, monkeypatch):
    """Texts are tokenized in a worker thread. The bundle's own tokenizer runs here, held at the
    start of one request's texts until the test has had its other answers: had the tokenizing
    run on the event loop, those answers would never come (the timeout is a bound on a hang,
    not a timing)."""
    entered, release = threading.Event(), threading.Event()
    encode = generator.codec.encode

    def held(texts, **options):
        if any("w7 w7 w7" in text for text in texts):
            entered.set()
            release.wait(60)
        return encode(texts, **options)

    monkeypatch.setattr(generator.codec, "encode", held)
    answers = []

    def slow_client():
        with httpx.Client(base_url=server.url, timeout=120) as client:
            answers.append(client.post("/v1/generate", json={"texts": ["w7 w7 w7"], "mode": "greedy",
                                                              "max_new_tokens": MAX_NEW}))

    thread = threading.Thread(target=slow_client)
    thread.start()
    try:
        assert entered.wait(60)
        assert server.client.get("/healthz", timeout=20).status_code == 200
        ok = server.client.post("/v1/generate", json={"texts": ["w1 w2"], "mode": "greedy", "max_new_tokens": MAX_NEW},
                                timeout=20)
        assert ok.status_code == 200 and ok.json()["outputs"][0]["ids"] == greedy(generator, ["w1 w2"])[0]
        assert not answers  # the held request is still being tokenized
    finally:
        release.set()
        thread.join(60)
    monkeypatch.undo()
    assert answers[0].status_code == 200
    assert answers[0].json()["outputs"][0]["ids"] == greedy(generator, ["w7 w7 w7"])[0]


def test_a_text_the_tokenizer_gives_up_on_is_an_item_error_and_the_others_are_decoded(bundle, tmp_path):
    """It was a plain-text 500 for the whole request (tokenizers' panic is a BaseException)."""
    import shutil

    from tests.runtime.test_bundle_hostile import BACKTRACKING_TEXT, backtracking_tokenizer

    root = tmp_path / "bundle"
    shutil.copytree(bundle("marian"), root)
    backtracking_tokenizer(root)
    generator = Generator(root, threads=1)
    with Running(generator, max_batch=4, max_wait_ms=2, max_queue=8, max_texts=4, max_body_bytes=4096) as running:
        response = running.generate(["w1 w2", BACKTRACKING_TEXT, "w3"], mode="greedy", max_new_tokens=MAX_NEW)
        assert response.status_code == 200, response.text
        outputs = response.json()["outputs"]
        assert [outputs[0]["ids"], outputs[2]["ids"]] == greedy(generator, ["w1 w2", "w3"])
        assert outputs[1]["error"]["kind"] == "input"
        assert outputs[1]["error"]["message"].startswith("text 1 cannot be tokenized")
