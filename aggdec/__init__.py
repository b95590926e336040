"""aggdec: lossless aggressive decoding for encoder-decoder Transformers.

The public surface is small: :class:`Generator` decodes with a bundle made by
``aggdec export``; :class:`GenerationResult` is what it returns; every deliberate error
derives from :class:`AggdecError`. Names resolve lazily so that ``aggdec.export`` (torch)
and the runtime (numpy + onnxruntime) load only what each needs.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["AggdecError", "DecodeOptions", "GenerationResult", "Generator", "Mode", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Generator", "GenerationResult"):
        from aggdec.runtime import generator

        return getattr(generator, name)
    if name in ("DecodeOptions", "Mode"):
        from aggdec.runtime import options

        return getattr(options, name)
    if name == "AggdecError":
        from aggdec.runtime.errors import AggdecError

        return AggdecError
    raise AttributeError(f"module 'aggdec' has no attribute {name!r}")
