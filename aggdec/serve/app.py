"""The HTTP API (FastAPI): `POST /v1/generate`, `/healthz`, `/readyz`, `/metrics`, OpenAPI docs.

One app serves one bundle. Texts of concurrent requests share batches in the engine's
decode loops (:mod:`aggdec.serve.engine`); the event loop only queues and waits (texts are
tokenized in a worker thread: a long one would hold every other request).

Failure behaviour, in the order a request meets it:

- draining (SIGTERM) or not warm yet: 503 with ``Retry-After``;
- a body over ``max_body_bytes``: 413, before it is parsed; more than ``max_texts`` texts, or
  more texts to decode than ``max_queue`` (no retry could admit them): 413;
- a body that is not UTF-8 JSON sent as ``application/json``, a wrong type, a number that is
  not finite or that no float holds, an unknown field, an option the bundle cannot honour: 422;
- a path the API does not serve: 404; a method a path does not take: 405 with ``Allow``;
- more texts than the queue has room for, or a configuration that needs a decode loop while the
  engine's most are busy: 429 with ``Retry-After`` (nothing is queued);
- past ``timeout_s``: 504, and the request's unfinished rows are dropped from their batch;
- the client disconnects: its unfinished rows are dropped at once (the answer, unread, is a 499);
- a text that cannot be decoded (empty, too long, not a string): an error in its own output
  item; the request's other texts are decoded;
- a fault of the server: 500.

Every error answer, whatever its origin (the framework's own 404 and 405 included), is
``{"error": {"kind", "message"}}`` and counted in ``aggdec_errors_total`` by kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from aggdec import __version__
from aggdec.runtime.continuous import RowDecoder
from aggdec.runtime.errors import AggdecError
from aggdec.runtime.generator import Generator
from aggdec.runtime.options import Mode
from aggdec.runtime.values import is_finite_real

from .engine import DEFAULT_MAX_TEXTS, Engine, EngineHooks, Overloaded, TooManyTexts, Warmup, warm_up
from .metrics import Metrics

GENERATE_PATH = "/v1/generate"
CLIENT_CLOSED = 499  # nginx's "client closed request": how the latency metric counts a request whose client left


@dataclass
class Settings:
    """How a server decodes and what it refuses (the `aggdec serve` options)."""

    mode: Mode | str = Mode.IAD  # a request's mode when it names none
    max_batch: int = 32  # rows per verifier call
    # an idle decode loop waits this long to gather a batch; 0 by default: later texts join the
    # running batch at its next call, and 5 ms cost a lone request 7 ms of its 22 and bought no
    # throughput at 8 to 64 clients (benchmarks/results/serve-linger-cpu)
    max_wait_ms: float = 0.0
    max_queue: int = 256  # texts waiting for a slot, over every mode; past it: 429
    timeout_s: float = 30.0  # a request's deadline; past it: 504 and its rows are dropped
    max_texts: int = DEFAULT_MAX_TEXTS  # texts per request; more: 413 (engine.max_texts_within: at most max_queue)
    max_body_bytes: int = 1 << 20  # request body; larger: 413
    warmup_text: str = "warm up"
    warm_at_startup: bool = False  # True: the app's startup waits for the warm-up (Ray replicas)


@dataclass
class ServerState:
    """What the app, its middleware and the process around it share."""

    settings: Settings
    generator: Generator
    metrics: Metrics = field(default_factory=Metrics)
    engine: Engine | None = None
    warm: Warmup = field(default_factory=Warmup)
    draining: bool = False
    in_flight: int = 0  # generate requests being served
    bundle_sha256: str = ""


# ---------------------------------------------------------------------- schemas

def _finite(value: Any) -> Any:
    # JSON's NaN/Infinity, 1e400 (parsed as inf) and 10**400 (no float holds it) are refused here with a
    # message; pydantic's own allow_inf_nan check raises OverflowError on such an int (a 500, not a 422)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not is_finite_real(value):
        shown = str(value) if isinstance(value, float) else f"an integer of {len(str(abs(value)))} digits"
        raise ValueError(f"should be a finite number that fits a float, got {shown}")
    return value


Real = Annotated[StrictFloat | StrictInt, BeforeValidator(_finite)]  # a real option: finite, no bool, no string


class GenerateRequest(BaseModel):
    """Texts to decode, with one set of options for all of them."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"texts": ["Привіт , як справи ?"], "mode": "iad", "max_new_tokens": 128}]})

    texts: list[Any] = Field(min_length=1, description="The texts to decode, each a string. An item that cannot "
                             "be decoded (empty, longer than the bundle allows, not a string) gets an error in its "
                             "own output; the others are decoded.", json_schema_extra={"items": {"type": "string"}})
    mode: Mode | None = Field(
        None, description="Decoding mode (default: the server's --mode). greedy, iad and gad give the same output; "
                          "gad++ with beta > 1 is faster and may differ.")
    max_new_tokens: StrictInt | None = Field(None, ge=1, description="Tokens to generate at most, per text "
                                             "(default and ceiling: the bundle's limit).")
    beta: StrictInt | None = Field(None, ge=1, description="gad++ only: a draft token is kept while among the "
                                   "verifier's top-beta (default 3; 1 is greedy).")
    tau: Real | None = Field(None, ge=0, description="gad++ only: ... and within tau log-prob of the best "
                             "(default 1.0).")
    draft_k: StrictInt | None = Field(None, ge=1, description="gad and gad++ only: the most draft tokens a verifier "
                                      "call checks, at most the drafter's k (default: its k).")
    num_beams: StrictInt | None = Field(None, ge=1, description="Beam search with this many hypotheses per text, "
                                        "equal to transformers' (a Marian bundle: Marian's) (default: greedy); with "
                                        "mode iad or gad, speculative beam search (the same output). A text takes "
                                        "num_beams rows of the server's batch; at most half the bundle's top-k (a "
                                        "Marian bundle: its top-k).")
    length_penalty: Real | None = Field(None, description="beam search only: a finished hypothesis scores "
                                        "log-prob / length ** this (default 1.0; a Marian bundle: its yml's "
                                        "normalize).")
    early_stopping: StrictBool | Literal["never"] | None = Field(None, description="beam search only: "
                                                                  "transformers' rule for when a text is done "
                                                                  "(true, false or \"never\"; default false; refused "
                                                                  "on Marian bundles).")
    num_return_sequences: StrictInt | None = Field(None, ge=1, description="beam search only: the best hypotheses "
                                                   "returned per text, at most num_beams (default 1).")


class ItemError(BaseModel):
    kind: str = Field(description="`input`: this text cannot be decoded; `internal`: a server fault.")
    message: str


class Stats(BaseModel):
    iterations: int = Field(description="verifier calls")
    drafted: list[int] = Field(description="draft tokens checked per call")
    accepted: list[int] = Field(description="tokens appended per call")
    encoder_seconds: float
    verifier_seconds: float
    drafter_seconds: float
    total_seconds: float = Field(description="this text's share of its batch's decode time")
    batch_size: int


class Hypothesis(BaseModel):
    text: str
    ids: list[int]
    score: float = Field(description="transformers' sequences_scores: log-prob sum / length ** length_penalty")


class Output(BaseModel):
    text: str | None = Field(description="the output text; null when `error` is set")
    ids: list[int] | None = Field(description="generated token ids after the decoder start token")
    stats: Stats | None
    error: ItemError | None = None
    score: float | None = Field(None, description="beam search: the best hypothesis's sequence score")
    sequences: list[Hypothesis] | None = Field(None, description="beam search: the num_return_sequences best "
                                             "hypotheses, best first (the first is text/ids)")


class GenerateResponse(BaseModel):
    mode: str
    outputs: list[Output] = Field(description="one per input text, in order")


class ErrorBody(BaseModel):
    kind: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


def _error(status: int, kind: str, message: str, metrics: Metrics | None = None,
           headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    if metrics is not None:
        metrics.errors.labels(kind).inc()
    return JSONResponse({"error": {"kind": kind, "message": message, **extra}}, status_code=status, headers=headers)


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as its text: a validation error echoes the input it
    refused (``NaN``, ``1e400``), and the response's strict JSON would fail on it (a 500)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def _validation_message(errors: list[dict[str, Any]]) -> str:
    """The first field's validation errors as one line: ``field: what it should be``. A union's
    branches (``tau``: a float or an int) each give an error, located by the branch's name
    (``tau.float``): named once, their wants joined with "or"."""
    if not errors:
        return "invalid request"
    first = errors[0]
    if first.get("type") == "json_invalid":  # FastAPI's: located by the character offset
        return (f"the body is not valid JSON: {first.get('ctx', {}).get('error', 'cannot be parsed')} "
                f"(at character {first['loc'][-1]}).")

    def field(error: dict[str, Any]) -> list[str]:
        parts = [str(part) for part in error.get("loc", ()) if part != "body"]
        return parts[:1] if parts and parts[0] in GenerateRequest.model_fields else parts

    where = field(first)
    wants = dict.fromkeys(str(error.get("msg", "invalid")).removeprefix("Value error, ")  # pydantic's prefix
                          for error in errors if field(error) == where)
    said = " or ".join(want if i == 0 else want.removeprefix("Input should be ") for i, want in enumerate(wants))
    return f"{'.'.join(where) + ': ' if where else ''}{said}"


def _unparsed(cause: BaseException | None) -> str:
    """Why a body sent as JSON could not be read (``cause``: the parser's exception), for a 422."""
    if isinstance(cause, UnicodeDecodeError):
        return (f"the body is not UTF-8 (byte 0x{cause.object[cause.start]:02x} at offset {cause.start}); "
                "send UTF-8 JSON.")
    if isinstance(cause, RecursionError):
        return "the body nests arrays or objects too deeply to parse; a request is one flat object."
    if isinstance(cause, ValueError) and "digits" in str(cause):  # Python's int-from-string limit
        return (f"the body holds a number of more than {sys.get_int_max_str_digits():,} digits, more than the "
                "server's JSON parser reads; options are small numbers.")
    return "the body could not be parsed: send UTF-8 JSON with Content-Type: application/json."


def _sent_as_json(request: Request) -> bool:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _output(result) -> dict[str, Any]:
    s = result.stats
    output = {"text": result.text, "ids": list(result.ids), "error": None, "stats": {
        "iterations": s.iterations, "drafted": list(s.drafted), "accepted": list(s.accepted),
        "encoder_seconds": s.encoder_seconds, "verifier_seconds": s.verifier_seconds,
        "drafter_seconds": s.drafter_seconds, "total_seconds": s.total_seconds, "batch_size": s.batch_size}}
    if result.sequences:  # beam search
        output["score"] = result.score
        output["sequences"] = [{"text": h.text, "ids": list(h.ids), "score": h.score} for h in result.sequences]
    return output


async def _until_gone(request: Request) -> None:
    """Returns once the client has disconnected. The body is read by then, and the server's next
    ASGI message is the disconnect (uvicorn's, and Ray Serve's proxy's, wait for it); the
    framework does not cancel a handler whose client left, so without this its rows were decoded
    to the end for nobody."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _failed(kind: str, message: str) -> dict[str, Any]:
    return {"text": None, "ids": None, "stats": None, "error": {"kind": kind, "message": message}}


# ---------------------------------------------------------------------- the gate (raw ASGI)

class Gate:
    """In front of the app: refuses generate requests while draining or not warm (503) and
    bodies over the size limit (413, read at most that far), counts requests in flight and
    times them."""

    def __init__(self, app, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != GENERATE_PATH:
            await self.app(scope, receive, send)
            return
        state, metrics = self.state, self.state.metrics
        started = time.perf_counter()
        status: dict[str, int | None] = {"code": None}  # None: no answer begun

        async def timed_send(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        state.in_flight += 1
        metrics.in_flight.inc()
        try:
            await self._serve(scope, receive, timed_send, status)
        except asyncio.CancelledError:
            # cancelled before an answer began: the client left and the server dropped the handler
            # (Ray Serve's proxy does), not a server fault; a 500 here fired 5xx alerts for hang-ups
            if status["code"] is None:
                status["code"] = CLIENT_CLOSED
            raise
        finally:
            state.in_flight -= 1
            metrics.in_flight.dec()
            metrics.latency.labels(str(status["code"] or 500)).observe(time.perf_counter() - started)

    async def _serve(self, scope, receive, send, status: dict[str, int | None]) -> None:
        state, metrics = self.state, self.state.metrics
        if state.draining:
            response = _error(503, "unavailable", "the server is shutting down; send this request elsewhere.",
                              metrics, headers={"Retry-After": "1", "Connection": "close"})
            await response(scope, receive, send)
            return
        if not state.warm.ready:
            response = _error(503, "unavailable", "the server is still loading; retry shortly." if state.warm.error
                              is None else f"the server failed to warm up: {state.warm.error}", metrics,
                              headers={"Retry-After": "1"})
            await response(scope, receive, send)
            return
        limit = state.settings.max_body_bytes

        def too_large() -> JSONResponse:  # made only when needed: every request passes here
            metrics.errors.labels("too_large").inc()
            return _error(413, "too_large", f"the request body exceeds {limit} bytes.", None,
                          headers={"Connection": "close"})

        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    if int(value) > limit:
                        await too_large()(scope, receive, send)
                        return
                except ValueError:
                    pass
        # read the body here, at most ``limit`` bytes, then hand it to the app
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":  # gone before its body was read: nobody to answer
                status["code"] = CLIENT_CLOSED
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await too_large()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# ---------------------------------------------------------------------- the app

def check_settings(generator: Generator, settings: Settings) -> None:
    """Refuse ``settings`` that ``generator`` cannot serve, before a server listens: a default
    mode it cannot decode (GAD without a drafter), or a ``max_batch`` whose rows' buffers cannot
    fit in this machine's memory (a decode loop makes them for all its rows at its first text:
    the warm-up and every request after it failed, and the server answered 503 for good)."""
    generator.check_options(settings.mode)
    RowDecoder(generator).check_batch_size(settings.max_batch, "--max-batch")


def create_app(generator: Generator, settings: Settings | None = None) -> FastAPI:
    """The API over ``generator``. Decode loops start, and the warm-up runs, when the app
    starts (ASGI lifespan); `/readyz` answers 200 once it is warm. Settings the generator
    cannot serve are refused here (:func:`check_settings`)."""
    settings = settings or Settings()
    check_settings(generator, settings)
    state = ServerState(settings=settings, generator=generator)
    metrics = state.metrics
    with contextlib.suppress(OSError):
        import hashlib

        state.bundle_sha256 = hashlib.sha256((generator.root / "manifest.json").read_bytes()).hexdigest()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine = Engine(generator, mode=settings.mode, max_batch=settings.max_batch,
                              max_wait=settings.max_wait_ms / 1000, max_queue=settings.max_queue,
                              hooks=EngineHooks(on_call=metrics.batch_rows.observe, on_result=metrics.observe_result))
        metrics.queue_depth.set_function(lambda: state.engine.queued if state.engine else 0)
        metrics.active.set_function(lambda: state.engine.active if state.engine else 0)

        async def warm() -> None:
            state.warm = await warm_up(state.engine, settings.warmup_text)

        task = asyncio.create_task(warm())
        if settings.warm_at_startup:
            await task
        try:
            yield
        finally:
            task.cancel()
            engine, state.engine = state.engine, None
            await asyncio.to_thread(engine.close)

    app = FastAPI(title="aggdec", version=__version__, lifespan=lifespan,
                  description="Lossless aggressive decoding (greedy, IAD, GAD, GAD++) over one aggdec bundle. "
                              "Texts of concurrent requests share batches.")
    app.state.aggdec = state
    app.add_middleware(Gate, state=state)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _json_safe(jsonable_encoder(exc.errors(),
                                             custom_encoder={bytes: lambda b: b.decode("utf-8", "replace")}))
        if not _sent_as_json(request):  # FastAPI then validates the raw body as the object: a riddle
            kind = request.headers.get("content-type")
            return _error(422, "invalid", f"send the body as JSON with Content-Type: application/json (this request "
                          f"{'has ' + repr(kind) if kind else 'has no Content-Type'}).", metrics, detail=errors)
        return _error(422, "invalid", _validation_message(errors), metrics, detail=errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """The framework's own errors, in the API's shape: 404, 405, and a body it cannot parse."""
        method, path = request.method, request.url.path
        if exc.status_code == 404:
            return _error(404, "not_found", f"no endpoint {path}; this API serves POST {GENERATE_PATH}, GET /healthz, "
                          "/readyz, /metrics and /docs.", metrics)
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            return _error(405, "method_not_allowed", f"{path} does not take {method}; use {allowed or 'another method'}.",
                          metrics, headers=exc.headers)
        if exc.status_code == 400:  # FastAPI could not read the body: its parser's error is the cause
            return _error(422, "invalid", _unparsed(exc.__cause__), metrics)
        return _error(exc.status_code, "invalid" if exc.status_code < 500 else "internal", str(exc.detail), metrics,
                      headers=exc.headers)

    @app.exception_handler(Exception)
    async def fault(request: Request, exc: Exception) -> JSONResponse:
        # answered in the API's shape; the exception is still logged by the server
        return _error(500, "internal", f"{type(exc).__name__}: {exc}", metrics)

    error_responses = {413: {"model": ErrorResponse, "description": "body or text count over the limit "
                                                                     "(max_texts, or more texts than max_queue)"},
                       422: {"model": ErrorResponse, "description": "malformed JSON, wrong types, bad options"},
                       429: {"model": ErrorResponse, "description": "queue full, or every decode loop busy "
                                                                     "with another configuration; see Retry-After"},
                       503: {"model": ErrorResponse, "description": "draining or not warm yet; see Retry-After"},
                       504: {"model": ErrorResponse, "description": "deadline passed; the work was dropped"}}

    @app.post(GENERATE_PATH, response_model=GenerateResponse, responses=error_responses,
              summary="Decode texts (batched with concurrent requests)")
    async def generate(body: GenerateRequest, request: Request) -> Response:
        engine = state.engine
        if engine is None:
            return _error(503, "unavailable", "the server is shutting down.", metrics, headers={"Retry-After": "1"})
        if len(body.texts) > settings.max_texts:
            return _error(413, "too_large", f"{len(body.texts)} texts in one request; at most {settings.max_texts}.",
                          metrics)
        try:
            config = engine.config(body.mode, body.beta, body.tau, body.draft_k, body.num_beams, body.length_penalty,
                                   body.early_stopping, body.num_return_sequences)
            engine.limits(body.max_new_tokens)  # options are refused before any text is tokenized
            prepared = await asyncio.to_thread(engine.prepare, body.texts)  # off the event loop (Engine.prepare)
            handles = engine.submit(body.texts, config, body.max_new_tokens, prepared=prepared)
        except Overloaded as exc:
            return _error(429, "overloaded", str(exc), metrics, headers={"Retry-After": str(exc.retry_after)})
        except TooManyTexts as exc:
            return _error(413, "too_large", str(exc), metrics)
        except AggdecError as exc:
            return _error(422, "invalid", str(exc), metrics)
        futures = [handle.future for handle in handles if handle.future is not None]
        finished = False
        gone = asyncio.ensure_future(_until_gone(request))
        try:
            if futures:
                waiting = asyncio.ensure_future(asyncio.wait(futures, timeout=settings.timeout_s))
                await asyncio.wait((waiting, gone), return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():  # the client left: drop its rows (finally); nobody reads this answer
                    waiting.cancel()
                    return Response(status_code=CLIENT_CLOSED)  # for the latency metric
                _, late = waiting.result()
                if late:
                    engine.cancel(handles)
                    return _error(504, "timeout", f"not done within {settings.timeout_s:g} s; the request's "
                                  "work was dropped.", metrics)
            finished = True
        finally:
            gone.cancel()
            if not finished:  # the client gone, or cancelled (shutdown): drop the rows
                engine.cancel(handles)
        outputs = []
        for handle in handles:
            if handle.error is not None:
                metrics.errors.labels("input").inc()
                outputs.append(_failed("input", str(handle.error)))
            elif handle.future.exception() is not None:
                metrics.errors.labels("internal").inc()
                error = handle.future.exception()
                outputs.append(_failed("internal", f"{type(error).__name__}: {error}"))
            else:
                outputs.append(_output(handle.future.result()))
        return JSONResponse({"mode": config.mode.value, "outputs": outputs})

    @app.get("/healthz", summary="Alive")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz", summary="Bundle loaded and warm (503 otherwise, or while draining)")
    async def readyz() -> Response:
        info = {"bundle": str(generator.root), "manifest_sha256": state.bundle_sha256,
                "device": generator.device, "static_shapes": bool(generator.static_shapes), "mode": str(settings.mode),
                "warmup_seconds": round(state.warm.seconds, 3)}
        if state.draining:
            return JSONResponse({"status": "draining", **info}, status_code=503)
        if not state.warm.ready:
            return JSONResponse({"status": "loading" if state.warm.error is None else "failed",
                                 "error": state.warm.error, **info}, status_code=503)
        return JSONResponse({"status": "ready", **info})

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
