"""The isolation rewrite's self-attention scores (export/positions.py, decision 036): Q.K^T on a
Transpose of the key buffer becomes K.q^T per position on the buffer as it is, a block equals
its positions alone bitwise, and a graph rewritten before (a bundle exported before) is left
as it is, so quantizing an old bundle keeps its products.

The exported verifiers of every family are checked in tests/export/test_export.py; here a
one-layer score graph of known shape, so that the rewrite's edge cases are pinned cheaply."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from aggdec.export.positions import ISOLATE_COLUMNS, ISOLATE_ROWS, isolate_positions  # noqa: E402
from aggdec.runtime.session import ort  # noqa: E402

HEADS, HEAD_DIM = 2, 8


def scores_graph(keys: str = "self_key_out.0"):
    """scores = q . Transpose(keys) as traced: the key written by the call (a graph output) and
    its K^T as the product's right operand."""
    nodes = [
        helper.make_node("Identity", ["self_key.0"], [keys], name="/Write"),
        helper.make_node("Transpose", [keys], ["keys_t"], perm=[0, 1, 3, 2], name="/Transpose_3"),
        helper.make_node("MatMul", ["q", "keys_t"], ["scores"], name="/MatMul"),
    ]
    value = lambda name, dims: helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)  # noqa: E731
    graph = helper.make_graph(
        nodes, "scores",
        [value("q", ["rows", HEADS, "new", HEAD_DIM]), value("self_key.0", ["rows", HEADS, "capacity", HEAD_DIM])],
        [value("scores", ["rows", HEADS, "new", "capacity"]), value(keys, ["rows", HEADS, "capacity", HEAD_DIM])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model, q, keys):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(["scores"], {"q": q, "self_key.0": keys})[0]


def test_self_key_scores_read_the_buffer_as_it_is_and_a_block_equals_its_positions():
    model = scores_graph()
    plain = onnx.ModelProto.FromString(model.SerializeToString())
    assert isolate_positions(model)[1] == 1
    nodes = {node.name: node for node in model.graph.node}
    assert not any(node.op_type == "Transpose" for node in nodes.values())  # no K^T left
    column = next(node for node in nodes.values() if ISOLATE_COLUMNS in node.name)
    assert column.input == ["q", column.input[1]]
    assert isolate_positions(model)[1] == 0  # idempotent: quantizing applies it again

    rng = np.random.default_rng(0)
    for rows, new, capacity in ((1, 1, 5), (1, 7, 16), (3, 33, 40)):
        q = rng.standard_normal((rows, HEADS, new, HEAD_DIM), dtype=np.float32)
        keys = rng.standard_normal((rows, HEADS, capacity, HEAD_DIM), dtype=np.float32)
        block = run(model, q, keys)
        np.testing.assert_allclose(block, run(plain, q, keys), rtol=1e-5, atol=1e-5)  # the same scores
        for t in range(new):  # bitwise, as the export's check requires
            assert np.array_equal(run(model, q[:, :, t : t + 1], keys)[:, :, 0], block[:, :, t])


def test_a_graph_rewritten_before_keeps_its_products():
    """A bundle exported before decision 036 has its score products isolated by rows, the K^T
    still in front of them: the rewrite leaves the graph byte for byte as it is."""
    model = scores_graph()
    product = next(node for node in model.graph.node if node.op_type == "MatMul")
    # the earlier rewrite's form: the query unsqueezed by an IsolateRows node
    model.graph.node.insert(2, helper.make_node("Unsqueeze", ["q", "axis"], ["q_rows"], name=f"/MatMul{ISOLATE_ROWS}"))
    model.graph.initializer.append(helper.make_tensor("axis", TensorProto.INT64, [1], [-2]))
    product.input[0] = "q_rows"
    before = model.SerializeToString()
    assert isolate_positions(model)[1] == 0
    assert model.SerializeToString() == before


def test_only_the_self_keys_are_read_by_column():
    """A Transpose of anything else (a cross key laid out as the values, in a bundle from before
    decision 031) is isolated by rows, as before."""
    model = scores_graph(keys="cross_key_copy.0")
    assert isolate_positions(model)[1] == 1
    assert any(node.op_type == "Transpose" for node in model.graph.node)
    assert any(ISOLATE_ROWS in node.name for node in model.graph.node)
    assert not any(ISOLATE_COLUMNS in node.name for node in model.graph.node)
