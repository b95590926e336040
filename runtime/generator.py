"""`Generator`: decode texts with greedy, IAD or GAD over an opened bundle, report what it cost.

Opening the bundle (manifest, sessions, drafter) is :func:`aggdec.runtime.loader.open_bundle`;
how to decode is a :class:`~aggdec.runtime.options.DecodeOptions`; how drafts and batches are
sized is a :class:`~aggdec.runtime.tuning.Tuning`."""

from __future__ import annotations

import dataclasses
import queue
import reprlib
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from . import values
from .decoding.arrivals import Arrivals, Closed, Work
from .decoding.beam import BeamRules
from .decoding.cache import check_rows
from .decoding.common import GREEDY, DecodeLimits, Verification
from .decoding.gad import DrafterDraft, HypothesisDrafterDraft
from .decoding.iad import BlockOptions, HypothesisSourceDraft, SourceDraft
from .decoding.loop import DraftSource, Finished, NoDraft, decode
from .decoding.fixed_calls import FixedCalls
from .decoding.sizing import AcceptancePrior, CallCost, DraftGate
from .decoding.verifier import SLACK, Verifier
from .errors import EmptyTextError, InputError
from .graph_specs import VERIFIER_GRAPHS, argmax_graph_runs_on
from .loader import PRECISION_DEVICES, PRECISION_LIMITS, OpenedBundle, check_precision, drafter_graph, open_bundle
from .options import DRAFTING_MODES, GAD_PLUS_BETA, GAD_PLUS_TAU, MODES, DecodeOptions, Mode, OptionLimits
from .tokenizer import SPLIT_OR_REEXPORT
from .tuning import Tuning, tuning_for
from .values import is_integer, positive_integer

__all__ = ["DecodeOptions", "DecodeStats", "GAD_PLUS_BETA", "GAD_PLUS_TAU", "GenerationResult", "Generator",
           "Hypothesis", "MODES",
           "Mode", "PRECISION_DEVICES", "PRECISION_LIMITS", "check_precision", "drafter_graph"]

_END = object()  # the end of a stream's results


@dataclass(frozen=True)
class _Failed:
    """An exception from a stream's reader or decoder thread, to raise in the consumer's."""

    error: BaseException


class Strategy(NamedTuple):
    """How the loop decodes for resolved options: where drafts come from, which of them pass,
    and (beam search) how a text's rows select their hypotheses."""

    drafts: DraftSource
    verification: Verification
    beams: BeamRules | None = None

    @property
    def rows_per_text(self) -> int:
        return 1 if self.beams is None else self.beams.num_beams


def _check_tuning(tuning: object) -> None:
    if tuning is not None and not isinstance(tuning, Tuning):
        raise InputError(f"tuning must be an aggdec.runtime.tuning.Tuning, not {type(tuning).__name__}.")


def _check_static_shapes(static_shapes: object) -> None:
    values.flag("static_shapes", static_shapes, optional=True)


def static_shapes_advice(device: str, precision: str, static_shapes: bool | None) -> str | None:
    """What a caller who did not choose ``static_shapes`` should know, or None. A float16 bundle
    on CUDA is where a call's shape was seen to change an output: cuBLAS picks kernels by shape,
    and on an H100 fp16 IAD, GAD and batched greedy parted from fp16 greedy at batch 1 in a few
    sentences of 1,000 (decision 034); with static shapes every mode equalled static greedy.
    float32 kept every output there; the CPU's kernels do not depend on the shape."""
    if static_shapes is not None or device != "cuda" or precision != "fp16":
        return None
    return ("a float16 bundle on CUDA without static shapes: a call's shape can change a log-prob's last bits "
            "there, so IAD, GAD and batched greedy may part from greedy at batch 1 on a near tie (decision 034). "
            "static_shapes=True (aggdec generate/serve --static-shapes) makes every mode exact by construction, "
            "slower batched; static_shapes=False (--no-static-shapes) decodes as now without this warning.")


def _check_cuda_graphs(cuda_graphs: object, static_shapes: bool | None, device: str,
                       io_binding: bool | None) -> None:
    """CUDA graphs replay one shape at fixed addresses: static shapes, onnxruntime's CUDA
    provider, buffers bound on the device."""
    if not values.flag("cuda_graphs", cuda_graphs):
        return
    if device != "cuda":
        raise InputError(f"cuda_graphs needs device 'cuda' (onnxruntime's CUDA provider captures them), not "
                         f"{device!r}.")
    if not static_shapes:
        raise InputError("cuda_graphs needs static_shapes=True (--static-shapes): a graph is captured for one "
                         "verifier shape, and only static shapes keep a batch's calls at one.")
    if io_binding is False:
        raise InputError("cuda_graphs needs io_binding: a graph replays calls whose inputs and outputs are bound "
                         "on the device.")


@dataclass(frozen=True)
class DecodeStats:
    """How one output was produced.

    In a batch, each verifier, drafter and encoder call's time is split evenly among the rows
    it served, so the rows' figures add up to the batch's; ``batch_size`` is the most rows a
    verifier call that decoded this output served (it included): 1 for a text decoded alone,
    whatever batch size was allowed.
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
class Hypothesis:
    """One of a beam search's returned hypotheses."""

    text: str
    ids: tuple[int, ...]  # generated ids after the decoder start token (EOS included if produced)
    score: float  # transformers' sequences_scores: log-prob sum / length ** length_penalty


@dataclass(frozen=True)
class GenerationResult:
    text: str
    ids: tuple[int, ...]  # generated ids after the decoder start token (EOS included if produced)
    stats: DecodeStats
    # beam search: the best hypothesis's sequence score, and the num_return_sequences best
    # hypotheses, best first (the first is text/ids); greedy: None and ()
    score: float | None = None
    sequences: tuple[Hypothesis, ...] = ()


# The longest text taken, in UTF-8 bytes (a str: in characters), checked before it is decoded or
# tokenized: no bundle takes that many tokens (at most 65,536), and the CLI reads no more of a line.
MAX_TEXT_BYTES = 1 << 24


def _kind_of(item: object) -> str:
    """What a non-text item is, in words that fit a JSON value (a server's texts) and a Python one."""
    if item is None:
        return "null (None)"
    if isinstance(item, bool):
        return "a boolean"
    if isinstance(item, (int, float)):
        return "a number"
    if isinstance(item, (list, tuple)):
        return "a list"
    if isinstance(item, dict):
        return "an object (a dict)"
    name = type(item).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _as_text(item: object, index: int) -> str:
    """``item`` as a text the tokenizer can take (UTF-8 bytes are decoded), or InputError naming ``index``."""
    if isinstance(item, (bytes, bytearray, str)) and len(item) > MAX_TEXT_BYTES:
        unit = "characters" if isinstance(item, str) else "bytes"
        raise InputError(f"text {index} is longer than {MAX_TEXT_BYTES:,} {unit}; no bundle takes that many tokens "
                         "(split the text).")
    if isinstance(item, (bytes, bytearray)):
        try:
            item = bytes(item).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"text {index} is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset "
                             f"{exc.start}).") from None
    if not isinstance(item, str):
        raise InputError(f"text {index} is {_kind_of(item)}, not a string.")
    if not item.strip():
        raise EmptyTextError(f"text {index} is empty; give at least one non-space character.")
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
                 tuning: Tuning | None = None, shortlist: bool = True, static_shapes: bool | None = None,
                 cuda_graphs: bool = False) -> None:
        """``threads``: onnxruntime's intra-op threads per graph; None: one per physical core, or
        one per CPU when the process is pinned to fewer than the machine has (taskset, a
        container's cpuset: ``session.default_threads``).

        ``io_binding``: pass the cache buffers to onnxruntime by pointer, so that the verifier
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
        ``tuning``: how drafts and batches are sized (default: ``tuning_for(device)``); speed
        only, never the output.
        ``shortlist``: a bundle with a lexical shortlist (Marian's, decoding/shortlist.py) decodes
        each sentence over its own shortlist; False decodes over the whole vocabulary.
        ``static_shapes``: every verifier call of a batch at one shape (its slots x
        :attr:`static_width` tokens, caches of the whole allocation) and every source encoded
        alone at the bundle's ``max_source_len``: a row's log-probs then depend on its own tokens
        only, not on its block, the rows beside it or when it joined, which a GPU's
        shape-dependent kernels otherwise break (decoding/verifier.StaticBatch). On the CPU it
        is slower (every call pays the widest block and the longest cache). Not with a shortlist
        (``shortlist=False`` decodes such a bundle without one). On a GPU it is what makes fp16
        exact: every mode equalled static greedy on an H100, at 1.06-2.6x the time batched (decision 034).
        None (the default): off, with a RuntimeWarning for a float16 bundle on CUDA
        (:func:`static_shapes_advice`); False: off, without it.
        ``cuda_graphs``: with ``static_shapes`` on ``device="cuda"``, the verifier's calls are
        captured as CUDA graphs (onnxruntime's ``enable_cuda_graph``), one per batch shape, and
        replayed: every input and output bound once on the device (decoding/fixed_calls.py).
        Off by default; on an H100 every exact mode gave static decoding's outputs with them, and
        greedy at batch 1 ran 1.8x faster (benchmarks/results/gpu-check-h100-cudagraphs; IAD and
        GAD, which make few calls, 1.1-1.5x). Since that run the encoder's calls (one source at
        the source allocation's width) are captured too, their outputs copied into the rows'
        slots on the device: NOT YET RUN on a GPU (equal to the static path on the CPU). Where
        onnxruntime refuses (a verifier node off the CUDA provider), decoding goes on without
        them, the encoder refused alone runs without its own, and :attr:`cuda_graphs_refused` says why.
        Decode from one thread at a time with it: a capture runs in CUDA's global capture mode,
        in which another thread's CUDA work fails.

        Every flag takes True or False (None where it has a default) and nothing else, and
        ``bundle_dir`` and ``engines`` a str or os.PathLike: anything else is an InputTypeError
        naming it, before any file is read (``runtime/values.py``).

        One Generator may be used from many threads at once: each ``generate`` call has its own
        buffers and binding, and onnxruntime sessions are thread-safe."""
        bundle_dir = values.path("bundle_dir", bundle_dir)  # before any file is read
        _check_tuning(tuning)
        _check_static_shapes(static_shapes)
        _check_cuda_graphs(cuda_graphs, static_shapes, device, io_binding)
        self._setup(open_bundle(bundle_dir, device=device, threads=threads, io_binding=io_binding, verify=verify,
                                tf32=tf32, engines=engines, int8_drafter=int8_drafter, shortlist=shortlist,
                                cuda_graphs=cuda_graphs),
                    tuning, static_shapes)

    @classmethod
    def from_bundle(cls, bundle: OpenedBundle, tuning: Tuning | None = None,
                    static_shapes: bool | None = None) -> Generator:
        """A Generator over a bundle :func:`~aggdec.runtime.loader.open_bundle` opened (with
        ``cuda_graphs=True`` there for CUDA graphs, which need ``static_shapes`` here)."""
        generator = cls.__new__(cls)
        generator._setup(bundle, tuning, static_shapes)
        return generator

    def _setup(self, bundle: OpenedBundle, tuning: Tuning | None, static_shapes: bool | None = None) -> None:
        if not isinstance(bundle, OpenedBundle):
            raise InputError(f"bundle must be what open_bundle returns, not {type(bundle).__name__}.")
        _check_tuning(tuning)
        _check_static_shapes(static_shapes)
        advice = static_shapes_advice(bundle.device, bundle.manifest.precision, static_shapes)
        if advice is not None:
            warnings.warn(advice, RuntimeWarning, stacklevel=3)
        static_shapes = bool(static_shapes)
        _check_cuda_graphs(bundle.request.cuda_graphs, static_shapes, bundle.device, bundle.io_binding)
        if static_shapes and bundle.shortlist is not None:
            raise InputError(f"static_shapes cannot decode {str(bundle.root)!r} over its lexical shortlist: the "
                             "verifier's output width follows each batch's lists; open it with shortlist=False "
                             "(--no-shortlist) to decode over the whole vocabulary.")
        self.tuning = tuning_for(bundle.device) if tuning is None else tuning
        self.bundle = bundle
        self.root, self.manifest, self.codec = bundle.root, bundle.manifest, bundle.codec
        self.device, self.tf32, self.io_binding = bundle.device, bundle.request.tf32, bundle.io_binding
        self.drafter_graph, self.drafter = bundle.drafter_graph, bundle.drafter
        self._sessions = bundle.sessions
        argmax = bundle.sessions.get("verifier_argmax") if self.tuning.argmax_graph else None
        if not argmax_graph_runs_on(bundle.manifest, bundle.device):
            argmax = None  # not opened by open_bundle on this device; an OpenedBundle made otherwise may hold it
        # CUDA graphs: the verifier and encoder sessions were made with enable_cuda_graph
        # (devices.OrtFactory), unless onnxruntime refused it for one of them: a verifier refused,
        # none is used; the encoder refused, it alone runs without (fixed_calls.FixedEncoderCall)
        refused = {name: why for name, why in ((name, getattr(session, "cuda_graph_refused", None))
                                               for name, session in bundle.sessions.items()) if why}
        said = "; ".join(f"{name}: {why}" for name, why in refused.items())
        self.cuda_graphs_refused: str | None = said if bundle.request.cuda_graphs and refused else None
        self.cuda_graphs = bundle.request.cuda_graphs and not set(refused) & set(VERIFIER_GRAPHS)
        if self.cuda_graphs_refused:
            warnings.warn("onnxruntime refused CUDA graphs; these graphs run without them: "
                          + self.cuda_graphs_refused, RuntimeWarning, stacklevel=3)
        self.verifier = Verifier(bundle.sessions["encoder"], bundle.sessions["verifier"], bundle.manifest,
                                 self.tuning.encoder_call_tokens, bundle.shortlist, argmax,
                                 self.tuning.kept_matrix_slots, FixedCalls() if self.cuda_graphs else None)
        # GAD's measured costs (a verifier call by block width, a drafter call), kept across
        # requests so that each starts from what the earlier ones measured; IAD's too when
        # load-adaptive (Tuning.load_adaptive: fitted per batch width)
        self.gad_costs = CallCost(self.tuning.cost_ratio, by_rows=self.tuning.load_adaptive)
        # GAD's (and GAD++'s) drafted against plain iterations, per token a row: whether a batch
        # drafts at all (Tuning.draft_payoff)
        self.gad_gates = {mode: DraftGate() for mode in (Mode.GAD, Mode.GAD_PLUS)}
        # per drafting mode, the acceptance its rows have seen: a new row's first draft length
        # starts from the workload's rate, not a fixed guess (sizing.AcceptancePrior)
        self.draft_priors = {mode: AcceptancePrior() if self.tuning.shared_prior else None for mode in DRAFTING_MODES}
        # speculative beam search's: the beam steps its calls replayed past the first (far fewer
        # than IAD's accepted tokens: every hypothesis a step selects must be on a drafted path)
        self.replay_prior = AcceptancePrior() if self.tuning.shared_prior else None
        # and its iterations' costs by width: whole iterations, host work included (its own:
        # GAD's and IAD's fits time the verifier call alone)
        self.beam_costs = CallCost(self.tuning.beam_cost_ratio, by_rows=True)
        # drafted against plain iterations, per beam step: its veto, and the rests between tries
        self.beam_gate = DraftGate.per_beam_step()
        # GAD's beam search keeps its own: a drafter's replay rate, and iterations that pay for a
        # drafter call, are not IAD's
        self.gad_replay_prior = AcceptancePrior() if self.tuning.shared_prior else None
        self.gad_beam_costs = CallCost(self.tuning.beam_cost_ratio, by_rows=True)
        self.gad_beam_gate = DraftGate.per_beam_step()
        # static shapes: every call this many tokens a row, the widest block any mode may ask:
        # a row's pending tokens (at most SLACK) and the longest draft (IAD's block, the drafter's
        # k). A longer wish (a caller's BlockOptions) is cut to fit: a shorter draft changes
        # speed, never the output. One width for every mode, so that all modes' calls share it.
        self.static_shapes = static_shapes
        drafts = max(self._block_options(None).max_block, self.drafter.k if self.drafter is not None else 0)
        self.static_width: int | None = SLACK + drafts if static_shapes else None

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

    def warm_up(self, options: DecodeOptions | Mode | str | None = None, batch_size: int = 1,
                max_new_tokens: int = 8) -> float:
        """Decode a few short sources once with ``options`` (or a mode) so that onnxruntime's first-call work
        (memory arenas, CUDA kernel selection, cuBLAS handles) is not counted in the next
        decode's time. Returns the seconds it took; the graphs' time counters are restored."""
        strategy = self._strategy(self.resolve_options(options))
        started = time.perf_counter()
        before = {name: session.seconds for name, session in self._sessions.items()}
        m = self.manifest
        special = {m.pad_token_id, m.eos_token_id, m.decoder_start_token_id}
        words = [i for i in range(m.vocab_size) if i not in special][: max(1, min(8, m.max_source_len - 1))]
        source = (words + [m.eos_token_id])[: m.max_source_len]
        limits = self._limits(min(positive_integer("max_new_tokens", max_new_tokens), m.max_target_len - 1))
        texts = min(positive_integer("batch_size", batch_size), 2)
        for _ in self._decode(Arrivals.of([list(source) for _ in range(texts)]), limits, strategy,
                              texts * strategy.rows_per_text, known=True):
            pass
        for name, session in self._sessions.items():
            session.seconds = before[name]
        self.gad_costs.reset()  # first calls are slow: not what the next decodes will cost
        for measured in (self.beam_costs, self.beam_gate, self.gad_beam_costs, self.gad_beam_gate,
                         *self.gad_gates.values()):
            measured.reset()
        for prior in (*self.draft_priors.values(), self.replay_prior, self.gad_replay_prior):
            if prior is not None:
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
        encoded = self.codec.encode(texts, most=self.manifest.max_source_len)
        for index, ids in enumerate(encoded):
            self._check_length(ids, index)
        return encoded

    def _check_length(self, ids: list[int], index: int) -> None:
        limit = self.manifest.max_source_len
        if len(ids) > limit:
            raise InputError(f"text {index} is {len(ids)} tokens long; this bundle accepts at most {limit} "
                             f"{SPLIT_OR_REEXPORT}")

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
        max_new_tokens = positive_integer("max_new_tokens", max_new_tokens)
        if max_new_tokens > ceiling:
            # the cache holds max_target_len positions, the decoder start token's included
            raise InputError(f"max_new_tokens {max_new_tokens} exceeds this bundle's limit of {ceiling} "
                             f"(max_target_len {m.max_target_len} minus the decoder start token); re-export "
                             "with a larger --max-target-len for longer outputs.")
        # the manifest's per-source cap (Marian's max-length-factor) is applied per row by the loop
        return DecodeLimits(start, m.eos_token_id, max_new_tokens, m.forced_eos_token_id, m.max_length_factor)

    # ------------------------------------------------------------------ decoding

    def generate(self, texts: Iterable[str], options: DecodeOptions | Mode | str | None = None,
                 max_new_tokens: int | None = None, batch_size: int = 16, *, mode: Mode | str | None = None,
                 block: BlockOptions | None = None, beta: int | None = None, tau: float | None = None,
                 draft_k: int | None = None, num_beams: int | None = None, length_penalty: float | None = None,
                 early_stopping: bool | str | None = None, num_return_sequences: int | None = None
                 ) -> list[GenerationResult]:
        """Decode ``texts`` (any iterable of strings); results come back in order.

        ``options``: a :class:`DecodeOptions` (default: greedy), or just a mode. The keywords
        ``mode``, ``block``, ``beta``, ``tau`` and ``draft_k`` are a shorthand for
        ``DecodeOptions(mode, ...)`` (its fields are documented there): "greedy", "iad" (the
        source is the draft), "gad" (drafts from the bundle's drafter, output identical to
        greedy) or "gad++" (relaxed verification). Every mode runs up to ``batch_size`` texts per
        verifier call, each row with its own draft; a finished row's slot goes to the next text
        at once. ``max_new_tokens``: tokens to generate at most (default: the bundle's limit).
        A text that cannot be decoded (empty, too long) raises InputError naming its index,
        before anything is decoded (`check` tells in advance).

        ``num_beams`` (with ``length_penalty``, ``early_stopping``, ``num_return_sequences``):
        beam search, equal to transformers' ``generate(num_beams=...)``; each result carries its
        ``score`` and its ``sequences`` (the best ``num_return_sequences``, best first), and a
        text takes ``num_beams`` rows, so a batch holds ``batch_size`` texts in
        ``batch_size x num_beams`` rows.

        A batch's cache buffers are made for all its rows at once: here, for the rows the texts
        fill (``min(batch_size, len(texts))`` texts' rows), so a large ``batch_size`` over a few
        texts costs nothing. Rows whose buffers cannot fit in this machine's physical memory are
        refused before anything is decoded (InputError naming the bytes a row and the limit).
        """
        strategy = self._strategy(self.resolve_options(
            options, mode=mode, block=block, beta=beta, tau=tau, draft_k=draft_k, num_beams=num_beams,
            length_penalty=length_penalty, early_stopping=early_stopping, num_return_sequences=num_return_sequences))
        batch_size = positive_integer("batch_size", batch_size)
        limits = self._limits(max_new_tokens)
        if not isinstance(texts, (str, bytes)):
            try:
                texts = list(texts)
            except TypeError:
                raise InputError(f"texts must be an iterable of strings, not {type(texts).__name__}.") from None
            # texts known up front: the batch is made for the rows they fill, not for batch_size's
            check_rows(min(batch_size, len(texts)) * strategy.rows_per_text, self._row_bytes(strategy), "batch_size",
                       batch_size, strategy.rows_per_text)
        encoded = self.encode(texts)
        results: list[GenerationResult | None] = [None] * len(encoded)
        for done in self._decode(Arrivals.of(encoded), limits, strategy, self._rows(batch_size, strategy), known=True):
            results[done.index] = self._result(done, texts[done.index])
        return results  # type: ignore[return-value]

    def stream(self, texts: Iterable[str | bytes], options: DecodeOptions | Mode | str | None = None,
               max_new_tokens: int | None = None, batch_size: int = 16, lookahead: int | None = None, *,
               mode: Mode | str | None = None, block: BlockOptions | None = None, beta: int | None = None,
               tau: float | None = None, draft_k: int | None = None, num_beams: int | None = None,
               length_penalty: float | None = None, early_stopping: bool | str | None = None,
               num_return_sequences: int | None = None) -> Iterator[tuple[int, GenerationResult | InputError]]:
        """Decode ``texts`` while they are still arriving; yields ``(index, result)`` as each
        text finishes, which is not input order.

        ``texts`` is read by a thread of its own, at most ``lookahead`` texts (default
        4 x ``batch_size``) ahead of decoding, so it may be a slow producer (stdin, a socket): a
        text joins the running batch as soon as a slot is free, and a lone text is decoded at
        once. Items are strings, or UTF-8 bytes. A text that cannot be decoded (empty, too long,
        not UTF-8) yields its ``InputError`` in place of a result and the others go on; the
        same options as :meth:`generate` are refused before anything is read. An error raised
        by the iterable itself is re-raised here after the texts before it are done. Stopping
        the iteration early (``break``, an exception) stops reading and decoding. With beam
        search a text's result comes when all its hypotheses are done, as in :meth:`generate`.
        While texts still arrive, the batch's cache buffers are made for all ``batch_size``
        texts' rows at the first text: a ``batch_size`` whose rows cannot fit in this machine's
        physical memory is refused with the other options.
        """
        strategy = self._strategy(self.resolve_options(
            options, mode=mode, block=block, beta=beta, tau=tau, draft_k=draft_k, num_beams=num_beams,
            length_penalty=length_penalty, early_stopping=early_stopping, num_return_sequences=num_return_sequences))
        batch_size = positive_integer("batch_size", batch_size)
        rows = self._rows(batch_size, strategy)
        # texts still arriving: the batch is made for all batch_size texts' rows when the first comes
        check_rows(rows, self._row_bytes(strategy), "batch_size", batch_size, strategy.rows_per_text)
        if lookahead is not None:
            lookahead = positive_integer("lookahead", lookahead)
        limits = self._limits(max_new_tokens)
        if isinstance(texts, (str, bytes)):
            raise InputError("texts must be an iterable of strings, not one string; wrap it: [text].")
        try:
            items = iter(texts)
        except TypeError:
            raise InputError(f"texts must be an iterable of strings, not {type(texts).__name__}.") from None
        return self._stream(items, limits, strategy, rows, lookahead or 4 * batch_size)

    def _stream(self, items: Iterator, limits: DecodeLimits, strategy: Strategy, rows: int, window: int
                ) -> Iterator[tuple[int, GenerationResult | InputError]]:
        work = Arrivals(lookahead=window, capacity=window)
        sources: dict[int, str] = {}  # the texts being decoded, for restoring <unk> in their results
        out: queue.Queue = queue.Queue()  # (index, result | InputError), or _Failed, or _END

        def read() -> None:
            try:
                for index, item in enumerate(items):
                    try:
                        text, ids = self._prepare(item, index)
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
                for done in self._decode(work, limits, strategy, rows):
                    out.put((done.index, self._result(done, sources.pop(done.index))))
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

    def generate_ids(self, source_ids: Sequence[int], options: DecodeOptions | Mode | str | None = None,
                     max_new_tokens: int | None = None, *, mode: Mode | str | None = None,
                     block: BlockOptions | None = None, beta: int | None = None, tau: float | None = None,
                     draft_k: int | None = None, num_beams: int | None = None, length_penalty: float | None = None,
                     early_stopping: bool | str | None = None, num_return_sequences: int | None = None
                     ) -> GenerationResult:
        """Decode one already-tokenized source (ids with their special tokens); ``options`` as
        for :meth:`generate`."""
        strategy = self._strategy(self.resolve_options(
            options, mode=mode, block=block, beta=beta, tau=tau, draft_k=draft_k, num_beams=num_beams,
            length_penalty=length_penalty, early_stopping=early_stopping, num_return_sequences=num_return_sequences))
        ids = self._checked_ids(source_ids)
        limits = self._limits(max_new_tokens)
        (done,) = self._decode(Arrivals.of([ids]), limits, strategy, self._rows(1, strategy), known=True)
        return self._result(done)

    def _checked_ids(self, source_ids: Sequence[int]) -> list[int]:
        vocab = self.manifest.vocab_size
        if isinstance(source_ids, (str, bytes, bytearray)):  # int() took each character: "560" was [5, 6, 0]
            raise InputError("source_ids must be a sequence of integers (token ids), not a string; "
                             "Generator.encode gives a text's.")
        try:
            ids = list(source_ids)
        except TypeError:
            raise InputError("source_ids must be a sequence of integers.") from None
        # each an integer: int() truncated 5.9 to 5 and took True as 1 (another source, decoded
        # silently), and raised OverflowError on inf
        wrong = [i for i in ids if not is_integer(i)]
        if wrong:
            raise InputError(f"source_ids must be a sequence of integers (token ids), and it holds "
                             f"{reprlib.repr(wrong[0])}.")
        ids = [int(i) for i in ids]
        if not ids:
            raise InputError("source_ids is empty.")
        if len(ids) > self.manifest.max_source_len:
            raise InputError(f"source_ids has {len(ids)} tokens; this bundle accepts at most "
                             f"{self.manifest.max_source_len}.")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise InputError(f"source_ids holds {bad[0]}, outside this bundle's vocabulary [0, {vocab}).")
        return ids

    def _rows(self, batch_size: int, strategy: Strategy) -> int:
        """The rows ``batch_size`` texts take (``num_beams`` each with beam search); InputError
        when a verifier call cannot take that many."""
        rows = batch_size * strategy.rows_per_text
        limit = self.option_limits.max_rows
        if strategy.beams is not None and limit is not None and rows > limit:
            raise InputError(f"batch_size {batch_size} x num_beams {strategy.beams.num_beams} = {rows} rows, more "
                             f"than the {limit} a verifier call of {str(self.root)!r} may take; lower batch_size.")
        return rows

    def _row_bytes(self, strategy: Strategy | None = None) -> int:
        """The bytes a batch allocates per row at once for ``strategy`` (None: for the costliest
        mode this bundle decodes: with a drafter, each row keeps its encoder output for it), what
        :func:`~.decoding.cache.check_rows` weighs a batch size with."""
        keep_hidden = self.drafter is not None if strategy is None else strategy.drafts.memory is not None
        return self.verifier.row_bytes(keep_hidden, self.static_width)

    def _decode(self, work: Arrivals, limits: DecodeLimits, strategy: Strategy, rows: int, linger: float = 0.0,
                known: bool = False):
        """Decode ``work`` in at most ``rows`` rows at once (a beam text takes ``num_beams``).
        ``known``: ``work`` holds every text from the start (``Arrivals.of``), so it is taken
        shortest first and a batch's rows already have similar lengths; cohorts would only
        split its calls. Otherwise texts come in arrival order and the device's length
        classes apply."""
        classes = () if known else self.tuning.length_classes
        return decode(self.verifier, work, limits, strategy.drafts, strategy.verification, rows,
                      self.manifest.pad_token_id, self.io_binding, linger=linger, classes=classes,
                      width_quantile=self.tuning.width_quantile, beams=strategy.beams,
                      static_width=self.static_width)

    @property
    def option_limits(self) -> OptionLimits:
        """What this bundle allows decoding options to be (its top-k, its drafter's k)."""
        limit = getattr(self.verifier.verifier, "max_dim", None)  # a TensorRT engine's profile
        return OptionLimits(top_k=self.manifest.top_k, drafter_k=None if self.drafter is None else self.drafter.k,
                            bundle=str(self.root), shortlist=self.verifier.shortlist is not None,
                            max_rows=None if limit is None else limit("input_ids", 0),
                            normalized=not self.manifest.suppressed_token_ids
                            or self.manifest.suppression == "after_log_softmax",
                            max_target_len=self.manifest.max_target_len, vocab_size=self.manifest.vocab_size,
                            **self._beam_defaults())

    def _beam_defaults(self) -> dict[str, Any]:
        """The bundle's beam rules for OptionLimits: Marian's, with its decoding yml's scoring."""
        rules = self.manifest.beam_rules
        if rules is None:
            return {}
        return {"beam_family": rules["family"], "beam_length_penalty": float(rules["normalize"]),
                "beam_word_penalty": float(rules["word_penalty"])}

    def resolve_options(self, options: DecodeOptions | Mode | str | None = None, **fields: object) -> DecodeOptions:
        """``options`` (or a mode and keyword fields, as :meth:`generate` takes them) checked
        against this bundle, with the mode's defaults filled in (:meth:`DecodeOptions.resolve`)."""
        return DecodeOptions.of(options, **fields).resolve(self.option_limits)

    def check_options(self, options: DecodeOptions | Mode | str | None = None, **fields: object) -> DecodeOptions:
        """Refuse a mode or option this bundle cannot decode with, before any input is read;
        returns the resolved options (same as :meth:`resolve_options`)."""
        return self.resolve_options(options, **fields)

    def _strategy(self, options: DecodeOptions) -> Strategy:
        """The draft source, acceptance rule and beam rules for resolved ``options``."""
        mode = options.mode
        beams = options.rules(self.option_limits)
        if mode is Mode.GREEDY:
            return Strategy(NoDraft(), GREEDY, beams)
        if mode is Mode.IAD and beams is not None:  # speculative beam search
            # sized as IAD's blocks are: measured call costs unless the caller gave BlockOptions
            measured = self.tuning.load_adaptive and options.block is None
            block = options.block or dataclasses.replace(self._block_options(None),
                                                         cost_ratio=self.tuning.beam_cost_ratio)
            return Strategy(HypothesisSourceDraft(block, self.replay_prior,
                                                  self.beam_costs if measured else None,
                                                  self.beam_gate if measured else None), GREEDY, beams)
        if mode is Mode.IAD:
            # a caller's own BlockOptions size the blocks with their cost_ratio, not the measured
            # call costs, so the same options draft the same blocks whatever the timings
            measured = self.tuning.load_adaptive and options.block is None
            return Strategy(SourceDraft(self._block_options(options.block), self.draft_priors[mode],
                                        self.gad_costs if measured else None), GREEDY)
        assert self.drafter is not None  # resolve() refused a drafting mode without one
        tuning = self.tuning
        if mode is Mode.GAD and beams is not None:  # speculative beam search, the drafter's drafts
            # sized as IAD's beams are (a TensorRT profile's width included), drafts of at most draft_k
            measured = tuning.load_adaptive and options.block is None
            block = options.block or dataclasses.replace(self._block_options(None), cost_ratio=tuning.beam_cost_ratio)
            block = dataclasses.replace(block, max_block=min(block.max_block, int(options.draft_k)))
            return Strategy(HypothesisDrafterDraft(self.drafter, self.manifest.pad_token_id, block,
                                                   self.gad_replay_prior, self.gad_beam_costs if measured else None,
                                                   self.gad_beam_gate if measured else None),
                            GREEDY, beams)
        drafts = DrafterDraft(self.drafter, self.manifest.pad_token_id, options.draft_k, cost_ratio=tuning.cost_ratio,
                              costs=self.gad_costs, prior=self.draft_priors[mode], decay=tuning.gad_decay,
                              max_rest=tuning.max_rest, min_repeat=tuning.min_repeat,
                              gate=self.gad_gates[mode] if tuning.draft_payoff else None)
        if mode is Mode.GAD:
            return Strategy(drafts, GREEDY)
        return Strategy(drafts, Verification(beta=int(options.beta), tau=float(options.tau)))

    def _prepare(self, item: object, index: int = 0) -> tuple[str, list[int]]:
        """``item`` (a string, or UTF-8 bytes) as a text and its token ids, or the InputError that
        :meth:`stream` reports for it (naming ``index``)."""
        text = _as_text(item, index)
        ids = self.codec.encode([text], first_index=index, most=self.manifest.max_source_len)[0]
        self._check_length(ids, index)
        return text, ids

    def _block_options(self, block: BlockOptions | None) -> BlockOptions:
        if block is not None:
            return block
        # no block holds more than the bundle's output (DecodeOptions.resolve cuts a caller's so)
        longest = min(self.tuning.max_block, self.manifest.max_target_len)
        limit = getattr(self.verifier.verifier, "max_dim", None)
        if limit is not None:  # a TensorRT engine: blocks (plus a row's missing tokens) within its profile
            longest = max(1, min(longest, limit("input_ids", 1) - SLACK))
        return BlockOptions(max_block=longest, cost_ratio=self.tuning.cost_ratio, max_rest=self.tuning.max_rest,
                            min_repeat=self.tuning.min_repeat)

    def _result(self, done: Finished, source: str | None = None) -> GenerationResult:
        trace = done.trace
        ids = tuple(trace.tokens[1:])
        started = time.perf_counter()
        text = self._text(ids, source)
        seconds = done.seconds
        stats = DecodeStats(
            iterations=len(trace.accepted),
            drafted=tuple(trace.drafted),
            accepted=tuple(trace.accepted),
            encoder_seconds=seconds["encoder"],
            verifier_seconds=seconds["verifier"],
            total_seconds=seconds["total"] + time.perf_counter() - started,
            batch_size=max(trace.rows, default=1),  # the rows decoded together, not the configured maximum
            drafter_seconds=seconds["drafter"],
        )
        if not done.hypotheses:
            return GenerationResult(text=text, ids=ids, stats=stats)
        sequences = tuple(Hypothesis(text if index == 0 else self._text(hypothesis.tokens[1:], source),
                                     tuple(hypothesis.tokens[1:]), hypothesis.score)
                          for index, hypothesis in enumerate(done.hypotheses))
        return GenerationResult(text=text, ids=ids, stats=stats, score=sequences[0].score, sequences=sequences)

    def _text(self, ids: Sequence[int], source: str | None) -> str:
        # characters the vocabulary lacks come back from the source instead of being dropped
        return self.codec.decode(list(ids)) if source is None else self.codec.decode_restoring(list(ids), source)
