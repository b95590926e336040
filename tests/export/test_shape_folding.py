"""export/shape_folding.py: traced reshapes made constant only where ONNX's 0 (copy the dim)
and -1 (what is left) mean the same numbers, with the same outputs at every shape."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from aggdec.export.shape_folding import constant_reshapes

HEADS, HEAD_DIM = 4, 8


class _Heads(torch.nn.Module):
    """A split into heads, a transpose, and a merge back: the verifier's reshapes."""

    def forward(self, x: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length = x.shape[0], x.shape[1]
        split = x.reshape(batch, length, HEADS, HEAD_DIM).transpose(1, 2) * 2.0  # [B, H, T, Dh]
        b, h, t, d = split.shape
        merged = split.transpose(1, 2).reshape(b, t, h * d)
        # sizes taken from another input, with a -1 already there: not provably the same
        mixed = merged.reshape(other.shape[0], -1)
        return merged, mixed


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    import onnx

    path = tmp_path_factory.mktemp("fold") / "heads.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Heads(), (torch.randn(2, 3, HEADS * HEAD_DIM), torch.randn(2, 5)), str(path),
                          input_names=["x", "other"], output_names=["merged", "mixed"], opset_version=17,
                          dynamic_axes={"x": {0: "b", 1: "t"}, "other": {0: "b2", 1: "o"},
                                        "merged": {0: "b", 1: "t"}, "mixed": {0: "b2", 1: "m"}}, dynamo=False)
    return onnx.load(str(path))


def test_reshapes_become_constant_only_where_provable_and_compute_the_same(traced):
    from onnx import numpy_helper

    from aggdec.runtime.session import ort

    folded = type(traced)()
    folded.CopyFrom(traced)
    before = len(folded.graph.node)
    assert constant_reshapes(folded) == 2  # the split and the merge; not the reshape by other's size
    assert len(folded.graph.node) < before  # the shape arithmetic that fed them is gone
    # as Constant nodes, so that a graph saved with external data keeps them inline
    constants = {node.output[0]: numpy_helper.to_array(node.attribute[0].t) for node in folded.graph.node
                 if node.op_type == "Constant"}
    shapes = sorted(constants[node.input[1]].tolist() for node in folded.graph.node
                    if node.op_type == "Reshape" and node.input[1] in constants)
    assert [0, 0, HEADS, HEAD_DIM] in shapes and [0, 0, -1] in shapes, shapes
    sessions = [ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
                for model in (traced, folded)]
    rng = np.random.default_rng(0)
    for batch, length in ((1, 1), (3, 7), (5, 2)):
        feeds = {"x": rng.standard_normal((batch, length, HEADS * HEAD_DIM)).astype(np.float32),
                 "other": np.zeros((batch, 5), np.float32)}
        original, rewritten = (session.run(None, feeds) for session in sessions)
        for a, b in zip(original, rewritten):
            assert a.shape == b.shape and np.array_equal(a, b), (batch, length)
