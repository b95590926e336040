"""Build-time half of aggdec: Hugging Face checkpoint -> ONNX bundle (needs the [export] extra).

``export_bundle`` (torch) is imported on first use, so that ``aggdec.export.quantize`` (onnx and
onnxruntime only) can be used without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["export_bundle"]


def __getattr__(name: str) -> Any:
    if name == "export_bundle":
        from .pipeline import export_bundle

        return export_bundle
    raise AttributeError(f"module 'aggdec.export' has no attribute {name!r}")
