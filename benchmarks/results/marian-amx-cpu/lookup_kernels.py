"""One value per id looked up in a vocabulary-long table, as a Marian shortlist head does at
every call: [44 rows, K ids] int64 indices into a [32,000] float32 or int64 table, onnxruntime
(one thread) against numpy's take. Microseconds per call, mean of 400 after 20 warm-up calls.

    python lookup_kernels.py > lookup_kernels.txt
"""

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

VOCAB, ROWS = 32000, 44


def session(nodes, inputs, output, dtype):
    graph = helper.make_graph(nodes, "lookup", inputs, [helper.make_tensor_value_info(output, dtype, None)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def timed(run, calls=400):
    for _ in range(20):
        run()
    started = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - started) / calls * 1e6


def main():
    rng = np.random.default_rng(0)
    for dtype, np_type in ((TensorProto.FLOAT, np.float32), (TensorProto.INT64, np.int64)):
        table = rng.integers(0, 1000, VOCAB).astype(np_type)
        inputs = [helper.make_tensor_value_info("table", dtype, [VOCAB]),
                  helper.make_tensor_value_info("ids", TensorProto.INT64, [ROWS, None])]
        gather = session([helper.make_node("Gather", ["table", "ids"], ["out"])], inputs, "out", dtype)
        flat = helper.make_tensor("flat", TensorProto.INT64, [1], [-1])
        elements = session([helper.make_node("Constant", [], ["minus_one"], value=flat),
                            helper.make_node("Reshape", ["ids", "minus_one"], ["flat_ids"]),
                            helper.make_node("GatherElements", ["table", "flat_ids"], ["picked"], axis=0),
                            helper.make_node("Shape", ["ids"], ["shape"]),
                            helper.make_node("Reshape", ["picked", "shape"], ["out"], allowzero=1)],
                           inputs, "out", dtype)
        for k in (200, 1000):
            ids = rng.integers(0, VOCAB, (ROWS, k)).astype(np.int64)
            feeds = {"table": table, "ids": ids}
            assert np.array_equal(gather.run(None, feeds)[0], elements.run(None, feeds)[0])
            print(f"{np.dtype(np_type).name:8s} [{ROWS}, {k:4d}] ids: Gather {timed(lambda: gather.run(None, feeds)):6.1f} us, "
                  f"GatherElements on the flat ids {timed(lambda: elements.run(None, feeds)):6.1f} us, "
                  f"numpy take {timed(lambda: table.take(ids)):5.1f} us")


if __name__ == "__main__":
    main()
