"""Sessions: how the decoding loops run a graph, whatever runs it.

The loops see only the :class:`Session` protocol: run a graph with named inputs and get
named outputs, some of which may stay on the device as opaque handles that can be passed
back as inputs. :class:`OrtSession` implements it with onnxruntime on the CPU or CUDA
execution provider, with IO binding so that the growing self-attention cache and the
encoder's cross K/V never leave the GPU between steps.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from .errors import BundleError, ProviderError

DEVICES = ("cpu", "cuda")


class Session(Protocol):
    """A graph that can be run. Device-resident outputs come back as opaque handles."""

    seconds: float  # time spent inside run(), summed over calls

    def run(self, inputs: Mapping[str, Any], device_outputs: Collection[str] = ()) -> dict[str, Any]: ...

    def to_device(self, array: np.ndarray) -> Any: ...


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
    """An ONNX graph run by onnxruntime on one device.

    ``io_binding=True`` binds inputs and outputs explicitly: numpy inputs are copied to the
    device once per call, handles returned for ``device_outputs`` stay where the provider put
    them and are bound back without a copy, and every other output is copied to the host.
    ``io_binding=False`` uses plain ``InferenceSession.run`` (everything through numpy); the
    two must give identical results and the tests check that they do.
    """

    def __init__(self, path: str | Path, device: str = "cpu", threads: int | None = None,
                 io_binding: bool = True) -> None:
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
        self.io_binding = io_binding
        self.seconds = 0.0
        self._ort_device = "cuda" if device == "cuda" else "cpu"
        self._binding = self._session.io_binding() if io_binding else None
        self.input_names = tuple(i.name for i in self._session.get_inputs())
        self.output_names = tuple(o.name for o in self._session.get_outputs())

    def to_device(self, array: np.ndarray) -> Any:
        """Upload once what several calls will read (e.g. the encoder attention mask)."""
        if not self.io_binding:
            return array
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self._ort_device, 0)

    def run(self, inputs: Mapping[str, Any], device_outputs: Collection[str] = ()) -> dict[str, Any]:
        if self._binding is None:
            feeds = {name: value.numpy() if isinstance(value, ort.OrtValue) else value
                     for name, value in inputs.items()}
            started = time.perf_counter()
            values = self._session.run(None, feeds)
            self.seconds += time.perf_counter() - started
            return dict(zip(self.output_names, values))

        binding = self._binding
        for name, value in inputs.items():  # rebinding a name replaces its previous binding
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        # Outputs have data-dependent shapes (the cache grows), so they are bound by device alone
        # and anew each call: a binding left in place would hold last call's buffer and shape.
        binding.clear_binding_outputs()
        for name in self.output_names:
            binding.bind_output(name, self._ort_device if name in device_outputs else "cpu")
        started = time.perf_counter()
        self._session.run_with_iobinding(binding)
        self.seconds += time.perf_counter() - started
        outputs = binding.get_outputs()
        return {
            name: value if name in device_outputs else value.numpy()
            for name, value in zip(self.output_names, outputs)
        }
