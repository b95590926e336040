"""Errors raised by aggdec.

Every error derives from :class:`AggdecError` and from the builtin it resembles, so callers
can catch either. Messages say what was given, what is accepted, and how to fix it.
"""

from __future__ import annotations


class AggdecError(Exception):
    """Root of every error aggdec raises on purpose."""


class BundleError(AggdecError, ValueError):
    """A bundle directory is malformed, incomplete or does not match its manifest."""


class BundleNotFoundError(AggdecError, FileNotFoundError):
    """A bundle directory or one of its files does not exist."""


class InputError(AggdecError, ValueError):
    """A request cannot be decoded as given (empty text, source too long, bad option)."""


class InputTypeError(InputError, TypeError):
    """An argument of the wrong type (a number where a path goes, a string where a flag does):
    an InputError, and the TypeError Python raises for such an argument."""


class EmptyTextError(InputError):
    """A text with nothing to decode (empty, or spaces only). An InputError like any other in the
    API and over HTTP; ``aggdec generate`` answers such a line with an empty line and no message,
    as Marian does: in a document a blank line is a paragraph break, not a mistake."""


class ProviderError(AggdecError, RuntimeError):
    """The requested device or execution provider is not available."""


class UnsupportedModelError(AggdecError, ValueError):
    """The checkpoint's architecture is not one aggdec can export."""


class ExportError(AggdecError, RuntimeError):
    """Exporting a checkpoint failed."""


class ValidationError(ExportError):
    """An exported graph disagrees with the torch module it was traced from."""


class GraphRunError(AggdecError, RuntimeError):
    """onnxruntime failed to run a bundle graph on inputs of its declared IO (a graph that
    cannot compute what it declares, or the device ran out of memory); names the graph."""


class CapacityError(AggdecError, RuntimeError):
    """A decode needed more cache positions than its buffers hold (a bug if it ever escapes)."""
