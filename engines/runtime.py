"""Loading a bundle's engines for ``Generator(device="tensorrt")``."""

from __future__ import annotations

from pathlib import Path

from aggdec.runtime.errors import BundleError
from aggdec.runtime.manifest import Manifest, manifest_digest

from .profiles import GRAPHS, default_engines_dir, read_engines_manifest, select_engine


def check_tensorrt() -> None:
    """TensorRT and cuda-python importable, or a ProviderError saying how to get them."""
    from .trt import import_cudart, import_tensorrt

    import_tensorrt()
    import_cudart()


def engine_sessions(bundle: Path, manifest: Manifest, engines_dir: Path | None, tf32: bool) -> dict:
    """A TrtSession per graph of the bundle, from the engines built for this GPU and TensorRT
    (fp32 engines preferred over fp16 ones when both exist: fp32 is what equals transformers)."""
    from .trt import TrtSession, current_target

    directory = Path(engines_dir) if engines_dir is not None else default_engines_dir(bundle)
    if not (directory / "engines.json").is_file():
        raise BundleError(f"no TensorRT engines in {directory}; build them with `aggdec build-engines {bundle}`.")
    engines = read_engines_manifest(directory, manifest_digest(bundle))
    sessions = {}
    for graph in GRAPHS:
        if graph not in manifest.graphs:
            continue
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
