"""`pip install 'aggdec[gpu]'` into a fresh environment gives onnxruntime's CUDA provider.

No GPU is needed: onnxruntime's provider list is fixed when the wheel is built, and the CUDA
libraries the provider links against come as nvidia-* wheels whose loading needs no device.
This downloads what a user downloads (onnxruntime-gpu and about 1.3 GB of CUDA and cuDNN
wheels) and takes a few minutes, hence `slow`; it needs the package index (pip's own).

Checked, in the fresh environment:
- onnxruntime-gpu is installed and the CPU-only onnxruntime is not (they ship the same module,
  and side by side one shadows the other: the bug this extra had), and `pip check` is clean;
- `onnxruntime.get_available_providers()` lists CUDAExecutionProvider;
- after aggdec's preload (`onnxruntime.preload_dlls`), the CUDA provider library resolves every
  library it links against except the NVIDIA driver's libcuda.so.1, which no wheel provides;
- the CUDA provider options aggdec passes (`use_tf32`) are option names this build parses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("source-tree"),  # builds in the source tree (build/, *.egg-info), as test_wheel does
    pytest.mark.skipif(sys.version_info < (3, 11), reason="onnxruntime-gpu >= 1.27 needs Python 3.11+"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks Linux shared libraries"),
]

PROBE = textwrap.dedent("""
    import ctypes, importlib.metadata as md, json, os, re
    found = {}
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    import onnxruntime
    from aggdec.runtime.session import cuda_provider_options, preload_cuda_libraries
    said = preload_cuda_libraries()
    capi = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
    provider = os.path.join(capi, "libonnxruntime_providers_cuda.so")
    try:
        ctypes.CDLL(provider)
        load_error = None
    except OSError as exc:
        load_error = str(exc)
    binary = open(provider, "rb").read()
    loaded = sorted({os.path.basename(line.split()[-1]) for line in open("/proc/self/maps")
                     if "/nvidia/" in line and ".so" in line})
    print(json.dumps({
        "distributions": found,
        "providers": onnxruntime.get_available_providers(),
        "preload_said": said,
        "provider_load_error": load_error,
        "nvidia_libraries_loaded": loaded,
        "unknown_options": [k for k in cuda_provider_options(False) if k.encode() + b"\\0" not in binary],
    }))
""")


def run(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def test_the_gpu_extra_gives_the_cuda_provider(tmp_path):
    dist = tmp_path / "dist"
    build = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT),
                timeout=300)
    assert build.returncode == 0, build.stderr
    wheel = next(dist.glob("aggdec-*.whl"))

    venv = tmp_path / "venv"
    made = run(sys.executable, "-m", "venv", str(venv), timeout=300)
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    env_note = f"(pip log: {tmp_path / 'pip.log'})"
    install = run(python, "-m", "pip", "install", "--quiet", "--log", str(tmp_path / "pip.log"),
                  f"aggdec[gpu] @ {wheel.as_uri()}")
    assert install.returncode == 0, install.stderr[-4000:] + env_note

    check = run(python, "-m", "pip", "check", timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr

    probe = subprocess.run([python, "-I", "-c", PROBE], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert probe.returncode == 0, probe.stderr
    report = json.loads(probe.stdout.strip().splitlines()[-1])

    assert "onnxruntime-gpu" in report["distributions"], report
    assert "onnxruntime" not in report["distributions"], report  # the CPU package would shadow it
    assert "CUDAExecutionProvider" in report["providers"], report
    # every CUDA and cuDNN library came from the wheels: nothing failed to load
    assert not [line for line in report["preload_said"] if "ailed" in line], report["preload_said"]
    for library in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libcudnn.so.9"):
        assert library in report["nvidia_libraries_loaded"], report
    # The provider library links cuBLAS(Lt), cuRAND, the CUDA runtime, then the driver, in that
    # order; the dynamic loader stops at the first it cannot find. Here (no driver) that must be
    # libcuda.so.1 and nothing before it; with a driver it loads.
    error = report["provider_load_error"]
    assert error is None or "libcuda.so.1" in error, error
    assert report["unknown_options"] == [], report
