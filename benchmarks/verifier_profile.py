"""Where one verifier step's time goes, per ONNX operator type (onnxruntime's profiler).

Feeds a bundle's verifier random caches of a given batch size and length, the way the
runtime does (fixed-capacity buffers bound by pointer, the outputs onto the inputs, so the
new tokens are written in place), runs it a few times with profiling on, and prints the
kernel time per operator type. The format-1 cache (one stacked tensor, re-gathered every
call) spent 78% of a batch-32 step with a 250-token cache moving it (Split, Concat,
GatherElements); this shows what a step costs now.

    python benchmarks/verifier_profile.py BUNDLE [--batch 32] [--past 250] [--new 1] [--runs 10]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

import numpy as np
import onnxruntime as ort

from aggdec.runtime.decoding.cache import bucket, cross_dims, cross_names, self_cache_names, self_cache_out_names
from aggdec.runtime.decoding.verifier import SLACK
from aggdec.runtime.manifest import load_manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--past", type=int, default=250, help="cache length")
    parser.add_argument("--new", type=int, default=1, help="tokens per call (a draft block)")
    parser.add_argument("--source", type=int, default=30, help="source length")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()

    m = load_manifest(args.bundle, verify=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "verifier")
    session = ort.InferenceSession(os.path.join(args.bundle, m.graph("verifier").file), options,
                                   providers=["CPUExecutionProvider"])
    b, layers, heads, dh = args.batch, m.decoder_layers, m.num_heads, m.head_dim
    capacity = bucket(args.past + args.new, m.max_target_len + SLACK)
    rng = np.random.default_rng(0)
    binding = session.io_binding()
    binding.bind_cpu_input("input_ids", np.full((b, args.new), 5, np.int64))
    binding.bind_cpu_input("past_lengths", np.full((b,), args.past, np.int64))
    binding.bind_cpu_input("encoder_attention_mask", np.ones((b, args.source), np.int64))
    binding.bind_output("top_logprobs", "cpu")
    binding.bind_output("top_ids", "cpu")
    buffers = []
    for name, out in zip(self_cache_names(layers), self_cache_out_names(layers)):
        value = ort.OrtValue.ortvalue_from_numpy(rng.random((b, heads, capacity, dh), dtype=np.float32))
        buffers.append(value)  # keep it alive: the binding holds only its pointer
        binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(out, value)
    for name in cross_names(layers):
        shape = cross_dims(b, heads, args.source, dh, name.startswith("cross_key"), m.cross_key_layout)
        binding.bind_cpu_input(name, rng.random(shape, dtype=np.float32))
    for _ in range(args.runs):
        session.run_with_iobinding(binding)
    by_type: collections.Counter = collections.Counter()
    for event in json.load(open(session.end_profiling())):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_type[event["args"]["op_name"]] += event["dur"]
    total = sum(by_type.values())
    print(f"batch {b}, cache {args.past}, {args.new} new token(s): {total / args.runs / 1e3:.2f} ms of kernels per call")
    for op, micros in by_type.most_common(10):
        print(f"  {op:20s} {micros / args.runs / 1e3:7.3f} ms  {100 * micros / total:5.1f}%")


if __name__ == "__main__":
    main()
