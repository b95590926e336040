"""One weight product at one row (x[1,K] @ W[K,N]), onnxruntime MatMul/Gemm with and without prepacking, and numpy:
GB/s of weights read. Run with OPENBLAS_NUM_THREADS=1 (numpy's BLAS is multithreaded by default)."""
import numpy as np, onnx, onnxruntime as ort, time
from onnx import helper, TensorProto, numpy_helper
K, N = 256, 8256
import sys
K = int(sys.argv[1]); N = int(sys.argv[2]); M = int(sys.argv[3]) if len(sys.argv) > 3 else 1
rng = np.random.default_rng(0)
W = rng.standard_normal((K, N)).astype(np.float32)
def model(transB=False):
    if transB:
        node = helper.make_node("Gemm", ["x", "W"], ["y"], transB=1)
        init = numpy_helper.from_array(np.ascontiguousarray(W.T), "W")
    else:
        node = helper.make_node("MatMul", ["x", "W"], ["y"])
        init = numpy_helper.from_array(W, "W")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])], [init])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
x = rng.standard_normal((M, K)).astype(np.float32)
def sess(m, cfg={}):
    o = ort.SessionOptions(); o.intra_op_num_threads = 1
    for k, v in cfg.items(): o.add_session_config_entry(k, v)
    return ort.InferenceSession(m, o, providers=["CPUExecutionProvider"])
cases = {"matmul packed": sess(model()), "matmul nopack": sess(model(), {"session.disable_prepacking": "1"}),
         "gemm transB packed": sess(model(True)), "gemm transB nopack": sess(model(True), {"session.disable_prepacking": "1"})}
WT = np.ascontiguousarray(W.T)
for r in range(3):
    for name, s in cases.items():
        for _ in range(50): s.run(None, {"x": x})
        t = time.perf_counter()
        for _ in range(500): s.run(None, {"x": x})
        dt = (time.perf_counter() - t) / 500
        print(f"{name:22s} {dt*1e6:8.1f} us  {K*N*4/dt/1e9:6.1f} GB/s")
    t = time.perf_counter()
    for _ in range(500): x @ W
    dt = (time.perf_counter() - t) / 500
    print(f"{'numpy x@W':22s} {dt*1e6:8.1f} us  {K*N*4/dt/1e9:6.1f} GB/s")
    t = time.perf_counter()
    for _ in range(500): WT @ x[0]
    dt = (time.perf_counter() - t) / 500
    print(f"{'numpy WT@x':22s} {dt*1e6:8.1f} us  {K*N*4/dt/1e9:6.1f} GB/s")
