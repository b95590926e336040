"""Pytest fixtures over :mod:`tests.support.tiny`.

Import them into ``tests/conftest.py`` with::

    from tests.support.fixtures import editing_marian_dir, random_checkpoint  # noqa: F401
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import tiny

__all__ = ["editing_marian_dir", "random_checkpoint"]

# Bump the version whenever train_editing_marian / the editing task changes, to invalidate caches.
EDITING_CACHE_KEY = "aggdec-editing-marian-v1"
_COMPLETE_MARKER = "COMPLETE"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "editing_eval.json")


def _is_complete(directory: Path) -> bool:
    # The marker is written last, so its presence means the training run finished and saved fully.
    return (directory / _COMPLETE_MARKER).is_file() and all((directory / f).is_file() for f in _REQUIRED_FILES)


@pytest.fixture(scope="session")
def editing_marian_dir(request: pytest.FixtureRequest) -> Path:
    """Directory of the trained editing Marian (see :func:`tiny.train_editing_marian`).

    Trained once (about two minutes on CPU) and cached in pytest's cache directory across runs;
    ``pytest --cache-clear`` forces retraining.  ``editing_eval.json`` in the directory holds the
    held-out exact-match rate under ``"exact_match"``.
    """
    cache_root = Path(request.config.cache.mkdir(EDITING_CACHE_KEY))
    model_dir = cache_root / "model"
    if _is_complete(model_dir):
        return model_dir
    if model_dir.exists():
        shutil.rmtree(model_dir)  # leftover of an interrupted run
    tiny.train_editing_marian(model_dir)
    report = json.loads((model_dir / "editing_eval.json").read_text())
    (model_dir / _COMPLETE_MARKER).write_text(json.dumps({"exact_match": report["exact_match"]}) + "\n")
    return model_dir


@pytest.fixture(scope="session")
def random_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory ``(family, seed=0) -> Path`` of tiny random checkpoints, built once per session each."""
    built: dict[tuple[str, int], Path] = {}

    def build(family: str, seed: int = 0) -> Path:
        key = (family, seed)
        if key not in built:
            out_dir = tmp_path_factory.mktemp(f"tiny-{family}-{seed}", numbered=True)
            built[key] = tiny.build_random_checkpoint(family, out_dir, seed=seed)
        return built[key]

    return build
