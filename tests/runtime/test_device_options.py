"""Device options that need no GPU to check: the CUDA provider options aggdec builds (TF32 off,
no device_id), refusals, the diagnosis of a shadowed onnxruntime-gpu, a runtime without
onnxruntime, and the warm-up that keeps first-call costs out of the timings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from aggdec.runtime.errors import ProviderError
from aggdec.runtime.generator import Generator
from aggdec.runtime.session import (
    check_device,
    cuda_provider_options,
    default_threads,
    installed_onnxruntime_distributions,
    missing_cuda_message,
    providers_for,
)


def test_cuda_providers_turn_tf32_off_and_pass_no_device_id():
    assert providers_for("cuda") == [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    assert providers_for("cuda", tf32=True)[0] == ("CUDAExecutionProvider", {"use_tf32": "1"})
    # a device_id option makes onnxruntime >= 1.26 warn about plugin EP devices on every session
    assert "device_id" not in cuda_provider_options(False) and "device_id" not in cuda_provider_options(True)
    assert providers_for("cpu") == ["CPUExecutionProvider"]


@pytest.mark.parametrize("call, needle", [
    (lambda: providers_for("cpu", tf32=True), "tf32 applies to device 'cuda' only"),
    (lambda: providers_for("tpu"), "unknown device 'tpu'"),
    (lambda: cuda_provider_options("yes"), "tf32 must be True or False"),
])
def test_bad_device_options_are_refused(call, needle):
    with pytest.raises(ProviderError, match=needle):
        call()


def test_tf32_on_the_cpu_is_refused_before_the_bundle_is_read(tmp_path):
    with pytest.raises(ProviderError, match="tf32 applies to device 'cuda' only"):
        Generator(tmp_path / "no-such-bundle", device="cpu", tf32=True)


def test_cuda_without_its_provider_says_how_to_get_it():
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has the CUDA provider")
    with pytest.raises(ProviderError, match=r"aggdec\[gpu\]"):
        check_device("cuda")


def test_a_shadowed_onnxruntime_gpu_is_diagnosed_with_the_fix():
    both = missing_cuda_message(["AzureExecutionProvider", "CPUExecutionProvider"],
                                ["onnxruntime 1.32.0", "onnxruntime-gpu 1.31.1"])
    assert "side by side" in both
    assert "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'aggdec[gpu]'" in both
    alone = missing_cuda_message(["CPUExecutionProvider"], ["onnxruntime 1.32.0"])
    assert "side by side" not in alone and "aggdec[gpu]" in alone
    # what this environment really has: one distribution ([cpu] in CI, [gpu] on a GPU machine)
    assert len(installed_onnxruntime_distributions()) == 1, installed_onnxruntime_distributions()


def test_the_runtime_without_onnxruntime_imports_and_says_which_extra(bundle):
    """`import aggdec` works without onnxruntime; making a Generator is one clear error."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["onnxruntime"] = None  # as if neither aggdec[cpu] nor aggdec[gpu] were installed
        import aggdec
        from aggdec import Generator, AggdecError
        try:
            Generator({str(bundle('marian'))!r})
        except AggdecError as exc:
            print(exc)
        from aggdec.cli import main
        sys.exit(main(["generate", {str(bundle('marian'))!r}, "--input", "/dev/null"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "onnxruntime, which is not installed" in done.stdout and "aggdec[cpu]" in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("aggdec: error:") and "aggdec[gpu]" in lines[0], done.stderr


def test_warm_up_decodes_and_leaves_the_counters_alone(bundle):
    generator = Generator(bundle("marian"))
    cold = Generator(bundle("marian"))
    before = generator.graph_seconds
    for mode in ("greedy", "iad"):
        assert generator.warm_up(mode, batch_size=4) > 0
    assert generator.graph_seconds == before
    texts = ["w1 w2 w3 w4", "w5 w6"]
    assert ([r.ids for r in generator.generate(texts, mode="iad", max_new_tokens=12)]
            == [r.ids for r in cold.generate(texts, mode="iad", max_new_tokens=12)])
    with pytest.raises(ValueError, match="unknown mode"):
        generator.warm_up("beam")


def test_provider_options_are_what_onnxruntime_applied(bundle):
    generator = Generator(bundle("marian"))
    assert "CPUExecutionProvider" in generator.provider_options
    assert generator.tf32 is False


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs CPU affinity and at least two CPUs")
def test_a_process_pinned_to_one_cpu_gets_one_onnxruntime_thread_per_graph(bundle):
    """onnxruntime sizes its default intra-op pool from the machine, not from the affinity mask:
    pinned to one CPU, every graph would start a pool of spinning threads sharing that CPU. With
    no ``threads`` given the runtime asks for one thread per usable CPU, so opening a Generator
    starts no onnxruntime thread (a pool of one is the calling thread)."""
    script = textwrap.dedent(f"""
        import os
        from aggdec.runtime.session import default_threads
        os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})
        from aggdec.runtime.generator import Generator
        Generator({str(bundle("marian"))!r}, threads=1)  # the threads any first Generator starts
        before = len(os.listdir("/proc/self/task"))
        generator = Generator({str(bundle("marian"))!r})
        started = len(os.listdir("/proc/self/task")) - before
        assert default_threads() == 1 and started == 0, (default_threads(), started)
        assert generator.generate(["w1 w2"], max_new_tokens=4)[0].ids
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_default_threads_follow_the_affinity_mask_only_when_it_is_narrower(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert default_threads() is None  # the whole machine: onnxruntime's default (per physical core)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 4}, raising=False)
    assert default_threads() == 2  # a container's cpuset of two CPUs on a 16-CPU host
