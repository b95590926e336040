"""How a caller's option values are checked: one function per kind of value, shared by every
record and constructor that takes options (``DecodeOptions``, ``BlockOptions``, ``Tuning``,
``Generator``, ``open_bundle``), so that each kind is refused alike wherever it is given.

Each refusal is an InputError naming the option and the value; a flag or a path of the wrong
type is an :class:`~aggdec.runtime.errors.InputTypeError`, which is also Python's TypeError
(numbers keep their InputError, as they always had). Numbers are
returned as Python's own ``int``: a numpy integer (``np.uint64(2**64 - 1)``) in arithmetic
wraps around or warns, where an ``int`` is exact.
"""

from __future__ import annotations

import math
import numbers
import os
import reprlib
from pathlib import Path

from .errors import InputError, InputTypeError


def is_integer(value: object) -> bool:
    """An int-like option value (a bool is not one): what every integer knob is checked with."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_integer(name: str, value: object, most: int | None = None) -> int:
    """``value`` as an int if it is an integer of at least 1 (numpy's too) and at most ``most``
    (None: no bound); InputError naming ``name``."""
    if not is_integer(value) or value < 1:  # type: ignore[operator]
        bound = "of at least 1" if most is None else f"between 1 and {most:,}"
        raise InputError(f"{name} must be an integer {bound}, got {value!r}.")
    number = int(value)  # type: ignore[call-overload]
    if most is not None and number > most:
        raise InputError(f"{name} must be an integer between 1 and {most:,}, got {number:,}.")
    return number


def is_finite_real(value: object) -> bool:
    """A finite real option value (a bool is not one): what every real knob is checked with.
    An int too large for a float (``10**400``) is not one: the option is used as a float, and
    ``math.isfinite`` would raise OverflowError on it instead of answering."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def flag(name: str, value: object, optional: bool = False) -> bool | None:
    """``value`` if it is True or False (or None where ``optional``: the default chosen
    elsewhere); InputTypeError naming ``name`` otherwise. Only a bool: a truthy string such as
    "no", "off" or "false" read as True would turn on what its caller meant to turn off."""
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        allowed = "True, False or None (not given)" if optional else "True or False"
        raise InputTypeError(f"{name} must be {allowed}, got {reprlib.repr(value)}.")
    return value


def path(name: str, value: object) -> Path:
    """``value`` (a str or an ``os.PathLike`` of one) as a Path; InputTypeError naming ``name``
    otherwise (pathlib's own TypeError names neither the argument nor the value)."""
    if isinstance(value, (str, os.PathLike)):
        try:
            return Path(value)
        except TypeError:  # an os.PathLike whose __fspath__ gives bytes
            pass
    raise InputTypeError(f"{name} must be a file system path (a str or pathlib.Path), not {type(value).__name__} "
                         f"({reprlib.repr(value)}).")
