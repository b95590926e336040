"""Build-time half of aggdec: Hugging Face checkpoint -> ONNX bundle (needs the [export] extra)."""

from .pipeline import export_bundle

__all__ = ["export_bundle"]
