"""The `aggdec` command line: one module per subcommand, each with ``register(commands)``
(its parser), ``add_arguments(parser)`` and ``run(args)``.

Heavy subcommands import lazily: `generate` needs only the runtime (numpy, onnxruntime,
tokenizers); `export` needs the [export] extra and says so if it is missing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from aggdec import __version__
from aggdec.runtime.errors import AggdecError

from . import bench, build_engines, export, generate, loadtest, quantize, serve, train_drafter

# in the order `aggdec --help` lists them
COMMANDS = (export, quantize, train_drafter, generate, build_engines, serve, loadtest, bench)


class _Parser(argparse.ArgumentParser):
    """argparse's parser with its usage errors as every other error: one ``aggdec: error:`` line,
    exit 2 (argparse prints the whole usage block first), naming the subcommand and its --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"aggdec: error: {self.prog}: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="aggdec", description="Lossless aggressive decoding for seq2seq models.")
    parser.add_argument("--version", action="version", version=f"aggdec {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(commands)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def run(args: argparse.Namespace) -> int:
    return args.run(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = None if argv is None else list(argv)
    try:
        return run(args)
    except AggdecError as exc:
        print(f"aggdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`| head -1`): what it wanted was written; leave quietly, and keep
        # Python from complaining again when it flushes stdout at exit
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
