"""TensorRT itself: importing it, the GPU it builds for, building engines, running them.

Everything here imports ``tensorrt`` and cuda-python (``cuda.bindings.runtime``, the CUDA
runtime API that TensorRT's own Python samples use for device memory and streams) only when
called, never at module import, so ``aggdec.engines`` loads without them and says what is
missing. No torch: device buffers are ``cudaMalloc`` allocations.

NOT RUN YET: this module was written against TensorRT's documented Python API (10.x:
``Builder``, ``OnnxParser``, ``IBuilderConfig.set_memory_pool_limit``, ``create_timing_cache``,
``IOptimizationProfile.set_shape``, ``build_serialized_network``, ``Runtime.
deserialize_cuda_engine``, ``IExecutionContext.set_input_shape``, ``set_tensor_address``,
``execute_async_v3``) on a machine without TensorRT or a GPU. See README, TensorRT.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from aggdec.runtime.errors import AggdecError, BundleError, ProviderError

from .profiles import Target, shape_error

TRT_HINT = ("pip install 'aggdec[tensorrt]' on a machine with an NVIDIA GPU (tensorrt >= 10, whose libraries pip "
            "fetches from NVIDIA's index pypi.nvidia.com, and cuda-python)")


def import_tensorrt() -> Any:
    """The tensorrt module, or a ProviderError (one ``aggdec: error:`` line in the CLI)."""
    try:
        import tensorrt
    except ImportError as exc:
        raise ProviderError(f"TensorRT is not installed here ({exc}); {TRT_HINT}.") from None
    except OSError as exc:  # the Python package is there but libnvinfer could not be loaded
        raise ProviderError(f"TensorRT's libraries could not be loaded ({exc}); {TRT_HINT}.") from None
    return tensorrt


def import_cudart() -> Any:
    """The CUDA runtime bindings of cuda-python (``cuda.bindings.runtime``; ``cuda.cudart`` before 12.6)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # type: ignore[no-redef]
        except ImportError as exc:
            raise ProviderError(f"cuda-python is not installed here ({exc}); {TRT_HINT}.") from None
    return cudart


def _check(result: Any) -> Any:
    """cuda-python returns (error, values...): raise on an error, return the values."""
    cudart = import_cudart()
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != cudart.cudaError_t.cudaSuccess:
        raise ProviderError(f"CUDA call failed: {error}")
    return values[0] if len(values) == 1 else tuple(values)


def current_target(fp16: bool = False, tf32: bool = False) -> Target:
    """The GPU (device 0) and TensorRT version an engine built now would be valid for."""
    trt = import_tensorrt()
    cudart = import_cudart()
    properties = _check(cudart.cudaGetDeviceProperties(0))
    name = properties.name
    name = name.decode(errors="replace").rstrip("\x00") if isinstance(name, bytes) else str(name)
    return Target(gpu=name, compute_capability=f"{properties.major}.{properties.minor}", tensorrt=trt.__version__,
                  fp16=fp16, tf32=tf32)


def _logger(trt: Any) -> Any:
    return trt.Logger(trt.Logger.WARNING)


def build_engine(onnx_path: Path, profile: Mapping[str, Mapping[str, list[int]]], fp16: bool, tf32: bool,
                 workspace_mib: int, timing_cache: bytes) -> tuple[bytes, bytes]:
    """Build one serialized engine from an ONNX graph with one optimization profile.

    Returns (engine bytes, the updated timing cache). TF32 is cleared unless asked for
    (TensorRT enables it by default), for the same reason as on onnxruntime's CUDA provider."""
    trt = import_tensorrt()
    logger = _logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch: the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BundleError(f"TensorRT's ONNX parser refused {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    if tf32:
        config.set_flag(trt.BuilderFlag.TF32)
    else:
        config.clear_flag(trt.BuilderFlag.TF32)
    cache = config.create_timing_cache(timing_cache)
    config.set_timing_cache(cache, ignore_mismatch=False)
    optimization = builder.create_optimization_profile()
    for name, shapes in profile.items():
        optimization.set_shape(name, shapes["min"], shapes["opt"], shapes["max"])
    config.add_optimization_profile(optimization)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise AggdecError(f"TensorRT could not build an engine from {onnx_path.name} (its log above says why).")
    return bytes(serialized), bytes(config.get_timing_cache().serialize())


# ---------------------------------------------------------------------------------------- running


class DeviceBuffer:
    """A cudaMalloc allocation that grows (never shrinks) to the largest size asked for."""

    def __init__(self) -> None:
        self.pointer = 0
        self.size = 0

    def ensure(self, size: int) -> int:
        if size > self.size:
            cudart = import_cudart()
            if self.pointer:
                _check(cudart.cudaFree(self.pointer))
            self.pointer = int(_check(cudart.cudaMalloc(max(size, 256))))
            self.size = max(size, 256)
        return self.pointer

    def free(self) -> None:
        if self.pointer:
            _check(import_cudart().cudaFree(self.pointer))
            self.pointer, self.size = 0, 0


class TrtBinding:
    """The subset of onnxruntime's IOBinding that aggdec's decode loop uses, for a TrtSession.

    Inputs are host arrays (copied to the device at run) or device pointers; outputs go to
    the host or to a device pointer. An output bound to the same pointer as an input (the
    format-2 cache written in place) is computed into a scratch buffer and copied device to
    device over the input after the call: TensorRT does not promise that an engine reads an
    input fully before writing an output that aliases it."""

    def __init__(self) -> None:
        self.inputs: dict[str, tuple[str, Any, tuple[int, ...]]] = {}  # name -> ("host", array) | ("device", ptr, shape)
        self.outputs: dict[str, tuple[str, int, tuple[int, ...]]] = {}  # name -> ("host", 0, ()) | ("device", ptr, shape)
        self.order: list[str] = []  # outputs in the order first bound, as onnxruntime returns them

    def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
        self.inputs[name] = ("host", np.ascontiguousarray(array), tuple(array.shape))

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any, shape: list[int],
                   buffer_ptr: int) -> None:
        if device_type == "cpu":
            raise ProviderError("TrtBinding takes host inputs through bind_cpu_input.")
        self.inputs[name] = ("device", int(buffer_ptr), tuple(shape))

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: list[int] | None = None, buffer_ptr: int | None = None) -> None:
        if name not in self.outputs:
            self.order.append(name)
        if buffer_ptr is None:
            self.outputs[name] = ("host", 0, ())
        else:
            self.outputs[name] = ("device", int(buffer_ptr), tuple(shape or ()))


class TrtSession:
    """A serialized TensorRT engine run on CUDA device 0: the :class:`~aggdec.runtime.session.Session`
    protocol (``run``, ``binding``, ``run_bound``), device buffers from cudaMalloc, no torch.

    ``run`` copies numpy inputs to the device and outputs back; ``run_bound`` takes a
    :class:`TrtBinding`. Shapes outside the engine's optimization profile are refused with the
    input, dim and range, before anything runs. One session serves one thread at a time (an
    execution context is not thread-safe; a lock serializes calls)."""

    def __init__(self, engine_path: str | Path, expected_sha256: str | None = None) -> None:
        trt = import_tensorrt()
        cudart = import_cudart()
        data = Path(engine_path).read_bytes()
        if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
            raise BundleError(f"{engine_path} does not match the sha256 in its engines manifest; rebuild it.")
        self._trt = trt
        self._runtime = trt.Runtime(_logger(trt))
        self._engine = self._runtime.deserialize_cuda_engine(data)
        if self._engine is None:
            raise BundleError(f"TensorRT could not load {engine_path} (built by another TensorRT version or for "
                              "another GPU?); rebuild it with `aggdec build-engines`.")
        self._context = self._engine.create_execution_context()
        self._stream = _check(cudart.cudaStreamCreate())
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        is_input = {n: self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names = tuple(n for n in names if is_input[n])
        self.output_names = tuple(n for n in names if not is_input[n])
        self._dtypes = {n: np.dtype(trt.nptype(self._engine.get_tensor_dtype(n))) for n in names}
        # profile 0's min and max shape per input
        self._ranges = {n: self._engine.get_tensor_profile_shape(n, 0) for n in self.input_names}
        self._buffers: dict[str, DeviceBuffer] = {n: DeviceBuffer() for n in names}
        self._scratch: dict[str, DeviceBuffer] = {n: DeviceBuffer() for n in self.output_names}
        self.device = "cuda"
        self.seconds = 0.0
        self._lock = threading.Lock()

    def max_dim(self, input_name: str, axis: int) -> int:
        """The largest size the engine's profile allows for one dim of an input."""
        return int(tuple(self._ranges[input_name][2])[axis])

    # the IO as onnxruntime's NodeArg shows it, for the load-time checks (runtime/bundle_checks.py)
    _ORT_TYPES = {np.dtype(np.float32): "tensor(float)", np.dtype(np.float16): "tensor(float16)",
                  np.dtype(np.int64): "tensor(int64)", np.dtype(np.int32): "tensor(int32)",
                  np.dtype(np.bool_): "tensor(bool)"}

    def _args(self, names: tuple[str, ...]) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=n, type=self._ORT_TYPES.get(self._dtypes[n], str(self._dtypes[n])),
                                shape=[None if d < 0 else int(d) for d in self._engine.get_tensor_shape(n)])
                for n in names]

    def get_inputs(self) -> list[SimpleNamespace]:
        return self._args(self.input_names)

    def get_outputs(self) -> list[SimpleNamespace]:
        return self._args(self.output_names)

    def _set_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        missing = sorted(set(self.input_names) - set(shapes))
        if missing:
            raise ProviderError(f"missing engine inputs: {', '.join(missing)}")
        for name, shape in shapes.items():
            if name not in self._ranges:
                raise ProviderError(f"the engine has no input {name!r} (it has {', '.join(self.input_names)})")
            low, _, high = self._ranges[name]
            problem = shape_error(name, tuple(shape), low, high)
            if problem is not None:
                raise ProviderError(problem)
            if not self._context.set_input_shape(name, tuple(int(d) for d in shape)):
                raise ProviderError(f"TensorRT refused shape {list(shape)} for input {name!r}.")

    def _execute(self, host_inputs: Mapping[str, np.ndarray], device_inputs: Mapping[str, tuple[int, tuple]],
                 device_outputs: Mapping[str, int], host_outputs: list[str]) -> dict[str, np.ndarray]:
        cudart = import_cudart()
        to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        to_host = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        on_device = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        shapes = {n: tuple(a.shape) for n, a in host_inputs.items()}
        shapes.update({n: shape for n, (_, shape) in device_inputs.items()})
        self._set_shapes(shapes)
        kept = []  # host arrays must outlive the asynchronous copies
        for name, array in host_inputs.items():
            array = np.ascontiguousarray(array, dtype=self._dtypes[name])
            kept.append(array)
            pointer = self._buffers[name].ensure(array.nbytes)
            _check(cudart.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes, to_device, self._stream))
            self._context.set_tensor_address(name, pointer)
        for name, (pointer, _) in device_inputs.items():
            self._context.set_tensor_address(name, pointer)
        input_pointers = {ptr for ptr, _ in device_inputs.values()}
        copy_back = []
        out_shapes = {n: tuple(self._context.get_tensor_shape(n)) for n in self.output_names}
        for name in self.output_names:
            nbytes = int(np.prod(out_shapes[name])) * self._dtypes[name].itemsize
            target = device_outputs.get(name)
            if target is not None and target in input_pointers:
                scratch = self._scratch[name].ensure(nbytes)
                self._context.set_tensor_address(name, scratch)
                copy_back.append((target, scratch, nbytes))
            elif target is not None:
                self._context.set_tensor_address(name, target)
            else:
                self._context.set_tensor_address(name, self._buffers[name].ensure(nbytes))
        if not self._context.execute_async_v3(int(self._stream)):  # TensorRT takes the stream as an integer handle
            raise ProviderError("TensorRT's execute_async_v3 failed (its log above says why).")
        for target, scratch, nbytes in copy_back:
            _check(cudart.cudaMemcpyAsync(target, scratch, nbytes, on_device, self._stream))
        results = {}
        for name in host_outputs:
            array = np.empty(out_shapes[name], dtype=self._dtypes[name])
            _check(cudart.cudaMemcpyAsync(array.ctypes.data, self._buffers[name].pointer, array.nbytes, to_host,
                                          self._stream))
            results[name] = array
        _check(cudart.cudaStreamSynchronize(self._stream))
        del kept
        return results

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            started = time.perf_counter()
            out = self._execute(inputs, {}, {}, list(self.output_names))
            self.seconds += time.perf_counter() - started
        return {name: out[name] for name in self.output_names}

    def binding(self) -> TrtBinding:
        return TrtBinding()

    def run_bound(self, binding: TrtBinding) -> list[Any]:
        host_inputs = {n: v[1] for n, v in binding.inputs.items() if v[0] == "host"}
        device_inputs = {n: (v[1], v[2]) for n, v in binding.inputs.items() if v[0] == "device"}
        device_outputs = {n: v[1] for n, v in binding.outputs.items() if v[0] == "device"}
        host_outputs = [n for n, v in binding.outputs.items() if v[0] == "host"]
        with self._lock:
            started = time.perf_counter()
            out = self._execute(host_inputs, device_inputs, device_outputs, host_outputs)
            self.seconds += time.perf_counter() - started
        return [SimpleNamespace(numpy=(lambda a=out[n]: a)) if n in out else None for n in binding.order]

    def __del__(self) -> None:
        try:
            for buffer in (*self._buffers.values(), *self._scratch.values()):
                buffer.free()
            import_cudart().cudaStreamDestroy(self._stream)
        except Exception:  # interpreter shutdown or a session that never finished loading
            pass
