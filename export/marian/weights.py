"""Marian's weight files, read strictly: ``model.*.bin`` (Marian's binary format) or ``.npz``.

Both are untrusted input. Every length, count and offset of a ``.bin`` is checked against the
file before it is used, an unknown element type is refused by its code, and a tensor whose
bytes disagree with its shape is refused by name; the result is plain float32 numpy arrays
(int8 matrices dequantized), so nothing downstream sees Marian's storage.

The ``.bin`` layout (Marian's ``io/binary.cpp``; checked against the Bergamot files): a u64
version (1), a u64 item count, one header per item (u64 name length with its NUL, u64 type,
u64 number of dims, u64 data bytes), then every name, every shape (int32 dims), a u64 count of
alignment bytes to skip, and the items' data in header order.

Types: 0x0404 float32. 0x4101 Marian's ``intgemm8`` storage: a row-major int8 matrix followed
by one float32 quantization multiplier, value = int8 / multiplier; the data is padded
(with bytes that are not zero), so exactly rows*cols + 4 bytes are read. The header's shape is
the logical (in, out) one but the int8 values are stored transposed ([out, in]), except for
the embedding matrix ``Wemb``, which is stored as its logical shape. Items named ``*_QuantMultA``
are the int8 engine's activation multipliers: they play no part in float semantics and are
dropped. ``special:model.yml`` is the model's config (text) and is returned apart.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...runtime.errors import ExportError
from ...runtime.npz import DAMAGED, npz_size_problem

FLOAT32 = 0x0404
INT8_INTGEMM = 0x4101
INT8_SIGNED = 0x0101  # plain int8 (used for the config item, a char array)
KNOWN_TYPES = {FLOAT32: "float32", INT8_INTGEMM: "intgemm8", INT8_SIGNED: "int8"}
CONFIG_ITEM = "special:model.yml"
ACTIVATION_MULTIPLIER = "_QuantMultA"
UNTRANSPOSED = frozenset({"Wemb"})  # stored as its logical shape even in int8
MAX_ITEMS = 1 << 16
MAX_NAME = 1 << 12
MAX_DIMS = 8


@dataclass(frozen=True)
class MarianWeights:
    tensors: dict[str, np.ndarray]  # float32, Marian's logical shapes ([in, out] for matrices)
    config_text: str | None  # special:model.yml, when the file carries it
    int8_matrices: int  # how many were stored as int8 and dequantized


class _Reader:
    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.pos, self.path = data, 0, path

    def fail(self, what: str) -> ExportError:
        return ExportError(f"{str(self.path)!r} is not a valid Marian .bin file: {what}.")

    def take(self, count: int, what: str) -> bytes:
        if count < 0 or self.pos + count > len(self.data):
            raise self.fail(f"it ends inside {what} (needs {count} bytes at offset {self.pos}, "
                            f"the file has {len(self.data)}; truncated?)")
        chunk = self.data[self.pos : self.pos + count]
        self.pos += count
        return chunk

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]


def read_bin(path: Path) -> MarianWeights:
    data = path.read_bytes()
    reader = _Reader(data, path)
    version = reader.u64("the version")
    if version != 1:
        raise reader.fail(f"version {version}, this reader knows version 1")
    count = reader.u64("the item count")
    if not 0 < count <= MAX_ITEMS:
        raise reader.fail(f"an item count of {count}")
    headers = []
    for index in range(count):
        name_len, kind, ndims, nbytes = struct.unpack("<4Q", reader.take(32, f"header {index}"))
        if not 1 < name_len <= MAX_NAME or ndims > MAX_DIMS or nbytes > len(data):
            raise reader.fail(f"header {index} is impossible (name length {name_len}, {ndims} dims, {nbytes} bytes)")
        headers.append((name_len, kind, ndims, nbytes))
    names = []
    for index, (name_len, *_rest) in enumerate(headers):
        raw = reader.take(name_len, f"the name of item {index}")
        if raw[-1:] != b"\0" or b"\0" in raw[:-1]:
            raise reader.fail(f"the name of item {index} is not one NUL-terminated string")
        try:
            names.append(raw[:-1].decode("utf-8"))
        except UnicodeDecodeError:
            raise reader.fail(f"the name of item {index} is not UTF-8") from None
    if len(set(names)) != len(names):
        raise reader.fail(f"item {next(n for n in names if names.count(n) > 1)!r} appears twice")
    shapes = []
    for name, (_len, _kind, ndims, _bytes) in zip(names, headers):
        dims = struct.unpack(f"<{ndims}i", reader.take(4 * ndims, f"the shape of {name!r}"))
        if any(d <= 0 for d in dims):
            raise reader.fail(f"{name!r} has shape {list(dims)}")
        shapes.append(dims)
    reader.take(reader.u64("the alignment"), "the alignment")

    tensors: dict[str, np.ndarray] = {}
    config_text = None
    int8 = 0
    for name, (_len, kind, _ndims, nbytes), dims in zip(names, headers, shapes):
        raw = reader.take(nbytes, f"the data of {name!r}")
        if kind not in KNOWN_TYPES:
            raise reader.fail(f"{name!r} has element type 0x{kind:x}, which this reader does not know "
                              f"(known: {', '.join(f'0x{k:x} {v}' for k, v in KNOWN_TYPES.items())})")
        size = math.prod(dims)  # Python's integers: np.prod wrapped (2**30, 2**30, 16) around to 0 elements
        if name == CONFIG_ITEM:
            if kind != INT8_SIGNED or nbytes < size:
                raise reader.fail(f"{name!r} is not text")
            try:
                config_text = raw[:size].rstrip(b"\0").decode("utf-8", errors="strict")
            except UnicodeDecodeError as exc:
                raise reader.fail(f"{name!r} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") \
                    from None
            continue
        if name.endswith(ACTIVATION_MULTIPLIER):
            continue
        if kind == FLOAT32:
            if nbytes < 4 * size:
                raise reader.fail(f"{name!r} has shape {list(dims)} ({4 * size} bytes of float32) but {nbytes} bytes")
            values = np.frombuffer(raw, dtype="<f4", count=size).reshape(dims)
        elif kind == INT8_INTGEMM:
            if len(dims) != 2 or nbytes < size + 4:
                raise reader.fail(f"{name!r} has shape {list(dims)} ({size + 4} bytes of int8 and scale) "
                                  f"but {nbytes} bytes")
            scale = float(np.frombuffer(raw, dtype="<f4", count=1, offset=size)[0])
            if not np.isfinite(scale) or scale == 0.0:
                raise reader.fail(f"{name!r} has quantization multiplier {scale}")
            stored = np.frombuffer(raw, dtype=np.int8, count=size)
            if name in UNTRANSPOSED:
                matrix = stored.reshape(dims)
            else:
                matrix = stored.reshape(dims[1], dims[0]).T
            with np.errstate(over="ignore"):  # a tiny multiplier gives inf: refused below, without a warning
                values = matrix.astype(np.float32) / np.float32(scale)
            int8 += 1
        else:
            raise reader.fail(f"{name!r} has element type {KNOWN_TYPES[kind]}, which is not a weight type")
        if not np.isfinite(values).all():
            raise reader.fail(f"{name!r} holds values that are not finite")
        tensors[name] = np.ascontiguousarray(values, dtype=np.float32)
    if reader.pos != len(data):
        raise reader.fail(f"{len(data) - reader.pos} bytes follow the last item")
    return MarianWeights(tensors, config_text, int8)


def _check_npz_sizes(path: Path) -> None:
    """Refuse a member whose ``.npy`` header declares more bytes than the member holds, before
    numpy allocates them, and a member that expands like a zip bomb (runtime/npz.py)."""
    problem = npz_size_problem(path)
    if problem is not None:
        raise ExportError(f"{str(path)!r}: {problem}.")


def read_npz(path: Path) -> MarianWeights:
    """A float ``.npz`` (Marian's other format): float32 arrays by name, the config as a char array.
    Every member's declared size is checked against what it holds before any array is read."""
    tensors: dict[str, np.ndarray] = {}
    config_text = None
    try:
        _check_npz_sizes(path)
        with np.load(path, allow_pickle=False) as archive:
            for name in archive.files:
                values = archive[name]
                if name == CONFIG_ITEM:
                    if values.dtype not in (np.int8, np.uint8) or values.ndim != 1:
                        raise ExportError(f"{str(path)!r}: {name!r} is not text.")
                    config_text = values.tobytes().rstrip(b"\0").decode("utf-8")
                    continue
                if name.endswith(ACTIVATION_MULTIPLIER):
                    continue
                if values.dtype != np.float32:
                    raise ExportError(f"{str(path)!r}: {name!r} has element type {values.dtype}; a Marian .npz "
                                      "holds float32 weights (convert an int8 model from its .bin).")
                if not np.isfinite(values).all():
                    raise ExportError(f"{str(path)!r}: {name!r} holds values that are not finite.")
                tensors[name] = np.ascontiguousarray(values)
    except (*DAMAGED, MemoryError) as exc:
        raise ExportError(f"{str(path)!r} is not a valid Marian .npz file: {exc}.") from None
    return MarianWeights(tensors, config_text, 0)


def read_weights(path: Path) -> MarianWeights:
    if path.suffix == ".npz":
        return read_npz(path)
    return read_bin(path)


SHORTLIST_MAGIC = 0xF11A48D5013417F5
SHORTLIST_HEADER = 48  # magic, checksum, first, best, offsets count, targets count: six u64


@dataclass(frozen=True)
class MarianShortlist:
    first: int  # the most frequent target ids always allowed
    best: int  # how many targets per source id the table was built with
    offsets: np.ndarray  # int64 [source vocab + 1]
    targets: np.ndarray  # int32


def read_shortlist(path: Path, source_vocab: int, target_vocab: int) -> MarianShortlist:
    """Marian's binary lexical shortlist (``lex.*.bin``, data/shortlist.h), read strictly.

    The header's checksum is Marian's own hash of the arrays and is not recomputed here; the
    structure is checked instead (sizes against the file, offsets partitioning the targets,
    every id inside its vocabulary)."""
    data = path.read_bytes()
    fail = lambda what: ExportError(f"{str(path)!r} is not a valid Marian binary shortlist: {what}.")  # noqa: E731
    if len(data) < SHORTLIST_HEADER:
        raise fail(f"it has {len(data)} bytes, fewer than its {SHORTLIST_HEADER}-byte header (truncated?)")
    magic, _checksum, first, best, offsets_count, targets_count = struct.unpack("<6Q", data[:SHORTLIST_HEADER])
    if magic != SHORTLIST_MAGIC:
        raise fail(f"magic 0x{magic:x}, not 0x{SHORTLIST_MAGIC:x} (a text shortlist is not supported)")
    if offsets_count != source_vocab + 1:
        raise fail(f"it indexes {offsets_count - 1} source ids, the model's vocabulary has {source_vocab}")
    size = SHORTLIST_HEADER + 8 * offsets_count + 4 * targets_count
    if len(data) != size:
        raise fail(f"its header implies {size} bytes, the file has {len(data)} (truncated?)")
    offsets = np.frombuffer(data, "<u8", count=offsets_count, offset=SHORTLIST_HEADER).astype(np.int64)
    targets = np.frombuffer(data, "<u4", count=targets_count, offset=SHORTLIST_HEADER + 8 * offsets_count)
    if offsets[0] != 0 or offsets[-1] != targets_count or np.any(np.diff(offsets) < 0):
        raise fail("its offsets do not partition its targets")
    if targets_count and int(targets.max()) >= target_vocab:
        raise fail(f"target id {int(targets.max())} is outside the vocabulary of {target_vocab}")
    if first > target_vocab:
        raise fail(f"first {first} exceeds the vocabulary of {target_vocab}")
    return MarianShortlist(int(first), int(best), offsets, targets.astype(np.int32))
