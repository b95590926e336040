"""Would fused operators make aggdec's CPU graphs faster? Three measurements on onnxruntime's
CPU provider, 1 thread, each variant a small ONNX graph of the reference model's shapes
(d_model 256, vocabulary 8000), alternated call by call, medians of ``--runs`` calls:

1. **Dispatch**: a chain of 200 trivial nodes (Unsqueeze/Squeeze) against 2: what a node costs
   the executor, i.e. what removing graph nodes (shape plumbing, the per-position attention
   rewrite) can save at most.
2. **Projections sharing an input** (q, k, v; or q, k, v, o-sized): separate MatMuls against
   one MatMul over the concatenated weights followed by a Split, fp32 and int8
   (MatMulInteger), at T = 1, 13, 30, 60 rows; with a check that the two agree bitwise.
3. **The int8 chain** of ``export/quantize.py`` (per-row scale, Div, Round, Add, Cast;
   MatMulInteger, Cast, two Muls) against onnxruntime's fused operators doing the same per-row
   arithmetic (one per-axis QuantizeLinear over the rows; MatMulIntegerToFloat with the column
   scales, then the row scale), for the FFN (N = 1024) and the vocabulary head (N = 8000), with
   a check that each keeps positions independent.

4. With ``--bundle BUNDLE``: what onnxruntime's graph optimization adds to loading the bundle's
   graphs (sessions created at each optimization level, medians of 5), i.e. what saving the
   optimized graphs could save at start-up, against the whole ``Generator(BUNDLE)``.

    python benchmarks/cpu_fusion.py [--runs 400] [--bundle BUNDLE]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

D = 256


def _model(nodes, inputs, outputs, inits, opset: int = 18):
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def _session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _medians(sessions: dict, feeds: dict, runs: int) -> dict[str, float]:
    """Median microseconds per call of each session, alternated call by call."""
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(runs):
        for name, session in sessions.items():
            started = time.perf_counter()
            session.run(None, feeds)
            times[name].append(time.perf_counter() - started)
    return {name: float(np.median(values)) * 1e6 for name, values in times.items()}


def dispatch(runs: int) -> None:
    from onnx import TensorProto, helper, numpy_helper

    def chain(pairs: int):
        nodes, previous = [], "x"
        for index in range(pairs):
            nodes += [helper.make_node("Unsqueeze", [previous, "axis"], [f"u{index}"]),
                      helper.make_node("Squeeze", [f"u{index}", "axis"], [f"s{index}"])]
            previous = f"s{index}"
        nodes.append(helper.make_node("Identity", [previous], ["y"]))
        return _session(_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", D])],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["t", D])],
                               [numpy_helper.from_array(np.array([0], np.int64), "axis")]))

    medians = _medians({"3 nodes": chain(1), "201 nodes": chain(100)}, {"x": np.ones((1, D), np.float32)}, runs)
    per_node = (medians["201 nodes"] - medians["3 nodes"]) / 198
    print(f"1. dispatch: 3 nodes {medians['3 nodes']:.1f} us, 201 nodes {medians['201 nodes']:.1f} us: "
          f"{per_node:.2f} us per node")


def shared_input(runs: int) -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    print("2. projections sharing an input: separate MatMuls against one over concatenated weights + Split")
    for int8 in (False, True):
        for count in (3, 4):
            if int8:
                weights = [rng.integers(-64, 65, size=(D, D)).astype(np.int8) for _ in range(count)]
            else:
                weights = [(rng.standard_normal((D, D)) * 0.05).astype(np.float32) for _ in range(count)]
            outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(count)]
            x = helper.make_tensor_value_info("x", TensorProto.UINT8 if int8 else TensorProto.FLOAT, ["b", "t", D])
            zero = [numpy_helper.from_array(np.array(128, np.uint8), "zp")] if int8 else []

            def product(weight: str, out: str) -> list:
                if not int8:
                    return [helper.make_node("MatMul", ["x", weight], [out])]
                return [helper.make_node("MatMulInteger", ["x", weight, "zp"], [f"{out}_i"]),
                        helper.make_node("Cast", [f"{out}_i"], [out], to=TensorProto.FLOAT)]

            separate = sum((product(f"w{i}", f"y{i}") for i in range(count)), [])
            fused = product("w", "z") + [helper.make_node("Split", ["z", "sizes"], [f"y{i}" for i in range(count)],
                                                          axis=-1)]
            sessions = {
                "separate": _session(_model(separate, [x], outputs, zero + [numpy_helper.from_array(w, f"w{i}")
                                                                           for i, w in enumerate(weights)])),
                "fused": _session(_model(fused, [x], outputs, zero + [
                    numpy_helper.from_array(np.concatenate(weights, 1), "w"),
                    numpy_helper.from_array(np.array([D] * count, np.int64), "sizes")])),
            }
            for rows in (1, 13, 30, 60):
                if int8:
                    feed = rng.integers(1, 256, (1, rows, D)).astype(np.uint8)
                else:
                    feed = rng.standard_normal((1, rows, D)).astype(np.float32)
                results = [session.run(None, {"x": feed}) for session in sessions.values()]
                same = all(np.array_equal(a, b) for a, b in zip(*results))
                medians = _medians(sessions, {"x": feed}, runs)
                print(f"   {'int8' if int8 else 'fp32'} x{count} T={rows:2d}: separate {medians['separate']:6.1f} us, "
                      f"fused {medians['fused']:6.1f} us ({medians['separate'] / medians['fused']:.2f}x); "
                      f"bitwise equal: {same}")


def int8_chain(runs: int) -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    print("3. per-row int8: aggdec's chain against QuantizeLinear (per row) + MatMulIntegerToFloat")
    for columns in (1024, 8000):
        inits = [numpy_helper.from_array(rng.integers(-64, 65, size=(D, columns)).astype(np.int8), "w"),
                 numpy_helper.from_array(((rng.random(columns) + 0.5) * 1e-3).astype(np.float32), "column_scale"),
                 numpy_helper.from_array(np.array(127, np.float32), "qmax"),
                 numpy_helper.from_array(np.array(np.finfo(np.float32).tiny, np.float32), "tiny"),
                 numpy_helper.from_array(np.array(128, np.uint8), "zp"),
                 numpy_helper.from_array(np.array(128, np.float32), "zp_float"),
                 numpy_helper.from_array(np.array([-1], np.int64), "last"),
                 numpy_helper.from_array(np.array([-1, D], np.int64), "rows_by_d"),
                 numpy_helper.from_array(np.array(1.0, np.float32), "one")]
        scale = [helper.make_node("Abs", ["x"], ["abs"]),
                 helper.make_node("ReduceMax", ["abs", "last"], ["absmax"], keepdims=1),
                 helper.make_node("Div", ["absmax", "qmax"], ["raw_scale"]),
                 helper.make_node("Max", ["raw_scale", "tiny"], ["scale"])]
        ours = scale + [
            helper.make_node("Div", ["x", "scale"], ["scaled"]), helper.make_node("Round", ["scaled"], ["rounded"]),
            helper.make_node("Add", ["rounded", "zp_float"], ["shifted"]),
            helper.make_node("Cast", ["shifted"], ["q"], to=TensorProto.UINT8),
            helper.make_node("MatMulInteger", ["q", "w", "zp"], ["acc"]),
            helper.make_node("Cast", ["acc"], ["as_float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["as_float", "scale"], ["by_row"]),
            helper.make_node("Mul", ["by_row", "column_scale"], ["y"])]
        fused = scale + [
            helper.make_node("Reshape", ["scale", "last"], ["row_scales"]),
            helper.make_node("Shape", ["row_scales"], ["row_count"]),
            helper.make_node("ConstantOfShape", ["row_count"], ["row_zero_points"],
                             value=helper.make_tensor("v", TensorProto.UINT8, [1], [128])),
            helper.make_node("Shape", ["x"], ["x_shape"]), helper.make_node("Reshape", ["x", "rows_by_d"], ["x_rows"]),
            helper.make_node("QuantizeLinear", ["x_rows", "row_scales", "row_zero_points"], ["q_rows"], axis=0),
            helper.make_node("Reshape", ["q_rows", "x_shape"], ["q"]),
            helper.make_node("MatMulIntegerToFloat", ["q", "w", "one", "column_scale", "zp"], ["unscaled"],
                             domain="com.microsoft"),
            helper.make_node("Mul", ["unscaled", "scale"], ["y"])]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", D])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        sessions = {"aggdec chain": _session(_model(ours, [x], [y], inits)),
                    "fused ops": _session(_model(fused, [x], [y], inits))}
        for rows in (1, 13, 32):
            feed = rng.standard_normal((1, rows, D)).astype(np.float32)
            independent = all(np.array_equal(
                session.run(None, {"x": feed})[0],
                np.concatenate([session.run(None, {"x": feed[:, t : t + 1]})[0] for t in range(rows)], axis=1))
                for session in sessions.values())
            medians = _medians(sessions, {"x": feed}, runs)
            print(f"   N={columns} T={rows:2d}: aggdec chain {medians['aggdec chain']:6.1f} us, fused ops "
                  f"{medians['fused ops']:6.1f} us ({medians['aggdec chain'] / medians['fused ops']:.2f}x); "
                  f"positions independent in both: {independent}")


def load_time(bundle: str) -> None:
    import onnxruntime as ort

    from aggdec import Generator
    from aggdec.runtime.manifest import load_manifest

    manifest = load_manifest(bundle)
    files = [f"{bundle}/{spec.file}" for spec in manifest.graphs.values()]
    print(f"4. loading {len(files)} graphs of {bundle}, sessions at each optimization level (medians of 5)")
    for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"):
        times = []
        for _ in range(5):
            started = time.perf_counter()
            for path in files:
                options = ort.SessionOptions()
                options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
                options.intra_op_num_threads = 1
                options.log_severity_level = 3
                ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            times.append(time.perf_counter() - started)
        print(f"   {level:20s} {np.median(times):.3f} s")
    times = []
    for _ in range(5):
        started = time.perf_counter()
        Generator(bundle, threads=1)
        times.append(time.perf_counter() - started)
    print(f"   Generator(BUNDLE) (manifest and hashes checked, tokenizer, sessions): {np.median(times):.3f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--bundle", help="also time loading this bundle's graphs at each optimization level")
    args = parser.parse_args(argv)
    dispatch(args.runs)
    shared_input(args.runs)
    int8_chain(args.runs)
    if args.bundle:
        load_time(args.bundle)


if __name__ == "__main__":
    main()
