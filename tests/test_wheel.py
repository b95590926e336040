"""The wheel maps export/, runtime/, engines/ to aggdec.* and works when installed alone."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
