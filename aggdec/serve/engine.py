"""The server's decoding engine: long-lived batched decode loops fed by requests.

Each decoding configuration a request asks for gets a *lane*: an
:class:`~aggdec.runtime.decoding.arrivals.Arrivals` queue that is never closed and one decoder
thread running :meth:`RowDecoder.rows` over it. A configuration is what needs a loop of its
own (:attr:`DecodeOptions.loop_options`: the mode, num_beams, draft_k, beta, tau); a beam
search's scoring (length_penalty, early_stopping, num_return_sequences) travels with each text,
so requests that differ only in it share a lane. A request's texts are tokenized and
put on their lane's queue; they join the running batch as soon as a slot is free
(continuous batching), and each finished row resolves the request's asyncio future through
``loop.call_soon_threadsafe``, so the event loop never waits on a decode. Texts of different
requests share verifier calls; a row's output depends only on its own text (every kept token
is the verifier's choice after the row's own prefix), so one request never changes another's
output.

Nothing here imports a web framework: the engine is what the FastAPI app and the Ray Serve
deployment both drive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aggdec.runtime.decoding.arrivals import Arrivals, Work
from aggdec.runtime.errors import AggdecError, InputError
from aggdec.runtime.continuous import RowDecoder
from aggdec.runtime.generator import GenerationResult, Generator
from aggdec.runtime.options import DecodeOptions, Mode

# decode loops alive at once besides the default configuration's, which always gets one: each holds
# batch buffers for max_batch rows, so their number bounds memory; idle ones are closed to make room
MAX_LANES = 8

# how far back the completions that size a 429's Retry-After go: long enough to hold a few
# batches' worth at any load, short enough that an idle spell before a burst does not count
RETRY_WINDOW_S = 10.0


class Overloaded(AggdecError, RuntimeError):
    """The queue is full: the client should retry after ``retry_after`` seconds (HTTP 429)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


DEFAULT_MAX_TEXTS = 64  # texts a request may hold, where the queue holds as many


def max_texts_within(max_texts: int | None, max_queue: int, names: tuple[str, str] = ("max_texts", "max_queue")) -> int:
    """The texts a request may hold: ``max_texts``, or not given :data:`DEFAULT_MAX_TEXTS` or a
    lower ``max_queue`` (so that a small queue alone still makes a server). One given above
    ``max_queue`` is an InputError naming both (``names``: how the caller spells them): a
    request of more texts than the queue holds could never be queued, and its 429 would be
    retried for ever (:class:`TooManyTexts` is the engine's own answer to one)."""
    if max_texts is None:
        return min(DEFAULT_MAX_TEXTS, max_queue)
    if max_texts > max_queue:
        texts, queue = names
        raise InputError(f"{texts} {max_texts} is above {queue} {max_queue}: a request of more texts than the queue "
                         f"holds could never be admitted; give {texts} {max_queue} or less, or a larger {queue}.")
    return max_texts


class TooManyTexts(InputError):
    """A request has more texts than the queue holds at all (HTTP 413): no retry can admit it, so
    it is not :class:`Overloaded`, whose 429 and Retry-After would have a client retry forever."""


@dataclass
class _Pending:
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    text: str


@dataclass
class Handle:
    """One submitted item: its future (None when the item was refused) or its error."""

    lane: Lane | None = None
    index: int = -1
    future: asyncio.Future | None = None
    error: InputError | None = None


@dataclass
class EngineHooks:
    """Where the engine reports what it does (the server's metrics); every hook is optional."""

    on_call: Callable[[int], None] | None = None  # rows in a verifier call
    on_result: Callable[[GenerationResult], None] | None = None  # each finished row


class Lane:
    """One decode loop: a queue that is never closed and the thread that decodes from it."""

    def __init__(self, engine: Engine, config: DecodeOptions) -> None:
        self.engine = engine
        self.config = config
        self.work = Arrivals()  # shortest first among everything queued (a source passed over too often goes first)
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self.failure: BaseException | None = None
        self.last_used = time.monotonic()
        # options are checked here, on the caller's thread: a bad one never starts a thread
        self._rows = engine.rows.rows(self.work, config, engine.max_batch, linger=engine.max_wait,
                                      on_call=engine.hooks.on_call)
        self.thread = threading.Thread(target=self._run, name=f"aggdec-serve-{config.mode.value}", daemon=True)
        self.thread.start()

    @property
    def queued(self) -> int:
        """Rows waiting for a slot."""
        return len(self.work)

    @property
    def active(self) -> int:
        """Rows submitted and not finished (queued or decoding)."""
        with self._lock:
            return len(self._pending)

    @property
    def alive(self) -> bool:
        return self.failure is None and not self.work.closed

    def submit(self, index: int, text: str, ids: list[int], limits, beams,
               loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        future = loop.create_future()
        with self._lock:
            self._pending[index] = _Pending(future, loop, text)
        self.last_used = time.monotonic()
        self.work.put(Work(index, ids, limits, beams))
        return future

    def cancel(self, index: int) -> None:
        """Drop row ``index`` (queued or decoding): its result will never be made."""
        with self._lock:
            if self._pending.pop(index, None) is None:
                return  # already finished
        self.work.cancel(index)

    def _run(self) -> None:
        hooks = self.engine.hooks
        try:
            for done in self._rows:
                with self._lock:
                    pending = self._pending.pop(done.index, None)
                if pending is None:  # cancelled just as it finished
                    self.work.forget(done.index)
                    continue
                try:
                    result = self.engine.rows.result(done, pending.text)
                except BaseException as exc:  # noqa: BLE001 - reported to this row's request only
                    _resolve_later(pending, error=exc)
                    continue
                if hooks.on_result is not None:
                    hooks.on_result(result)
                _resolve_later(pending, result=result)
        except BaseException as exc:  # noqa: BLE001 - a broken loop fails its rows, not the server
            self.failure = exc
        finally:
            self.work.abandon()
            with self._lock:
                pending, self._pending = list(self._pending.values()), {}
            error = self.failure or RuntimeError("the decode loop stopped")
            for item in pending:
                _resolve_later(item, error=error)

    def close(self, wait: float | None = None) -> None:
        self.work.abandon()
        if wait is not None:
            self.thread.join(wait)


def _described(config: DecodeOptions) -> str:
    """A lane's configuration (loop options) as a message names it: the mode and each option it sets."""
    options = [f"{field.name} {getattr(config, field.name)}" for field in dataclasses.fields(config)
               if field.name != "mode" and getattr(config, field.name) is not None]
    return ", ".join([f"mode {config.mode.value}", *options])


def _resolve_later(pending: _Pending, result=None, error: BaseException | None = None) -> None:
    def settle() -> None:
        if pending.future.done():  # the request gave up (deadline, disconnect)
            return
        if error is not None:
            pending.future.set_exception(error)
        else:
            pending.future.set_result(result)

    try:
        pending.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the event loop is closed: nobody is waiting
        pass


class Engine:
    """Decodes requests' texts in shared batches, one lane per decoding configuration.

    ``max_batch``: rows per verifier call. ``max_wait``: seconds an idle lane waits to gather a
    batch after the first text. ``max_queue``: rows that may wait for a slot, over every lane;
    past it :meth:`submit` raises :class:`Overloaded`, and a request of more texts than that
    :class:`TooManyTexts`.
    """

    def __init__(self, generator: Generator, mode: Mode | str = Mode.IAD, max_batch: int = 32,
                 max_wait: float = 0.0, max_queue: int = 256, hooks: EngineHooks | None = None) -> None:
        self.generator = generator
        self.rows = RowDecoder(generator)
        self.default_mode = Mode.parse(mode)
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.max_queue = max_queue
        self.hooks = hooks or EngineHooks()
        self._lanes: dict[DecodeOptions, Lane] = {}  # by DecodeOptions.loop_options
        self._default: DecodeOptions | None = None  # _default_loop's, once known
        self._lock = threading.Lock()
        self._indexes = itertools.count()
        self._finished: deque[float] = deque(maxlen=256)  # completion times, for Retry-After
        self._closed = False
        user_hook = self.hooks.on_result

        def on_result(result: GenerationResult) -> None:
            self._finished.append(time.monotonic())
            if user_hook is not None:
                user_hook(result)

        self.hooks.on_result = on_result

    # ------------------------------------------------------------------ configuration

    def config(self, mode: Mode | str | None = None, beta: int | None = None, tau: float | None = None,
               draft_k: int | None = None, num_beams: int | None = None, length_penalty: float | None = None,
               early_stopping: bool | str | None = None, num_return_sequences: int | None = None) -> DecodeOptions:
        """The lane configuration for a request's options, resolved once against the bundle:
        InputError / BundleError if it cannot decode with them (unknown mode, beta/tau outside
        GAD++, draft_k above the drafter's k, GAD without a drafter, more beams than the
        bundle's top-k allows or than a batch has rows: a text with beams takes num_beams rows)."""
        config = self.generator.resolve_options(
            self.default_mode if mode is None else mode, beta=beta, tau=tau, draft_k=draft_k, num_beams=num_beams,
            length_penalty=length_penalty, early_stopping=early_stopping, num_return_sequences=num_return_sequences)
        if (config.num_beams or 1) > self.max_batch:
            raise InputError(f"num_beams {config.num_beams} takes more rows than the server's batch of "
                             f"{self.max_batch}; ask for at most {self.max_batch} beams.")
        return config

    def limits(self, max_new_tokens: int | None):
        return None if max_new_tokens is None else self.rows.limits(max_new_tokens)

    # ------------------------------------------------------------------ load

    @property
    def queued(self) -> int:
        """Rows waiting for a slot, over every lane."""
        return sum(lane.queued for lane in list(self._lanes.values()))

    @property
    def active(self) -> int:
        """Rows submitted and not finished, over every lane."""
        return sum(lane.active for lane in list(self._lanes.values()))

    def retry_after(self, now: float | None = None) -> int:
        """Seconds until the queue has room, from the completions of the last
        :data:`RETRY_WINDOW_S` seconds up to now (1 to 60); 1 where none finished in it. The
        rate is over the window up to now, not between the last completions: after an idle
        spell those spanned it (the warm-up's too), and a queue that was draining in a second
        was told to come back in 25-60."""
        now = time.monotonic() if now is None else now
        recent = [t for t in list(self._finished) if now - t <= RETRY_WINDOW_S]
        if len(recent) < 2 or now <= recent[0]:
            return 1
        rate = len(recent) / (now - recent[0])
        return int(min(60, max(1, math.ceil(self.queued / rate))))

    # ------------------------------------------------------------------ requests

    def prepare(self, items: Sequence[object]) -> list[tuple[str, list[int]] | InputError]:
        """Each item as its text and token ids, or its InputError (empty, too long, not a string).
        Safe in any thread: the app runs it in a worker thread, because tokenizing a 1 MiB text
        takes 0.3-0.9 s, and on the event loop that stalled every other request as long."""
        prepared: list[tuple[str, list[int]] | InputError] = []
        for position, item in enumerate(items):
            try:
                prepared.append(self.rows.prepare(item, position))
            except InputError as exc:
                prepared.append(exc)
        return prepared

    def submit(self, items: Sequence[object], config: DecodeOptions, max_new_tokens: int | None = None,
               loop: asyncio.AbstractEventLoop | None = None,
               prepared: Sequence[tuple[str, list[int]] | InputError] | None = None) -> list[Handle]:
        """Queue ``items`` (each a text) on ``config``'s lane. Returns a handle per item: a future
        that resolves to its GenerationResult, or the item's InputError (empty, too long, not a
        string). Raises :class:`Overloaded` when the queue has no room for the request's texts
        now, :class:`TooManyTexts` when it never can (more texts than ``max_queue``; nothing is
        queued either way), InputError for a bad ``max_new_tokens``. ``prepared``: what
        :meth:`prepare` gave for ``items``, if it has run already."""
        loop = loop or asyncio.get_running_loop()
        limits = self.limits(max_new_tokens)
        handles: list[Handle] = []
        accepted: list[tuple[Handle, str, list[int]]] = []
        for entry in self.prepare(items) if prepared is None else prepared:
            if isinstance(entry, InputError):
                handles.append(Handle(error=entry))
                continue
            text, ids = entry
            handle = Handle()
            handles.append(handle)
            accepted.append((handle, text, ids))
        # counted in the texts that would be queued (items refused above take no place): more than
        # the whole queue is refused even on an idle server, where "retry later" would never come
        # true. `aggdec serve` refuses --max-texts above --max-queue at startup; an app built in
        # Python (create_app, Ray's application) may still be given such settings
        if len(accepted) > self.max_queue:
            raise TooManyTexts(f"this request has {len(accepted)} texts to decode, more than the server's queue "
                               f"holds at once ({self.max_queue}); send at most {self.max_queue} a request.")
        with self._lock:
            if self._closed:
                raise Overloaded("the server is shutting down.", retry_after=1)
            queued = self.queued
            if accepted and queued + len(accepted) > self.max_queue:
                room = max(0, self.max_queue - queued)
                raise Overloaded(f"the queue is full: {queued} texts wait, room for {room} more of at most "
                                 f"{self.max_queue}; this request has {len(accepted)}. Retry later.",
                                 retry_after=self.retry_after())
            lane = self._lane(config.loop_options) if accepted else None
            beams = self.rows.beam_rules(config)
            for handle, text, ids in accepted:
                handle.lane, handle.index = lane, next(self._indexes)
                handle.future = lane.submit(handle.index, text, ids, limits, beams, loop)
        return handles

    def cancel(self, handles: Sequence[Handle]) -> None:
        """Drop the unfinished rows of ``handles`` (a request past its deadline or gone)."""
        for handle in handles:
            if handle.lane is not None and handle.future is not None and not handle.future.done():
                handle.lane.cancel(handle.index)
                handle.future.cancel()

    def _lane(self, config: DecodeOptions) -> Lane:
        lane = self._lanes.get(config)
        if lane is not None and lane.alive:
            return lane
        if lane is not None:  # its loop failed: its rows were failed; a new loop takes over
            del self._lanes[config]
        default = self._default_loop()
        others = [lane for key, lane in self._lanes.items() if key != default]
        if config != default and len(others) >= MAX_LANES:
            idle = sorted((lane for lane in others if lane.active == 0), key=lambda lane: lane.last_used)
            if not idle:
                raise Overloaded(
                    f"this request's decoding configuration ({_described(config)}) would need a decode loop of its "
                    f"own, and the {MAX_LANES} that the server runs besides its default one are all busy with other "
                    "configurations; retry later, or send the server's default options or those of a busy one "
                    "(a beam search's length_penalty, early_stopping and num_return_sequences make none).",
                    retry_after=1)
            idle[0].close()
            del self._lanes[idle[0].config]
        lane = self._lanes[config] = Lane(self, config)
        return lane

    def _default_loop(self) -> DecodeOptions | None:
        """The loop options of a request that names none (None: the default mode cannot decode)."""
        if self._default is None:
            try:
                self._default = self.config().loop_options
            except AggdecError:  # e.g. GAD without a drafter: every such request is refused anyway
                return None
        return self._default

    def close(self, wait: float | None = 5.0) -> None:
        """Stop every lane (unfinished rows fail); no more requests are taken."""
        with self._lock:
            self._closed = True
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.close(wait)


@dataclass
class Warmup:
    """Warm-up state: the bundle is loaded and one text has gone through the default lane."""

    ready: bool = False
    error: str | None = None
    seconds: float = field(default=0.0)


async def warm_up(engine: Engine, text: str = "warm up") -> Warmup:
    """Decode one text through the default lane (its thread starts, onnxruntime allocates)."""
    started = time.perf_counter()
    state = Warmup()
    try:
        (handle,) = engine.submit([text], engine.config(), max_new_tokens=None)
        if handle.error is not None:
            raise handle.error
        await handle.future
        state.ready = True
    except Exception as exc:  # noqa: BLE001 - reported by /readyz
        state.error = f"{type(exc).__name__}: {exc}"
    state.seconds = time.perf_counter() - started
    return state
