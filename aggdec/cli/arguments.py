"""Argument types the subcommands share: each refuses a bad value with argparse's usage error."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def path_text(text: str) -> str:
    """A file or directory argument: an empty one is refused, where the file system reads it as
    the current directory (``aggdec export "" OUT`` exported the working directory; an OUT_DIR
    of "" ran a whole export, then failed to replace ".")."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def port(text: str) -> int:
    """A TCP port: 0 (any free one) .. 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0 (any free port) .. 65535, got {value}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def finite_non_negative(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


EARLY_STOPPING_CHOICES = {"true": True, "false": False, "never": "never"}


def early_stopping(text: str) -> bool | str:
    """transformers' early_stopping as a command line gives it: true, false or never."""
    try:
        return EARLY_STOPPING_CHOICES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(EARLY_STOPPING_CHOICES)}, got {text!r}") from None


def add_gpu_arguments(parser: argparse.ArgumentParser, cuda_graphs: bool = True) -> None:
    """How a GPU runs the graphs, for the subcommands that decode (generate, serve): ``--tf32``,
    ``--[no-]static-shapes`` and (``cuda_graphs``) ``--cuda-graphs``; :func:`gpu_options` reads them."""
    parser.add_argument("--static-shapes", action=argparse.BooleanOptionalAction, default=None,
                        help="every verifier call of a batch at one shape, so that a row's result cannot depend on "
                             "its block or its neighbours on a GPU (slower on the CPU; not with a shortlist: add "
                             "--no-shortlist; on a GPU it makes fp16 bundles exact; not given: off, with a warning "
                             "for an fp16 bundle on cuda)")
    if cuda_graphs:
        parser.add_argument("--cuda-graphs", action="store_true",
                            help="cuda, with --static-shapes: capture each batch shape's verifier call as a CUDA "
                                 "graph and replay it (off; same outputs, greedy 1.8x faster at batch 1 on an H100)")
    parser.add_argument("--tf32", action="store_true",
                        help="cuda: allow TF32 matrix products (faster, no longer float32: may differ from CPU greedy)")


def gpu_options(args: argparse.Namespace) -> dict[str, object]:
    """The :class:`~aggdec.runtime.generator.Generator` keywords of :func:`add_gpu_arguments`."""
    options: dict[str, object] = {"tf32": args.tf32, "static_shapes": args.static_shapes}
    if hasattr(args, "cuda_graphs"):
        options["cuda_graphs"] = args.cuda_graphs
    return options
