"""What a one-token verifier call costs by the span of its cache, and right after a call as wide
as a draft: the two costs a GAD batch's plain steps pay after it drafted (``gad.DrafterDraft``,
``DraftGate``), measured on a bundle's verifier alone, the way the runtime calls it on the CPU
(IO binding, every self-attention buffer bound as both input and output, written in place).

    python benchmarks/call_after_block.py BUNDLE [--rows 1 8 32] [--source 64] [--wide 21] [--past 20]

Random cache contents and ids (the cost does not depend on them); ``--past``: positions already
cached per row. Prints, per row count, the median ms of a one-token call at capacities 32 to
256, and of a one-token call alternating with a ``--wide``-token one (each after the other).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def bind(session, rows: int, width: int, capacity: int, source: int, past: int, keep: list):
    """An IO binding of one call's inputs and outputs; arrays it points at are appended to ``keep``."""
    binding = session.io_binding()
    sizes = {"batch": rows, "new_len": width, "capacity": capacity, "source_len": source}
    outputs = {o.name for o in session.get_outputs()}
    for spec in session.get_inputs():
        shape = [sizes[d] if isinstance(d, str) else d for d in spec.shape]
        if spec.name == "input_ids":
            array = np.full(shape, 5, dtype=np.int64)
        elif spec.name == "past_lengths":
            array = np.full(shape, past, dtype=np.int64)
        elif spec.type == "tensor(int64)":  # masks
            array = np.ones(shape, dtype=np.int64)
        else:
            array = np.random.default_rng(0).random(shape, dtype=np.float32)
        keep.append(array)
        binding.bind_input(spec.name, "cpu", 0, array.dtype, shape, array.ctypes.data)
        out = spec.name.replace("self_key.", "self_key_out.").replace("self_value.", "self_value_out.")
        if out != spec.name and out in outputs:  # the cache written in place, as the runtime binds it
            binding.bind_output(out, "cpu", 0, array.dtype, shape, array.ctypes.data)
    for spec in session.get_outputs():
        if not spec.name.startswith("self_"):
            binding.bind_output(spec.name, "cpu")
    return binding


def medians(session, bindings: list, repeats: int) -> list[float]:
    """Median ms of each binding's call, the bindings called in turn (warm-up first)."""
    times: list[list[float]] = [[] for _ in bindings]
    for _ in range(5):
        for binding in bindings:
            session.run_with_iobinding(binding)
    for _ in range(repeats):
        for index, binding in enumerate(bindings):
            started = time.perf_counter()
            session.run_with_iobinding(binding)
            times[index].append(time.perf_counter() - started)
    return [float(np.median(t)) * 1e3 for t in times]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--graph", default="verifier_argmax", help="the verifier graph's name in the bundle")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--source", type=int, default=64, help="source positions (the cross-attention span)")
    parser.add_argument("--wide", type=int, default=21, help="the wide call's positions (a draft of 20 and one)")
    parser.add_argument("--past", type=int, default=20, help="positions cached per row")
    parser.add_argument("--capacities", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    import onnxruntime as ort

    path = args.bundle / f"{args.graph}.onnx"
    if not path.is_file():
        print(f"call_after_block: {path} does not exist (an attention-cache verifier graph is needed)", file=sys.stderr)
        return 2
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    if not any(i.name.startswith("self_key.") for i in session.get_inputs()):
        print(f"call_after_block: {path} has no self-attention key cache (a recurrent cache?)", file=sys.stderr)
        return 2
    report: dict = {"bundle": str(args.bundle), "graph": args.graph, "source": args.source, "past": args.past,
                    "wide": args.wide, "onnxruntime": ort.__version__, "rows": {}}
    low = min(args.capacities)
    for rows in args.rows:
        repeats = max(40, 400 // rows)
        keep: list = []
        by_capacity = {c: medians(session, [bind(session, rows, 1, c, args.source, args.past, keep)], repeats)[0]
                       for c in args.capacities}
        narrow = bind(session, rows, 1, low, args.source, args.past, keep)
        wide = bind(session, rows, args.wide, low * 2, args.source, args.past, keep)
        after, wide_ms = medians(session, [narrow, wide], repeats // 2)
        report["rows"][rows] = {"one_token_by_capacity": by_capacity, "one_token_after_wide": after,
                                "wide": wide_ms}
        spans = "  ".join(f"cap {c} {ms:.3f}" for c, ms in by_capacity.items())
        print(f"rows {rows:3d}: one token, {spans} | right after a {args.wide}-token call (cap {low}): "
              f"{after:.3f} ({after / by_capacity[low]:.2f}x; the wide call {wide_ms:.3f})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
