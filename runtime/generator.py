"""`Generator`: load a bundle, decode texts with greedy, IAD or GAD, report what it cost."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .decoding.common import DecodeLimits, RowTrace, Verification
from .decoding.gad import Drafter, gad
from .decoding.greedy import greedy
from .decoding.iad import BlockOptions, iad
from .decoding.verifier import DecodeState, Verifier
from .errors import BundleError, InputError
from .manifest import TOKENIZER_FILE, Manifest, load_manifest
from .session import OrtSession, check_device
from .tokenizer import TextCodec

MODES = ("greedy", "iad", "gad", "gad++")
GAD_PLUS_BETA, GAD_PLUS_TAU = 3, 1.0  # GAD++ defaults (SpecDec's relaxed verification)
# per extra block position, relative to a one-token call (see BlockOptions)
DEFAULT_COST_RATIO = {"cpu": 0.05, "cuda": 0.005}
DEFAULT_MAX_BLOCK = {"cpu": 32, "cuda": 64}


@dataclass(frozen=True)
class DecodeStats:
    """How one output was produced.

    For a batched greedy call the times are those of the whole batch the text was in
    (``batch_size`` says how many texts shared them).
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


class Generator:
    """Decodes texts with an aggdec bundle on onnxruntime.

    >>> generator = Generator("bundle/")                         # doctest: +SKIP
    >>> generator.generate(["a sentence"], mode="iad")[0].text   # doctest: +SKIP
    """

    def __init__(self, bundle_dir: str | Path, device: str = "cpu", threads: int | None = None,
                 io_binding: bool | None = None, verify: bool = True) -> None:
        """``io_binding``: None picks per device: on for CUDA, where it keeps the cache on the GPU;
        off for the CPU, where there is nothing to keep and binding each call costs a little
        (benchmarks/decode_overhead.py: 2% of greedy time on a Transformer-base-sized model).
        ``verify``: check every bundle file's sha256 against the manifest."""
        check_device(device)  # fail before reading any file
        if io_binding is None:
            io_binding = device == "cuda"
        self.root = Path(bundle_dir)
        self.manifest: Manifest = load_manifest(self.root, verify=verify)
        self.device = device
        self.codec = TextCodec(self.root / TOKENIZER_FILE)
        m = self.manifest
        self.verifier = Verifier(OrtSession(self.root / m.graph("encoder").file, device, threads, io_binding),
                                 OrtSession(self.root / m.graph("verifier").file, device, threads, io_binding), m)
        self.drafter: Drafter | None = None
        if "drafter" in m.graphs:
            session = OrtSession(self.root / m.graph("drafter").file, device, threads, io_binding)
            self.drafter = Drafter(session, int(m.draft_k or 0), int(m.mask_token_id or 0))

    def _seconds(self) -> dict[str, float]:
        seconds = dict(self.verifier.seconds)
        seconds["drafter"] = self.drafter.session.seconds if self.drafter is not None else 0.0
        return seconds

    @property
    def graph_seconds(self) -> float:
        """Time spent inside onnxruntime by this generator so far."""
        return sum(self._seconds().values())

    # ------------------------------------------------------------------ input checks

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, refusing what cannot be decoded (with the text's index)."""
        if isinstance(texts, str):
            raise InputError("texts must be a list of strings, not one string; wrap it: [text].")
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"text {index} is a {type(text).__name__}, not a string.")
            if not text.strip():
                raise InputError(f"text {index} is empty; give at least one non-space character.")
        encoded = self.codec.encode(list(texts))
        limit = self.manifest.max_source_len
        for index, ids in enumerate(encoded):
            if len(ids) > limit:
                raise InputError(
                    f"text {index} is {len(ids)} tokens long; this bundle accepts at most {limit} "
                    "(split the text, or re-export with a larger --max-source-len)."
                )
        return encoded

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
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be at least 1, got {max_new_tokens}.")
        return DecodeLimits(start, m.eos_token_id, min(max_new_tokens, ceiling), m.forced_eos_token_id)

    # ------------------------------------------------------------------ decoding

    def generate(self, texts: Sequence[str], mode: str = "greedy", max_new_tokens: int | None = None,
                 batch_size: int = 16, block: BlockOptions | None = None, beta: int | None = None,
                 tau: float | None = None, draft_k: int | None = None) -> list[GenerationResult]:
        """Decode ``texts``; results come back in order.

        ``mode``: "greedy" (batches of ``batch_size``), "iad" (the source is the draft),
        "gad" (drafts from the bundle's drafter, output identical to greedy) or "gad++"
        (relaxed verification: ``beta`` top candidates, default 3, within ``tau`` log-prob of
        the best, default 1.0; ``beta=1`` is greedy again). IAD and GAD decode one text at a time.
        ``max_new_tokens``: tokens to generate at most (default: the bundle's limit).
        ``block``: IAD draft-block options (default: tuned for the device).
        ``draft_k``: GAD draft tokens per iteration, at most the drafter's k (default: its k).
        """
        decode = self._decoder(mode, block, beta, tau, draft_k)
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {batch_size}.")
        limits = self._limits(max_new_tokens)
        encoded = self.encode(texts)
        if decode is None:
            results: list[GenerationResult] = []
            for first in range(0, len(encoded), batch_size):
                results.extend(self._greedy_batch(encoded[first : first + batch_size], limits))
            return results
        return [self._one_row(ids, limits, decode) for ids in encoded]

    def generate_ids(self, source_ids: Sequence[int], mode: str = "greedy", max_new_tokens: int | None = None,
                     block: BlockOptions | None = None, beta: int | None = None, tau: float | None = None,
                     draft_k: int | None = None) -> GenerationResult:
        """Decode one already-tokenized source (ids with their special tokens)."""
        decode = self._decoder(mode, block, beta, tau, draft_k)
        ids = [int(i) for i in source_ids]
        if not ids:
            raise InputError("source_ids is empty.")
        if len(ids) > self.manifest.max_source_len:
            raise InputError(f"source_ids has {len(ids)} tokens; this bundle accepts at most "
                             f"{self.manifest.max_source_len}.")
        limits = self._limits(max_new_tokens)
        if decode is None:
            return self._greedy_batch([ids], limits)[0]
        return self._one_row(ids, limits, decode)

    def check_options(self, mode: str, block: BlockOptions | None = None, beta: int | None = None,
                      tau: float | None = None, draft_k: int | None = None) -> None:
        """Refuse a mode or option this bundle cannot decode with, before any input is read."""
        self._decoder(mode, block, beta, tau, draft_k)

    def _decoder(self, mode: str, block: BlockOptions | None, beta: int | None, tau: float | None,
                 draft_k: int | None) -> Callable[[DecodeState, list[int], DecodeLimits], RowTrace] | None:
        """The one-row decode loop for ``mode`` with its options checked (None: batched greedy)."""
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; choose one of: {', '.join(MODES)}.")
        if (beta is not None or tau is not None) and mode != "gad++":
            raise InputError("beta and tau apply to mode 'gad++' only.")
        if draft_k is not None and mode not in ("gad", "gad++"):
            raise InputError("draft_k applies to modes 'gad' and 'gad++' only.")
        if mode == "greedy":
            return None
        if mode == "iad":
            options = self._block_options(block)
            return lambda state, ids, limits: iad(state, np.asarray(ids, dtype=np.int64), limits, options)
        drafter = self.drafter
        if drafter is None:
            raise BundleError(f"mode {mode!r} needs a drafter, and the bundle {str(self.root)!r} has none; "
                              "train one with `aggdec train-drafter` and export with --drafter.")
        if draft_k is not None and not 1 <= draft_k <= drafter.k:
            raise InputError(f"draft_k must be between 1 and the drafter's k ({drafter.k}), got {draft_k}.")
        if mode == "gad":
            verification = Verification()
        else:
            beta = GAD_PLUS_BETA if beta is None else beta
            tau = GAD_PLUS_TAU if tau is None else tau
            if not 1 <= beta <= self.manifest.top_k:
                raise InputError(f"beta must be between 1 and the bundle's top-k ({self.manifest.top_k}), got "
                                 f"{beta}; re-export with a larger --top-k for more.")
            if tau < 0:
                raise InputError(f"tau must be >= 0, got {tau}.")
            verification = Verification(beta=beta, tau=tau)
        return lambda state, ids, limits: gad(state, drafter, limits, verification, draft_k)

    def _block_options(self, block: BlockOptions | None) -> BlockOptions:
        if block is not None:
            return block
        return BlockOptions(max_block=DEFAULT_MAX_BLOCK[self.device], cost_ratio=DEFAULT_COST_RATIO[self.device])

    def _batch_arrays(self, encoded: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        width = max(len(ids) for ids in encoded)
        input_ids = np.full((len(encoded), width), self.manifest.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(encoded), width), dtype=np.int64)
        for row, ids in enumerate(encoded):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        return input_ids, mask

    def _greedy_batch(self, encoded: list[list[int]], limits: DecodeLimits) -> list[GenerationResult]:
        started, before = time.perf_counter(), self._seconds()
        state = self.verifier.start(*self._batch_arrays(encoded))
        traces = greedy(state, limits, self.manifest.pad_token_id)
        return [self._result(t, started, before, len(encoded)) for t in traces]

    def _one_row(self, ids: list[int], limits: DecodeLimits,
                 decode: Callable[[DecodeState, list[int], DecodeLimits], RowTrace]) -> GenerationResult:
        started, before = time.perf_counter(), self._seconds()
        state = self.verifier.start(*self._batch_arrays([ids]))
        return self._result(decode(state, ids, limits), started, before, 1)

    def _result(self, trace: RowTrace, started: float, before: dict[str, float], batch: int) -> GenerationResult:
        ids = tuple(trace.tokens[1:])
        text = self.codec.decode(list(ids))
        now = self._seconds()
        stats = DecodeStats(
            iterations=len(trace.accepted),
            drafted=tuple(trace.drafted),
            accepted=tuple(trace.accepted),
            encoder_seconds=now["encoder"] - before["encoder"],
            verifier_seconds=now["verifier"] - before["verifier"],
            total_seconds=time.perf_counter() - started,
            batch_size=batch,
            drafter_seconds=now["drafter"] - before["drafter"],
        )
        return GenerationResult(text=text, ids=ids, stats=stats)
