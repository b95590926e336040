"""`aggdec train-drafter`."""

from __future__ import annotations

import argparse

from aggdec.runtime.errors import AggdecError

from .arguments import path_text


def register(commands) -> argparse.ArgumentParser:
    """The `train-drafter` subcommand, its arguments and what runs it."""
    parser = commands.add_parser("train-drafter", help="train a GAD drafter for a checkpoint by distillation")
    add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC_DIR", type=path_text, help="the verifier: a local save_pretrained directory, or a Marian model folder as it ships")
    parser.add_argument("--sources", required=True, type=path_text, metavar="FILE", help="training sources, one per line")
    parser.add_argument("--out", required=True, type=path_text, metavar="DIR", help="where the drafter and checkpoints go")
    parser.add_argument("--k", type=int, default=25, help="tokens drafted per call (25)")
    parser.add_argument("--layers", type=int, default=2, help="drafter decoder layers (2)")
    parser.add_argument("--ffn-dim", type=int, default=None,
                        help="the drafter layers' feed-forward width (default: the verifier's)")
    parser.add_argument("--encoder-layers", type=int, default=0,
                        help="drafter-only layers over the verifier's encoder output, run once per request (0)")
    parser.add_argument("--window", type=int, default=16,
                        help="output tokens the drafter reads before its slots, 0 = all (16): a bounded window "
                             "keeps a drafter call's cost flat as the output grows")
    parser.add_argument("--positions", choices=("output", "source"), default=None,
                        help="positions the drafter reads its tokens at: output (default), or source, the "
                             "aligned source position of each token: for editing tasks (grammar correction), "
                             "where output positions drift from the source's after each edit")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, help="optimizer steps")
    length.add_argument("--epochs", type=int, help="passes over the sources (default 1)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="tokens per batch (4096)")
    parser.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint")
    parser.add_argument("--seed", type=int, default=0, help="random seed (0)")
    parser.add_argument("--glancing", type=float, default=0.0, help="glancing ratio, 0 = off (0)")
    parser.add_argument("--heldout", type=int, default=100, help="sources held out for the acceptance report (100)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to train (cpu)")
    parser.add_argument("--no-speed", dest="speed", action="store_false", default=None,
                        help="skip timing GAD against greedy on the held-out sources with the runtime (CPU, "
                             "1 thread; a temporary bundle is exported for it)")


def run(args: argparse.Namespace) -> int:
    try:
        from aggdec.export.train_drafter import run_from_args
    except ImportError as exc:
        raise AggdecError(
            f"`aggdec train-drafter` needs the export extra ({exc.name} is not installed): pip install 'aggdec[export]'"
        ) from None
    return run_from_args(args)
