"""TensorRT as a device of the runtime: ``Generator(device="tensorrt")`` / ``open_bundle``.

This module registers the "tensorrt" session factory with ``aggdec.runtime.devices`` when it
is imported (``import aggdec.engines`` imports it), and pyproject names it under the
``aggdec.devices`` entry points, so the runtime finds it without importing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aggdec.runtime.devices import SessionRequest, register_device
from aggdec.runtime.errors import BundleError
from aggdec.runtime.manifest import BundleFiles, Manifest, manifest_digest
from aggdec.runtime.session import Session, check_device, ort

from .profiles import default_engines_dir, read_engines_manifest, select_engine


def check_tensorrt() -> None:
    """TensorRT and cuda-python importable, or a ProviderError saying how to get them."""
    from .trt import import_cudart, import_tensorrt

    import_tensorrt()
    import_cudart()


def engine_sessions(bundle: Path, manifest: Manifest, engines_dir: Path | None, tf32: bool,
                    graphs: Sequence[str]) -> dict[str, Session]:
    """A TrtSession per graph of ``graphs``, from the engines built for this GPU and TensorRT
    (fp32 engines preferred over fp16 ones when both exist: fp32 is what equals transformers)."""
    from .trt import TrtSession, current_target

    directory = Path(engines_dir) if engines_dir is not None else default_engines_dir(bundle)
    if not (directory / "engines.json").is_file():
        raise BundleError(f"no TensorRT engines in {directory}; build them with `aggdec build-engines {bundle}`.")
    engines = read_engines_manifest(directory, manifest_digest(bundle))
    sessions: dict[str, Session] = {}
    for graph in graphs:
        entry = None
        for fp16 in (False, True):
            try:
                entry = select_engine(engines, graph, current_target(fp16=fp16, tf32=tf32), directory)
                break
            except BundleError as exc:
                problem = exc
        if entry is None:
            raise problem
        sessions[graph] = TrtSession(directory / entry.file, expected_sha256=entry.sha256)
    return sessions


class TensorRTFactory:
    """TensorRT engines built by ``aggdec build-engines``. NOT RUN YET on a TensorRT machine."""

    probes_vocabulary = False  # engine profiles fix shapes the load-time probe cannot assume

    def check(self, request: SessionRequest) -> bool:
        check_tensorrt()
        if request.io_binding is None:  # the bound cache buffers are onnxruntime CUDA allocations
            return ort is not None and "CUDAExecutionProvider" in ort.get_available_providers()
        if request.io_binding:
            check_device("cuda")
        return bool(request.io_binding)

    def open(self, root: Path, manifest: Manifest, graphs: Sequence[str], request: SessionRequest,
             files: BundleFiles) -> dict[str, Session]:
        # engines are files of their own (build-engines' directory), checked by their own sha256s
        return engine_sessions(root, manifest, request.engines, request.tf32, graphs)


TENSORRT = TensorRTFactory()
register_device("tensorrt", TENSORRT)
