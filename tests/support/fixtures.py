"""Pytest fixtures over :mod:`tests.support.tiny`.

Import them into ``tests/conftest.py`` with::

    from tests.support.fixtures import editing_marian_dir, random_checkpoint  # noqa: F401
    from tests.support.fixtures import drafter_bundle, trained_drafter_dir  # noqa: F401
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

from tests.support import tiny

__all__ = ["drafter_bundle", "editing_marian_dir", "random_checkpoint", "trained_drafter_dir"]

# Bump the version whenever train_editing_marian / the editing task changes, to invalidate caches.
EDITING_CACHE_KEY = "aggdec-editing-marian-v2"
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
    with _trained_once(cache_root):
        if _is_complete(model_dir):
            return model_dir
        if model_dir.exists():
            shutil.rmtree(model_dir)  # leftover of an interrupted run
        tiny.train_editing_marian(model_dir)
        report = json.loads((model_dir / "editing_eval.json").read_text())
        (model_dir / _COMPLETE_MARKER).write_text(json.dumps({"exact_match": report["exact_match"]}) + "\n")
        return model_dir


def _trained_once(cache_root: Path) -> FileLock:
    """A lock on one cache entry: parallel pytest workers (``-n``) that need the same trained model
    wait for the first to train it rather than train it twice into the same folder."""
    return FileLock(str(cache_root / ".lock"))


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


# Bump whenever the drafter recipe or the fixture's settings change, to invalidate caches.
DRAFTER_CACHE_KEY = "aggdec-editing-drafter-v2"  # v2: a window of 6 output tokens
DRAFTER_SOURCES = 1500  # the last DRAFTER_HELDOUT are held out for the report
DRAFTER_HELDOUT = 100
DRAFTER_K = 8
DRAFTER_WINDOW = 6  # shorter than most outputs: the window is exercised
DRAFTER_STEPS = 600  # about 50 s on one CPU thread


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def trained_drafter_dir(request: pytest.FixtureRequest, editing_marian_dir: Path) -> Path:
    """A GAD drafter (k = 8, 2 layers) trained for the editing Marian by ``train_drafter``.

    Trained once (about a minute on one CPU thread) and cached across runs like
    ``editing_marian_dir``; it is retrained when that model changes.  The directory holds
    drafter.json, drafter.safetensors and train_report.json (``tokens_per_iteration``: the
    held-out Tok.).
    """
    from aggdec.export.train_drafter import TrainOptions, train_drafter

    cache_root = Path(request.config.cache.mkdir(DRAFTER_CACHE_KEY))
    out = cache_root / "drafter"
    verifier = _sha256(editing_marian_dir / "model.safetensors")
    with _trained_once(cache_root):
        marker = out / _COMPLETE_MARKER
        if marker.is_file() and json.loads(marker.read_text()).get("verifier_sha256") == verifier:
            return out
        if out.exists():
            shutil.rmtree(out)  # interrupted run, or trained for another verifier
        rng = random.Random("editing-drafter-sources")
        sources = cache_root / "sources.txt"
        sources.write_text("".join(tiny.make_editing_pair(rng)[0] + "\n" for _ in range(DRAFTER_SOURCES)))
        options = TrainOptions(k=DRAFTER_K, window=DRAFTER_WINDOW, layers=2, steps=DRAFTER_STEPS, warmup_steps=50, heldout=DRAFTER_HELDOUT)
        with tiny._torch_threads(1):  # see _torch_threads: one thread is the robust choice on shared cores
            report = train_drafter(editing_marian_dir, sources, out, options, progress=False)
        marker.write_text(json.dumps({"verifier_sha256": verifier, "tokens_per_iteration":
                                      report["tokens_per_iteration"]}) + "\n")
        return out


@pytest.fixture(scope="session")
def drafter_bundle(tmp_path_factory: pytest.TempPathFactory, random_checkpoint: Callable[..., Path]
                   ) -> Callable[..., tuple[Path, Path]]:
    """Factory ``(family, name, make_drafter) -> (bundle, drafter directory)``: the random
    checkpoint of ``family`` exported with the drafter ``make_drafter(model)`` returns (``model``:
    the checkpoint in transformers), built once per (family, name) a session."""
    made: dict[tuple[str, str], tuple[Path, Path]] = {}

    def make(family: str, name: str, make_drafter: Callable) -> tuple[Path, Path]:
        if (family, name) not in made:
            from transformers import AutoModelForSeq2SeqLM

            from aggdec.export import export_bundle

            root = tmp_path_factory.mktemp(f"{name}-{family}")
            make_drafter(AutoModelForSeq2SeqLM.from_pretrained(random_checkpoint(family))).eval().save(root / "drafter")
            export_bundle(random_checkpoint(family), root / "bundle", drafter_dir=root / "drafter", progress=None)
            made[(family, name)] = (root / "bundle", root / "drafter")
        return made[(family, name)]

    return make
