"""Writes the cache edit graphs that ``runtime/decoding/device_edits.py`` runs (package data).

The runtime never imports onnx, so these tiny graphs are built here, at development time, and
committed as ``runtime/decoding/edit_graphs/*.onnx``; ``tests/runtime/test_device_edits.py``
checks that this script still writes exactly the committed bytes. Regenerate with

    python -m aggdec.export.edit_graphs

- ``copy_K`` (K in COPY_WIDTHS): K independent Identity nodes over ``uint8 [n_i]``. Bound by
  pointer, byte offset and size, each is a memcpy between any two contiguous byte ranges (of one
  device allocation, two, or a host array and a device one): a row move, a row upload, a scratch
  copy, whatever the dtype. K of them per run: a row move touches every layer's buffers, and one
  run per buffer would pay the per-run overhead 4 x layers times.
- ``pad_<dtype>``: Pad (constant 0) of a rank-4 tensor with its ``pads`` as an input, so one
  graph re-lays any axis to any size (negative pads crop): the capacity changes. Typed, not
  uint8: onnxruntime's CUDA Pad has float, double and float16 kernels only, and a uint8 Pad would
  run on the CPU provider, through the host.
"""

from __future__ import annotations

import argparse
from pathlib import Path

OPSET = 17
IR_VERSION = 8  # onnxruntime 1.14 and later read it
COPY_WIDTHS = (1, 4, 16, 64)
PAD_DTYPES = ("float32", "float16")
OUT_DIR = Path(__file__).resolve().parent.parent / "runtime" / "decoding" / "edit_graphs"


def _model(graph: object) -> bytes:
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="aggdec.export.edit_graphs", ir_version=IR_VERSION)
    return model.SerializeToString(deterministic=True)


def copy_graph(width: int) -> bytes:
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.UINT8, [f"n{i}"]) for i in range(width)]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.UINT8, [f"n{i}"]) for i in range(width)]
    nodes = [helper.make_node("Identity", [f"x{i}"], [f"y{i}"], name=f"copy{i}") for i in range(width)]
    return _model(helper.make_graph(nodes, f"copy_{width}", inputs, outputs))


def pad_graph(dtype: str) -> bytes:
    from onnx import TensorProto, helper

    element = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    x = helper.make_tensor_value_info("x", element, ["a", "b", "c", "d"])
    pads = helper.make_tensor_value_info("pads", TensorProto.INT64, [8])
    y = helper.make_tensor_value_info("y", element, ["p", "q", "r", "s"])
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant", name="pad")
    return _model(helper.make_graph([node], f"pad_{dtype}", [x, pads], [y]))


def graphs() -> dict[str, bytes]:
    """File name -> bytes of every edit graph."""
    made = {f"copy_{width}.onnx": copy_graph(width) for width in COPY_WIDTHS}
    made.update({f"pad_{dtype}.onnx": pad_graph(dtype) for dtype in PAD_DTYPES})
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in graphs().items():
        (args.out / name).write_bytes(data)
        print(f"{args.out / name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
