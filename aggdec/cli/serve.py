"""`aggdec serve`."""

from __future__ import annotations

import argparse

from aggdec.runtime.errors import AggdecError, InputError
from aggdec.runtime.options import MODES

from .arguments import (
    add_gpu_arguments, finite_non_negative, gpu_options, path_text, port, positive_float, positive_int,
)


def register(commands) -> argparse.ArgumentParser:
    """The `serve` subcommand, its arguments and what runs it."""
    parser = commands.add_parser(
        "serve", help="serve a bundle over HTTP with dynamic batching (the serve extra)",
        description="An HTTP JSON API over one bundle: POST /v1/generate, GET /healthz, /readyz, /metrics, /docs. "
                    "Texts of concurrent requests share batches. SIGTERM drains: requests in flight finish, "
                    "new ones get 503, then the process exits.")
    add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", metavar="BUNDLE", type=path_text, help="a directory written by `aggdec export`")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument("--port", type=port, default=8000, help="port to listen on, 0 = any free one (8000)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to run (cpu)")
    parser.add_argument("--threads", type=positive_int, help="intra-op threads (default: one per core, or per CPU the process is pinned to)")
    # no --cuda-graphs: each mode's decode loop has a thread of its own, and a capture fails
    # another thread's CUDA work (Generator's cuda_graphs)
    add_gpu_arguments(parser, cuda_graphs=False)
    parser.add_argument("--mode", choices=MODES, default="iad",
                        help="mode of a request that names none (iad)")
    parser.add_argument("--max-batch", type=positive_int, default=32, help="rows per verifier call (32)")
    parser.add_argument("--max-wait-ms", type=finite_non_negative, default=0.0,
                        help="an idle decode loop waits this long to gather a batch after the first text (0: "
                             "texts join a running batch at its next call anyway, and a lone request would "
                             "pay the whole wait)")
    parser.add_argument("--max-queue", type=positive_int, default=256,
                        help="texts that may wait for a slot; past it requests get 429 (256)")
    parser.add_argument("--timeout-s", type=positive_float, default=30.0,
                        help="a request's deadline; past it 504 and its work is dropped (30)")
    parser.add_argument("--max-texts", type=positive_int, default=None,
                        help="texts per request; more: 413; at most --max-queue (64, or --max-queue if lower)")
    parser.add_argument("--max-body-bytes", type=positive_int, default=1 << 20,
                        help="request body size; larger: 413 (1048576)")
    parser.add_argument("--drain-s", type=finite_non_negative,
                        help="on SIGTERM, wait at most this long for requests in flight (default: --timeout-s + 5)")
    parser.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                        help="uvicorn's log level (warning)")
    parser.add_argument("--ray", action="store_true",
                        help="run as a Ray Serve application (the ray extra) on the Ray cluster of $RAY_ADDRESS, "
                             "or a local one")
    parser.add_argument("--replicas", type=positive_int, default=1, help="--ray: replicas (1)")
    parser.add_argument("--max-replicas", type=positive_int,
                        help="--ray: autoscale between --replicas and this many replicas (default: a fixed number)")


def run(args: argparse.Namespace) -> int:
    if args.max_replicas is not None and args.max_replicas < args.replicas:
        raise InputError(f"--max-replicas {args.max_replicas} is below --replicas {args.replicas}.")
    from aggdec.serve.engine import max_texts_within  # no web framework: before the bundle loads, for --ray too

    max_texts = max_texts_within(args.max_texts, args.max_queue, ("--max-texts", "--max-queue"))
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise AggdecError(
            f"`aggdec serve` needs the serve extra ({exc.name} is not installed): pip install 'aggdec[serve]'"
        ) from None
    from aggdec.serve.app import Settings

    settings = Settings(mode=args.mode, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                        max_queue=args.max_queue, timeout_s=args.timeout_s, max_texts=max_texts,
                        max_body_bytes=args.max_body_bytes)
    if args.ray:
        try:
            import ray  # noqa: F401
            from ray import serve  # noqa: F401
        except ImportError as exc:
            raise AggdecError(
                f"`aggdec serve --ray` needs the ray extra ({exc.name} is not installed): pip install 'aggdec[ray]'"
            ) from None
        from aggdec.serve.ray import run_ray

        return run_ray(args.bundle, host=args.host, port=args.port, device=args.device, threads=args.threads,
                       settings=settings, replicas=args.replicas, max_replicas=args.max_replicas,
                       generator_options=gpu_options(args))
    from aggdec.serve.server import serve

    return serve(args.bundle, host=args.host, port=args.port, device=args.device, threads=args.threads,
                 settings=settings, drain_s=args.drain_s, log_level=args.log_level, generator_options=gpu_options(args))
