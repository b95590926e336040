"""The int8 shortlist head alone (decision 045): row by row (a Scan of Gather + MatMulInteger,
as `aggdec quantize` wrote it before) against the union of the call's rows' ids (one Gather,
one MatMulInteger, each row's sums picked), on uint8 rows of a random [32000, 256] matrix and
each row's real lexical shortlist (ids 0..49 and the 50 best targets of each source token, from
a Bergamot bundle's shortlist.npz and tokenizer), checked bitwise equal, timed in thread CPU
time (one thread, 50 calls, two rounds each).

    python union_micro.py BUNDLE DATA      # BUNDLE: `aggdec export` of enpt-1693087644
"""
import sys
import time, numpy as np, onnxruntime as ort
from onnx import helper, TensorProto as TP, numpy_helper
BUNDLE, DATA = sys.argv[1], sys.argv[2]
V, D = 32000, 256
rng = np.random.default_rng(0)
W = rng.integers(64, 193, (V, D)).astype(np.uint8)
init = [numpy_helper.from_array(W, "by_id"), numpy_helper.from_array(np.uint8(128), "zp"),
        numpy_helper.from_array(np.zeros(V, np.int64), "zeros_v"), numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
        numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "ax0"), numpy_helper.from_array(np.array([1], np.int64), "ax1")]
ins = [helper.make_tensor_value_info("ids", TP.INT64, ["B", "L"]), helper.make_tensor_value_info("cols", TP.INT8, ["B", D, "T"])]
out = [helper.make_tensor_value_info("out", TP.INT32, None)]
def scan_graph():
    body = helper.make_graph([helper.make_node("Gather", ["by_id", "rid"], ["m"]),
        helper.make_node("MatMulInteger", ["m", "rc", "zp"], ["rs"])], "body",
        [helper.make_tensor_value_info("rid", TP.INT64, None), helper.make_tensor_value_info("rc", TP.INT8, None)],
        [helper.make_tensor_value_info("rs", TP.INT32, None)])
    nodes = [helper.make_node("Scan", ["ids", "cols"], ["st"], body=body, num_scan_inputs=2),
             helper.make_node("Transpose", ["st"], ["out"], perm=[0, 2, 1])]
    return helper.make_graph(nodes, "scan", ins, out, init)
def union_graph():
    n = helper.make_node
    nodes = [n("Reshape", ["ids", "minus1"], ["flat"]),
        n("Shape", ["flat"], ["flat_shape"]), n("ConstantOfShape", ["flat_shape"], ["ones_f"], value=numpy_helper.from_array(np.array([1], np.int64))),
        n("ScatterElements", ["zeros_v", "flat", "ones_f"], ["mask"]),
        n("NonZero", ["mask"], ["nz"]), n("Squeeze", ["nz", "ax0"], ["union"]),
        n("CumSum", ["mask", "zero"], ["cum"]), n("Sub", ["cum", "one"], ["pos"]),
        n("Gather", ["pos", "ids"], ["rowcol"]),               # [B, L]
        n("Gather", ["by_id", "union"], ["um"]),                # [U, D]
        n("Transpose", ["cols"], ["colsT"], perm=[1, 0, 2]),    # [D, B, T]
        n("Shape", ["cols"], ["cs"]),
        n("Reshape", ["colsT", "dflat"], ["c2"]),              # [D, B*T]
        n("MatMulInteger", ["um", "c2", "zp"], ["S"]),          # [U, B*T]
        n("Reshape", ["S", "ubt"], ["S3"]),                     # [U, B, T]
        n("Transpose", ["S3"], ["S4"], perm=[1, 2, 0]),         # [B, T, U]
        n("Unsqueeze", ["rowcol", "ax1"], ["rc3"]),             # [B, 1, L]
        n("Shape", ["S4"], ["s4s"]), n("Slice", ["s4s", "ax0", "two"], ["bt"]), n("Shape", ["rowcol"], ["rcs"]), n("Slice", ["rcs", "ax1", "two"], ["lsh"]),
        n("Concat", ["bt", "lsh"], ["btl"], axis=0),
        n("Expand", ["rc3", "btl"], ["rcE"]),
        n("GatherElements", ["S4", "rcE"], ["out"], axis=2)]
    extra = [numpy_helper.from_array(np.array([D, -1], np.int64), "dflat"),
             numpy_helper.from_array(np.array([2], np.int64), "two")]
    # [U, B*T] -> [U, B, T], B and T read from the columns' shape
    nodes.insert(13, n("Slice", ["cs", "ax0", "ax1"], ["bdim"]))
    nodes.insert(14, n("Slice", ["cs", "two", "three"], ["tdim"]))
    nodes.insert(15, n("Concat", ["minus1", "bdim", "tdim"], ["ubt"], axis=0))
    extra.append(numpy_helper.from_array(np.array([3], np.int64), "three"))
    return helper.make_graph(nodes, "union", ins, out, init + extra)
def sess(g):
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    o = ort.SessionOptions(); o.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])
A, B_ = sess(scan_graph()), sess(union_graph())
sl = np.load(f"{BUNDLE}/shortlist.npz"); off, tg = sl["offsets"], sl["targets"]
from tokenizers import Tokenizer
tok = Tokenizer.from_file(f"{BUNDLE}/tokenizer.json")
lines = [l.strip() for l in open(DATA)]
def shortlist(k):
    toks = tok.encode(lines[k * 7 % len(lines)]).ids + [0]
    s = set(range(50))
    for t in toks: s.update(tg[off[t]:off[t+1]].tolist())
    return np.array(sorted(s), np.int64)
for B in (1, 2, 4, 6, 8, 12, 16, 40, 64):
    rows = [shortlist(i) for i in range(B)]; L = max(map(len, rows))
    ids = np.full((B, L), -1, np.int64)
    for i, r in enumerate(rows): ids[i, :len(r)] = r
    cols = rng.integers(-63, 64, (B, D, 1)).astype(np.int8)
    f = {"ids": ids, "cols": cols}
    a, b = A.run(None, f)[0], B_.run(None, f)[0]
    assert a.shape == b.shape and np.array_equal(a, b), (a.shape, b.shape)
    ts = {}
    for name, s in (("scan", A), ("union", B_), ("scan2", A), ("union2", B_)):
        for _ in range(5): s.run(None, f)
        t = time.thread_time()
        for _ in range(50): s.run(None, f)
        ts[name] = (time.thread_time() - t) / 50 * 1e3
    print(f"B{B} L{L}: " + " ".join(f"{k} {v:.3f}ms" for k, v in ts.items()))
