"""One verifier call of two bundles at fixed shapes, alternated call by call in one process, as
the runtime drives it (IO binding, each cache output bound onto its input, so the new tokens
are written in place): median wall time per call, B over A. Random caches and cross K/V.

    python call_ab.py A B [--runs 300] [--graph verifier_argmax]
"""
import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort

from aggdec.runtime.decoding.cache import bucket, cross_dims, cross_names, self_cache_names, self_cache_out_names
from aggdec.runtime.decoding.verifier import SLACK
from aggdec.runtime.manifest import load_manifest

SHAPES = [(1, 1, 20), (1, 1, 60), (1, 8, 20), (8, 1, 20), (8, 1, 60), (8, 8, 40), (32, 1, 20), (32, 1, 60),
          (32, 1, 120), (32, 8, 40)]  # (rows, new tokens, cached length)


def setup(path, graph, rows, new, past, source=30):
    m = load_manifest(path, verify=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(f"{path}/{m.graph(graph).file}", options, providers=["CPUExecutionProvider"])
    capacity = bucket(past + new, m.max_target_len + SLACK)
    rng = np.random.default_rng(0)
    binding = session.io_binding()
    binding.bind_cpu_input("input_ids", np.full((rows, new), 5, np.int64))
    binding.bind_cpu_input("past_lengths", np.full((rows,), past, np.int64))
    binding.bind_cpu_input("encoder_attention_mask", np.ones((rows, source), np.int64))
    for output in session.get_outputs():
        if not output.name.startswith("self_"):
            binding.bind_output(output.name, "cpu")
    keep = []
    for name, out in zip(self_cache_names(m.decoder_layers), self_cache_out_names(m.decoder_layers)):
        initial = rng.random((rows, m.num_heads, capacity, m.head_dim), dtype=np.float32)
        value = ort.OrtValue.ortvalue_from_numpy(initial)
        keep.append(value)
        binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(out, value)
    for name in cross_names(m.decoder_layers):
        shape = cross_dims(rows, m.num_heads, source, m.head_dim, name.startswith("cross_key"), m.cross_key_layout)
        binding.bind_cpu_input(name, rng.random(shape, dtype=np.float32))
    return session, binding, keep


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("a"); parser.add_argument("b")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--graph", default="verifier_argmax")
    args = parser.parse_args()
    print(f"{args.graph}: A = {args.a}, B = {args.b}; median ms per call over {args.runs} alternated calls")
    for rows, new, past in SHAPES:
        sides = [setup(path, args.graph, rows, new, past) for path in (args.a, args.b)]
        times = [[], []]
        for run in range(args.runs + 10):
            for k in ((0, 1) if run % 2 else (1, 0)):
                session, binding, _keep = sides[k]
                started = time.perf_counter()
                session.run_with_iobinding(binding)
                if run >= 10:
                    times[k].append(time.perf_counter() - started)
        a, b = (1e3 * statistics.median(t) for t in times)
        print(f"  rows {rows:2d}, {new} new, cache {past:3d}: A {a:.3f} ms, B {b:.3f} ms, B/A {b / a:.3f}", flush=True)


main()
