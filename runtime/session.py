"""Sessions: how the decoding loops run a graph, whatever runs it.

The loops see only the :class:`Session` protocol: run a graph with named numpy inputs and get
named numpy outputs, or, for the buffers that stay put between calls, run it through an IO
binding that the caller fills (see ``decoding/cache.py``). :class:`OrtSession` implements it
with onnxruntime on the CPU or CUDA execution provider; ``aggdec.engines.TrtSession`` with
TensorRT engines.

CUDA options (:func:`cuda_provider_options`): TF32 is off unless asked for. onnxruntime's CUDA
provider otherwise runs float32 matrix products on TF32 tensor cores (10-bit mantissa), and
aggdec promises transformers' float32 greedy output; ``tf32=True`` trades that for speed.
``cuda_graph=True`` (the verifier sessions of ``Generator(cuda_graphs=True)``) turns on the
provider's ``enable_cuda_graph``: a bound run given a ``graph_id`` is captured as a CUDA graph on
its first run for that id and replayed after (:meth:`OrtSession.run_bound`); every other run of
such a session passes ``gpu_graph_id`` -1, onnxruntime's "no capture, no replay".
``device_id`` is not passed (0 is the provider's default): since onnxruntime 1.26, a
``device_id`` provider option makes the Python binding first look for a registered plugin EP
device and, finding none for the built-in CUDA provider, log "No registered plugin EP device
found for 'CUDAExecutionProvider' with device_id=0" for every session.

Thread safety: one session serves many threads. onnxruntime's ``run`` is thread-safe, and
every batch makes its own IO binding (a binding is per call sequence, never shared), so
concurrent ``Generator.generate`` calls never see each other's buffers.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import numbers
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .errors import BundleError, GraphRunError, ProviderError
from .manifest import GraphSpec

try:
    import onnxruntime as ort
except ImportError:  # aggdec[cpu] or aggdec[gpu] brings it; the error says which when a session is made
    ort = None  # type: ignore[assignment]

DEVICES = ("cpu", "cuda")
INSTALL_HINT = ("install aggdec[cpu] (onnxruntime) or, on a machine with an NVIDIA GPU and CUDA 13 driver, "
                "aggdec[gpu] (onnxruntime-gpu with its CUDA and cuDNN wheels), never both")


def require_onnxruntime() -> Any:
    """The onnxruntime module, or a ProviderError saying which extra brings it."""
    if ort is None:
        raise ProviderError(f"aggdec's runtime needs onnxruntime, which is not installed: {INSTALL_HINT}.")
    return ort


class Session(Protocol):
    """A graph that can be run; ``seconds`` is the time spent inside it, summed over calls."""

    device: str
    seconds: float

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def binding(self) -> Any: ...

    def run_bound(self, binding: Any) -> Sequence[Any]:
        """Run through ``binding``; its outputs, in the order they were bound, indexable
        (``len`` and ``[i]``, each with ``numpy()``), valid until the next run."""


def cuda_provider_options(tf32: bool = False, cuda_graph: bool = False) -> dict[str, str]:
    """onnxruntime CUDAExecutionProvider options: TF32 off unless asked for; no ``device_id``
    (see the module docstring for both); ``enable_cuda_graph`` with ``cuda_graph``."""
    if not isinstance(tf32, bool):
        raise ProviderError(f"tf32 must be True or False, got {tf32!r}.")
    options = {"use_tf32": "1" if tf32 else "0"}
    if cuda_graph:
        options["enable_cuda_graph"] = "1"
    return options


def providers_for(device: str, tf32: bool = False, cuda_graph: bool = False) -> list[Any]:
    """The providers list passed to onnxruntime for ``device`` (availability not checked)."""
    if device not in DEVICES:
        raise ProviderError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}.")
    if tf32 and device != "cuda":
        raise ProviderError(f"tf32 applies to device 'cuda' only (TF32 is a GPU math mode), not {device!r}.")
    if cuda_graph and device != "cuda":
        raise ProviderError(f"CUDA graphs apply to device 'cuda' only, not {device!r}.")
    if device == "cpu":
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", cuda_provider_options(tf32, cuda_graph)), "CPUExecutionProvider"]


def installed_onnxruntime_distributions() -> list[str]:
    """The onnxruntime distributions installed here (they all provide the same module)."""
    found = []
    for name in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def missing_cuda_message(available: list[str], distributions: list[str]) -> str:
    """Why there is no CUDA provider, and the fix, from what is installed."""
    message = (f"device 'cuda' needs onnxruntime's CUDAExecutionProvider, but this onnxruntime offers only "
               f"{', '.join(available)}.")
    names = [d.split()[0] for d in distributions]
    if "onnxruntime-gpu" in names and len(names) > 1:
        return (message + f" {' and '.join(distributions)} are installed side by side and provide the same "
                "module, so one shadows the other; reinstall just one: pip uninstall -y "
                + " ".join(names) + " && pip install 'aggdec[gpu]'.")
    return message + " Install aggdec[gpu] (onnxruntime-gpu) on a machine with an NVIDIA GPU, or use device 'cpu'."


_CUDA_PRELOAD: list[str] | None = None  # what onnxruntime.preload_dlls said, once per process
_PRELOAD_LOCK = threading.Lock()


def preload_cuda_libraries() -> list[str]:
    """Load the CUDA and cuDNN libraries that aggdec[gpu] installs as nvidia-* wheels.

    onnxruntime-gpu's CUDA provider links against libcudart, libcublas(Lt), libcurand and
    (lazily) cuDNN, but the wheels put them under site-packages/nvidia/, where the dynamic
    loader does not look; ``onnxruntime.preload_dlls()`` (onnxruntime-gpu >= 1.21) loads them
    from there, falling back to the system's library path (a system CUDA works as before).
    Its complaints are printed to stdout, which would corrupt ``aggdec generate``'s output, so
    they are captured and returned (the lines that say what failed to load)."""
    global _CUDA_PRELOAD
    with _PRELOAD_LOCK:
        if _CUDA_PRELOAD is None:
            module = require_onnxruntime()
            captured = io.StringIO()
            preload = getattr(module, "preload_dlls", None)
            if preload is not None:
                with contextlib.redirect_stdout(captured):
                    try:
                        preload()
                    except Exception as exc:  # a failed preload only means the system's paths are used
                        print(f"onnxruntime.preload_dlls failed: {exc}")
            _CUDA_PRELOAD = [line for line in captured.getvalue().splitlines() if line.strip()]
        return _CUDA_PRELOAD


def check_device(device: str, tf32: bool = False, cuda_graph: bool = False) -> list[Any]:
    """The onnxruntime providers for a device, or a ProviderError saying how to get them."""
    providers = providers_for(device, tf32, cuda_graph)
    if device == "cpu":
        return providers
    module = require_onnxruntime()
    available = module.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise ProviderError(missing_cuda_message(available, installed_onnxruntime_distributions()))
    preload_cuda_libraries()
    return providers


def check_output_shapes(spec: GraphSpec, inputs: Mapping[str, Any], outputs: Mapping[str, Any], label: str) -> None:
    """Raise :class:`BundleError` unless every output has its declared rank and fixed dims, and
    each named dim (``batch``, ``source_len``, ...) the size the inputs gave it."""
    sizes: dict[str, int] = {}
    for tensor in spec.inputs:
        if tensor.name in inputs:
            for dim, size in zip(tensor.dims, np.shape(inputs[tensor.name])):
                if isinstance(dim, str):
                    sizes.setdefault(dim, int(size))
    for tensor in spec.outputs:
        if tensor.name not in outputs:
            continue
        shape = tuple(np.shape(outputs[tensor.name]))
        expected = tuple(sizes.get(dim) if isinstance(dim, str) else dim for dim in tensor.dims)
        if len(shape) != len(expected) or any(e is not None and e != s for e, s in zip(expected, shape)):
            shown = [e if e is not None else d for e, d in zip(expected, tensor.dims)]
            raise BundleError(f"{label} computed output {tensor.name!r} of shape {list(shape)}, where its declared "
                              f"IO implies {shown}; the bundle's graph does not compute what its manifest says.")


# where onnxruntime looks for the external data of a graph loaded from memory: a directory
# that cannot exist (under a file), so that it reads external data from the table it is given
# or not at all
_NO_DIRECTORY = str(Path(os.devnull) / "aggdec-reads-external-data-from-memory-only")


def _external_data_from_memory_only(options: Any, files: Mapping[str, bytes]) -> None:
    """Let a graph loaded from memory read external data from ``files`` and nowhere else.
    onnxruntime copies the buffers while the session is made: they may be freed after."""
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", _NO_DIRECTORY)
    if files:
        names = list(files)
        options.add_external_initializers_from_files_in_memory(names, [files[n] for n in names],
                                                               [len(files[n]) for n in names])


THREADS_PER_CPU = 4  # the most intra-op threads per CPU this process may use


def usable_cpus() -> int:
    """How many CPUs this process may run on: its affinity mask where the OS has one (taskset,
    a container's cpuset), else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_threads() -> int | None:
    """The intra-op thread count used when the caller gives none: one per usable CPU when the
    process is confined to fewer CPUs than the machine has, else None (onnxruntime's own
    default, one thread per physical core). onnxruntime sizes its default pool from the
    machine, not from the affinity mask, so a process pinned to one CPU of sixteen would start
    a pool of (say) eight spinning threads that all share that one CPU."""
    cpus = usable_cpus()
    return cpus if cpus < (os.cpu_count() or cpus) else None


def checked_threads(threads: object) -> int:
    """``threads``, an intra-op thread count, refused outside 1 .. THREADS_PER_CPU x the CPUs this
    process may use: onnxruntime starts that many spinning threads per graph, and 3,000 on two
    CPUs left a one-line decode running for minutes (past 2**31 it raises TypeError instead)."""
    cpus = usable_cpus()
    most = THREADS_PER_CPU * cpus
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or not 1 <= threads <= most:
        raise ProviderError(f"threads must be an integer between 1 and {most} ({THREADS_PER_CPU} x the {cpus} CPUs "
                            f"this process may use), got {threads!r}.")
    return int(threads)


class OrtSession:
    """An ONNX graph run by onnxruntime on one device."""

    def __init__(self, path: str | Path, device: str = "cpu", threads: int | None = None,
                 tf32: bool = False, spec: GraphSpec | None = None, name: str | None = None,
                 contents: bytes | None = None, external_data: Mapping[str, bytes] | None = None,
                 profile_prefix: str | None = None, cuda_graph: bool = False) -> None:
        """``spec``: the IO the manifest declares for this graph; with it, every unbound call's
        outputs are checked against the shapes the inputs imply (a bundle is untrusted: a graph
        can declare one shape and compute another). ``name``: the graph's, for messages.
        ``contents``: the graph's bytes, as read and hashed (manifest.BundleFiles); onnxruntime
        then reads nothing from disk: ``external_data`` (file name -> bytes) are the only files
        its external-data tensors may name, and a graph naming any other fails to load.
        Without ``contents`` the graph is read from ``path``. ``profile_prefix``: onnxruntime's
        profiler records every call, and :meth:`end_profiling` writes its JSON trace there
        (benchmarks/profile_step.py); None: no profiling. ``cuda_graph``: CUDA only, the
        provider's ``enable_cuda_graph`` (the module docstring; :meth:`run_bound`'s ``graph_id``);
        onnxruntime refuses such a session when a node is not on the CUDA provider (a
        BundleError here: ``devices.OrtFactory`` then opens the graph without it)."""
        providers = check_device(device, tf32, cuda_graph)
        self.spec = spec
        self.label = f"{Path(path).name} ({name})" if name else Path(path).name
        ort = require_onnxruntime()
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1  # one request's graph at a time: parallelism is inside ops
        threads = default_threads() if threads is None else checked_threads(threads)
        if threads is not None:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        if profile_prefix is not None:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        if contents is not None:
            _external_data_from_memory_only(options, external_data or {})
        try:
            self._session = ort.InferenceSession(str(path) if contents is None else contents, options,
                                                 providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors for a corrupt file
            detail = str(exc).strip()
            if contents is not None and "xternal" in detail:
                raise BundleError(f"{str(path)!r} keeps weights in external data that is not a file the manifest "
                                  f"lists (and hashes) in the bundle ({detail[:300]}); re-run `aggdec export`."
                                  ) from exc
            raise BundleError(f"onnxruntime could not load {str(path)!r}: {detail}") from exc
        if device == "cuda" and "CUDAExecutionProvider" not in self._session.get_providers():
            failed = [line for line in preload_cuda_libraries() if "ailed" in line]
            raise ProviderError(
                "onnxruntime could not start its CUDA provider (is a GPU visible, and do the CUDA libraries "
                "match onnxruntime-gpu?); use device 'cpu' or fix the CUDA installation."
                + (f" Loading the CUDA libraries said: {'; '.join(failed)}" if failed else "")
            )
        self.device = device
        self.tf32 = tf32
        self.cuda_graph = cuda_graph
        # set by devices.OrtFactory when onnxruntime refused cuda_graph for this graph: why
        self.cuda_graph_refused: str | None = None
        self._run_options: dict[int, Any] = {}  # gpu_graph_id -> its RunOptions (cuda_graph only)
        # a capture must not interleave with another run of the session: its runs take turns
        self._graph_lock = threading.Lock()
        # what onnxruntime actually applied, per provider (recorded by aggdec bench)
        self.provider_options = {name: dict(values) for name, values in self._session.get_provider_options().items()}
        self.seconds = 0.0
        self._lock = threading.Lock()
        self.input_names = tuple(i.name for i in self._session.get_inputs())
        self.output_names = tuple(o.name for o in self._session.get_outputs())
        self.inference_session = self._session  # for load-time checks of the graph's declared IO

    def _count(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds

    def _options(self, graph_id: int) -> Any:
        """The RunOptions naming ``graph_id`` (-1: neither captured nor replayed)."""
        options = self._run_options.get(graph_id)
        if options is None:
            options = require_onnxruntime().RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(graph_id))
            self._run_options[graph_id] = options
        return options

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        started = time.perf_counter()
        try:
            if self.cuda_graph:  # host inputs: never a graph (the load-time probes, an unbound call)
                with self._graph_lock:
                    values = self._session.run(None, dict(inputs), self._options(-1))
            else:
                values = self._session.run(None, dict(inputs))
        except Exception as exc:  # onnxruntime's untyped errors: the graph failed on inputs of its declared IO
            raise self._failed(exc, inputs) from exc
        self._count(time.perf_counter() - started)
        outputs = dict(zip(self.output_names, values))
        if self.spec is not None:
            check_output_shapes(self.spec, inputs, outputs, self.label)
        return outputs

    def _failed(self, exc: Exception, inputs: Mapping[str, Any] | None = None) -> GraphRunError:
        shapes = ", ".join(f"{name} {list(np.shape(value))}" for name, value in (inputs or {}).items())
        return GraphRunError(f"{self.label} failed" + (f" on inputs {shapes}" if shapes else "")
                             + f": {str(exc).strip()[:500]}")

    def end_profiling(self) -> str:
        """Stop profiling (see ``profile_prefix``); the path of the JSON trace written."""
        return self._session.end_profiling()

    def binding(self) -> Any:
        """A fresh IO binding: one per batch, so that threads never share one."""
        return self._session.io_binding()

    def run_bound(self, binding: Any, graph_id: int | None = None) -> Sequence[Any]:
        """Run through ``binding``. ``graph_id`` (at least 1; a ``cuda_graph`` session's): every
        input and output of ``binding`` is an onnxruntime value on the device at an address fixed
        for that id. onnxruntime's CUDA provider runs an id uncaptured twice (its arena allocates
        then), captures the next run and replays it, so that every run's outputs are computed
        (its Python tests say the first call does all of that, running itself again); later runs
        replay the graph: the binding must not change between them (decoding/fixed_calls.py).
        The provider keeps graphs per thread: a thread that did not capture an id captures it
        again. Ignored by a session without ``cuda_graph`` (the CPU's)."""
        started = time.perf_counter()
        try:  # outputs bound with a shape are checked by onnxruntime; the caller checks the others
            if self.cuda_graph:
                with self._graph_lock:
                    self._session.run_with_iobinding(binding, self._options(-1 if graph_id is None else graph_id))
            else:
                self._session.run_with_iobinding(binding)
        except Exception as exc:
            raise self._failed(exc) from exc
        self._count(time.perf_counter() - started)
        # onnxruntime's own vector of the outputs: its public get_outputs() wraps each one in a
        # Python OrtValue (a device query apiece), about a tenth of the host work of a one-row
        # greedy step on the CPU, for outputs the caller mostly never reads (the caches,
        # written in place); indexing the vector makes only the values read
        outputs = getattr(binding, "_iobinding", None)
        return binding.get_outputs() if outputs is None else outputs.get_outputs()
