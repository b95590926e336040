"""The cache's device edits (runtime/decoding/device_edits.py) on the CPU provider.

The graphs and IO bindings are CUDA's, bound to CPU onnxruntime values: each edit is checked
against numpy on random buffers (byte offsets, the last row, one row, rows that swap, every
axis of a re-layout, float16), and SlotBuffers driven through them against SlotBuffers on numpy
arrays. The decode loop's modes with this path forced on: test_device_edits_decoding.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from aggdec.runtime.decoding import cache
from aggdec.runtime.decoding.cache import SlotBuffers
from aggdec.runtime.decoding.device_edits import COPY_WIDTHS, DeviceEdits
from tests.support.traces import host_edit_log

ort = pytest.importorskip("onnxruntime")


def held(values: np.ndarray):
    """``values`` as a CPU onnxruntime value over the same memory (the test reads it back)."""
    value = ort.OrtValue.ortvalue_from_numpy(values, "cpu")
    assert value.data_ptr() == values.ctypes.data
    return value


def test_the_script_writes_the_committed_graphs():
    pytest.importorskip("onnx")
    from importlib import resources

    from aggdec.export.edit_graphs import graphs

    folder = resources.files("aggdec.runtime.decoding") / "edit_graphs"
    made = graphs()
    assert sorted(made) == sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".onnx"))
    for name, data in made.items():
        assert (folder / name).read_bytes() == data, f"{name}: run python -m aggdec.export.edit_graphs"


def test_copies_land_in_the_bound_memory_at_any_byte_offset():
    """More copies than the widest graph takes (cut into several runs), each between odd byte
    offsets of two allocations: the targets get the bytes (onnxruntime copied into the bound
    output, it did not alias it to the input), the sources and every other byte stay."""
    rng = np.random.default_rng(0)
    source = rng.integers(0, 255, 4000, dtype=np.uint8)
    target = rng.integers(0, 255, 4000, dtype=np.uint8)
    expected_source, expected = source.copy(), target.copy()
    edits = DeviceEdits("cpu", np.dtype(np.float32))
    values = (held(source), held(target))
    count = COPY_WIDTHS[0] + COPY_WIDTHS[1] + 1
    moves = []
    for i in range(count):  # disjoint target ranges of 1..17 bytes, at odd places
        at, size = 3 + 37 * i, 1 + i % 17
        start = int(rng.integers(0, 3900))
        moves.append((values[0].data_ptr() + start, values[1].data_ptr() + at, size))
        expected[at : at + size] = source[start : start + size]
    runs = edits.graphs.copy_runs
    edits.copy(moves)
    assert edits.graphs.copy_runs - runs == 3
    assert (target == expected).all() and (source == expected_source).all()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("sources,targets", [
    ([4], [0]),  # the last row into the first: a finished row's replacement
    ([0], [4]),
    ([2], [2]),  # nothing moves
    ([1, 0], [0, 1]),  # a swap: read before written
    ([3, 3, 3, 0], [0, 1, 2, 3]),  # one row to several, and a row read and overwritten
    ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0]),
    ([2, 4], [3, 0]),  # no moved row is both read and written: copied directly
])
def test_row_moves_equal_numpy(dtype, sources, targets):
    rng = np.random.default_rng(len(sources))
    shape = (5, 3, 7, 2)
    buffers = [rng.standard_normal(int(np.prod(shape)) + 11).astype(dtype) for _ in range(3)]
    expected = [b.copy() for b in buffers]
    for b in expected:
        view = b[: int(np.prod(shape))].reshape(shape)
        view[targets] = view[sources]
    values = [held(b) for b in buffers]
    row_bytes = int(np.prod(shape[1:])) * np.dtype(dtype).itemsize
    DeviceEdits("cpu", np.dtype(dtype)).move_rows([v.data_ptr() for v in values], row_bytes, sources, targets)
    for got, want in zip(buffers, expected):
        assert (got == want).all()


def test_row_targets_may_not_repeat():
    values = held(np.zeros(40, np.float32))
    with pytest.raises(ValueError, match="repeat"):
        DeviceEdits("cpu", np.dtype(np.float32)).move_rows([values.data_ptr()], 16, [0, 1], [2, 2])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("axis", [0, 1, 2, 3])
@pytest.mark.parametrize("grow", [True, False])
def test_relayout_of_every_axis_equals_numpy(dtype, axis, grow):
    """The prefix of shape ``old`` re-laid as ``new`` in the same allocation: every kept value
    where the new layout puts it, the new positions zero; nothing past the new prefix written."""
    rng = np.random.default_rng(axis)
    old = (3, 2, 5, 4)
    new = tuple(size + (3 if grow else -1) if i == axis else size for i, size in enumerate(old))
    room = max(np.prod(old), np.prod(new)) + 9
    buffer = rng.standard_normal(room).astype(dtype)
    before = buffer.copy()
    keep = tuple(slice(0, min(a, b)) for a, b in zip(old, new))
    expected = np.zeros(new, dtype)
    expected[keep] = before[: int(np.prod(old))].reshape(old)[keep]
    value = held(buffer)
    edits = DeviceEdits("cpu", np.dtype(dtype))
    runs = edits.graphs.pad_runs
    edits.relayout(value.data_ptr(), old, new)
    assert edits.graphs.pad_runs == runs + 1
    assert (buffer[: int(np.prod(new))].reshape(new) == expected).all()
    assert (buffer[int(np.prod(new)) :] == before[int(np.prod(new)) :]).all()


def test_uploads_write_only_their_rows():
    buffer = np.full(60, 7.0, np.float16)
    value = held(buffer)
    rows = np.arange(12, dtype=np.float32).reshape(2, 6)  # cast to the buffers' type on the way
    DeviceEdits("cpu", np.dtype(np.float16)).upload([(rows, value.data_ptr() + 6 * 2 * 3)])
    expected = np.full(60, 7.0, np.float16)
    expected[18:30] = np.arange(12)
    assert (buffer == expected).all()


# ------------------------------------------------------------------ SlotBuffers through the graphs


def pair(monkeypatch, dtype="float32", layout=None, static=False):
    """Two SlotBuffers of one shape: numpy arrays, and CPU onnxruntime values edited by the graphs."""
    made = []
    for on_ort in (False, True):
        monkeypatch.setattr(cache, "ORT_BUFFERS_ON_CPU", on_ort)
        made.append(SlotBuffers(layers=2, heads=2, head_dim=3, d_model=4, slots=5, max_target=70, max_source=20,
                                device="cpu", bound=True, keep_hidden=True, dtype=dtype, cross_key_layout=layout,
                                static=static))
    plain, graphs = made
    assert all(not f.on_device for f in plain._self) and all(f.on_device for f in graphs._self + graphs._cross)
    assert graphs._edits is not None and plain._edits is None
    return plain, graphs


def contents(flat) -> np.ndarray:
    return flat._value.numpy() if flat.on_device else flat._host


def sync(rng, plain, graphs):
    """The same random values in every buffer of both (the whole allocations)."""
    for a, b in zip(plain._self + plain._cross, graphs._self + graphs._cross):
        values = rng.standard_normal(a.size).astype(plain.dtype)
        a._host[:] = values
        b._value.update_inplace(values)


def same(plain, graphs, rows=None, positions=None, sources=None):
    """Both hold the same values in the current layout, over ``rows`` and the first
    ``positions`` self and ``sources`` cross positions (default: all of them)."""
    assert (plain.rows, plain.capacity, plain.source_capacity) == (graphs.rows, graphs.capacity, graphs.source_capacity)
    rows = slice(0, plain.rows) if rows is None else rows
    for a, b in zip(plain._self, graphs._self):
        shape = plain.self_shape()
        view = (lambda data: data[: int(np.prod(shape))].reshape(shape)[rows, :, :positions])
        assert (view(contents(a)) == view(contents(b))).all()
    for a, b, key in zip(plain._cross, graphs._cross, plain._cross_keys):
        shape, axis = plain.cross_shape(key=key), cache.source_axis(key, plain.cross_key_layout)

        def view(data):
            return np.moveaxis(data[: int(np.prod(shape))].reshape(shape), axis, 2)[rows, :, :sources]
        assert (view(contents(a)) == view(contents(b))).all()
    assert (plain.hidden() == graphs.hidden()).all() and (plain.source_mask() == graphs.source_mask()).all()


def encoded(rng, count, length, buffers):
    layout = buffers.cross_key_layout
    cross = [rng.standard_normal(cache.cross_dims(count, 2, length, 3, key, layout)).astype(np.float32)
             for key in buffers._cross_keys]
    mask = np.ones((count, length), np.int64)
    mask[:, length - 1 :] = rng.integers(0, 2, (count, 1))
    return cross, mask, rng.standard_normal((count, length, 4)).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", [None, cache.KEYS_TRANSPOSED])
def test_slot_buffers_through_the_graphs_equal_numpy(monkeypatch, dtype, layout):
    """Rows join (widening the source), finish (the last row moves, the last row itself, the only
    row), grow and shrink the capacity, copy rows: each edit leaves the graph-edited buffers as
    the numpy ones over every position that means anything (a numpy re-layout leaves stale
    values past the kept ones, the graphs zeros: both masked), and no whole allocation went
    through the host."""
    rng = np.random.default_rng(1)
    plain, graphs = pair(monkeypatch, dtype, layout)
    host_edits = host_edit_log(monkeypatch)
    for count, length in ((2, 5), (1, 3), (2, 19)):  # the third widens the source: a re-layout
        first, sources = plain.rows, plain.source_capacity
        sync(rng, plain, graphs)
        cross, mask, hidden = encoded(rng, count, length, plain)
        for buffers in (plain, graphs):
            buffers.add_rows(cross, mask, hidden)
        same(plain, graphs, rows=slice(first, plain.rows))
        same(plain, graphs, rows=slice(0, first), sources=sources)
    sync(rng, plain, graphs)
    for buffers in (plain, graphs):
        buffers.ensure_capacity(40)
    same(plain, graphs, positions=16)
    for sources, targets in (([4, 4, 0], [1, 2, 4]), ([1], [3])):
        sync(rng, plain, graphs)
        for buffers in (plain, graphs):
            buffers.copy_rows(sources, targets)
        same(plain, graphs)
    for slot in (1, 3, 0, 0, 0):  # a middle row, the last row, the first, then down to none
        sync(rng, plain, graphs)
        for buffers in (plain, graphs):
            moved = buffers.remove_row(slot)
        same(plain, graphs)
        if plain.rows == 1:
            cross, mask, hidden = encoded(rng, 1, 4, plain)
            for buffers in (plain, graphs):
                buffers.ensure_capacity(70)
                buffers.add_rows(cross, mask, hidden)
            sync(rng, plain, graphs)
            for buffers in (plain, graphs):
                buffers.shrink(9)  # 70 -> 16 positions, and the source down to its longest row
            same(plain, graphs)
    while plain.rows:
        for buffers in (plain, graphs):
            moved = buffers.remove_row(0)
        same(plain, graphs)
    assert moved is None and plain.rows == graphs.rows == 0
    assert True not in host_edits, "a device buffer was edited through the host"
    assert graphs._edits.graphs.copy_runs > 0 and graphs._edits.graphs.pad_runs > 0


def test_static_rows_are_written_into_their_slots(monkeypatch):
    rng = np.random.default_rng(2)
    plain, graphs = pair(monkeypatch, layout=cache.KEYS_TRANSPOSED, static=True)
    sync(rng, plain, graphs)
    cross, mask, hidden = encoded(rng, 3, plain.source_capacity, plain)
    for buffers in (plain, graphs):
        buffers.write_rows([4, 0, 2], cross, mask, hidden)
        buffers.copy_rows([4, 4], [1, 3])
    same(plain, graphs)


def test_host_edits_remain_for_the_gpu_check_to_compare(monkeypatch):
    """DEVICE_EDITS = "host" keeps the buffers as onnxruntime values, edited as before (the
    whole allocation through numpy): the GPU check's baseline."""
    monkeypatch.setattr(cache, "DEVICE_EDITS", "host")
    monkeypatch.setattr(cache, "ORT_BUFFERS_ON_CPU", True)
    host = SlotBuffers(2, 2, 3, 4, 5, 70, 20, "cpu", True, False)
    assert host._edits is None and all(f.on_device for f in host._self)
    rng = np.random.default_rng(3)
    cross, mask, _ = encoded(rng, 2, 5, host)
    host.add_rows(cross, mask, None)
    host.remove_row(0)
    shape = host.cross_shape()
    assert (contents(host._cross[1])[: int(np.prod(shape))].reshape(shape)[0, :, :5] == cross[1][1]).all()
