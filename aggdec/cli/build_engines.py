"""`aggdec build-engines`."""

from __future__ import annotations

import argparse
import sys

from .arguments import path_text, positive_int


def register(commands) -> argparse.ArgumentParser:
    """The `build-engines` subcommand, its arguments and what runs it."""
    parser = commands.add_parser(
        "build-engines", help="build TensorRT engines for a bundle (needs TensorRT and a GPU; not yet run on one)",
        description="Build a TensorRT engine per graph of BUNDLE, with optimization profiles derived from its "
                    "manifest, into a directory beside it (engines.json, *.engine, timing.cache). Engines are "
                    "keyed by bundle, GPU, TensorRT version, precision and profile; an up-to-date one is reused.")
    add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", metavar="BUNDLE", type=path_text, help="a directory written by `aggdec export`")
    parser.add_argument("--out", metavar="DIR", type=path_text, help="where the engines go (default: BUNDLE.engines)")
    parser.add_argument("--fp16", action="store_true", help="allow fp16 kernels (faster; outputs may differ from fp32)")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 kernels (off: TensorRT's default is on)")
    parser.add_argument("--max-batch", type=positive_int, default=16, help="most rows per call (16)")
    parser.add_argument("--opt-batch", type=positive_int, default=1, help="the batch size tuned for (1)")
    parser.add_argument("--max-block", type=positive_int, default=64,
                        help="longest IAD draft block the verifier engine takes (64, the CUDA default)")
    parser.add_argument("--workspace", type=positive_int, default=4096, metavar="MB",
                        help="TensorRT workspace memory pool, MiB (4096)")
    parser.add_argument("--force", action="store_true", help="rebuild engines that are up to date")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the profiles that would be built, as JSON, and stop (no TensorRT needed)")


def run(args: argparse.Namespace) -> int:
    import json

    from aggdec.engines import BuildOptions, ProfileOptions, build_engines, plan

    options = BuildOptions(profile=ProfileOptions(max_batch=args.max_batch, opt_batch=args.opt_batch,
                                                  max_block=args.max_block),
                           fp16=args.fp16, tf32=args.tf32, workspace_mib=args.workspace, force=args.force)
    planned = plan(args.bundle, args.out, options)  # bundle and options checked before TensorRT is needed
    if args.dry_run:  # one line per input: {"min": "1x1", "opt": "1x16", "max": "16x66"}
        print(json.dumps({"out": str(planned.out)}))
        for graph, profile in planned.profiles.items():
            for name, shapes in profile.items():
                print(json.dumps({"graph": graph, "input": name,
                                  **{k: "x".join(map(str, v)) for k, v in shapes.items()}}))
        return 0
    out = build_engines(args.bundle, args.out, options,
                        progress=lambda message: print(f"aggdec build-engines: {message}", file=sys.stderr, flush=True))
    print(out)
    return 0
