"""The wheel maps export/, runtime/, engines/ to aggdec.* and works when installed alone."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# These builds write build/ and *.egg-info in the source tree (as test_gpu_extra's does): under
# `pytest -n`, one worker runs them all, one at a time.
pytestmark = pytest.mark.xdist_group("source-tree")


def test_wheel_installs_and_imports(tmp_path, bundle):
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr
    wheel = next(dist.glob("aggdec-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("aggdec/__init__.py", "aggdec/cli/__init__.py", "aggdec/cli/generate.py", "aggdec/runtime/generator.py",
                   "aggdec/runtime/decoding/iad.py", "aggdec/export/pipeline.py", "aggdec/engines/__init__.py"):
        assert module in names
    assert not any(name.startswith(("tests/", "runtime/", "export/")) for name in names)
    assert "aggdec/py.typed" in names  # PEP 561: type checkers read aggdec's hints
    # the cache edit graphs CUDA batches run (package data: the runtime cannot build them)
    graphs = "aggdec/runtime/decoding/edit_graphs"
    assert {f"{graphs}/copy_64.onnx", f"{graphs}/pad_float16.onnx"} <= set(names)
    license_text = (ROOT / "LICENSE").read_text()
    licenses = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
    assert licenses and zipfile.ZipFile(wheel).read(licenses[0]).decode() == license_text
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text

    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, install.stderr
    script = (
        "import aggdec, sys; from aggdec import Generator;"
        f"r = Generator({str(bundle('marian'))!r}).generate(['w1 w2'], mode='iad', max_new_tokens=5)[0];"
        "print(aggdec.__file__)"
    )
    # -I: isolated mode, so neither the repository nor the editable install is on the path
    run = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {script}"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().startswith(str(target))


def test_the_sdist_carries_the_license_and_the_changelog(tmp_path):
    import tarfile

    build = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--skip-dependency-check", "--outdir", str(tmp_path),
                            str(ROOT)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    with tarfile.open(next(tmp_path.glob("aggdec-*.tar.gz"))) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "aggdec/py.typed", "runtime/decoding/edit_graphs/copy_1.onnx"} <= names
