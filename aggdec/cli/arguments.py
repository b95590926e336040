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
    value = finite_non_negative(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


EARLY_STOPPING_CHOICES = {"true": True, "false": False, "never": "never"}


def early_stopping(text: str) -> bool | str:
    """transformers' early_stopping as a command line gives it: true, false or never."""
    try:
        return EARLY_STOPPING_CHOICES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(EARLY_STOPPING_CHOICES)}, got {text!r}") from None
