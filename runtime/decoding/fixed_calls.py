"""A static batch's verifier calls with every input and output at a fixed address: what
onnxruntime's CUDA graphs need (``Generator(cuda_graphs=True)``).

A captured CUDA graph replays the kernels of one run with the addresses they had: it may be
replayed only while every input and output of the call is the same buffer, of the same shape,
and only the buffers' contents change. :class:`~.verifier.StaticBatch` already gives each batch
one shape (decision 034) and its caches fixed addresses (``cache.py``); a :class:`FixedCall`
adds the rest: the ids, the past lengths, the source mask and the candidates, each an
onnxruntime value allocated once on the session's device, refreshed in place
(``OrtValue.update_inplace``) before a call, bound once. Its :class:`FixedEncoderCall` does the
same for the encoder, whose every call in a static batch is one source at the source
allocation's width: its cross keys and values stay on the device and are copied from there into
the rows' slots (``SlotBuffers.write_cross``), where the ordinary admission brings them to the
host and uploads them again. On the CPU the same code runs with
CPU values, which is how the tests check it without a GPU: the outputs must equal the static
path's that binds the ids and lengths from the host.

A capture bakes its buffers' addresses in, and onnxruntime keeps every graph it captured for
the session's life (it has no call to drop one). So the calls are pooled (:class:`FixedCalls`,
one per Verifier): a batch takes a free call of its shape (slots, width, which graph, and
whether the rows keep an encoder output: the capacities are the bundle's) and gives it back when
its decode ends, with its buffers and its graph id (``gpu_graph_id``, one per call made,
from 1: 0 is onnxruntime's own). A later batch of that shape replays the graph captured before;
two batches of one shape at once (two threads, two cohorts) take two calls, and two graphs.
The graphs captured are at most (shapes x concurrent batches), and so is the memory the pool
keeps (onnxruntime keeps them per thread: a batch of a shape on a new thread captures again).
A capture runs in CUDA's global capture mode, which another thread's synchronous CUDA work
(another session's run, an upload) breaks: the run then fails, and the pool goes on without
graphs (:meth:`FixedCalls.refuse`); decode from one thread to keep them. Ran on an H100
(benchmarks/results/gpu-check-h100-cudagraphs: every exact mode equal to static decoding
without graphs, greedy at batch 1 1.8x faster).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ..bundle_schema import HEAD_POSITIONS
from ..errors import GraphRunError
from ..session import Session, require_onnxruntime
from .cache import SlotBuffers

# onnxruntime's output types, as its sessions name them (the candidates are bound before any run)
_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
                "tensor(int32)": np.int32}


def _writes_as(encoder: Session, names: list[str], dtype: np.dtype) -> bool:
    """Whether ``encoder`` writes its cross keys and values in ``dtype``, the verifier buffers'
    (a byte copy into them needs it; otherwise the admission converts them on the host)."""
    declared = {output.name: output.type for output in encoder.inference_session.get_outputs()}
    return all(np.dtype(_NUMPY_TYPES.get(declared.get(name, ""), object)) == dtype for name in names)


def _run(session: Session, binding: Any, call: FixedCall | FixedEncoderCall, refused: Callable[[str], None]) -> None:
    """Run ``call``'s binding under its graph id; where the graph cannot be captured or
    replayed, ``refused`` is told why and the call runs again without one (and keeps none:
    its outputs and cache writes are the same)."""
    if call.graph_id is None:
        session.run_bound(binding)
        return
    try:
        session.run_bound(binding, call.graph_id)
    except GraphRunError as exc:
        refused(str(exc))
        call.graph_id = None
        session.run_bound(binding)


class FixedEncoderCall:
    """The encoder's call for one source at a static batch's source width, every input and
    output bound once on the session's device: ``cross``, one row of each cross key and value
    (``cross_names``' order) as the verifier's buffers lay them out, and ``hidden``, the encoder
    output, when the rows keep it (a drafter reads it on the host)."""

    def __init__(self, session: Session, buffers: SlotBuffers, names: list[str], graph_id: int | None) -> None:
        """``graph_id``: none where onnxruntime refused the encoder a CUDA graph (its session
        then has no ``cuda_graph``): the call is still bound once, and runs without a graph."""
        ort = require_onnxruntime()
        device, width = session.device, buffers.max_source
        self.session = session
        self.graph_id = graph_id if getattr(session, "cuda_graph", False) else None
        declared = {output.name: output.type for output in session.inference_session.get_outputs()}
        self.ids = ort.OrtValue.ortvalue_from_shape_and_type([1, width], np.int64, device, 0)
        self.mask = ort.OrtValue.ortvalue_from_shape_and_type([1, width], np.int64, device, 0)
        self.cross = [ort.OrtValue.ortvalue_from_shape_and_type(
            list(buffers.cross_shape(rows=1, source=width, key=index % 2 == 0)), _NUMPY_TYPES[declared[name]], device, 0)
            for index, name in enumerate(names)]  # cross_names' order: key, value
        self.binding = session.binding()
        self.binding.bind_ortvalue_input("input_ids", self.ids)
        self.binding.bind_ortvalue_input("attention_mask", self.mask)
        for name, value in zip(names, self.cross):
            self.binding.bind_ortvalue_output(name, value)
        self.hidden = None
        if buffers.keep_hidden:
            self.hidden = ort.OrtValue.ortvalue_from_shape_and_type(
                [1, width, buffers.d_model], _NUMPY_TYPES[declared["encoder_hidden_states"]], device, 0)
            self.binding.bind_ortvalue_output("encoder_hidden_states", self.hidden)

    def run(self, input_ids: np.ndarray, mask: np.ndarray, refused: Callable[[str], None]) -> None:
        """Encode ``input_ids`` [1, width] under ``mask``: :attr:`cross` and :attr:`hidden` hold the result."""
        self.ids.update_inplace(input_ids)
        self.mask.update_inplace(mask)
        _run(self.session, self.binding, self, refused)


class FixedCall:
    """One static shape's buffers and binding; every verifier input and output is bound once
    (and, with ``encoder``, the encoder's: :class:`FixedEncoderCall`)."""

    def __init__(self, session: Session, buffers: SlotBuffers, width: int, candidates: tuple[str, ...],
                 tail: tuple[int, ...], names: tuple[list[str], list[str], list[str]], graph_id: int | None,
                 encoder: Session | None = None) -> None:
        """``tail``: the candidates' dims after [slots, width] (Verifier.candidate_tail).
        ``encoder``: the bundle's encoder session, for a :class:`FixedEncoderCall` of these
        buffers (under the same graph id: ids are per session)."""
        ort = require_onnxruntime()
        device = session.device
        slots = buffers.slots
        self.session, self.buffers, self.width, self.graph_id = session, buffers, width, graph_id
        declared = {output.name: output.type for output in session.inference_session.get_outputs()}
        shape = [slots, width, *tail]
        # an argmax graph that takes HEAD_POSITIONS (decision 050): asked for every position, once
        self.head_positions = None
        if HEAD_POSITIONS in {graph_input.name for graph_input in session.inference_session.get_inputs()}:
            self.head_positions = np.arange(slots * width, dtype=np.int64)
            shape = [1, slots * width, *tail]
        self.candidates = [ort.OrtValue.ortvalue_from_shape_and_type(shape, _NUMPY_TYPES[declared[name]], device, 0)
                           for name in candidates]
        self.ids = ort.OrtValue.ortvalue_from_shape_and_type([slots, width], np.int64, device, 0)
        self.past = ort.OrtValue.ortvalue_from_shape_and_type([slots], np.int64, device, 0)
        self.mask = ort.OrtValue.ortvalue_from_shape_and_type(list(buffers.source_mask().shape), np.int64, device, 0)
        self.source_mask_changed()
        self.binding = session.binding()
        self.binding.bind_ortvalue_input("input_ids", self.ids)
        self.binding.bind_ortvalue_input("past_lengths", self.past)
        self.binding.bind_ortvalue_input("encoder_attention_mask", self.mask)
        if self.head_positions is not None:
            self.positions = ort.OrtValue.ortvalue_from_numpy(self.head_positions, device, 0)
            self.binding.bind_ortvalue_input(HEAD_POSITIONS, self.positions)
        for name, value in zip(candidates, self.candidates):
            self.binding.bind_ortvalue_output(name, value)
        buffers.bind(self.binding, *names)  # the caches by pointer, written in place: fixed for life
        self.encoder = None
        if encoder is not None and _writes_as(encoder, names[2], buffers.dtype):
            self.encoder = FixedEncoderCall(encoder, buffers, names[2], graph_id)

    def run(self, tokens: np.ndarray, past: np.ndarray, refused: Callable[[str], None]) -> list[np.ndarray]:
        """The candidates for ``tokens`` [slots, width] after ``past`` [slots] cached positions.
        ``refused``: told why, when the call's graph could not be captured or replayed (the
        call is then run again without one: its cache writes are the same)."""
        self.ids.update_inplace(tokens)
        self.past.update_inplace(past)
        _run(self.session, self.binding, self, refused)
        return [value.numpy() for value in self.candidates]

    def source_mask_changed(self) -> None:
        """Rows joined: the mask's new contents, into the same buffer."""
        self.mask.update_inplace(self.buffers.source_mask())


class FixedCalls:
    """The pool of a Verifier's :class:`FixedCall` s, by shape (module docstring).

    ``graphs``: give each call made a graph id (its session captures and replays it when made
    with ``cuda_graph``; a CPU session ignores the id, which lets the tests run the pool)."""

    def __init__(self, graphs: bool = True) -> None:
        self.graphs = graphs
        self.refused: str | None = None  # why onnxruntime would not run a graph, once it did not
        self.made = 0  # calls made (and graph ids given) so far
        self._free: dict[tuple, list[FixedCall]] = {}
        self._lock = threading.Lock()

    def take(self, key: tuple, make: Callable[[int | None], FixedCall]) -> FixedCall:
        """A free call for ``key``, or a new one from ``make(graph_id)``."""
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
            self.made += 1
            graph_id = self.made if self.graphs and self.refused is None else None
        return make(graph_id)

    def give(self, key: tuple, call: FixedCall) -> None:
        with self._lock:
            self._free.setdefault(key, []).append(call)

    def refuse(self, why: str) -> None:
        """A graph failed: the calls made from now on have none, and the user is told once."""
        with self._lock:
            first = self.refused is None
            self.refused = why
        if first:
            warnings.warn(f"onnxruntime could not capture or replay a CUDA graph; decoding goes on "
                          f"without CUDA graphs: {why}", RuntimeWarning, stacklevel=2)

    def key(self, session: Any, slots: int, width: int, keep_hidden: bool) -> tuple:
        """A call's shape: which session (its graphs are its own), the slots, the width, and
        whether the buffers keep an encoder output (the capacities are the bundle's)."""
        return (id(session), slots, width, keep_hidden)
