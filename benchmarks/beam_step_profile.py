"""Where a plain beam step's time goes, against greedy at the same rows and against CTranslate2.

For each configuration (plain beam N at batch 1 and 8, greedy at batch N and 1 by default)
decodes the first sentences of the data with the bundle's verifier under onnxruntime's
profiler, and prints per verifier call: the rows, the time inside onnxruntime's run (the
session's clock) and of it the kernels' own time per operator type and for the head (the
nodes with an output as wide as the vocabulary: projection, bias, LogSoftmax, TopK, Gather),
the time outside onnxruntime (the host: the loop, the beam step, the cache row copies, IO
binding), and the whole iteration. A second, unprofiled pass runs each configuration under
cProfile and lists where the host time goes. CTranslate2 (when installed and given its
converted model folder) decodes the same sentences with the same settings, interleaved with
aggdec pass by pass, so that the ratios are taken under the same load.

    python benchmarks/beam_step_profile.py BUNDLE [--ct2 bench-work/ct2-fp32] [--limit 60]
        [--configs beam4:1 beam4:8 greedy:4 greedy:1] [--repeats 3] [--json OUT.json]

Timings on a shared machine are noisy: read the ratios within a run, and the spread over runs.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

from aggdec.runtime.decoding.verifier import Batch
from aggdec.runtime.generator import Generator
from aggdec.runtime.loader import open_bundle
from aggdec.sentences import load_examples

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script's helpers
from profile_step import kernel_times, verifier_graphs, verifier_session  # noqa: E402

ROWS: list[int] = []  # rows of each verifier call, while counted


def _counting(verify):
    """``Batch.verify`` that also records each call's rows (in ROWS)."""
    def counted(self, tokens):
        ROWS.append(tokens.shape[0])
        return verify(self, tokens)
    return counted


def parse_config(text: str) -> tuple[int, int]:
    """"beam4:8" -> (4 beams, batch 8); "greedy:4" -> (1, 4)."""
    kind, batch = text.split(":")
    beams = 1 if kind == "greedy" else int(kind.removeprefix("beam"))
    return beams, int(batch)


def decode(generator: Generator, sources: list[str], beams: int, batch: int, max_new_tokens: int) -> list:
    options = {"num_beams": beams} if beams > 1 else {}
    out = []
    for start in range(0, len(sources), batch):
        out += generator.generate(sources[start : start + batch], mode="greedy", batch_size=batch,
                                  max_new_tokens=max_new_tokens, **options)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--ct2", help="CTranslate2's converted model folder (aggdec bench's bench-work/ct2-fp32)")
    parser.add_argument("--checkpoint", default="benchmarks/models/uagec/model", help="its tokenizer.json")
    parser.add_argument("--data", default="uagec-test")
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--configs", nargs="+", default=["beam4:1", "beam4:8", "greedy:4", "greedy:1"])
    parser.add_argument("--repeats", type=int, default=3, help="timed passes (interleaved with CTranslate2)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json")
    args = parser.parse_args()

    Batch.verify = _counting(Batch.verify)  # this process only: the rows of every call
    sources = [example.source for example in load_examples(args.data, args.limit)]
    opened = open_bundle(args.bundle, threads=1)
    vocab = opened.manifest.vocab_size
    generator = Generator.from_bundle(opened)
    decode(generator, sources[:8], 4, 1, args.max_new_tokens)  # warm-up
    plain_sessions = {attribute: getattr(generator.verifier, attribute)
                      for attribute in verifier_graphs(generator).values()}

    translator = tokenizer = None
    if args.ct2:
        import ctranslate2
        from tokenizers import Tokenizer

        translator = ctranslate2.Translator(args.ct2, device="cpu", compute_type="float32", intra_threads=1,
                                            inter_threads=1)
        tokenizer = Tokenizer.from_file(str(Path(args.checkpoint) / "tokenizer.json"))
        ct2_tokens = [e.tokens for e in tokenizer.encode_batch(sources, add_special_tokens=True)]

    report: dict = {"sentences": len(sources), "configs": {}}
    for text in args.configs:
        beams, batch = parse_config(text)
        # 1. onnxruntime's profiler: kernel time per op type and the head, per call
        # (greedy runs the argmax graph where the bundle has one: each graph gets a profiled session)
        profiled = {}
        for graph, attribute in verifier_graphs(generator).items():
            profiled[graph] = verifier_session(opened, graph, 1, str(Path(tempfile.mkdtemp()) / graph))
            setattr(generator.verifier, attribute, profiled[graph])
        ROWS.clear()
        decode(generator, sources, beams, batch, args.max_new_tokens)
        rows = sum(ROWS)
        for attribute, session in plain_sessions.items():
            setattr(generator.verifier, attribute, session)
        by_type, head, calls = collections.Counter(), collections.Counter(), 0
        for session in profiled.values():
            graph_types, graph_head, graph_calls, _nodes = kernel_times(session.end_profiling(), vocab)
            by_type, head, calls = by_type + graph_types, head + graph_head, calls + graph_calls
        kernels = sum(by_type.values()) / 1e3
        # 2. timed passes, unprofiled, interleaved with CTranslate2's same decoding
        wall = graph = ct2_wall = 0.0
        for _ in range(args.repeats):
            before, started = generator.graph_seconds, time.perf_counter()
            decode(generator, sources, beams, batch, args.max_new_tokens)
            wall += time.perf_counter() - started
            graph += generator.graph_seconds - before
            if translator is not None:
                started = time.perf_counter()
                for start in range(0, len(sources), batch):
                    translator.translate_batch(ct2_tokens[start : start + batch], beam_size=beams,
                                               max_decoding_length=args.max_new_tokens, return_end_token=True)
                ct2_wall += time.perf_counter() - started
        # 3. cProfile of one more pass: the host's functions
        profile = cProfile.Profile()
        profile.enable()
        decode(generator, sources, beams, batch, args.max_new_tokens)
        profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(18)
        per_call = 1e3 / calls / args.repeats
        entry = {
            "beams": beams, "batch": batch, "verifier_calls": calls,
            "graphs": [graph for graph, session in profiled.items() if session.seconds > 0],
            "kernel_ms_per_call": round(kernels / calls, 4),
            "ops_ms_per_call": {op: round(us / 1e3 / calls, 4) for op, us in by_type.most_common(12)},
            "head_ms_per_call": {op: round(us / 1e3 / calls, 4) for op, us in head.most_common()},
            "head_share_of_kernels": round(sum(head.values()) / 1e3 / kernels, 3),
            "wall_ms_per_call": round(wall * per_call, 4),
            "onnxruntime_ms_per_call": round(graph * per_call, 4),
            "outside_ms_per_call": round((wall - graph) * per_call, 4),
            "aggdec_seconds": round(wall / args.repeats, 3),
        }
        entry["rows_per_call"] = round(rows / calls, 2)
        if translator is not None:
            entry["ct2_seconds"] = round(ct2_wall / args.repeats, 3)
            entry["aggdec_over_ct2_speed"] = round(ct2_wall / wall, 3)
        report["configs"][text] = entry
        print(json.dumps({text: entry}, indent=1), flush=True)
        print(f"## {text}: cProfile, by own time\n{out.getvalue()}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
