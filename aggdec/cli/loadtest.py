"""`aggdec loadtest`."""

from __future__ import annotations

import argparse

from aggdec.runtime.errors import AggdecError
from aggdec.runtime.options import MODES

from .arguments import path_text, positive_float, positive_int


def register(commands) -> argparse.ArgumentParser:
    """The `loadtest` subcommand, its arguments and what runs it."""
    parser = commands.add_parser(
        "loadtest", help="closed-loop load test of an `aggdec serve` endpoint, every answer checked against greedy",
        description="Closed-loop clients (each sends its next request when the last is answered) at each "
                    "concurrency for a fixed time, over UA-GEC test sources; every output is compared with offline "
                    "greedy on the same bundle. Writes loadtest.json, loadtest.md and loadtest.png; exit status 1 "
                    "if any response was wrong or lost.")
    add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the server, on loopback: http://127.0.0.1:8000")
    parser.add_argument("--bundle", required=True, metavar="DIR", type=path_text, help="the bundle the server runs (for the greedy "
                        "reference and the offline comparison)")
    parser.add_argument("--data", default="uagec-test", metavar="FILE",
                        help="sources: uagec-test (the ua-gec package) or a file, one per line (uagec-test)")
    parser.add_argument("--limit", type=positive_int, default=512, help="distinct sentences to cycle through (512)")
    parser.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 8, 32, 64], metavar="N",
                        help="closed-loop clients per step (1 8 32 64)")
    parser.add_argument("--duration", type=positive_float, default=20.0, help="seconds per step (20)")
    parser.add_argument("--max-requests", type=positive_int, default=100000, help="requests per step at most (100000)")
    parser.add_argument("--mode", choices=MODES, default="iad", help="mode requested (iad)")
    parser.add_argument("--texts-per-request", type=positive_int, default=1, help="texts per request (1)")
    parser.add_argument("--timeout-s", type=positive_float, default=60.0, help="client timeout per request (60)")
    parser.add_argument("--offline-batch", type=int, default=32,
                        help="also time offline batched decoding of the same sentences in --mode at this batch size, "
                             "for the served/offline ratio; 0 = skip (32)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="intra-op threads of the offline reference (set it to the server's --threads)")
    parser.add_argument("--max-new-tokens", type=positive_int, help="tokens to generate at most, sent with every request")
    parser.add_argument("--out", default="loadtest-out", type=path_text, metavar="DIR", help="where the report goes (loadtest-out)")


def run(args: argparse.Namespace) -> int:
    try:
        import aiohttp  # noqa: F401
    except ImportError as exc:
        raise AggdecError(
            f"`aggdec loadtest` needs the serve extra ({exc.name} is not installed): pip install 'aggdec[serve]'"
        ) from None
    from aggdec.serve.loadtest import run_from_args

    return run_from_args(args)
