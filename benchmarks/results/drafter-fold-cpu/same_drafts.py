"""The old (main's) and new (this branch's) exports' drafters, fp32 and int8, on the same
random inputs at several shapes: are the scores (the ArgMax's input) and the drafts bitwise
equal? Prints one JSON line per graph.

    python benchmarks/results/drafter-fold-cpu/same_drafts.py OLD_BUNDLE NEW_BUNDLE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def session(path: Path) -> ort.InferenceSession:
    model = onnx.load(str(path))
    argmax = next(node for node in model.graph.node if node.op_type == "ArgMax")
    model.graph.output.append(helper.make_tensor_value_info(argmax.input[0], TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    old, new = Path(sys.argv[1]), Path(sys.argv[2])
    manifest = json.loads((new / "manifest.json").read_text())
    k, d_model, vocab, mask_id = (manifest["draft_k"], manifest["d_model"], manifest["vocab_size"],
                                  manifest["mask_token_id"])
    rng = np.random.default_rng(0)
    for file in ("drafter.onnx", "drafter.int8.onnx"):
        a, b = session(old / file), session(new / file)
        cases = equal = 0
        for batch, seen, source in ((1, 1, 1), (1, 8, 20), (3, 5, 7), (8, 12, 40), (32, 3, 15)):
            ids = np.concatenate([rng.integers(4, vocab, (batch, seen)), np.full((batch, k), mask_id)], 1)
            mask = np.ones_like(ids)
            source_mask = np.ones((batch, source), np.int64)
            source_mask[0, source // 2 + 1:] = 0
            feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64),
                     "slot_start": np.full(batch, seen, np.int64), "position_offset": np.zeros(batch, np.int64),
                     "encoder_hidden_states": rng.standard_normal((batch, source, d_model)).astype(np.float32),
                     "encoder_attention_mask": source_mask}
            outputs = zip(a.run(None, feeds), b.run(None, feeds), strict=True)
            cases += 1
            equal += all(x.shape == y.shape and np.array_equal(x, y) for x, y in outputs)
        print(json.dumps({"graph": file, "cases": cases, "bitwise_equal": equal}))


if __name__ == "__main__":
    main()
