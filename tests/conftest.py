"""Shared fixtures: tiny checkpoints built from configs, and their exported bundles.

Everything is built locally (nothing is downloaded) and memoised for the session; the
trained editing model is also cached on disk across runs (see tests/support).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _one_cpu_per_worker() -> None:
    """Under ``pytest -n N`` (pytest-xdist), give each worker a CPU of its own, before torch or
    onnxruntime start their thread pools. Both would otherwise size their pools from the whole
    machine in every worker, and their spinning threads then slow every worker down many times
    over. Pinned, torch takes one thread and the runtime one onnxruntime thread a graph
    (``runtime.session.default_threads``); subprocesses the tests start inherit the pin."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    if worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


_one_cpu_per_worker()

from tests.support.fixtures import drafter_bundle, editing_marian_dir, random_checkpoint, trained_drafter_dir  # noqa: E402, F401


@pytest.fixture(scope="session")
def bundle(tmp_path_factory, random_checkpoint):  # noqa: F811 - the fixture imported above
    """(family, seed) -> the aggdec bundle exported from ``random_checkpoint(family, seed)``."""
    from aggdec.export import export_bundle

    made: dict[tuple[str, int], Path] = {}

    def make(family: str, seed: int = 0) -> Path:
        key = (family, seed)
        if key not in made:
            out = tmp_path_factory.mktemp(f"bundle-{family}-{seed}") / "bundle"
            export_bundle(random_checkpoint(family, seed), out, progress=None)
            made[key] = out
        return made[key]

    return make


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """(fp32 bundle directory, precision) -> its `aggdec quantize --precision` copy, made once."""
    from aggdec.export.quantize import quantize_bundle

    made: dict[tuple[Path, str], Path] = {}

    def make(fp32_dir: Path, precision: str) -> Path:
        if (fp32_dir, precision) not in made:
            out = tmp_path_factory.mktemp(precision) / "bundle"
            quantize_bundle(fp32_dir, out, precision=precision, progress=None)
            made[(fp32_dir, precision)] = out
        return made[(fp32_dir, precision)]

    return make


@pytest.fixture(scope="session")
def editing_bundle(tmp_path_factory, editing_marian_dir):  # noqa: F811
    """The trained editing Marian, exported."""
    from aggdec.export import export_bundle

    out = tmp_path_factory.mktemp("bundle-editing") / "bundle"
    export_bundle(editing_marian_dir, out, progress=None)
    return out


@pytest.fixture(scope="session")
def reference_bundle(tmp_path_factory):
    """The committed UA-GEC reference model and its drafter, exported the way users do."""
    from aggdec.export import export_bundle

    uagec = Path(__file__).resolve().parents[1] / "benchmarks" / "models" / "uagec"
    out = tmp_path_factory.mktemp("uagec") / "bundle"
    export_bundle(uagec / "model", out, drafter_dir=uagec / "drafter", progress=None)
    return out
