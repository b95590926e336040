"""Tiny Marian-native bundles (tests/support/marian.py; SSRU and self-attention decoders)
exported with this branch's code and with its folding patched out (as beam-host-cpu made main's
graphs): node counts as exported and after onnxruntime's optimizations.

    python benchmarks/results/drafter-fold-cpu/marian_node_counts.py   (from the repository root)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import onnx

sys.path.insert(0, ".")
sys.path.insert(0, str(Path(__file__).parent))

import aggdec.export.marian.export as marian_export  # noqa: E402
import aggdec.export.tracing as tracing  # noqa: E402
from aggdec.export import export_bundle  # noqa: E402
from node_counts import optimized_nodes  # noqa: E402
from tests.support.marian import write_model  # noqa: E402


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="marian-fold-"))
    fold = marian_export.fold_reshapes
    print("| decoder | export | graph | nodes | after onnxruntime's optimizations |")
    print("|---|---|---|---|---|")
    for decoder in ("self-attention", "ssru"):
        folder, _config, _weights = write_model(root / decoder / "model", decoder)
        for label, rewrite in (("unfolded", lambda path: None), ("folded", fold)):
            marian_export.fold_reshapes = tracing.fold_reshapes = rewrite
            out = root / decoder / label
            export_bundle(folder, out, progress=None, max_source_len=64, max_target_len=64)
            for path in sorted(out.glob("*.onnx")):
                print(f"| {decoder} | {label} | {path.name} | {len(onnx.load(str(path)).graph.node)} | "
                      f"{optimized_nodes(path, [])} |")


if __name__ == "__main__":
    main()
