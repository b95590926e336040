"""export/table_lookups.py: a Gather of single values from a rank-1 constant table by run-time
indices becomes a GatherElements on the flattened indices, with the same values (negative
indices, a subgraph, any index shape); every other Gather is left as it was."""

from __future__ import annotations

import numpy as np
import pytest

from aggdec.export.shape_folding import graphs_within
from aggdec.export.table_lookups import table_lookups_as_gather_elements

VOCAB = 50


def _model():
    """Lookups in a [VOCAB] table by ``ids`` [B, K], at the top level and inside an If; a row
    lookup in a [VOCAB, 3] table, a Gather of a Shape by a constant index and a lookup by a
    constant index, which must stay Gathers."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal(VOCAB).astype(np.float32), "table")
    ids_table = numpy_helper.from_array(rng.integers(0, 1000, VOCAB).astype(np.int64), "ids_table")
    rows = numpy_helper.from_array(rng.standard_normal((VOCAB, 3)).astype(np.float32), "rows")
    n = helper.make_node
    branch = helper.make_graph(
        [n("Gather", ["ids_table", "ids"], ["in_branch"], name="BranchLookup")], "branch", [],
        [helper.make_tensor_value_info("in_branch", TensorProto.INT64, None)])
    other = helper.make_graph(
        [n("Identity", ["ids"], ["not_looked_up"])], "other", [],
        [helper.make_tensor_value_info("not_looked_up", TensorProto.INT64, None)])
    nodes = [
        n("Constant", [], ["one"], value=numpy_helper.from_array(np.array(1, np.int64), "one")),
        n("Gather", ["table", "ids"], ["values"], name="Lookup"),
        n("Gather", ["rows", "ids"], ["row_values"], name="RowLookup"),
        n("Shape", ["ids"], ["shape"]),
        n("Gather", ["shape", "one"], ["dim"], name="ShapeDim"),  # a constant index: left alone
        n("Gather", ["table", "one"], ["fixed"], name="FixedLookup"),
        n("If", ["flag"], ["branched"], then_branch=branch, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes, "lookups",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "k"]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(name, t, dims) for name, t, dims in (
            ("values", TensorProto.FLOAT, ["b", "k"]), ("row_values", TensorProto.FLOAT, ["b", "k", 3]),
            ("dim", TensorProto.INT64, []), ("fixed", TensorProto.FLOAT, []),
            ("branched", TensorProto.INT64, ["b", "k"]))],
        [table, ids_table, rows])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, ids: np.ndarray, flag: bool) -> list[np.ndarray]:
    from aggdec.runtime.session import ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"ids": ids, "flag": np.array(flag)})


def _op_types(graph) -> list[str]:
    return [node.op_type for g in graphs_within(graph) for node in g.node]


@pytest.mark.parametrize("shape", [(3, 7), (1, 1), (4, 0), (2, 3)])
def test_lookups_become_gather_elements_with_the_same_values(shape):
    import onnx

    original = _model()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(original)
    assert table_lookups_as_gather_elements(rewritten) == 2  # the top-level lookup and the branch's
    onnx.checker.check_model(rewritten)
    assert _op_types(rewritten.graph).count("GatherElements") == 2
    assert _op_types(rewritten.graph).count("Gather") == 3  # rows, the Shape's dim, the constant index
    assert table_lookups_as_gather_elements(rewritten) == 0  # nothing left to rewrite

    rng = np.random.default_rng(sum(shape))
    ids = rng.integers(-VOCAB, VOCAB, shape).astype(np.int64)  # negative ids count from the end, as in Gather
    for flag in (True, False):
        before, after = _run(original, ids, flag), _run(rewritten, ids, flag)
        for expected, got in zip(before, after, strict=True):
            assert expected.dtype == got.dtype and expected.shape == got.shape
            np.testing.assert_array_equal(got, expected)


def test_an_index_outside_the_table_is_still_an_error():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from aggdec.runtime.session import ort

    table = numpy_helper.from_array(np.arange(VOCAB, dtype=np.float32), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["values"])], "lookup",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "k"])],
                              [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["b", "k"])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert table_lookups_as_gather_elements(model) == 1
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"ids": np.array([[3, -1]], np.int64)})[0], [[3, VOCAB - 1]])
    for wrong in (VOCAB, -VOCAB - 1):
        with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="Out of range value in index"):
            session.run(None, {"ids": np.array([[0, wrong]], np.int64)})
