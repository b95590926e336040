"""Sessions: how the decoding loops run a graph, whatever runs it.

The loops see only the :class:`Session` protocol: run a graph with named numpy inputs and get
named numpy outputs, or, for the buffers that stay put between calls, run it through an IO
binding that the caller fills (see ``decoding/cache.py``). :class:`OrtSession` implements it
with onnxruntime on the CPU or CUDA execution provider.

Thread safety: one session serves many threads. onnxruntime's ``run`` is thread-safe, and
every batch makes its own IO binding (a binding is per call sequence, never shared), so
concurrent ``Generator.generate`` calls never see each other's buffers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from .errors import BundleError, ProviderError

DEVICES = ("cpu", "cuda")


class Session(Protocol):
    """A graph that can be run; ``seconds`` is the time spent inside it, summed over calls."""

    device: str
    seconds: float

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def binding(self) -> Any: ...

    def run_bound(self, binding: Any) -> list[Any]: ...


def check_device(device: str) -> list[Any]:
    """The onnxruntime providers for a device, or a ProviderError saying how to get them."""
    if device not in DEVICES:
        raise ProviderError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}.")
    if device == "cpu":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise ProviderError(
            "device 'cuda' needs onnxruntime's CUDAExecutionProvider, but this onnxruntime offers only "
            f"{', '.join(available)}. Install aggdec[gpu] (onnxruntime-gpu) on a machine with an NVIDIA GPU, "
            "or use device 'cpu'."
        )
    return [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]


class OrtSession:
    """An ONNX graph run by onnxruntime on one device."""

    def __init__(self, path: str | Path, device: str = "cpu", threads: int | None = None) -> None:
        providers = check_device(device)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1  # one request's graph at a time: parallelism is inside ops
        if threads is not None:
            if threads < 1:
                raise ProviderError(f"threads must be at least 1, got {threads}.")
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors for a corrupt file
            raise BundleError(f"onnxruntime could not load {str(path)!r}: {exc}") from exc
        if device == "cuda" and "CUDAExecutionProvider" not in self._session.get_providers():
            raise ProviderError(
                "onnxruntime could not start its CUDA provider (is a GPU visible, and do the CUDA libraries "
                "match onnxruntime-gpu?); use device 'cpu' or fix the CUDA installation."
            )
        self.device = device
        self.seconds = 0.0
        self._lock = threading.Lock()
        self.input_names = tuple(i.name for i in self._session.get_inputs())
        self.output_names = tuple(o.name for o in self._session.get_outputs())
        self.inference_session = self._session  # for load-time checks of the graph's declared IO

    def _count(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        started = time.perf_counter()
        values = self._session.run(None, dict(inputs))
        self._count(time.perf_counter() - started)
        return dict(zip(self.output_names, values))

    def binding(self) -> ort.IOBinding:
        """A fresh IO binding: one per batch, so that threads never share one."""
        return self._session.io_binding()

    def run_bound(self, binding: ort.IOBinding) -> list[ort.OrtValue]:
        started = time.perf_counter()
        self._session.run_with_iobinding(binding)
        self._count(time.perf_counter() - started)
        return binding.get_outputs()
