"""The bundles aggdec runs in a benchmark when it is not handed them: the checkpoint exported, and
the fp32 bundle converted to int8 or fp16 (`aggdec quantize`). Each is made once in the work
directory and made again only when what it was made from changes, which a stamp beside it records."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from aggdec.runtime.errors import InputError

REFERENCE_MODEL = Path(__file__).resolve().parents[2] / "benchmarks" / "models" / "uagec"
# the converters and the per-position verifier rewrite they apply: a change to any changes the graphs
QUANTIZER_SOURCES = ("quantize.py", "half.py", "positions.py")


def _say(message: str) -> None:
    print(f"aggdec bench: {message}", file=sys.stderr, flush=True)


def made_once(target: Path, made_from: dict, make: Callable[[Path], None]) -> float | None:
    """Call ``make(target)`` unless ``target`` is a bundle made from exactly ``made_from`` (the
    stamp ``TARGET.made-from.json`` says so). Returns the seconds ``make`` took, None if reused."""
    stamp = target.with_name(target.name + ".made-from.json")
    if (target / "manifest.json").is_file() and stamp.is_file() and json.loads(stamp.read_text()) == made_from:
        return None
    started = time.perf_counter()
    make(target)
    seconds = time.perf_counter() - started
    stamp.write_text(json.dumps(made_from, indent=1))
    return seconds


def source_digest(names: tuple[str, ...] | None = None) -> str:
    """The digest of aggdec's export modules (``names`` of them, default all): a bundle made by
    older code is made again."""
    import aggdec.export

    digest = hashlib.sha256()
    for path in sorted(Path(aggdec.export.__file__).parent.glob("*.py")):
        if names is None or path.name in names:
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def checkpoint_digest(checkpoint: Path) -> str:
    """sha256 over a checkpoint's configuration and weight files (names and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(checkpoint.iterdir()):
        if path.suffix in (".json", ".safetensors", ".bin"):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _path_key(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def exported_bundle(checkpoint: Path | None, work: Path) -> tuple[Path, Path]:
    """A bundle of ``checkpoint`` (default: the committed reference model) and of the drafter
    beside it (``CHECKPOINT/../drafter``, the layout of the reference models), exported into
    ``work`` once and again whenever either changes: the peers and aggdec then always run the
    same weights."""
    if checkpoint is None:
        checkpoint = REFERENCE_MODEL / "model"
        if not (checkpoint / "config.json").is_file():
            raise InputError("the reference model lives in a source checkout (benchmarks/models/uagec); "
                             "give --checkpoint (and optionally BUNDLE) instead.")
    drafter = checkpoint.resolve().parent / "drafter"
    has_drafter = (drafter / "drafter.json").is_file()
    made_from = {"checkpoint": str(checkpoint.resolve()), "checkpoint_sha256": checkpoint_digest(checkpoint),
                 "drafter": str(drafter) if has_drafter else None,
                 "drafter_sha256": checkpoint_digest(drafter) if has_drafter else None,
                 "exporter_sha256": source_digest()}

    def export(bundle: Path) -> None:
        try:
            from aggdec.export import export_bundle
        except ImportError as exc:
            raise InputError(f"exporting {checkpoint} needs the export extra ({exc.name} is missing): "
                             "pip install 'aggdec[export]', or give a BUNDLE exported from it") from None
        export_bundle(checkpoint, bundle, force=True, drafter_dir=drafter if has_drafter else None, progress=_say)

    bundle = work / ("bundle-" + _path_key(checkpoint))
    made_once(bundle, made_from, export)
    return bundle, checkpoint


def quantized_bundle(bundle: Path, work: Path, precision: str = "int8") -> tuple[Path, float | None]:
    """The ``precision`` copy of the fp32 ``bundle`` (`aggdec quantize --precision`), made in
    ``work`` once and again whenever the bundle or the converter changes. Returns its path and
    the seconds converting took (None: reused). ExportError from the converter (a converted
    BUNDLE, a failed position check, an fp16 overflow) and InputError (no onnx) go to the caller."""
    from aggdec.runtime.manifest import manifest_digest

    made_from = {"bundle": str(bundle.resolve()), "manifest_sha256": manifest_digest(bundle),
                 "quantizer_sha256": source_digest(QUANTIZER_SOURCES), "precision": precision}

    def quantize(out: Path) -> None:
        try:
            from aggdec.export.quantize import quantize_bundle
        except ImportError as exc:
            raise InputError(f"converting a bundle needs onnx ({exc.name} is not installed): pip install onnx, "
                             "or 'aggdec[export]'") from None
        quantize_bundle(bundle, out, precision=precision, force=True, progress=_say)

    target = work / (f"bundle-{precision}-" + _path_key(bundle))
    return target, made_once(target, made_from, quantize)
