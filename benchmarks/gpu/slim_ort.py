"""onnxruntime-gpu made small enough to reach the lent GPU in two or three calls instead of nine.

Its wheel is 256 MB, and a device call carries 64 MiB with the tree, so the wheel whole takes
nine calls (and a quarter of the session's device time in transfers). Most of it is GPU code
for chips the lent machine is not: ``libonnxruntime_providers_cuda.so`` holds one cubin per
kernel for each of sm_75, 80, 86, 89, 90 and 120 (no PTX). This keeps the package as pip would
install it, with three changes, and packs it as one ``.tar.xz`` of a site folder:

- in the CUDA provider's ``.nv_fatbin`` section, in every fatbin that has a kernel image for
  ``--arch`` (90: the H100 and H200), the other images' payloads are zeroed; the entries'
  headers stay, so every offset in the library is unchanged and the CUDA runtime, which picks a
  kernel image by the header's architecture, still finds the one it loads, bit for bit the
  original (a fatbin with no image for the chip, such as sm_120-only kernels, stays whole);
- ``libonnxruntime.so`` (the C API's library: the Python binding links the runtime in itself)
  and the TensorRT provider (TensorRT cannot be installed there) are left out.

A machine whose GPU is another architecture then finds no kernel image, and the first CUDA
graph run fails; ``prepare.sh --arch`` or ``--full-wheel`` (the whole wheel) is for such a
machine. On an H100 the slimmed package ran every stage of the check (2026-11-26).

    python benchmarks/gpu/slim_ort.py WHEEL OUT.tar.xz [--arch 90]

Standard library only, like carry.py.
"""

from __future__ import annotations

import argparse
import io
import lzma
import struct
import sys
import tarfile
import zipfile
from pathlib import Path

CUDA_PROVIDER = "libonnxruntime_providers_cuda.so"
LEFT_OUT = ("libonnxruntime.so", "libonnxruntime_providers_tensorrt.so")
FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTION = b".nv_fatbin"


class SlimError(Exception):
    """A wheel or library this module cannot read as it expects."""


def section(elf: bytes | bytearray, name: bytes) -> tuple[int, int]:
    """(file offset, size) of the ELF64 little-endian section ``name``."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise SlimError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    names_offset, = struct.unpack_from("<Q", elf, shoff + shstrndx * shentsize + 0x18)
    for index in range(shnum):
        header = shoff + index * shentsize
        name_at, = struct.unpack_from("<I", elf, header)
        start = names_offset + name_at
        if bytes(elf[start:start + len(name) + 1]) == name + b"\0":
            offset, size = struct.unpack_from("<QQ", elf, header + 0x18)
            return offset, size
    raise SlimError(f"no {name.decode()} section")


def fatbins(data: bytes | bytearray, start: int, end: int):
    """The fatbins between ``start`` and ``end`` (8-byte aligned, zero padding between), each as
    the list of its kernel images: (payload offset, payload size, kind (1 PTX, 2 cubin), architecture)."""
    pos = start
    while pos + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8
            continue
        entry, last = pos + header_size, pos + header_size + fat_size
        if last > end:
            raise SlimError(f"a fatbin at {pos} runs past its section")
        images = []
        while entry < last:
            kind, _, entry_header, size = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            if entry_header < 32 or entry + entry_header + size > last:
                raise SlimError(f"a malformed fatbin entry at {entry}")
            images.append((entry + entry_header, size, kind, arch))
            entry += entry_header + size
        yield images
        pos = last


def keep_one_architecture(library: bytes, arch: int) -> tuple[bytearray, dict[int, int]]:
    """``library`` with, in every fatbin that has a kernel image for ``arch``, the other images
    zeroed (a fatbin without one, such as a kernel built for one other chip only, stays whole).
    Returns it and the bytes zeroed per architecture; refuses a library with no image for ``arch``."""
    data = bytearray(library)
    start, size = section(data, FATBIN_SECTION)
    zeroed: dict[int, int] = {}
    kept = 0
    for images in list(fatbins(data, start, start + size)):
        if not any(image_arch == arch for *_, image_arch in images):
            continue
        for offset, length, _kind, image_arch in images:
            if image_arch == arch:
                kept += 1
                continue
            data[offset:offset + length] = bytes(length)
            zeroed[image_arch] = zeroed.get(image_arch, 0) + length
    if not kept:
        raise SlimError(f"no kernel image for sm_{arch} in the library")
    return data, zeroed


def slim_wheel(wheel: Path, out: Path, arch: int = 90) -> dict:
    """The wheel's files (less LEFT_OUT, with the CUDA provider kept for ``arch`` only) as a
    ``.tar.xz`` laid out as a site folder. Returns what was done, for pack.json."""
    zeroed: dict[int, int] = {}
    left_out: list[str] = []
    with zipfile.ZipFile(wheel) as archive, lzma.open(out, "wb", preset=9) as packed, \
            tarfile.open(fileobj=packed, mode="w") as tar:
        for item in archive.infolist():
            if item.is_dir():
                continue
            base = item.filename.rsplit("/", 1)[-1]
            if any(base.startswith(name) for name in LEFT_OUT):
                left_out.append(item.filename)
                continue
            data = archive.read(item)
            if base == CUDA_PROVIDER:
                data, zeroed = keep_one_architecture(data, arch)
            info = tarfile.TarInfo(item.filename)
            info.size = len(data)
            info.mode = 0o755 if base.endswith(".so") or ".so." in base else 0o644
            tar.addfile(info, io.BytesIO(bytes(data)))
    if not zeroed and arch:
        raise SlimError(f"{wheel.name} has no {CUDA_PROVIDER}")
    return {"arch": arch, "zeroed_mib": {f"sm_{a}": round(n / 2**20) for a, n in sorted(zeroed.items())},
            "left_out": left_out, "from": wheel.name}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", type=int, default=90, help="the compute capability kept, as sm_NN (90)")
    args = parser.parse_args(argv)
    try:
        done = slim_wheel(args.wheel, args.out, args.arch)
    except (SlimError, zipfile.BadZipFile, OSError) as exc:
        print(f"slim_ort.py: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB; kept sm_{args.arch}, zeroed "
          + ", ".join(f"{a} {m} MiB" for a, m in done["zeroed_mib"].items()) + "; left out " + ", ".join(done["left_out"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
