"""CUDA execution provider with IO binding: the same outputs as the CPU. Skipped without a GPU."""

from __future__ import annotations

import onnxruntime
import pytest

from aggdec.runtime.generator import Generator
from tests.runtime.test_lossless import MAX_NEW, random_texts
from tests.support.traces import host_edit_log

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif("CUDAExecutionProvider" not in onnxruntime.get_available_providers(),
                       reason="needs onnxruntime-gpu and a CUDA GPU"),
]


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_cuda_matches_cpu(family, bundle):
    texts = random_texts(seed=5, count=12)
    cpu = Generator(bundle(family), device="cpu")
    cuda = Generator(bundle(family), device="cuda")
    for mode in ("greedy", "iad"):
        expected = [r.ids for r in cpu.generate(texts, mode=mode, max_new_tokens=MAX_NEW)]
        assert [r.ids for r in cuda.generate(texts, mode=mode, max_new_tokens=MAX_NEW)] == expected


def test_cuda_cache_stays_on_the_device(bundle):
    """The verifier's buffers are device allocations, bound by pointer and written in place."""
    import numpy as np

    generator = Generator(bundle("marian"), device="cuda")
    batch = generator.verifier.batch(1, bound=True)
    batch.admit(generator.encode(["w1 w2 w3"]), generator.manifest.pad_token_id)
    batch.verify(np.array([[generator.manifest.decoder_start_token_id]], dtype=np.int64))
    assert batch.buffers.device == "cuda"
    assert all(flat.on_device for flat in batch.buffers._self)


def test_cuda_cache_edits_stay_on_the_device(bundle, monkeypatch):
    """Rows finishing and joining (batch 4 over 12 texts), capacity growth and beam reorders on
    CUDA: every edit ran the device edit graphs (device_edits.py), none copied a whole buffer
    through the host (_Flat.edit on a device buffer), and the output is the CPU's; the old host
    edits (DEVICE_EDITS = "host", the GPU check's baseline) give it too."""
    from aggdec.runtime.decoding import cache
    from aggdec.runtime.decoding.device_edits import edit_graphs

    texts = random_texts(seed=6, count=12)
    options = dict(max_new_tokens=MAX_NEW, batch_size=4)
    cpu = Generator(bundle("marian"), device="cpu")
    expected = [r.ids for r in cpu.generate(texts, mode="greedy", **options)]
    beams = [[h.ids for h in r.sequences] for r in cpu.generate(texts[:4], num_beams=3, **options)]
    host_edits = host_edit_log(monkeypatch)
    cuda = Generator(bundle("marian"), device="cuda")
    before = (edit_graphs("cuda").copy_runs, edit_graphs("cuda").pad_runs)
    assert [r.ids for r in cuda.generate(texts, mode="greedy", **options)] == expected
    assert [[h.ids for h in r.sequences] for r in cuda.generate(texts[:4], num_beams=3, **options)] == beams
    assert True not in host_edits, "a device buffer was edited through the host"
    assert edit_graphs("cuda").copy_runs > before[0] and edit_graphs("cuda").pad_runs > before[1]
    monkeypatch.setattr(cache, "DEVICE_EDITS", "host")
    assert [r.ids for r in cuda.generate(texts, mode="greedy", **options)] == expected
    assert True in host_edits


def test_bench_runs_cpu_and_gpu_side_by_side(bundle, tmp_path):
    """`aggdec bench --device cpu cuda`: both columns, the CPU-vs-GPU plot, GPU outputs = CPU greedy;
    the int8 systems on the CPU only, with a note for cuda."""
    import json
    import subprocess
    import sys

    data = tmp_path / "data.txt"
    data.write_text("\n".join(random_texts(seed=9, count=6)) + "\n")
    done = subprocess.run([sys.executable, "-m", "aggdec", "bench", str(bundle("marian")), "--data", str(data),
                           "--systems", "aggdec-greedy", "aggdec-iad", "aggdec-int8-iad", "--device", "cpu", "cuda",
                           "--batch-size", "1", "--max-new-tokens", str(MAX_NEW), "--out", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work"), "--no-progress"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    rows = {(r["system"], r["device"]): r for r in report["summary"]["rows"]}
    assert set(rows) == {(s, d) for s in ("aggdec-greedy", "aggdec-iad") for d in ("cpu", "cuda")} | {
        ("aggdec-int8-greedy", "cpu"), ("aggdec-int8-iad", "cpu")}
    assert rows[("aggdec-iad", "cuda")]["exact_match_vs_greedy"] == 1.0
    assert rows[("aggdec-int8-iad", "cpu")]["exact_match_vs_greedy"] == 1.0
    skipped = "aggdec-int8-iad on cuda skipped: int8 bundles run on cpu only"
    assert any(note.startswith(skipped) for note in report["notes"])
    assert "cpu_vs_gpu.png" in report["plots"]


def test_cuda_sessions_run_without_tf32_unless_asked(bundle):
    """onnxruntime applied use_tf32=0 (the default) or 1 (tf32=True) to the CUDA provider."""
    default = Generator(bundle("marian"), device="cuda")
    assert default.provider_options["CUDAExecutionProvider"]["use_tf32"] == "0"
    fast = Generator(bundle("marian"), device="cuda", tf32=True)
    assert fast.provider_options["CUDAExecutionProvider"]["use_tf32"] == "1"
    assert fast.generate(["w1 w2 w3"], mode="iad", max_new_tokens=MAX_NEW)[0].ids  # it decodes


def test_no_plugin_ep_warning_on_cuda(bundle):
    """No "No registered plugin EP device found" line: aggdec passes no device_id option."""
    import subprocess
    import sys

    script = (f"from aggdec import Generator; g = Generator({str(bundle('marian'))!r}, device='cuda'); "
              "print(len(g.generate(['w1 w2'], mode='greedy', max_new_tokens=4)[0].ids))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "No registered plugin EP device" not in done.stderr + done.stdout


@pytest.mark.parametrize("family", ["marian", "bart"])
def test_cuda_graphs_equal_static_shapes_without_them(family, bundle):
    """Generator(cuda_graphs=True): each batch shape's verifier and encoder calls captured as CUDA
    graphs and replayed (decoding/fixed_calls.py), the same tokens as static shapes without graphs, every
    mode, at two batch sizes; a second decode replays the graphs the first captured."""
    texts = random_texts(seed=7, count=10)
    plain = Generator(bundle(family), device="cuda", static_shapes=True)
    graphs = Generator(bundle(family), device="cuda", static_shapes=True, cuda_graphs=True)
    assert graphs.cuda_graphs and graphs.cuda_graphs_refused is None, graphs.cuda_graphs_refused
    for batch_size in (1, 4):
        for mode in ("greedy", "iad"):
            options = dict(mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size)
            expected = [r.ids for r in plain.generate(texts, **options)]
            assert [r.ids for r in graphs.generate(texts, **options)] == expected, (mode, batch_size)
            made = graphs.verifier.fixed_calls.made
            assert [r.ids for r in graphs.generate(texts, **options)] == expected, (mode, batch_size)
            assert graphs.verifier.fixed_calls.made == made  # replayed: no new buffers, no new capture
    assert graphs.verifier.fixed_calls.refused is None
    # the encoder's calls too: each pooled call has its own, under its graph id (FixedEncoderCall)
    calls = [call for free in graphs.verifier.fixed_calls._free.values() for call in free]
    assert calls and all(call.encoder is not None and call.encoder.graph_id == call.graph_id for call in calls)
