"""Whether a weight product over gathered columns gives the full product's bits (onnxruntime MatMul with
the weights as an input, as a Gather of the constant, one row at a time, and numpy multiply+sum)."""
import numpy as np, onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper
rng = np.random.default_rng(1)
K, N = 256, 8256
W = rng.standard_normal((K, N)).astype(np.float32) * 0.05
def sess(nodes, inputs, outputs, inits, cfg={}):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    o = ort.SessionOptions(); o.intra_op_num_threads = 1
    for k, v in cfg.items(): o.add_session_config_entry(k, v)
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])
f = TensorProto.FLOAT
full = sess([helper.make_node("MatMul", ["x", "W"], ["y"])], [helper.make_tensor_value_info("x", f, ["M", K])],
            [helper.make_tensor_value_info("y", f, ["M", N])], [numpy_helper.from_array(W, "W")])
dyn = sess([helper.make_node("MatMul", ["x", "B"], ["y"])], [helper.make_tensor_value_info("x", f, ["M", K]),
            helper.make_tensor_value_info("B", f, [K, "C"])], [helper.make_tensor_value_info("y", f, ["M", "C"])], [])
# gathered columns as Gather on the constant, then MatMul
gat = sess([helper.make_node("Gather", ["W", "idx"], ["B"], axis=1), helper.make_node("MatMul", ["x", "B"], ["y"])],
           [helper.make_tensor_value_info("x", f, ["M", K]), helper.make_tensor_value_info("idx", TensorProto.INT64, ["C"])],
           [helper.make_tensor_value_info("y", f, ["M", "C"])], [numpy_helper.from_array(W, "W")])
bad = 0; tot = 0
for trial in range(200):
    M = int(rng.integers(1, 40))
    x = (rng.standard_normal((M, K)) * 3).astype(np.float32)
    y = full.run(None, {"x": x})[0]
    C = int(rng.integers(1, 60))
    idx = np.sort(rng.choice(N, C, replace=False)).astype(np.int64)
    for name, out in [("dyn", dyn.run(None, {"x": x, "B": np.ascontiguousarray(W[:, idx])})[0]),
                      ("gat", gat.run(None, {"x": x, "idx": idx})[0]),
                      ("dyn1", np.concatenate([dyn.run(None, {"x": x[i:i+1], "B": np.ascontiguousarray(W[:, idx])})[0] for i in range(M)])),
                      ("np", np.stack([(x[i][None, :] * W[:, idx].T).sum(-1) for i in range(M)]))]:
        d = np.count_nonzero(out != y[:, idx]); tot += out.size
        if d: bad += 1; print(trial, name, M, C, d, "of", out.size, float(np.abs(out - y[:, idx]).max()))
print("trials with differences:", bad)
