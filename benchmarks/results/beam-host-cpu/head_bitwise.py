"""Is a top-k head's "logit minus logsumexp" bitwise onnxruntime's LogSoftmax?

One graph computes, over random [4, 8256] float32 logits (the reference model's vocabulary,
4 beam rows), LogSoftmax, x - ReduceLogSumExp(x), and (x - max) - log(sum(exp(x - max))) from
separate ONNX ops, on onnxruntime's CPU provider with 1 thread, and counts the elements where
each differs from LogSoftmax. Any difference rules the rewrite out: a beam head computed from
the top-2N logits and a logsumexp would move scores against transformers and against the
bundles already exported (decision 037).

    python benchmarks/results/beam-host-cpu/head_bitwise.py
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def main() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8256])
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("a", "b", "c")]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
    nodes = [helper.make_node("LogSoftmax", ["x"], ["a"], axis=-1),
             helper.make_node("ReduceLogSumExp", ["x", "axes"], ["lse"], keepdims=1),
             helper.make_node("Sub", ["x", "lse"], ["b"]),
             helper.make_node("ReduceMax", ["x", "axes"], ["mx"], keepdims=1),
             helper.make_node("Sub", ["x", "mx"], ["xm"]),
             helper.make_node("Exp", ["xm"], ["e"]),
             helper.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=1),
             helper.make_node("Log", ["s"], ["ls"]),
             helper.make_node("Sub", ["xm", "ls"], ["c"])]
    model = helper.make_model(helper.make_graph(nodes, "head", [x], outputs, initializer=[axes]),
                              opset_imports=[helper.make_opsetid("", 18)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    total = differ_lse = differ_parts = 0
    worst = [0.0, 0.0]
    for _ in range(50):
        logits = (rng.standard_normal((4, 8256)) * 4).astype(np.float32)
        reference, lse, parts = session.run(None, {"x": logits})
        total += reference.size
        differ_lse += int((reference != lse).sum())
        differ_parts += int((reference != parts).sum())
        worst = [max(worst[0], float(np.abs(reference - lse).max())),
                 max(worst[1], float(np.abs(reference - parts).max()))]
    print(json.dumps({"onnxruntime": ort.__version__, "elements": total,
                      "x_minus_reducelogsumexp_differs": differ_lse, "max_minus_log_sum_exp_differs": differ_parts,
                      "max_abs_difference": worst}, indent=1))


if __name__ == "__main__":
    main()
