"""Scratch (issue31-amx-cpu): onnxruntime's MatMulInteger (u8 x s8) against fp32 MatMul, one
thread, for a verifier's product shapes at 1, 16 and 256 rows (random values; speed only)."""
import numpy as np, onnxruntime as ort, time, onnx
from onnx import helper, TensorProto, numpy_helper
def graph(kind, M, K, N):
    rng = np.random.default_rng(0)
    if kind == "f32":
        W = numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "W")
        n = helper.make_node("MatMul", ["A", "W"], ["Y"])
        g = helper.make_graph([n], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, N])], [W])
    else:
        W = numpy_helper.from_array(rng.integers(-63, 64, (K, N)).astype(np.int8), "W")
        n = helper.make_node("MatMulInteger", ["A", "W"], ["Y"])
        g = helper.make_graph([n], "g", [helper.make_tensor_value_info("A", TensorProto.UINT8, [None, K])],
                              [helper.make_tensor_value_info("Y", TensorProto.INT32, [None, N])], [W])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions(); so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
for M in (1, 16, 256):
    for K, N in ((256, 8256), (256, 1024), (1024, 256)):
        res = {}
        for kind in ("f32", "u8"):
            s = graph(kind, M, K, N)
            A = (np.random.rand(M, K).astype(np.float32) if kind == "f32" else np.random.randint(0, 255, (M, K)).astype(np.uint8))
            for _ in range(5): s.run(None, {"A": A})
            n = max(20, int(2e8 / (M * K * N)))
            t = time.perf_counter()
            for _ in range(n): s.run(None, {"A": A})
            res[kind] = (time.perf_counter() - t) / n
        print(f"M={M} K={K} N={N}: f32 {res['f32']*1e6:.0f} us, u8s8 {res['u8']*1e6:.0f} us, f32/int8 {res['f32']/res['u8']:.2f}x, int8 GMAC/s {M*K*N/res['u8']/1e9:.0f}")
