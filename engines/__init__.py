"""TensorRT engines for aggdec bundles: not implemented yet.

This package is reserved by the design (``aggdec.engines`` builds TensorRT engines from the
same graph contracts as the ONNX bundle). Nothing here is functional in this release, and
no CLI command exposes it.
"""
