"""Where a decoding step's verifier time goes, in real decoding: per operator type, how much of
each call is padding, and what the output head (projection, log-softmax, top-k) costs.

For each bundle, mode and batch size, decodes the first sentences of the data twice with the
bundle's own verifier graph:

- **profiled** (the runtime's IO binding, as ``generate`` runs): the verifier session has
  onnxruntime's profiler on (``SessionOptions.enable_profiling``); its JSON trace's kernel
  times are summed per operator type, and separately for the **head**: the nodes with an
  output as wide as the vocabulary (the output projection and what follows it: the
  suppression bias, LogSoftmax, TopK);
- **recorded** (no IO binding, so that each call's inputs are seen): per call, how many block
  positions are padding (``pad_id`` after a row's first position: blocks are right-padded to
  the widest row; an upper bound, since a token equal to ``pad_id`` would count), how many
  source tokens are padding (the encoder mask), and how many of the cache positions that
  attention reads are past what a position may see (attention reads the whole buffer under a
  mask; ``capacity`` is the buffer's length).

    python benchmarks/profile_step.py BUNDLE [BUNDLE ...] [--modes greedy iad] [--batch-sizes 1 32]
                                      [--sentences 64] [--threads 1] [--json OUT.json] [--pruning]
                                      [--nodes NAME ...]

``--nodes``: also the summed kernel time of these nodes (as named in the graph and in
onnxruntime's trace), e.g. the self-attention keys' K^T.

``--pruning`` first checks whether onnxruntime skips the nodes that only unrequested outputs
need (an ArgMax output is added to the verifier and requested alone with the caches): if it
did, an argmax output beside the top-k ones would make the top-k head free when not requested.

``--sentences``: per batch size, at least twice the batch (rows leave and are refilled, so a
batch-32 step serves up to 32 rows). Bounded: a few hundred verifier calls per configuration.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from aggdec.runtime.decoding.cache import cross_dims, self_cache_names
from aggdec.runtime.generator import Generator
from aggdec.runtime.loader import open_bundle
from aggdec.runtime.session import OrtSession
from aggdec.runtime.tuning import Tuning
from aggdec.sentences import load_examples

HEAD_OPS = ("LogSoftmax", "TopK", "ArgMax")
CAPACITY_INPUT = self_cache_names(1)[0]  # a self-attention buffer: [rows, heads, capacity, head_dim]


class RecordingSession:
    """The verifier's session, unbound: records each call's padding, then runs it."""

    def __init__(self, session: OrtSession, pad_id: int) -> None:
        self._session = session
        self.device = session.device
        self.pad_id = pad_id
        self.calls: list[dict[str, int]] = []

    @property
    def seconds(self) -> float:
        return self._session.seconds

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, lengths, mask = inputs["input_ids"], inputs["past_lengths"], inputs["encoder_attention_mask"]
        rows, width = ids.shape
        # a self-attention key buffer, or a recurrent bundle's state buffer (same layout)
        own = CAPACITY_INPUT if CAPACITY_INPUT in inputs else next(name for name in inputs if name.startswith("self_"))
        capacity = int(inputs[own].shape[2])
        # a query at block position t of a row sees keys 0 .. past + t
        needed = int(sum(int(p) * width + width * (width + 1) // 2 for p in lengths))
        self.calls.append({
            "rows": rows, "width": width,
            "padded_positions": int((ids[:, 1:] == self.pad_id).sum()),
            "source_tokens": int(mask.size), "padded_source_tokens": int(mask.size - mask.sum()),
            "keys_read": rows * width * capacity, "keys_needed": needed,
        })
        return self._session.run(inputs)

    def binding(self) -> Any:
        raise NotImplementedError("the recorded pass runs unbound")

    def run_bound(self, binding: Any) -> list[Any]:
        raise NotImplementedError("the recorded pass runs unbound")


def verifier_session(bundle: Any, graph: str, threads: int, profile_prefix: str | None) -> OrtSession:
    """A fresh session of a verifier graph over the bundle's own (hashed) graph bytes."""
    from aggdec.runtime.manifest import BundleFiles

    spec = bundle.manifest.graph(graph)
    files = BundleFiles(bundle.root, bundle.manifest, True)
    return OrtSession(bundle.root / spec.file, "cpu", threads, spec=spec, name=graph,
                      contents=files.read(spec.file), external_data=files.external_data(),
                      profile_prefix=profile_prefix)


def verifier_graphs(generator: Generator) -> dict[str, str]:
    """The verifier graphs a Generator may run (graph name -> its attribute of generator.verifier)."""
    return {"verifier": "verifier", **({"verifier_argmax": "argmax"} if generator.verifier.argmax is not None else {})}


def kernel_times(trace: str, vocab_size: int) -> tuple[collections.Counter, collections.Counter, int,
                                                        collections.Counter]:
    """(microseconds per operator type, microseconds per head operator type, calls, microseconds
    per node name) of a trace."""
    by_type: collections.Counter = collections.Counter()
    head: collections.Counter = collections.Counter()
    by_node: collections.Counter = collections.Counter()
    calls = 0
    for event in json.loads(Path(trace).read_text()):
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            calls += 1
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        op = event["args"]["op_name"]
        by_type[op] += event["dur"]
        by_node[event["name"].removesuffix("_kernel_time")] += event["dur"]
        shapes = [dims for output in event["args"].get("output_type_shape", []) for dims in output.values()]
        if op in HEAD_OPS or any(dims and dims[-1] == vocab_size for dims in shapes):
            head[op] += event["dur"]
    return by_type, head, calls, by_node


def profile(path: str, mode: str, batch_size: int, texts: list[str], threads: int,
            tuning: Tuning | None = None, nodes: tuple[str, ...] = ()) -> dict[str, Any]:
    opened = open_bundle(path, threads=threads)
    m = opened.manifest
    generator = Generator.from_bundle(opened, tuning)
    generator.generate(texts[:batch_size], mode=mode, batch_size=batch_size)  # warm-up: first calls, measured costs
    profiled = {}
    for graph, attribute in verifier_graphs(generator).items():  # the mode runs one of them
        profiled[graph] = verifier_session(opened, graph, threads, str(Path(tempfile.mkdtemp()) / graph))
        setattr(generator.verifier, attribute, profiled[graph])
    started = time.perf_counter()
    results = generator.generate(texts, mode=mode, batch_size=batch_size)
    wall = time.perf_counter() - started
    by_type, head, calls, by_node = collections.Counter(), collections.Counter(), 0, collections.Counter()
    for session in profiled.values():
        graph_types, graph_head, graph_calls, graph_nodes = kernel_times(session.end_profiling(), m.vocab_size)
        by_type, head, calls = by_type + graph_types, head + graph_head, calls + graph_calls
        by_node += graph_nodes
    ran = [graph for graph, session in profiled.items() if session.seconds > 0]

    unbound = Generator.from_bundle(open_bundle(path, threads=threads, io_binding=False), tuning)
    recorders = []
    for attribute in verifier_graphs(unbound).values():
        recorders.append(RecordingSession(getattr(unbound.verifier, attribute), int(m.pad_token_id)))
        setattr(unbound.verifier, attribute, recorders[-1])
    recorded = unbound.generate(texts, mode=mode, batch_size=batch_size)
    if [r.text for r in recorded] != [r.text for r in results]:  # exact modes: never
        raise SystemExit(f"{path} {mode} batch {batch_size}: the recorded pass decoded other outputs")
    record = [call for recorder in recorders for call in recorder.calls]
    totals = {key: sum(call[key] for call in record) for key in record[0]}
    positions = sum(call["rows"] * call["width"] for call in record)
    kernels = sum(by_type.values())
    return {
        "bundle": path, "precision": m.precision, "mode": mode, "batch_size": batch_size, "sentences": len(texts),
        "graphs": ran, "wall_seconds": wall, "verifier_calls": calls,
        "verifier_ms_per_call": 1e3 * sum(session.seconds for session in profiled.values()) / max(1, calls),
        "kernel_ms_per_call": kernels / 1e3 / max(1, calls),
        "rows_per_call": totals["rows"] / len(record),
        "width_per_call": totals["width"] / len(record),
        "ops_ms_per_call": {op: us / 1e3 / calls for op, us in by_type.most_common()},
        "head_ms_per_call": {op: us / 1e3 / calls for op, us in head.most_common()},
        "head_share": sum(head.values()) / kernels,
        "nodes_ms_per_call": {name: by_node[name] / 1e3 / calls for name in nodes},
        "padded_positions_share": totals["padded_positions"] / positions,
        "padded_source_share": totals["padded_source_tokens"] / totals["source_tokens"],
        "unneeded_keys_share": 1 - totals["keys_needed"] / totals["keys_read"],
    }


def pruning(path: str, threads: int) -> dict[str, int]:
    """Does onnxruntime skip the nodes only unrequested outputs need? The bundle's verifier with
    an ArgMax output added is run with only that output and the caches requested (IO binding,
    as the runtime runs); returns how many LogSoftmax and TopK kernels ran per call (0: skipped)."""
    import onnx
    import onnxruntime as ort

    opened = open_bundle(path, threads=threads)
    spec = opened.manifest.graph("verifier")
    model = onnx.load(str(opened.root / spec.file))
    log_softmax = next(node for node in model.graph.node if node.op_type == "LogSoftmax")
    model.graph.node.append(onnx.helper.make_node("ArgMax", [log_softmax.input[0]], ["argmax_only"], axis=-1,
                                                  keepdims=0))
    model.graph.output.append(onnx.helper.make_tensor_value_info("argmax_only", onnx.TensorProto.INT64, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "pruning")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    m, rows, width, source, capacity = opened.manifest, 4, 3, 20, 64
    binding = session.io_binding()
    binding.bind_cpu_input("input_ids", np.full((rows, width), 5, np.int64))
    binding.bind_cpu_input("past_lengths", np.full((rows,), 7, np.int64))
    binding.bind_cpu_input("encoder_attention_mask", np.ones((rows, source), np.int64))
    dtype = np.float16 if m.precision == "fp16" else np.float32
    for tensor in spec.inputs:
        if tensor.name.startswith("self_"):
            binding.bind_cpu_input(tensor.name, np.zeros((rows, m.num_heads, capacity, m.head_dim), dtype))
        elif tensor.name.startswith("cross_"):
            shape = cross_dims(rows, m.num_heads, source, m.head_dim, tensor.name.startswith("cross_key"),
                               m.cross_key_layout)
            binding.bind_cpu_input(tensor.name, np.zeros(shape, dtype))
    binding.bind_output("argmax_only", "cpu")
    for tensor in spec.outputs:
        if tensor.name.startswith("self_"):
            binding.bind_output(tensor.name, "cpu")
    runs = 3
    for _ in range(runs):
        session.run_with_iobinding(binding)
    ran: collections.Counter = collections.Counter()
    for event in json.loads(Path(session.end_profiling()).read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            ran[event["args"]["op_name"]] += 1
    return {op: ran[op] // runs for op in ("LogSoftmax", "TopK", "ArgMax")}


def report(row: dict[str, Any]) -> str:
    lines = [f"{Path(row['bundle']).name} ({row['precision']}, {' and '.join(row['graphs'])}) {row['mode']} "
             f"batch {row['batch_size']}: "
             f"{row['verifier_calls']} calls, {row['rows_per_call']:.1f} rows x {row['width_per_call']:.2f} positions "
             f"per call; {row['verifier_ms_per_call']:.3f} ms per call ({row['kernel_ms_per_call']:.3f} ms in kernels)",
             f"  padding: {100 * row['padded_positions_share']:.1f}% of block positions, "
             f"{100 * row['padded_source_share']:.1f}% of source tokens; attention reads "
             f"{100 * row['unneeded_keys_share']:.1f}% masked cache positions",
             f"  head (projection + bias + log-softmax + top-k or argmax): {100 * row['head_share']:.1f}% of kernel time: "
             + ", ".join(f"{op} {ms:.3f} ms" for op, ms in row["head_ms_per_call"].items())]
    for op, ms in list(row["ops_ms_per_call"].items())[:12]:
        lines.append(f"    {op:22s} {ms:7.3f} ms  {100 * ms / row['kernel_ms_per_call']:5.1f}%")
    if row["nodes_ms_per_call"]:
        named = sum(row["nodes_ms_per_call"].values())
        lines.append(f"  nodes {' + '.join(row['nodes_ms_per_call'])}: {named:.3f} ms, "
                     f"{100 * named / row['kernel_ms_per_call']:.1f}% of kernel time")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--modes", nargs="*", default=["greedy", "iad"])
    parser.add_argument("--batch-sizes", nargs="*", type=int, default=[1, 32])
    parser.add_argument("--sentences", type=int, default=16, help="per batch size: at least twice the batch")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", default="uagec-test", help="uagec-test, or a file of sources, one per line")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--top-k-graph", action="store_true",
                        help="run the top-K verifier graph in every mode (Tuning argmax_graph=False)")
    parser.add_argument("--nodes", nargs="*", default=[],
                        help="also report these nodes' kernel time (names as in the graph, e.g. /Transpose_3)")
    parser.add_argument("--pruning", action="store_true",
                        help="also check whether onnxruntime skips nodes that only unrequested outputs need")
    args = parser.parse_args()
    examples = load_examples(args.data)
    rows: list[dict[str, Any]] = []
    if args.pruning:
        for path in args.bundles:
            ran = pruning(path, args.threads)
            print(f"{path}: with only an added ArgMax output and the caches requested, kernels run per call: "
                  + ", ".join(f"{op} {count}" for op, count in ran.items())
                  + (" (onnxruntime runs the unrequested head)" if ran["TopK"] else " (skipped)"), flush=True)
            rows.append({"bundle": path, "pruning": ran})
    for path in args.bundles:
        for batch_size in args.batch_sizes:
            texts = [e.source for e in examples[: max(args.sentences, 2 * batch_size)]]
            for mode in args.modes:
                row = profile(path, mode, batch_size, texts, args.threads,
                              Tuning(argmax_graph=False) if args.top_k_graph else None, tuple(args.nodes))
                print(report(row), flush=True)
                rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"({' '.join(sys.argv)})")


if __name__ == "__main__":
    main()
