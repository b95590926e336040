"""Per-call costs behind GAD on a Marian bundle with a drafter, graphs alone (batch 1, 1 thread).

    python benchmarks/marian_gad_costs.py BUNDLE

Times, in one process and interleaved (min of 3 rounds of 300 calls): a one-token
verifier_argmax call, a call checking a block of k + 1 tokens, and the drafter call (int8 and
fp32), on a fixed 40-token source and a 440-id shortlist (a typical sentence's list size). What
GAD must beat: greedy pays one one-token call per token; a GAD iteration pays a drafter call and
a block call, and keeps the accepted drafts plus one.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def main(bundle: Path) -> None:
    m = json.loads((bundle / "manifest.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1

    def session(name: str) -> ort.InferenceSession:
        return ort.InferenceSession(str(bundle / name), options, providers=["CPUExecutionProvider"])

    encoder, verifier = session("encoder.onnx"), session("verifier_argmax.onnx")
    drafters = {"drafter_int8": session("drafter.int8.onnx"), "drafter_fp32": session("drafter.onnx")}
    source = np.array([[23, 400, 77, 1200, 56, 88, 3000, 41, 952, 12, 7, 800, 331, 90, 5, 1400, 21, 66, 70, 0] * 2])
    mask = np.ones_like(source)
    output_ids = np.sort(np.random.default_rng(0).choice(m["vocab_size"], 440, replace=False)).astype(np.int64)[None]
    # a bundle whose encoder gathers each row's output matrix (output_rows) feeds it to the
    # verifier, as the runtime does at batch 1 (docs/decisions/029)
    gathers = "output_ids" in {i.name for i in encoder.get_overridable_initializers()}
    encoded = dict(zip([o.name for o in encoder.get_outputs()],
                       encoder.run(None, {"input_ids": source, "attention_mask": mask,
                                          **({"output_ids": output_ids} if gathers else {})})))
    k, window = m["draft_k"], m["draft_window"]
    feeds = {"input_ids": np.array([[5]], dtype=np.int64), "past_lengths": np.array([10], dtype=np.int64), "encoder_attention_mask": mask,
             "output_ids": output_ids, **{name: encoded[name] for name in encoded if name.startswith("cross")},
             **({"output_rows": encoded["output_rows"]} if gathers else {})}
    for layer in range(m["decoder_layers"]):
        feeds[f"self_state.{layer}"] = np.zeros((1, m["num_heads"], 64, m["head_dim"]), np.float32)
    names = {i.name for i in verifier.get_inputs()}
    one = {name: value for name, value in feeds.items() if name in names}
    block = dict(one, input_ids=np.full((1, k + 1), 5, dtype=np.int64))
    ids = np.array([[0] + [9] * (window - 1) + [m["mask_token_id"]] * k])
    draft = {"input_ids": ids, "attention_mask": np.ones_like(ids), "slot_start": np.array([window]),
             "position_offset": np.array([3]), "encoder_hidden_states": encoded["encoder_hidden_states"],
             "encoder_attention_mask": mask, "output_ids": output_ids}

    def ms(s: ort.InferenceSession, f: dict, n: int = 300) -> float:
        s.run(None, f)
        started = time.perf_counter()
        for _ in range(n):
            s.run(None, f)
        return (time.perf_counter() - started) / n * 1000

    runs = {"verifier, 1 token": [], f"verifier, block of {k + 1}": [], **{name: [] for name in drafters}}
    for _ in range(3):
        runs["verifier, 1 token"].append(ms(verifier, one))
        runs[f"verifier, block of {k + 1}"].append(ms(verifier, block))
        for name, s in drafters.items():
            runs[name].append(ms(s, draft))
    for name, values in runs.items():
        print(f"{name}: {min(values):.3f} ms")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
