"""Reading ``.npz`` archives that are untrusted (a Marian folder's weights, a bundle's shortlist
table) without letting them allocate what they do not hold.

``np.load`` allocates each array from its ``.npy`` header before reading it (for a member of a
zip it makes the whole array first), and inflates deflated members whatever they expand to: a
header claiming 4 TiB is a ``MemoryError`` inside ``np.load``, and 2 MB of deflated zeros that
declare 2 GB allocate and fill 2 GB. :func:`npz_size_problem` finds both from the zip's
directory and each member's header, before any array is read. A damaged archive raises what
zipfile, zlib and numpy raise (:data:`DAMAGED`), for the caller to name in its own error.
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

# A member may be deflated, but weights and id tables do not compress much (float32 values:
# about 1.1x); a member expanding more than this is a zip bomb
MAX_NPZ_EXPANSION = 64
# what reading a damaged archive raises: zipfile.BadZipFile, zlib.error and EOFError are neither
# OSErrors nor ValueErrors (numpy's header parser raises ValueError)
# (NotImplementedError: a compression method zipfile lacks)
DAMAGED = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError)


def npz_size_problem(source: str | Path | bytes) -> str | None:
    """Why the ``.npz`` at ``source`` (a path, or its bytes) may not be read with ``np.load``, or
    None: a member that expands more than MAX_NPZ_EXPANSION-fold, or whose ``.npy`` header
    declares more bytes than the member holds. A damaged archive raises one of :data:`DAMAGED`."""
    with zipfile.ZipFile(io.BytesIO(source) if isinstance(source, bytes) else source) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_NPZ_EXPANSION * max(
                    info.compress_size, 1 << 16):
                return (f"member {info.filename!r} expands from {info.compress_size} to {info.file_size} bytes, "
                        f"more than {MAX_NPZ_EXPANSION}-fold; weights do not compress like that")
            if not info.filename.endswith(".npy"):
                continue  # np.load reads only .npy members as arrays
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version == (1, 0):
                    shape, _fortran, dtype = np.lib.format.read_array_header_1_0(member)
                elif version == (2, 0):
                    shape, _fortran, dtype = np.lib.format.read_array_header_2_0(member)
                else:  # 3.0 (UTF-8 field names), which neither Marian nor aggdec writes: np.load's own checks
                    continue
            declared = math.prod(shape) * dtype.itemsize
            if declared > info.file_size:
                return (f"member {info.filename!r} declares shape {list(shape)} of {dtype} ({declared} bytes) "
                        f"but holds {info.file_size} bytes")
    return None
