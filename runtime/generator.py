"""`Generator`: load a bundle, decode texts with greedy, IAD or GAD, report what it cost."""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .bundle_checks import check_consistency
from .decoding.arrivals import Arrivals, Closed, Work
from .decoding.common import GREEDY, DecodeLimits, Verification
from .decoding.gad import Drafter, DrafterDraft
from .decoding.iad import BlockOptions, SourceDraft
from .decoding.loop import DraftSource, Finished, NoDraft, decode
from .decoding.shortlist import load_shortlist
from .decoding.sizing import AcceptancePrior, CallCost
from .decoding.verifier import SLACK, Verifier
from .errors import BundleError, InputError, ProviderError
from .manifest import TOKENIZER_FILE, Manifest, load_manifest
from .session import OrtSession, check_device, ort
from .tokenizer import TextCodec

MODES = ("greedy", "iad", "gad", "gad++")
GAD_PLUS_BETA, GAD_PLUS_TAU = 3, 1.0  # GAD++ defaults (SpecDec's relaxed verification)
# per extra block position, relative to a one-token call (see BlockOptions)
DEFAULT_COST_RATIO = {"cpu": 0.05, "cuda": 0.005, "tensorrt": 0.005}
DEFAULT_MAX_BLOCK = {"cpu": 32, "cuda": 64, "tensorrt": 64}
# Source lengths that split a batch into cohorts (runtime/decoding/loop.py: decode). On the CPU a
# call's cost grows with the span its longest row makes every row attend over; a server's
# arrival-order batches mix lengths (benchmarks/results/serve-cpu). A GPU call costs about the
# same at any span and more calls would cost more: one batch.
LENGTH_CLASSES = {"cpu": (32, 64), "cuda": (), "tensorrt": ()}
_END = object()  # the end of a stream's results


@dataclass(frozen=True)
class _Failed:
    """An exception from a stream's reader or decoder thread, to raise in the consumer's."""

    error: BaseException


def _check_batch_size(batch_size: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be an integer of at least 1, got {batch_size!r}.")


# the devices each bundle precision runs on, and why the others cannot run it
PRECISION_DEVICES = {"fp32": ("cpu", "cuda", "tensorrt"), "int8": ("cpu",), "fp16": ("cuda", "cpu")}
PRECISION_LIMITS = {
    "int8": "its MatMulInteger products are a CPU kernel (onnxruntime's CUDA provider would run them on the CPU, "
            "copying every activation across, and TensorRT has no such layer)",
    "fp16": "aggdec's TensorRT engines are built from fp32 graphs (`aggdec build-engines --fp16` builds fp16 "
            "engines from them)",
}


def check_precision(manifest: Manifest, device: str, root: Path | str = "the bundle") -> None:
    """Refuse a bundle whose precision ``device`` cannot run, before any session is made."""
    devices = PRECISION_DEVICES.get(manifest.precision, ())
    if device not in devices:
        raise ProviderError(
            f"{str(root)!r} is an {manifest.precision} bundle, which runs on device {' or '.join(map(repr, devices))} "
            f"only, not {device!r}: {PRECISION_LIMITS[manifest.precision]}. Use "
            f"device {devices[0]!r}, or the fp32 bundle it was converted from on {device!r}."
        )


def drafter_graph(manifest: Manifest, device: str, int8_drafter: bool | None, root: Path | str = "the bundle"
                  ) -> str | None:
    """Which of the bundle's drafter graphs to open: "drafter_int8" (fp32 bundles exported by
    this aggdec carry one) on the CPU unless ``int8_drafter`` is False, else "drafter"; None
    when the bundle has no drafter. The drafter only proposes tokens, which the verifier checks,
    so its precision never changes an output (only how many drafts are accepted)."""
    if int8_drafter is not None and not isinstance(int8_drafter, bool):
        raise InputError(f"int8_drafter must be True, False or None, got {int8_drafter!r}.")
    if "drafter" not in manifest.graphs:
        if int8_drafter:
            raise BundleError(f"int8_drafter=True, but {str(root)!r} has no drafter; export it with --drafter.")
        return None
    if int8_drafter and device != "cpu":
        raise ProviderError(f"int8_drafter=True runs on device 'cpu' only, not {device!r} (int8 MatMulInteger is a "
                            "CPU kernel); leave it unset to use the float drafter there.")
    if int8_drafter and manifest.precision == "fp32" and "drafter_int8" not in manifest.graphs:
        raise BundleError(f"int8_drafter=True, but {str(root)!r} has no int8 drafter (drafter_int8): it was exported "
                          "before aggdec wrote one, or with --no-int8-drafter; re-export it, or leave int8_drafter "
                          "unset.")
    if device == "cpu" and int8_drafter is not False and "drafter_int8" in manifest.graphs:
        return "drafter_int8"
    return "drafter"  # in an int8 bundle, that one is int8 already


def _ort_cuda_available() -> bool:
    return ort is not None and "CUDAExecutionProvider" in ort.get_available_providers()


@dataclass(frozen=True)
class DecodeStats:
    """How one output was produced.

    In a batch, each verifier, drafter and encoder call's time is split evenly among the rows
    it served, so the rows' figures add up to the batch's; ``batch_size`` is the batch's slots.
    """

    iterations: int  # verifier calls
    drafted: tuple[int, ...]  # draft tokens checked per iteration (0 for a greedy step)
    accepted: tuple[int, ...]  # tokens appended per iteration
    encoder_seconds: float
    verifier_seconds: float
    total_seconds: float
    batch_size: int = 1
    drafter_seconds: float = 0.0

    @property
    def graph_seconds(self) -> float:
        return self.encoder_seconds + self.verifier_seconds + self.drafter_seconds

    @property
    def outside_seconds(self) -> float:
        """Time in the decode loop, tokenization and Python glue: not in any graph."""
        return max(self.total_seconds - self.graph_seconds, 0.0)


@dataclass(frozen=True)
class GenerationResult:
    text: str
    ids: tuple[int, ...]  # generated ids after the decoder start token (EOS included if produced)
    stats: DecodeStats


def _as_text(item: object, index: int) -> str:
    """``item`` as a text the tokenizer can take (UTF-8 bytes are decoded), or InputError naming ``index``."""
    if isinstance(item, (bytes, bytearray)):
        try:
            item = bytes(item).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"text {index} is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset "
                             f"{exc.start}).") from None
    if not isinstance(item, str):
        raise InputError(f"text {index} is a {type(item).__name__}, not a string.")
    if not item.strip():
        raise InputError(f"text {index} is empty; give at least one non-space character.")
    try:
        item.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no tokenizer can take it
        raise InputError(f"text {index} holds {item[exc.start]!r} at character {exc.start}, which is not "
                         "a Unicode scalar value (a lone surrogate).") from None
    return item


class Generator:
    """Decodes texts with an aggdec bundle on onnxruntime.

    >>> generator = Generator("bundle/")                         # doctest: +SKIP
    >>> generator.generate(["a sentence"], mode="iad")[0].text   # doctest: +SKIP
    """

    def __init__(self, bundle_dir: str | Path, device: str = "cpu", threads: int | None = None,
                 io_binding: bool | None = None, verify: bool = True, tf32: bool = False,
                 engines: str | Path | None = None, int8_drafter: bool | None = None,
                 shortlist: bool = True) -> None:
        """``io_binding``: pass the cache buffers to onnxruntime by pointer, so that the verifier
        writes each step's keys/values in place (and on CUDA they stay on the device). None (the
        default) means on; off runs the same graphs through numpy arrays, copying the cache in
        and out of every call: identical outputs, slower, kept for debugging and comparison.
        ``verify``: check every bundle file's sha256 against the manifest.
        ``tf32``: on ``device="cuda"``, let onnxruntime run float32 matrix products on TF32
        tensor cores: faster on Ampere and newer GPUs, but no longer transformers' float32
        arithmetic, so outputs may differ from greedy on the CPU where two candidates are close.
        Off by default; refused on the CPU.
        ``device="tensorrt"``: run TensorRT engines built by ``aggdec build-engines`` (from
        ``engines``, default ``BUNDLE.engines``) instead of onnxruntime; needs the [tensorrt]
        extra. NOT RUN YET on a TensorRT machine (README, TensorRT). IO binding there needs
        onnxruntime's CUDA provider too (it allocates the cache on the device); without it the
        cache goes through the host every call.
        ``int8_drafter``: GAD's drafter with int8 products (the bundle's ``drafter_int8``
        graph). None (the default): on the CPU when the bundle has one; True: require it;
        False: the float drafter. Outputs are the same either way: drafts are only proposals.
        ``shortlist``: a bundle with a lexical shortlist (Marian's, decoding/shortlist.py) decodes
        each sentence over its own shortlist; False decodes over the whole vocabulary.

        One Generator may be used from many threads at once: each ``generate`` call has its own
        buffers and binding, and onnxruntime sessions are thread-safe."""
        if device == "tensorrt":  # fail before reading any file
            from aggdec.engines.runtime import check_tensorrt

            check_tensorrt()
            if io_binding is None:
                io_binding = _ort_cuda_available()
            elif io_binding:
                check_device("cuda")  # the bound cache buffers are onnxruntime CUDA allocations
        else:
            check_device(device, tf32)
            if engines is not None:
                raise ProviderError("engines applies to device 'tensorrt' only.")
        self.io_binding = True if io_binding is None else bool(io_binding)
        self.root = Path(bundle_dir)
        self.manifest: Manifest = load_manifest(self.root, verify=verify)
        check_precision(self.manifest, device, self.root)  # before any session is made
        self.drafter_graph = drafter_graph(self.manifest, device, int8_drafter, self.root)
        self.device = device
        self.tf32 = tf32
        self.codec = TextCodec(self.root / TOKENIZER_FILE)
        m = self.manifest
        if device == "tensorrt":
            from aggdec.engines.runtime import engine_sessions

            sessions = engine_sessions(self.root, m, None if engines is None else Path(engines), tf32)
        else:
            sessions = {name: OrtSession(self.root / m.graph(name).file, device, threads, tf32, m.graph(name), name)
                        for name in ("encoder", "verifier", self.drafter_graph, "drafter_source")
                        if name is not None and name in m.graphs}  # drafter_source: a drafter's own layers
        # the graphs must be what the manifest says they are, before any text meets them
        check_consistency(m, sessions, self.codec.vocab_size)
        self._sessions = sessions
        self.verifier = Verifier(sessions["encoder"], sessions["verifier"], m,
                                 load_shortlist(self.root, m) if shortlist else None)
        self.drafter: Drafter | None = None
        # GAD's measured costs (a verifier call by block width, a drafter call), kept across
        # requests so that each starts from what the earlier ones measured
        self.gad_costs = CallCost(DEFAULT_COST_RATIO[device])
        # per drafting mode, the acceptance its rows have seen: a new row's first draft length
        # starts from the workload's rate, not a fixed guess (sizing.AcceptancePrior)
        self.draft_priors = {mode: AcceptancePrior() for mode in ("iad", "gad", "gad++")}
        if self.drafter_graph is not None:
            self.drafter = Drafter(sessions[self.drafter_graph], int(m.draft_k or 0), int(m.mask_token_id or 0),
                                   int(m.draft_window or 0), sessions.get("drafter_source"),
                                   source_positions=m.draft_positions == "source")

    def _seconds(self) -> dict[str, float]:
        seconds = dict(self.verifier.seconds)
        seconds["drafter"] = self.drafter.session.seconds if self.drafter is not None else 0.0
        if "drafter_source" in self._sessions:  # per source, like the encoder (and counted with it per row)
            seconds["encoder"] += self._sessions["drafter_source"].seconds
        return seconds

    @property
    def provider_options(self) -> dict[str, dict[str, str]]:
        """The options onnxruntime applied to the verifier's session, per execution provider
        (empty for TensorRT engines, which onnxruntime does not run)."""
        return dict(getattr(self.verifier.verifier, "provider_options", {}))

    def warm_up(self, mode: str = "greedy", batch_size: int = 1, max_new_tokens: int = 8) -> float:
        """Decode a few short sources once with ``mode`` so that onnxruntime's first-call work
        (memory arenas, CUDA kernel selection, cuBLAS handles) is not counted in the next
        decode's time. Returns the seconds it took; the graphs' time counters are restored."""
        drafts, verification = self._strategy(mode, None, None, None, None)
        started = time.perf_counter()
        before = {name: session.seconds for name, session in self._sessions.items()}
        m = self.manifest
        special = {m.pad_token_id, m.eos_token_id, m.decoder_start_token_id}
        words = [i for i in range(m.vocab_size) if i not in special][: max(1, min(8, m.max_source_len - 1))]
        source = (words + [m.eos_token_id])[: m.max_source_len]
        limits = self._limits(min(max_new_tokens, m.max_target_len - 1))
        rows = max(1, min(int(batch_size), 2))
        for _ in self._decode(Arrivals.of([list(source) for _ in range(rows)]), limits, drafts, verification, rows,
                              known=True):
            pass
        for name, session in self._sessions.items():
            session.seconds = before[name]
        self.gad_costs.reset()  # first calls are slow: not what the next decodes will cost
        for prior in self.draft_priors.values():
            prior.reset()  # the warm-up's made-up text is not the workload
        return time.perf_counter() - started

    @property
    def graph_seconds(self) -> float:
        """Time spent inside onnxruntime by this generator so far."""
        return sum(self._seconds().values())

    # ------------------------------------------------------------------ input checks

    def encode(self, texts: Iterable[str]) -> list[list[int]]:
        """Token ids of each text, refusing what cannot be decoded (with the text's index)."""
        if isinstance(texts, (str, bytes)):
            raise InputError("texts must be a list of strings, not one string; wrap it: [text].")
        try:
            texts = [_as_text(text, index) for index, text in enumerate(texts)]
        except TypeError:
            raise InputError(f"texts must be an iterable of strings, not {type(texts).__name__}.") from None
        encoded = self.codec.encode(texts)
        for index, ids in enumerate(encoded):
            self._check_length(ids, index)
        return encoded

    def _check_length(self, ids: list[int], index: int) -> None:
        limit = self.manifest.max_source_len
        if len(ids) > limit:
            raise InputError(f"text {index} is {len(ids)} tokens long; this bundle accepts at most {limit} "
                             "(split the text, or re-export with a larger --max-source-len).")

    def check(self, text: str) -> str | None:
        """Why ``text`` would be refused, or None if it can be decoded."""
        try:
            self.encode([text])
        except InputError as exc:
            return str(exc).replace("text 0 ", "input ", 1)
        return None

    def _limits(self, max_new_tokens: int | None) -> DecodeLimits:
        m = self.manifest
        start = (m.decoder_start_token_id,) if m.forced_bos_token_id is None else (
            m.decoder_start_token_id, m.forced_bos_token_id)
        ceiling = m.max_target_len - 1
        if max_new_tokens is None:
            max_new_tokens = ceiling
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be an integer of at least 1, got {max_new_tokens!r}.")
        if max_new_tokens > ceiling:
            # the cache holds max_target_len positions, the decoder start token's included
            raise InputError(f"max_new_tokens {max_new_tokens} exceeds this bundle's limit of {ceiling} "
                             f"(max_target_len {m.max_target_len} minus the decoder start token); re-export "
                             "with a larger --max-target-len for longer outputs.")
        return DecodeLimits(start, m.eos_token_id, max_new_tokens, m.forced_eos_token_id)

    # ------------------------------------------------------------------ decoding

    def generate(self, texts: Iterable[str], mode: str = "greedy", max_new_tokens: int | None = None,
                 batch_size: int = 16, block: BlockOptions | None = None, beta: int | None = None,
                 tau: float | None = None, draft_k: int | None = None) -> list[GenerationResult]:
        """Decode ``texts`` (any iterable of strings); results come back in order.

        ``mode``: "greedy", "iad" (the source is the draft), "gad" (drafts from the bundle's
        drafter, output identical to greedy) or "gad++" (relaxed verification: ``beta`` top
        candidates, default 3, within ``tau`` log-prob of the best, default 1.0; ``beta=1`` is
        greedy again). Every mode runs up to ``batch_size`` texts per verifier call, each row with
        its own draft; a finished row's slot goes to the next text at once.
        ``max_new_tokens``: tokens to generate at most (default: the bundle's limit).
        ``block``: IAD draft-block options (default: tuned for the device).
        ``draft_k``: the most GAD draft tokens a verifier call checks, at most the drafter's k
        (default: its k); each row checks fewer while its drafts are being rejected.
        A text that cannot be decoded (empty, too long) raises InputError naming its index,
        before anything is decoded (`check` tells in advance).
        """
        drafts, verification = self._strategy(mode, block, beta, tau, draft_k)
        _check_batch_size(batch_size)
        limits = self._limits(max_new_tokens)
        if not isinstance(texts, (str, bytes)):
            try:
                texts = list(texts)
            except TypeError:
                raise InputError(f"texts must be an iterable of strings, not {type(texts).__name__}.") from None
        encoded = self.encode(texts)
        results: list[GenerationResult | None] = [None] * len(encoded)
        for done in self._decode(Arrivals.of(encoded), limits, drafts, verification, batch_size, known=True):
            results[done.index] = self._result(done, batch_size, texts[done.index])
        return results  # type: ignore[return-value]

    def stream(self, texts: Iterable[str | bytes], mode: str = "greedy", max_new_tokens: int | None = None,
               batch_size: int = 16, block: BlockOptions | None = None, beta: int | None = None,
               tau: float | None = None, draft_k: int | None = None, lookahead: int | None = None
               ) -> Iterator[tuple[int, GenerationResult | InputError]]:
        """Decode ``texts`` while they are still arriving; yields ``(index, result)`` as each
        text finishes, which is not input order.

        ``texts`` is read by a thread of its own, at most ``lookahead`` texts (default
        4 x ``batch_size``) ahead of decoding, so it may be a slow producer (stdin, a socket): a
        text joins the running batch as soon as a slot is free, and a lone text is decoded at
        once. Items are strings, or UTF-8 bytes. A text that cannot be decoded (empty, too long,
        not UTF-8) yields its ``InputError`` in place of a result and the others go on; the
        same options as :meth:`generate` are refused before anything is read. An error raised
        by the iterable itself is re-raised here after the texts before it are done. Stopping
        the iteration early (``break``, an exception) stops reading and decoding.
        """
        drafts, verification = self._strategy(mode, block, beta, tau, draft_k)
        _check_batch_size(batch_size)
        if lookahead is not None and (isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1):
            raise InputError(f"lookahead must be an integer of at least 1, got {lookahead!r}.")
        limits = self._limits(max_new_tokens)
        if isinstance(texts, (str, bytes)):
            raise InputError("texts must be an iterable of strings, not one string; wrap it: [text].")
        try:
            items = iter(texts)
        except TypeError:
            raise InputError(f"texts must be an iterable of strings, not {type(texts).__name__}.") from None
        return self._stream(items, limits, drafts, verification, batch_size, lookahead or 4 * batch_size)

    def _stream(self, items: Iterator, limits: DecodeLimits, drafts: DraftSource, verification: Verification,
                batch_size: int, window: int) -> Iterator[tuple[int, GenerationResult | InputError]]:
        work = Arrivals(lookahead=window, capacity=window)
        sources: dict[int, str] = {}  # the texts being decoded, for restoring <unk> in their results
        out: queue.Queue = queue.Queue()  # (index, result | InputError), or _Failed, or _END

        def read() -> None:
            try:
                for index, item in enumerate(items):
                    try:
                        text, ids = self.prepare(item, index)
                    except InputError as exc:
                        out.put((index, exc))
                        continue
                    sources[index] = text
                    work.put(Work(index, ids))
            except Closed:  # the consumer stopped
                return
            except BaseException as exc:  # the iterable's own error: raised to the consumer in turn
                out.put(_Failed(exc))
            finally:
                work.close()

        def run() -> None:
            try:
                for done in self._decode(work, limits, drafts, verification, batch_size):
                    out.put((done.index, self._result(done, batch_size, sources.pop(done.index))))
            except BaseException as exc:
                out.put(_Failed(exc))
            finally:
                out.put(_END)

        reader = threading.Thread(target=read, name="aggdec-stream-reader", daemon=True)
        decoder = threading.Thread(target=run, name="aggdec-stream-decoder", daemon=True)
        reader.start()
        decoder.start()
        failure: BaseException | None = None
        try:
            while True:
                item = out.get()
                if item is _END:
                    break
                if isinstance(item, _Failed):
                    failure = failure or item.error
                    continue
                yield item
            if failure is not None:
                raise failure
        finally:
            work.abandon()  # a consumer that stopped early stops the reader and the decoder
            decoder.join()

    def generate_ids(self, source_ids: Sequence[int], mode: str = "greedy", max_new_tokens: int | None = None,
                     block: BlockOptions | None = None, beta: int | None = None, tau: float | None = None,
                     draft_k: int | None = None) -> GenerationResult:
        """Decode one already-tokenized source (ids with their special tokens)."""
        drafts, verification = self._strategy(mode, block, beta, tau, draft_k)
        ids = self._checked_ids(source_ids)
        limits = self._limits(max_new_tokens)
        (done,) = self._decode(Arrivals.of([ids]), limits, drafts, verification, 1, known=True)
        return self._result(done, 1)

    def _checked_ids(self, source_ids: Sequence[int]) -> list[int]:
        vocab = self.manifest.vocab_size
        try:
            ids = [int(i) for i in source_ids]
        except (TypeError, ValueError):
            raise InputError("source_ids must be a sequence of integers.") from None
        if not ids:
            raise InputError("source_ids is empty.")
        if len(ids) > self.manifest.max_source_len:
            raise InputError(f"source_ids has {len(ids)} tokens; this bundle accepts at most "
                             f"{self.manifest.max_source_len}.")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise InputError(f"source_ids holds {bad[0]}, outside this bundle's vocabulary [0, {vocab}).")
        return ids

    def _decode(self, work: Arrivals, limits: DecodeLimits, drafts: DraftSource,
                verification: Verification, batch_size: int, linger: float = 0.0, known: bool = False):
        """``known``: ``work`` holds every text from the start (``Arrivals.of``), so it is taken
        shortest first and a batch's rows already have similar lengths; cohorts would only
        split its calls. Otherwise texts come in arrival order and the device's length
        classes apply."""
        classes = () if known else LENGTH_CLASSES[self.device]
        return decode(self.verifier, work, limits, drafts, verification, batch_size, self.manifest.pad_token_id,
                      self.io_binding, linger=linger, classes=classes)

    def check_options(self, mode: str, block: BlockOptions | None = None, beta: int | None = None,
                      tau: float | None = None, draft_k: int | None = None) -> None:
        """Refuse a mode or option this bundle cannot decode with, before any input is read."""
        self._strategy(mode, block, beta, tau, draft_k)

    def _strategy(self, mode: str, block: BlockOptions | None, beta: int | None, tau: float | None,
                  draft_k: int | None) -> tuple[DraftSource, Verification]:
        """The draft source and acceptance rule for ``mode``, with its options checked."""
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; choose one of: {', '.join(MODES)}.")
        if (beta is not None or tau is not None) and mode != "gad++":
            raise InputError("beta and tau apply to mode 'gad++' only.")
        if draft_k is not None and mode not in ("gad", "gad++"):
            raise InputError("draft_k applies to modes 'gad' and 'gad++' only.")
        if block is not None and mode != "iad":
            raise InputError("block applies to mode 'iad' only.")
        if block is not None and not isinstance(block, BlockOptions):
            raise InputError(f"block must be an aggdec.runtime.decoding.iad.BlockOptions, not {type(block).__name__}.")
        if mode == "greedy":
            return NoDraft(), GREEDY
        if mode == "iad":
            return SourceDraft(self._block_options(block), self._limits(None), self.draft_priors[mode]), GREEDY
        drafter = self.drafter
        if drafter is None:
            raise BundleError(f"mode {mode!r} needs a drafter, and the bundle {str(self.root)!r} has none; "
                              "train one with `aggdec train-drafter` and export with --drafter.")
        if draft_k is not None and (isinstance(draft_k, bool) or not isinstance(draft_k, int)
                                    or not 1 <= draft_k <= drafter.k):
            raise InputError(f"draft_k must be an integer between 1 and the drafter's k ({drafter.k}), "
                             f"got {draft_k!r}.")
        drafts = DrafterDraft(drafter, self.manifest.pad_token_id, draft_k, cost_ratio=DEFAULT_COST_RATIO[self.device],
                              costs=self.gad_costs, prior=self.draft_priors[mode])
        if mode == "gad":
            return drafts, GREEDY
        beta = GAD_PLUS_BETA if beta is None else beta
        tau = GAD_PLUS_TAU if tau is None else tau
        if isinstance(beta, bool) or not isinstance(beta, int) or not 1 <= beta <= self.manifest.top_k:
            raise InputError(f"beta must be an integer between 1 and the bundle's top-k ({self.manifest.top_k}), "
                             f"got {beta!r}; re-export with a larger --top-k for more.")
        if not isinstance(tau, (int, float)) or not math.isfinite(tau) or tau < 0:
            raise InputError(f"tau must be a finite number >= 0, got {tau!r}.")
        return drafts, Verification(beta=beta, tau=float(tau))

    # ------------------------------------------------------------------ building blocks for servers

    def prepare(self, item: object, index: int = 0) -> tuple[str, list[int]]:
        """``item`` (a string, or UTF-8 bytes) as a text and its token ids, or the InputError that
        :meth:`stream` would report for it (naming ``index``): what a server checks per item."""
        text = _as_text(item, index)
        ids = self.codec.encode([text])[0]
        self._check_length(ids, index)
        return text, ids

    def limits(self, max_new_tokens: int | None = None) -> DecodeLimits:
        """The stopping rule for ``max_new_tokens`` (None: the bundle's limit), for a
        :class:`Work` of its own; InputError if the bundle cannot honour it."""
        return self._limits(max_new_tokens)

    def decoder(self, work: Arrivals, mode: str = "greedy", batch_size: int = 16, block: BlockOptions | None = None,
                beta: int | None = None, tau: float | None = None, draft_k: int | None = None,
                linger: float = 0.0, on_call: Callable[[int], None] | None = None) -> Iterator[Finished]:
        """The batched decode loop over ``work`` (which may keep growing until it is closed):
        yields each row as it finishes; :meth:`result` turns it into a GenerationResult. A server
        runs one per decoding configuration in a thread of its own, with a queue it never
        closes. ``linger``: seconds an idle loop waits to gather a batch after the first
        source. ``on_call(rows)``: called before each verifier call with its number of rows."""
        drafts, verification = self._strategy(mode, block, beta, tau, draft_k)
        _check_batch_size(batch_size)
        if on_call is not None:
            drafts = _Counted(drafts, on_call)
        return self._decode(work, self._limits(None), drafts, verification, batch_size, linger)

    def result(self, done: Finished, batch_size: int = 1, source: str | None = None) -> GenerationResult:
        """A finished row as a GenerationResult (``source``: its text, to restore <unk>)."""
        return self._result(done, batch_size, source)

    def _block_options(self, block: BlockOptions | None) -> BlockOptions:
        if block is not None:
            return block
        longest = DEFAULT_MAX_BLOCK[self.device]
        limit = getattr(self.verifier.verifier, "max_dim", None)
        if limit is not None:  # a TensorRT engine: blocks (plus a row's missing tokens) within its profile
            longest = max(1, min(longest, limit("input_ids", 1) - SLACK))
        return BlockOptions(max_block=longest, cost_ratio=DEFAULT_COST_RATIO[self.device])

    def _result(self, done: Finished, batch: int, source: str | None = None) -> GenerationResult:
        trace = done.trace
        ids = tuple(trace.tokens[1:])
        started = time.perf_counter()
        # characters the vocabulary lacks come back from the source instead of being dropped
        text = self.codec.decode(list(ids)) if source is None else self.codec.decode_restoring(list(ids), source)
        seconds = done.seconds
        stats = DecodeStats(
            iterations=len(trace.accepted),
            drafted=tuple(trace.drafted),
            accepted=tuple(trace.accepted),
            encoder_seconds=seconds["encoder"],
            verifier_seconds=seconds["verifier"],
            total_seconds=seconds["total"] + time.perf_counter() - started,
            batch_size=batch,
            drafter_seconds=seconds["drafter"],
        )
        return GenerationResult(text=text, ids=ids, stats=stats)


class _Counted:
    """A draft source that reports each verifier call's number of rows (a server's batch-size metric)."""

    def __init__(self, inner: DraftSource, on_call: Callable[[int], None]) -> None:
        self.inner = inner
        self.on_call = on_call

    @property
    def seconds(self) -> float:
        return self.inner.seconds

    @property
    def memory(self):
        return self.inner.memory

    def start(self, row) -> None:
        self.inner.start(row)

    def propose(self, batch, rows, rooms):
        self.on_call(len(rows))
        return self.inner.propose(batch, rows, rooms)

    def observe(self, row, drafted: int, accepted: int, appended: int) -> None:
        self.inner.observe(row, drafted, accepted, appended)
