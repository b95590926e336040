"""The decoder's buffers for one batch of rows: allocated once, written in place.

Format 2 of the cache contract (``export/graphs.py`` is the graph side). For every decoder
layer there is a self-attention key buffer and value buffer of shape
``[rows, heads, capacity, head_dim]``, and a cross-attention value of shape
``[rows, heads, source_capacity, head_dim]`` and key of shape ``[rows, heads, head_dim,
source_capacity]`` (:func:`cross_dims`; bundles from before ``cross_key_layout`` have keys
shaped as the values). Each buffer is one flat allocation sized for
the most rows (``slots``), the longest output (the bundle's ``max_target_len``) and the
longest source, made once per batch; the graphs see a prefix of it with the current
``rows x capacity``. The verifier writes only the new tokens' keys/values, at each row's own
position, into the very memory it was given (the output is bound to the input's pointer),
so a step's cache traffic is proportional to the new tokens, not to the cached length.

Why a current capacity below the allocation: attention reads every slot of the buffer under
a mask, so a buffer as long as ``max_target_len`` would make a 20-token output pay for 256
positions. The capacity is a power of two at least as long as the longest row needs, and
grows (one re-layout of the rows' data, at most log2(max_target_len) times a batch) when a
row outgrows it. Rows are always the first ``rows`` slots: a row that finishes is replaced
by the last row (one row's copy), a row that joins takes the next slot.

Rows, capacity and source capacity only change between calls, so a device can capture a
fixed (rows, T, capacity) step, e.g. under CUDA graphs, with every buffer at a fixed address.

On the CPU the buffers are numpy arrays and every edit (a row's join, move or growth) is a
numpy copy. On CUDA with IO binding they are device allocations (onnxruntime values), edited on
the device by tiny onnxruntime graphs (``device_edits.py``): only the rows that change move, and
a joining row's cross keys and values are the only upload. The same graphs can drive CPU
onnxruntime values (:data:`ORT_BUFFERS_ON_CPU`), which is how the tests run that path without a
GPU. :data:`DEVICE_EDITS` = "host" brings back the edits of before (download the whole
allocation, edit it in numpy, upload it), kept only so the GPU check can measure one against
the other. Static buffers
(``static=True``, verifier.StaticBatch) have one shape for life and never move a row: their
only edits are a joining row's encoding (:meth:`SlotBuffers.write_rows`) and a beam search's
row copies.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..bundle_schema import CROSS_KEY_LAYOUTS
from ..errors import CapacityError, InputError
from ..session import require_onnxruntime
from .device_edits import DeviceEdits

MIN_CAPACITY = 16

# How buffers held as onnxruntime values (CUDA with IO binding) are edited: "graphs" (on their
# device, device_edits.py) or "host" (the whole allocation through numpy and back, as before
# device_edits: correct, but hundreds of MB of PCIe traffic per finished row at batch 32). "host"
# is kept so that the GPU check can time both on the same machine (benchmarks/gpu/README.md);
# read when a batch's buffers are made.
DEVICE_EDITS = "graphs"
# A bound CPU batch keeps its buffers as CPU onnxruntime values, edited like CUDA's: for tests
# (the CUDA edit path, run without a GPU); numpy buffers are cheaper on the CPU.
ORT_BUFFERS_ON_CPU = False

Dim = int | str  # a shape dim: a size, or a graph spec's symbolic name

# The decoder's own cache, per layer and position, by the manifest's ``cache_kind``:
# - "attention": a self-attention layer's key and value of each position;
# - "recurrent": a recurrent layer's state after each position (Marian's SSRU,
#   export/marian/graphs.py), d_model values laid out as [heads, head_dim] like a key.
# A recurrent state is kept per position, not once per row, for the reason the keys are: a
# block writes the state after each of its positions, and a row that keeps n of them simply
# has length + n, so the next call starts from the state at its last kept position (rollback
# after rejected drafts is the row length, as for attention, with no state copy or recompute);
# the buffers, their growth, row moves and in-place binding are the same code for both kinds.
CACHE_KINDS: dict[str, tuple[str, ...]] = {"attention": ("key", "value"), "recurrent": ("state",)}


def self_cache_names(layers: int, kind: str = "attention") -> list[str]:
    """The verifier's own cache inputs: per layer, its kind's buffers (key then value; state)."""
    return [f"self_{part}.{i}" for i in range(layers) for part in CACHE_KINDS[kind]]


def self_cache_out_names(layers: int, kind: str = "attention") -> list[str]:
    """The same buffers as outputs, with the new tokens written."""
    return [f"self_{part}_out.{i}" for i in range(layers) for part in CACHE_KINDS[kind]]


def cross_names(layers: int) -> list[str]:
    """The encoder's per-layer cross-attention outputs, which the verifier takes as inputs."""
    return [f"cross_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]


# Manifest.cross_key_layout (bundle_schema.CROSS_KEY_LAYOUTS). Keys transposed: the verifier's
# scores are Q.K^T, and a key laid out as the values made every call transpose every layer's
# keys again (about a tenth of a batch-32 greedy call's kernel time), though they are fixed for
# a sentence; the encoder transposes them once per sentence instead. The values stay
# [.., source, head_dim]: weights.V reads them as they are.
KEYS_BY_SOURCE, KEYS_TRANSPOSED = CROSS_KEY_LAYOUTS


def cross_dims(rows: Dim, heads: Dim, source: Dim, head_dim: Dim, key: bool, layout: str | None) -> tuple[Dim, ...]:
    """The shape of a cross-attention key (``key``) or value for a bundle's ``cross_key_layout``
    (None: a bundle from before the field, keys as the values); dims are ints or names."""
    if key and layout == KEYS_TRANSPOSED:
        return (rows, heads, head_dim, source)
    return (rows, heads, source, head_dim)


def source_axis(key: bool, layout: str | None) -> int:
    """The source axis of :func:`cross_dims`' shape."""
    return 3 if key and layout == KEYS_TRANSPOSED else 2


# A shortlist row's gathered output matrix (SlotBuffers.matrices) is kept [slots, L, d], L at
# least the longest current list: every call multiplies the padding too, so L follows the rows,
# but each change of L copies every row's matrix (about 100 MB at batch 64, some 30 ms), so it
# grows by at least a quarter and shrinks only when a third of it is unused, in MATRIX_STEPs.
MATRIX_STEP = 64


def _matrix_step(length: int) -> int:
    return -length // MATRIX_STEP * -MATRIX_STEP


def bucket(needed: int, limit: int) -> int:
    """The smallest power of two >= ``needed`` (at least MIN_CAPACITY), capped at ``limit``."""
    size = MIN_CAPACITY
    while size < needed:
        size *= 2
    return min(size, limit)


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the system does not say
    (``os.sysconf`` is missing on Windows, a name it does not know is a ValueError, and an
    unknown value is -1)."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    if not isinstance(pages, int) or not isinstance(page, int) or pages <= 0 or page <= 0:
        return None
    return pages * page


def check_rows(rows: int, row_bytes: int, name: str, value: int, per_value: int = 1) -> None:
    """Refuse, before anything is allocated, ``rows`` rows of buffers of ``row_bytes`` each that
    this machine cannot hold: an InputError naming the option ``name`` that asked for them (its
    ``value`` takes ``per_value`` rows each: a beam search's ``num_beams``), the bytes a row and
    the limit, instead of numpy's MemoryError (or its ValueError past 2**63 bytes) from deep in
    the decode loop.

    The limit is the machine's physical memory (where it is unknown, the largest array numpy can
    make): a batch's buffers are made for all its rows at once, and zeros numpy has not touched
    yet take no memory, so a batch larger than memory could start and then take all of it as
    its rows fill. What is within it is no promise: other processes, a container's memory limit
    and each call's own work memory are not counted, and a server holds such a batch per decode
    loop and length class. Python's integers: ``rows * row_bytes`` cannot wrap around."""
    memory = physical_memory()
    limit, what = (memory, "this machine's physical memory") if memory is not None else (
        int(np.iinfo(np.intp).max), "the largest array numpy can make")
    rows, row_bytes = int(rows), max(1, int(row_bytes))
    if rows * row_bytes <= limit:
        return
    most = limit // row_bytes // max(1, int(per_value))
    beams = f" ({per_value} a text)" if per_value > 1 else ""
    raise InputError(f"{name} {int(value):,} needs cache buffers for {rows:,} rows{beams} at {row_bytes:,} bytes a row "
                     f"({_gib(rows * row_bytes)}), more than {what} ({_gib(limit)}); {name} can be at most "
                     f"{most:,} here.")


def _gib(size: int) -> str:
    gib = size / 2**30
    return f"{gib:,.1f} GiB" if gib < 1e6 else f"{gib:.3g} GiB"


class _Flat:
    """One flat float allocation (float32, or float16 for fp16 bundles): a numpy array, or (with
    IO binding on CUDA, or :data:`ORT_BUFFERS_ON_CPU`) an onnxruntime value on ``device``."""

    def __init__(self, size: int, device: str | None, dtype: np.dtype) -> None:
        self.size = size
        if device is not None:
            ort = require_onnxruntime()
            self._value: Any = ort.OrtValue.ortvalue_from_numpy(np.zeros(size, dtype), device, 0)
            self._host: np.ndarray | None = None
        else:
            self._value = None
            # zeros, not empty: masked positions are multiplied by 0, and 0 * NaN would be NaN
            self._host = np.zeros(size, dtype)
            # read once: ``ndarray.ctypes`` makes a ctypes object per read (~1 us), and every
            # re-binding (each row that joins or leaves) reads every buffer's pointer
            self._address = self._host.ctypes.data

    @property
    def on_device(self) -> bool:
        return self._value is not None

    def pointer(self) -> int:
        return self._value.data_ptr() if self._value is not None else self._address

    def view(self, shape: tuple[int, ...]) -> np.ndarray:
        """The first prod(shape) values as an array of ``shape`` (host buffers only)."""
        assert self._host is not None
        return self._host[: math.prod(shape)].reshape(shape)

    def move(self, source: int, target: int, size: int) -> None:
        """Copy the ``size`` values at ``source * size`` onto those at ``target * size`` (a row;
        the two do not overlap). A host buffer is written directly: :meth:`edit`'s context costs
        more than a short row's copy, and a leaving row takes one per buffer."""
        with contextlib.nullcontext(self._host) if self._value is None else self.edit() as data:
            data[target * size : (target + 1) * size] = data[source * size : (source + 1) * size]

    @contextlib.contextmanager
    def edit(self) -> Iterator[np.ndarray]:
        """The whole allocation as a writable host array; a device buffer is updated after (only
        with :data:`DEVICE_EDITS` = "host": otherwise device buffers are edited by the graphs)."""
        if self._value is None:
            yield self._host  # type: ignore[misc]
            return
        host = self._value.numpy().copy()
        yield host
        self._value.update_inplace(host)


class SlotBuffers:
    """Self-attention buffers, cross K/V, source mask (and encoder output, for a drafter) of a batch.

    ``bound``: the buffers are passed to onnxruntime by pointer through IO binding, and the
    verifier's outputs are written into them (on CUDA they live on the device). Unbound:
    numpy arrays in, new arrays out, copied back: the same results, more traffic. ``dtype``:
    the graphs' activation type (``ACTIVATION_DTYPES`` of the bundle's precision).
    """

    def __init__(self, layers: int, heads: int, head_dim: int, d_model: int, slots: int, max_target: int,
                 max_source: int, device: str, bound: bool, keep_hidden: bool, dtype: str = "float32",
                 cache_kind: str = "attention", matrices: bool = False, cross_key_layout: str | None = None,
                 static: bool = False) -> None:
        """``matrices``: each row also keeps its shortlist's gathered output matrix (a verifier
        that takes ``output_rows``, graph_specs.takes_output_rows), written when it is admitted.
        ``cross_key_layout``: the bundle's (Manifest.cross_key_layout, :func:`cross_dims`).
        ``static``: one shape for the batch's lifetime (verifier.StaticBatch): every slot is a
        row from the start, the capacities are the allocations, and rows are written into the
        slots they are given (:meth:`write_rows`), never moved; the layout never changes."""
        # refused here, before any buffer is made, where no caller checked its rows already
        check_rows(slots, self.slot_bytes(layers, heads, head_dim, d_model, max_target, max_source, keep_hidden, dtype,
                                          cache_kind), "rows", slots)
        self.dtype = np.dtype(dtype)
        self.layers, self.heads, self.head_dim, self.d_model = layers, heads, head_dim, d_model
        self.slots, self.max_target, self.max_source = slots, max_target, max_source
        on_device = bound and device == "cuda"
        self.bound = bound
        self.device = "cuda" if on_device else "cpu"
        # where the buffers are onnxruntime values (None: numpy arrays), and their edits' graphs
        held = self.device if on_device or (bound and ORT_BUFFERS_ON_CPU) else None
        self._edits = DeviceEdits(held, self.dtype) if held is not None and DEVICE_EDITS == "graphs" else None
        self._self = [_Flat(slots * heads * max_target * head_dim, held, self.dtype)
                      for _ in range(layers * len(CACHE_KINDS[cache_kind]))]
        self._cross = [_Flat(slots * heads * max_source * head_dim, held, self.dtype) for _ in range(2 * layers)]
        self.cross_key_layout = cross_key_layout
        self._cross_keys = [index % 2 == 0 for index in range(2 * layers)]  # cross_names' order: key, value
        # the drafter reads the encoder output from the host side: it is small, written once a row
        self._hidden = _Flat(slots * max_source * d_model, None, self.dtype) if keep_hidden else None
        self.keep_hidden = keep_hidden
        self.mask = np.zeros((slots, max_source), dtype=np.int64)
        # host-side even with IO binding on CUDA (bound as a CPU input, copied once per layout)
        self.keeps_matrices = matrices
        self._matrices = np.zeros((slots, 0, d_model), self.dtype)
        self._matrix_lens = np.zeros(slots, dtype=np.int64)  # each row's list length
        self.rows = 0
        self.capacity = min(MIN_CAPACITY, max_target)
        self.source_capacity = 0
        self.layout = 0  # changes whenever rows or capacities do: bindings made before are stale
        self.static = static
        if static:
            if matrices:
                raise ValueError("static buffers keep no shortlist matrices")
            self.rows, self.capacity, self.source_capacity = slots, max_target, max_source
            # a slot no row has used yet is a padding row: zero keys and values over one visible
            # source position, so that its (ignored) outputs, and the cache entries they write
            # past length 0, stay finite (an all-masked softmax may give NaN, and a NaN in a
            # masked cache position would poison the next row's 0-weighted sums)
            self.mask[:, 0] = 1

    @staticmethod
    def slot_bytes(layers: int, heads: int, head_dim: int, d_model: int, max_target: int, max_source: int,
                   keep_hidden: bool, dtype: str = "float32", cache_kind: str = "attention") -> int:
        """The bytes one slot of such buffers takes (the constructor's arguments): its own cache,
        its cross keys and values, its encoder output if kept, its source mask. A shortlist
        row's kept matrix, which grows with the lists and only in batches of a few slots, is
        left out."""
        own = layers * len(CACHE_KINDS[cache_kind]) * heads * max_target * head_dim
        cross = 2 * layers * heads * max_source * head_dim
        hidden = max_source * d_model if keep_hidden else 0
        return (own + cross + hidden) * np.dtype(dtype).itemsize + 8 * (max_source + 1)

    # ------------------------------------------------------------------ shapes

    def self_shape(self, rows: int | None = None, capacity: int | None = None) -> tuple[int, int, int, int]:
        return (self.rows if rows is None else rows, self.heads,
                self.capacity if capacity is None else capacity, self.head_dim)

    def cross_shape(self, rows: int | None = None, source: int | None = None, key: bool = False) -> tuple[int, ...]:
        """A cross-attention value's shape, or with ``key`` a key's (:func:`cross_dims`)."""
        return cross_dims(self.rows if rows is None else rows, self.heads,
                          self.source_capacity if source is None else source, self.head_dim, key,
                          self.cross_key_layout)

    def _cross_by_kind(self) -> Iterator[tuple[bool, list[_Flat]]]:
        """(key, its flats): the cross keys, then the values, each of one shape."""
        for key in (True, False):
            yield key, [flat for flat, is_key in zip(self._cross, self._cross_keys) if is_key == key]

    def hidden(self) -> np.ndarray:
        """The encoder output of the current rows, [rows, source_capacity, d_model]."""
        assert self._hidden is not None, "this batch keeps no encoder output"
        return self._hidden.view((self.rows, self.source_capacity, self.d_model))

    def matrices(self) -> np.ndarray:
        """The current rows' gathered output matrices, [rows, L, d_model], rows zero past a
        row's own list (the verifier gives those ids -inf from its -1 padded output_ids)."""
        return self._matrices[: self.rows]

    @property
    def matrix_len(self) -> int:
        return self._matrices.shape[1]

    def reserve_matrices(self, needed: int) -> None:
        """Make room for lists of ``needed`` ids before rows are added (once for all the rows
        an admission adds, not once per encoder call)."""
        if needed > self.matrix_len:
            self._resize_matrices(max(_matrix_step(needed), _matrix_step(self.matrix_len * 5 // 4)))

    def _resize_matrices(self, length: int) -> None:
        resized = np.zeros((self.slots, length, self.d_model), self.dtype)
        keep = min(length, self.matrix_len)
        resized[: self.rows, :keep] = self._matrices[: self.rows, :keep]
        self._matrices = resized
        self.layout += 1

    @property
    def reusable(self) -> bool:
        """Host arrays of a dynamic batch with no kept matrices: a later batch of the same shape
        may take them over after :meth:`reset` (Verifier.take_buffers)."""
        return (not self.static and not self.keeps_matrices and self._edits is None
                and not any(flat.on_device for flat in (*self._self, *self._cross)))

    def reset(self) -> None:
        """Empty, as if new: no rows, the smallest capacities, the mask cleared. The arrays keep
        the values written before; every position a row reads that it has not written is
        masked, as the positions a growth (:meth:`_relayout`) exposes already are, and add_rows
        writes a new row's cross keys and values over its source and zeros past it."""
        assert self.reusable
        self.rows = 0
        self.capacity = min(MIN_CAPACITY, self.max_target)
        self.source_capacity = 0
        self.layout += 1
        self.mask[:] = 0

    def source_mask(self) -> np.ndarray:
        return np.ascontiguousarray(self.mask[: self.rows, : self.source_capacity])

    # ------------------------------------------------------------------ growth and row moves

    def _relayout(self, flats: list[_Flat], old: tuple[int, ...], new: tuple[int, ...], axis: int) -> None:
        """Re-lay the first ``old[0]`` rows of each buffer from shape ``old`` to ``new`` along ``axis``."""
        if old[0] == 0:
            return
        keep = min(old[axis], new[axis])
        for flat in flats:
            if flat.on_device and self._edits is not None:
                self._edits.relayout(flat.pointer(), old, new)
                continue
            with flat.edit() as data:
                before = data[: math.prod(old)].reshape(old)
                index = [slice(None)] * len(old)
                index[axis] = slice(0, keep)
                data_copy = before[tuple(index)].copy()  # the old and new layouts overlap
                data[: math.prod(new)].reshape(new)[tuple(index)] = data_copy

    def ensure_capacity(self, needed: int) -> None:
        """Make the self-attention buffers hold ``needed`` positions (at most ``max_target``)."""
        if needed > self.max_target:
            raise CapacityError(f"a row needs {needed} cache positions, more than the {self.max_target} allocated; "
                                "this is a bug in aggdec's decode loop, please report it.")
        if needed <= self.capacity:
            return
        capacity = bucket(needed, self.max_target)
        self._relayout(self._self, self.self_shape(), self.self_shape(capacity=capacity), axis=2)
        self.capacity = capacity
        self.layout += 1

    def _ensure_source(self, needed: int) -> None:
        if needed <= self.source_capacity:
            return
        self._resize_source(bucket(needed, self.max_source))

    def _resize_source(self, source: int) -> None:
        for key, flats in self._cross_by_kind():
            self._relayout(flats, self.cross_shape(key=key), self.cross_shape(source=source, key=key),
                           axis=source_axis(key, self.cross_key_layout))
        if self._hidden is not None and self.rows:
            self._relayout([self._hidden], (self.rows, self.source_capacity, self.d_model),
                           (self.rows, source, self.d_model), axis=1)
        self.source_capacity = source
        self.layout += 1

    def shrink(self, needed: int) -> None:
        """Give back capacity the current rows no longer need: self-attention down to ``needed``
        positions (bucketed), source down to the longest current source.

        A batch that never empties (a server's) would otherwise keep the capacity of the longest
        row it ever held, and every later call would attend over it. Only positions past every
        row's length are dropped, and those are masked, so results are unchanged. Host buffers
        only (and CPU onnxruntime values, :data:`ORT_BUFFERS_ON_CPU`): a GPU call costs about
        the same at any span.
        """
        if self.rows == 0 or self.device != "cpu":
            return
        capacity = bucket(needed, self.max_target)
        if capacity < self.capacity:
            self._relayout(self._self, self.self_shape(), self.self_shape(capacity=capacity), axis=2)
            self.capacity = capacity
            self.layout += 1
        source = bucket(int(self.mask[: self.rows].sum(axis=1).max()), self.max_source)
        if source < self.source_capacity:
            self._resize_source(source)
        if self.keeps_matrices:
            longest = _matrix_step(int(self._matrix_lens[: self.rows].max()))
            if 2 * longest <= self.matrix_len:
                self._resize_matrices(longest)

    def add_rows(self, cross: list[np.ndarray], mask: np.ndarray, hidden: np.ndarray | None,
                 matrices: np.ndarray | None = None, matrix_lens: np.ndarray | None = None) -> range:
        """Append rows from one encoder call (cross keys and values per layer, :func:`cross_dims`
        with S the call's source width); their slots.
        ``matrices`` [m, L, d_model] (with :attr:`keeps_matrices`): each row's gathered output
        matrix, the first ``matrix_lens[row]`` of its L rows its own."""
        count, length = mask.shape
        if self.rows + count > self.slots:
            raise ValueError(f"{count} more rows do not fit in {self.slots} slots ({self.rows} in use)")
        self._ensure_source(length)
        first, self.rows = self.rows, self.rows + count
        self.layout += 1
        uploads = []
        for flat, key, values in zip(self._cross, self._cross_keys, cross):
            shape, axis = self.cross_shape(key=key), source_axis(key, self.cross_key_layout)
            if self._edits is not None:  # the new rows, padded to the source capacity, are all that moves
                rows = np.zeros((count, *shape[1:]), self.dtype)
                np.moveaxis(rows, axis, 2)[:, :, :length] = np.moveaxis(values, axis, 2)
                uploads.append((rows, flat.pointer() + first * rows[0].nbytes))
                continue
            with flat.edit() as data:
                view = np.moveaxis(data[: int(np.prod(shape))].reshape(shape), axis, 2)  # source at axis 2
                view[first:, :, :length] = np.moveaxis(values, axis, 2)
                view[first:, :, length:] = 0.0
        if self._edits is not None:
            self._edits.upload(uploads)
        self.mask[first : self.rows] = 0
        self.mask[first : self.rows, :length] = mask
        if hidden is not None and self._hidden is not None:
            view = self.hidden()
            view[first:, :length] = hidden
            view[first:, length:] = 0.0
        if matrices is not None and matrix_lens is not None:
            needed = matrices.shape[1]
            self.reserve_matrices(needed)
            self._matrices[first : self.rows, :needed] = matrices
            self._matrices[first : self.rows, needed:] = 0.0
            self._matrix_lens[first : self.rows] = matrix_lens
        return range(first, self.rows)

    def write_rows(self, slots: list[int], cross: list[np.ndarray] | None, mask: np.ndarray,
                   hidden: np.ndarray | None) -> None:
        """Static buffers: the rows of one encoder call (as :meth:`add_rows` takes them, at the
        source capacity's width) into ``slots``, which need not be consecutive. ``cross`` None:
        the cross keys and values are there already (:meth:`write_cross`)."""
        assert self.static and mask.shape == (len(slots), self.source_capacity)
        if cross is not None:
            self._write_cross_arrays(slots, cross)
        self.mask[slots] = mask
        if hidden is not None and self._hidden is not None:
            self.hidden()[slots] = hidden

    def _write_cross_arrays(self, slots: list[int], cross: list[np.ndarray]) -> None:
        """Host arrays of cross keys and values, a row each for ``slots``, into those slots."""
        if self._edits is not None:  # a row is contiguous: one upload per row and buffer
            self._edits.upload([(values[i], flat.pointer() + slot * values[i].nbytes)
                                for flat, values in zip(self._cross, cross) for i, slot in enumerate(slots)])
            return
        for flat, key, values in zip(self._cross, self._cross_keys, cross):
            with flat.edit() as data:
                data[: int(np.prod(self.cross_shape(key=key)))].reshape(self.cross_shape(key=key))[slots] = values

    def write_cross(self, slots: list[int], values: list[Any]) -> None:
        """Static buffers: one row of cross keys and values (onnxruntime values in
        ``cross_names``' order, as :class:`~.fixed_calls.FixedEncoderCall` holds them, on the
        buffers' device) into each of ``slots``: device to device where the buffers are
        onnxruntime values, else through numpy. The mask and encoder output: :meth:`write_rows`."""
        assert self.static
        if self._edits is None:
            self._write_cross_arrays(slots, [np.repeat(value.numpy(), len(slots), axis=0) for value in values])
            return
        sizes = [int(np.prod(value.shape())) * self.dtype.itemsize for value in values]
        self._edits.copy([(int(value.data_ptr()), flat.pointer() + slot * size, size)
                          for flat, value, size in zip(self._cross, values, sizes) for slot in slots])

    def copy_rows(self, sources: list[int], targets: list[int]) -> None:
        """Copy the decoder's own cache (every layer's keys and values, or states) of rows
        ``sources`` onto rows ``targets``, all read before any is written; only those rows move.
        The cross-attention rows, mask and encoder output are left alone: a beam search copies
        between rows of one source, where they are the same. The layout does not change, so a
        binding stays valid. Device buffers: only the rows that change move, on the device
        (:meth:`DeviceEdits.move_rows`; on an H100, 4 beams at batch 32 gave the host path's outputs:
        benchmarks/results/gpu-check-h100-device-edits)."""
        if not targets:
            return
        shape = self.self_shape()
        if self._edits is not None:
            row_bytes = int(np.prod(shape[1:])) * self.dtype.itemsize
            self._edits.move_rows([flat.pointer() for flat in self._self], row_bytes, sources, targets)
            return
        for flat in self._self:
            with flat.edit() as data:
                view = data[: int(np.prod(shape))].reshape(shape)
                view[targets] = view[sources]  # fancy indexing reads a copy first

    def remove_row(self, slot: int) -> int | None:
        """Drop ``slot``; the last row moves into it. Returns the slot that moved (None if none did)."""
        last = self.rows - 1
        if slot != last:
            # a row is contiguous in every buffer, whatever the layout after its axis
            buffers = ((self._self, self.self_shape()), (self._cross, self.cross_shape()))
            if self._edits is not None:  # one row per buffer, all in one batch of copies
                sizes = [(flat, int(np.prod(shape[1:])) * self.dtype.itemsize) for flats, shape in buffers
                         for flat in flats]
                self._edits.copy([(flat.pointer() + last * size, flat.pointer() + slot * size, size)
                                  for flat, size in sizes])
            else:
                for flats, shape in buffers:
                    size = math.prod(shape[1:])  # a row's values: one slice of the flat buffer
                    for flat in flats:
                        flat.move(last, slot, size)
            self.mask[slot] = self.mask[last]
            if self.keeps_matrices:
                self._matrices[slot] = self._matrices[last]
                self._matrix_lens[slot] = self._matrix_lens[last]
            if self._hidden is not None:
                view = self.hidden()
                view[slot] = view[last]
        self.rows = last
        self.layout += 1
        if self.rows == 0:  # an empty batch starts small again: nothing to re-lay
            self.source_capacity = 0
            if self.matrix_len:
                self._matrices = np.zeros((self.slots, 0, self.d_model), self.dtype)
            self.capacity = min(MIN_CAPACITY, self.max_target)
        return last if slot != last else None

    # ------------------------------------------------------------------ feeding the verifier

    def bind(self, binding: Any, in_names: list[str], out_names: list[str], cross: list[str]) -> None:
        """Bind every buffer by pointer, the outputs onto the inputs' own memory."""
        shape = self.self_shape()
        for flat, name, out in zip(self._self, in_names, out_names):
            binding.bind_input(name, self.device, 0, self.dtype, list(shape), flat.pointer())
            binding.bind_output(out, self.device, 0, self.dtype, list(shape), flat.pointer())
        for flat, key, name in zip(self._cross, self._cross_keys, cross):
            binding.bind_input(name, self.device, 0, self.dtype, list(self.cross_shape(key=key)), flat.pointer())

    def feeds(self, in_names: list[str], cross: list[str]) -> dict[str, np.ndarray]:
        """The buffers as numpy inputs (unbound)."""
        feeds = {name: flat.view(self.self_shape()) for flat, name in zip(self._self, in_names)}
        feeds.update({name: flat.view(self.cross_shape(key=key))
                      for flat, key, name in zip(self._cross, self._cross_keys, cross)})
        return feeds

    def store(self, outputs: list[np.ndarray]) -> None:
        """Copy an unbound call's returned buffers back (the bound path wrote in place)."""
        for flat, values in zip(self._self, outputs):
            np.copyto(flat.view(self.self_shape()), values)
