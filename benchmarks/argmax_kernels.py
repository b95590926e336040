"""What the argmax verifier graph's last node costs: onnxruntime's ArgMax over a block's logits
against TopK(k=1) and numpy's argmax of the same logits (CPU, one thread).

The argmax graph (decision 023) ends in ArgMax over [positions, vocabulary] float32 logits;
``benchmarks/profile_step.py`` found that node as costly as the int8 output projection feeding
it at batch 32. This times the three ways of taking each position's best id on random logits of
the same shape, checks that they choose the same ids (ties: the first, in all three), and
prints the medians.

    python benchmarks/argmax_kernels.py [--positions 8 80 320] [--vocab 8000] [--repeats 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np


def _session(op: str, vocab: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if op == "ArgMax":
        nodes, inits = [helper.make_node("ArgMax", ["logits"], ["ids"], axis=-1, keepdims=0)], []
    else:
        k = helper.make_tensor("k", TensorProto.INT64, [1], [1])
        axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
        nodes = [helper.make_node("TopK", ["logits", "k"], ["values", "top"], axis=-1),
                 helper.make_node("Squeeze", ["top", "axes"], ["ids"])]
        inits = [k, axes]
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", vocab])],
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, nargs="+", default=[8, 80, 320],
                        help="rows x block width per call (8: greedy at batch 8; 80: IAD at batch 8-32)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    sessions = {op: _session(op, args.vocab) for op in ("ArgMax", "TopK")}
    rng = np.random.default_rng(0)
    print(f"best id of each position over {args.vocab} float32 logits, CPU, 1 thread, median of {args.repeats}")
    print("| positions | onnxruntime ArgMax ms | onnxruntime TopK(k=1) ms | numpy argmax ms | ArgMax / numpy | same ids |")
    print("|---|---|---|---|---|---|")
    for positions in args.positions:
        logits = rng.standard_normal((positions, args.vocab), dtype=np.float32)
        logits[0, [11, 4000]] = logits[0].max() + 1.0  # a tie: every way must take the first
        ids = {op: session.run(None, {"logits": logits})[0] for op, session in sessions.items()}
        ids["numpy"] = logits.argmax(-1)
        same = all(np.array_equal(ids["numpy"], other) for other in ids.values()) and ids["numpy"][0] == 11
        ms = {op: _median_ms(lambda s=session: s.run(None, {"logits": logits}), args.repeats)
              for op, session in sessions.items()}
        ms["numpy"] = _median_ms(lambda: logits.argmax(-1), args.repeats)
        print(f"| {positions} | {ms['ArgMax']:.3f} | {ms['TopK']:.3f} | {ms['numpy']:.3f} | "
              f"{ms['ArgMax'] / ms['numpy']:.1f}x | {same} |")


if __name__ == "__main__":
    main()
