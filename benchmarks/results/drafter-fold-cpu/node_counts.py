"""Node counts of each graph of the bundles given: as exported, after onnxruntime's optimizations
(ORT_ENABLE_ALL, as runtime/session.py loads them), the same with onnxruntime's ReshapeFusion
disabled, and how many reshapes export/shape_folding.py could still make constant.

    python benchmarks/results/drafter-fold-cpu/node_counts.py OLD_BUNDLE NEW_BUNDLE
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort

from aggdec.export.shape_folding import constant_reshapes


def optimized_nodes(path: Path, disabled: list[str]) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        options.optimized_model_filepath = str(Path(scratch) / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
        return len(onnx.load(options.optimized_model_filepath).graph.node)


def main() -> None:
    print("| bundle | graph | nodes | after onnxruntime's optimizations | without its ReshapeFusion | still foldable |")
    print("|---|---|---|---|---|---|")
    for root in map(Path, sys.argv[1:]):
        for path in sorted(root.glob("*.onnx")):
            model = onnx.load(str(path))
            nodes = len(model.graph.node)
            print(f"| {root.name} | {path.name} | {nodes} | {optimized_nodes(path, [])} | "
                  f"{optimized_nodes(path, ['ReshapeFusion'])} | {constant_reshapes(model)} |")


if __name__ == "__main__":
    main()
