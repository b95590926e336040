"""The verifier's most expensive nodes, by name (subgraphs included), in real decoding:
``benchmarks/profile_step.py``'s profile with every node of the graph asked for.

    python profile_nodes.py BUNDLE BATCH SENTENCES [MODE] [GRAPH] [SOURCES]
    python profile_nodes.py I8 64 300 greedy verifier_argmax.onnx s300.txt   # the first 300 WEB verses

Prints the profiled ms per call, the kernels' ms per call, rows x positions per call, then the
25 costliest nodes (ms per call). An If's time includes its branch's nodes, listed too.
"""

import sys
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
import profile_step  # noqa: E402

from aggdec.export.shape_folding import graphs_within  # noqa: E402


def node_names(graph) -> list[str]:
    return [node.name for g in graphs_within(graph) for node in g.node]


def main() -> None:
    bundle, batch, sentences = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "greedy"
    graph = sys.argv[5] if len(sys.argv) > 5 else "verifier_argmax.onnx"
    sources = sys.argv[6] if len(sys.argv) > 6 else "s300.txt"
    names = node_names(onnx.load(f"{bundle}/{graph}", load_external_data=False).graph)
    texts = [line.rstrip("\n") for line in open(sources, encoding="utf-8")][:sentences]
    row = profile_step.profile(bundle, mode, batch, texts, 1, None, tuple(names))
    print(f"{row['verifier_ms_per_call']:.3f} ms/call, kernels {row['kernel_ms_per_call']:.3f}, "
          f"rows {row['rows_per_call']:.1f} x {row['width_per_call']:.2f}")
    for name, ms in sorted(row["nodes_ms_per_call"].items(), key=lambda item: -item[1])[:25]:
        print(f"  {ms:.3f}  {name}")


if __name__ == "__main__":
    main()
