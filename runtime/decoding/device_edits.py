"""Cache edits that stay on the buffers' device: tiny onnxruntime graphs run through IO binding.

With IO binding on CUDA the decoder's buffers (``cache.py``) are device allocations, and an edit
(a finished row's move, a joining row's cross keys and values, a capacity change, a beam's row
copies) used to download the whole allocation, edit it in numpy and upload it again: hundreds
of MB over PCIe per finished row at batch 32. Here the same edits are runs of the graphs that
``export/edit_graphs.py`` writes (package data, so the runtime needs no onnx):

- ``copy_K``: K Identity nodes over ``uint8 [n]``. Inputs and outputs are bound by pointer (a
  buffer's base plus a byte offset) and size, so each node copies any contiguous byte range to
  any other: device to device for a row move, host to device for a row upload. onnxruntime's
  Identity kernels copy whenever the output's memory is not the input's (they alias only when
  the planner gives them the same buffer, and a bound output is the caller's), which the tests
  check on the CPU (test_device_edits.py) and the GPU check on CUDA (test_gpu.py).
- ``pad_<dtype>``: a rank-4 Pad with its pads as an input, for re-laying the rows along one axis
  (a capacity change). The old and new layouts overlap in the allocation, so the old prefix is
  first copied to a scratch allocation and padded (or cropped: negative pads) from there.

Only the bytes that change move (plus the scratch copies). The same graphs and bindings run on
the CPU provider for buffers held as CPU OrtValues, which is how the tests drive this path
without a GPU; on the CPU the decode loop itself keeps numpy buffers (cheaper: a view is free).
Sessions are made once per device and shared; each run makes its own binding (thread-safe).
"""

from __future__ import annotations

import threading
from importlib import resources
from typing import Any

import numpy as np

from ..errors import ProviderError
from ..session import providers_for, require_onnxruntime

COPY_WIDTHS = (64, 16, 4, 1)  # export/edit_graphs.py's, widest first: a batch of copies is cut greedily

# (device) -> EditGraphs; made on first use
_GRAPHS: dict[str, EditGraphs] = {}
_GRAPHS_LOCK = threading.Lock()


class EditGraphs:
    """The edit graphs' sessions on one device, and how many runs each kind has made (tests and
    the GPU check read the counts to tell that the device path was taken)."""

    def __init__(self, device: str) -> None:
        ort = require_onnxruntime()
        self.device = device
        options = ort.SessionOptions()
        # nothing to optimize, and an optimizer must not fold an Identity away: it is the copy
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        folder = resources.files(__package__) / "edit_graphs"
        providers = providers_for(device)

        def load(name: str) -> Any:
            session = ort.InferenceSession((folder / f"{name}.onnx").read_bytes(), options, providers=providers)
            # onnxruntime falls back to the CPU when a provider does not start; a CPU kernel handed
            # device pointers must never run (the decode's own sessions refuse the same way)
            if device == "cuda" and "CUDAExecutionProvider" not in session.get_providers():
                raise ProviderError("onnxruntime could not start its CUDA provider for the cache edit graphs; "
                                    "use device 'cpu' or fix the CUDA installation.")
            return session

        self._copy = {width: load(f"copy_{width}") for width in COPY_WIDTHS}
        self._pad = {np.dtype(dtype): load(f"pad_{dtype}") for dtype in ("float32", "float16")}
        self.copy_runs = 0
        self.pad_runs = 0

    def copy(self, moves: list[tuple[str, int, int, int]]) -> None:
        """Each (source device, source pointer, target pointer, bytes): copy that many bytes to
        the target (on this device). Sources must not overlap targets; host sources must stay
        alive until this returns (it returns once the copies are done)."""
        moves = [move for move in moves if move[3] > 0]
        while moves:
            width = next(width for width in COPY_WIDTHS if width <= len(moves))
            batch, moves = moves[:width], moves[width:]
            session = self._copy[width]
            binding = session.io_binding()
            for i, (where, source, target, size) in enumerate(batch):
                binding.bind_input(f"x{i}", where, 0, np.uint8, [size], source)
                binding.bind_output(f"y{i}", self.device, 0, np.uint8, [size], target)
            session.run_with_iobinding(binding)
            self.copy_runs += 1

    def pad(self, source: int, target: int, dtype: np.dtype, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        """The rank-4 tensor ``old`` at ``source`` written at ``target`` with shape ``new``: each
        axis cut or zero-padded at its end. Source and target must not overlap."""
        pads = np.array([0] * 4 + [b - a for a, b in zip(old, new)], dtype=np.int64)
        session = self._pad[dtype]
        binding = session.io_binding()
        binding.bind_input("x", self.device, 0, dtype, list(old), source)
        binding.bind_cpu_input("pads", pads)
        binding.bind_output("y", self.device, 0, dtype, list(new), target)
        session.run_with_iobinding(binding)
        self.pad_runs += 1


def edit_graphs(device: str) -> EditGraphs:
    """The shared :class:`EditGraphs` of ``device`` ("cpu" or "cuda")."""
    with _GRAPHS_LOCK:
        if device not in _GRAPHS:
            _GRAPHS[device] = EditGraphs(device)
        return _GRAPHS[device]


class DeviceEdits:
    """The edits of one batch's buffers (``cache.SlotBuffers``), all on ``device``, with the
    scratch allocation that overlapping edits go through (kept at its largest size: edits
    recur, and an allocation per edit would cost more than the memory)."""

    def __init__(self, device: str, dtype: np.dtype) -> None:
        self.device, self.dtype = device, np.dtype(dtype)
        self.graphs = edit_graphs(device)
        self._scratch: Any = None
        self._scratch_bytes = 0

    def _scratch_pointer(self, size: int) -> int:
        if size > self._scratch_bytes:
            ort = require_onnxruntime()
            self._scratch = None  # the old one goes first: on a device the memory is the point
            self._scratch = ort.OrtValue.ortvalue_from_shape_and_type([size], np.uint8, self.device, 0)
            self._scratch_bytes = size
        return int(self._scratch.data_ptr())

    def copy(self, moves: list[tuple[int, int, int]]) -> None:
        """Each (source pointer, target pointer, bytes) on the device; no source overlaps a target."""
        self.graphs.copy([(self.device, source, target, size) for source, target, size in moves])

    def move_rows(self, pointers: list[int], row_bytes: int, sources: list[int], targets: list[int]) -> None:
        """In each buffer (base pointers), rows ``sources`` copied onto rows ``targets``, every
        source read before any target is written (a beam reorder may swap rows). Rows that stay
        where they are do not move; when no moved row is both read and written, rows are copied
        directly, otherwise through the scratch."""
        pairs = [(source, target) for source, target in zip(sources, targets) if source != target]
        if not pairs:
            return
        if len({target for _, target in pairs}) != len(pairs):
            raise ValueError(f"row targets repeat: {targets}")
        read = sorted({source for source, _ in pairs})
        if not set(read) & {target for _, target in pairs}:
            self.graphs.copy([(self.device, base + source * row_bytes, base + target * row_bytes, row_bytes)
                              for base in pointers for source, target in pairs])
            return
        scratch = self._scratch_pointer(len(pointers) * len(read) * row_bytes)
        slot = {row: i for i, row in enumerate(read)}

        def staged(buffer: int, row: int) -> int:
            return scratch + (buffer * len(read) + slot[row]) * row_bytes

        self.graphs.copy([(self.device, base + row * row_bytes, staged(b, row), row_bytes)
                          for b, base in enumerate(pointers) for row in read])
        self.graphs.copy([(self.device, staged(b, source), base + target * row_bytes, row_bytes)
                          for b, base in enumerate(pointers) for source, target in pairs])

    def upload(self, writes: list[tuple[np.ndarray, int]]) -> None:
        """Each (host array, target pointer): the array's bytes written there."""
        arrays = [np.ascontiguousarray(values, dtype=self.dtype) for values, _ in writes]
        self.graphs.copy([("cpu", values.ctypes.data, target, values.nbytes)
                          for values, (_, target) in zip(arrays, writes)])

    def relayout(self, pointer: int, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        """The rank-4 tensor of shape ``old`` at the start of a buffer re-laid as ``new`` (every
        axis kept up to the smaller size, the rest zero); the layouts overlap, hence the scratch."""
        size = int(np.prod(old)) * self.dtype.itemsize
        if size == 0 or int(np.prod(new)) == 0:
            return
        scratch = self._scratch_pointer(size)
        self.graphs.copy([(self.device, pointer, scratch, size)])
        self.graphs.pad(scratch, pointer, self.dtype, old, new)
