"""Why decision 045 finds the union with a mask, not onnxruntime's Unique: both timed on the ids
of a 40-row call (each row's real lexical shortlist, -1 padded, as union_micro.py builds them),
one thread, thread CPU time, 100 calls. The mask is the union head's: ScatterElements into a
vocabulary of zeros, NonZero for the union, CumSum minus 1 for each id's column.

    python unique_cost.py BUNDLE DATA      # BUNDLE: `aggdec export` of enpt-1693087644
"""
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP, helper, numpy_helper
from tokenizers import Tokenizer

BUNDLE, DATA = sys.argv[1], sys.argv[2]
V, ROWS = 32000, 40
table = np.load(f"{BUNDLE}/shortlist.npz")
offsets, targets = table["offsets"], table["targets"]
tokenizer = Tokenizer.from_file(f"{BUNDLE}/tokenizer.json")
lines = [line.strip() for line in open(DATA, encoding="utf-8")]
lists = []
for row in range(ROWS):
    allowed = set(range(50))
    for token in tokenizer.encode(lines[row * 7 % len(lines)]).ids + [0]:
        allowed.update(targets[offsets[token]:offsets[token + 1]].tolist())
    lists.append(np.array(sorted(allowed), np.int64))
ids = np.full((ROWS, max(map(len, lists))), -1, np.int64)
for row, allowed in enumerate(lists):
    ids[row, :len(allowed)] = allowed
flat = ids.reshape(-1)


def session(nodes, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.INT64, [None])],
                              [helper.make_tensor_value_info(o, TP.INT64, None) for o in outputs], list(initializers))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


unique = session([helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], sorted=0)], ["y", "inverse"])
mask = session([
    helper.make_node("Shape", ["x"], ["n"]),
    helper.make_node("ConstantOfShape", ["n"], ["ones"], value=numpy_helper.from_array(np.array([1], np.int64))),
    helper.make_node("ConstantOfShape", ["v"], ["zeros"], value=numpy_helper.from_array(np.array([0], np.int64))),
    helper.make_node("ScatterElements", ["zeros", "x", "ones"], ["marks"]),
    helper.make_node("NonZero", ["marks"], ["union"]),
    helper.make_node("CumSum", ["marks", "axis"], ["places"]),
    helper.make_node("Sub", ["places", "one"], ["column_of"]),
    helper.make_node("Gather", ["column_of", "x"], ["columns"]),
], ["union", "columns"], [numpy_helper.from_array(np.array([V], np.int64), "v"),
                          numpy_helper.from_array(np.array(0, np.int64), "axis"),
                          numpy_helper.from_array(np.array(1, np.int64), "one")])
(y, inverse), (union, columns) = unique.run(None, {"x": flat}), mask.run(None, {"x": flat})
assert np.array_equal(np.sort(y % V), union[0]) and np.array_equal(union[0][columns], flat % V)
for name, s in (("Unique", unique), ("mask", mask)) * 2:
    for _ in range(10):
        s.run(None, {"x": flat})
    started = time.thread_time()
    for _ in range(100):
        s.run(None, {"x": flat})
    print(f"{name}: {(time.thread_time() - started) * 10:.3f} ms a call, {flat.size} ids, union of {len(y)}")
