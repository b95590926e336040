"""Scratch (issue31-amx-cpu): the int8 vocabulary head alone, one thread, three ways: as
`aggdec quantize` wrote it (MatMulInteger, Cast, row and column Muls, the bias Add, the
same-type Cast before the output), without that last Cast, and as MatMulIntegerToFloat (column
scales in the kernel) then the row Mul (random values; speed only)."""
import numpy as np, onnxruntime as ort, time
from onnx import helper, TensorProto as TP, numpy_helper as nh
K, V = 256, 8256
rng = np.random.default_rng(0)
W = nh.from_array(rng.integers(-63, 64, (K, V)).astype(np.int8), "W")
cs = nh.from_array((rng.random(V).astype(np.float32) * 1e-3), "cs")
b = nh.from_array(np.zeros((1, V), np.float32), "b")
zp = nh.from_array(np.array(128, np.uint8), "zp")
one = nh.from_array(np.array(1.0, np.float32), "one")
def sess(variant):
    ins = [helper.make_tensor_value_info("A", TP.UINT8, [None, K]), helper.make_tensor_value_info("rs", TP.FLOAT, [None, 1])]
    if variant == "current":
        nodes = [helper.make_node("MatMulInteger", ["A", "W", "zp"], ["S"]), helper.make_node("Cast", ["S"], ["F"], to=1),
                 helper.make_node("Mul", ["F", "rs"], ["R"]), helper.make_node("Mul", ["R", "cs"], ["C"]),
                 helper.make_node("Add", ["C", "b"], ["L"]), helper.make_node("Cast", ["L"], ["Y"], to=1)]
    elif variant == "no-copy":
        nodes = [helper.make_node("MatMulInteger", ["A", "W", "zp"], ["S"]), helper.make_node("Cast", ["S"], ["F"], to=1),
                 helper.make_node("Mul", ["F", "rs"], ["R"]), helper.make_node("Mul", ["R", "cs"], ["C"]),
                 helper.make_node("Add", ["C", "b"], ["Y"])]
    elif variant == "fused":
        nodes = [helper.make_node("MatMulIntegerToFloat", ["A", "W", "one", "cs", "zp", "", "b1"], ["F"], domain="com.microsoft"),
                 helper.make_node("Mul", ["F", "rs"], ["Y"])]
    inits = [W, cs, b, zp, one, nh.from_array(np.zeros(V, np.float32), "b1")]
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("Y", TP.FLOAT, [None, V])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions(); so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
for N in (1, 18, 280):
    A = rng.integers(1, 256, (N, K)).astype(np.uint8); rs = rng.random((N, 1)).astype(np.float32)
    ss = {v: sess(v) for v in ("current", "no-copy", "fused")}
    t = {v: 0.0 for v in ss}
    reps = max(30, 6000 // N)
    for r in range(3):
        for v, s in ss.items():
            for _ in range(3): s.run(None, {"A": A, "rs": rs})
            t0 = time.perf_counter()
            for _ in range(reps): s.run(None, {"A": A, "rs": rs})
            t[v] += time.perf_counter() - t0
    print(N, {v: f"{t[v]/reps/3*1e6:.0f}us" for v in t})
