"""benchmarks/gpu/: the GPU check's dry run, so that the script a GPU session runs cannot rot.

The dry run is check.sh with ``--dry-run``: every stage, for real, on the CPU provider, with a
tiny random Marian and a random drafter (tests/support) as the model: export and fp16
conversion, pytest -m gpu (everything skips without a GPU), the device-vs-CPU comparison in
every exact mode at two batch sizes, the block-vs-alone check and fp16 modes against fp16
greedy, the verifier call timed as bound, and aggdec bench; then the report and the tarball a
GPU call hands back. What cannot run without a GPU (onnxruntime-gpu, CUDA graphs) is said so
in the stages' notes, which the test checks too. carry.py's parts are put back together from
real files, and a real (tiny) wheel is installed from them.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.runtime.test_lossless import random_texts

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"


def _module(name: str):
    """benchmarks/gpu/NAME.py as a module: the folder holds scripts, which import each other as
    top-level modules (as they do when run from there)."""
    if str(GPU) not in sys.path:
        sys.path.insert(0, str(GPU))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, random_checkpoint) -> Path:
    """A tiny random Marian with a random drafter beside it, laid out as the reference models are
    (CHECKPOINT/../drafter, which the export stage looks for)."""
    from transformers import AutoModelForSeq2SeqLM

    from aggdec.export.drafter import new_drafter_from_verifier

    root = tmp_path_factory.mktemp("tiny-gpu-check")
    shutil.copytree(random_checkpoint("marian"), root / "model")
    model = AutoModelForSeq2SeqLM.from_pretrained(root / "model")
    new_drafter_from_verifier(model, layers=2, k=8, seed=1).eval().save(root / "drafter")
    return root / "model"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, tiny_model):
    """One dry-run call of check.sh with every stage; (return code, output, results dir, $OUT)."""
    root = tmp_path_factory.mktemp("dry-run")
    data = root / "data.txt"
    data.write_text("\n".join(random_texts(seed=31, count=10)) + "\n")
    env = {**os.environ, "GPU_CHECK_WORK": str(root / "work"), "PYTHON": sys.executable, "OUT": str(root / "out")}
    done = subprocess.run(["bash", str(GPU / "check.sh"), "--dry-run", "--model", f"tiny={tiny_model}",
                           "--data", str(data)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr, root / "work" / "results", root / "out"


@pytest.mark.slow  # the dry run: about a minute of CPU, once for the module
def test_every_stage_runs_and_passes(dry_run):
    code, output, results, _ = dry_run
    assert code == 0, output
    stages = json.loads((results / "check.json").read_text())["stages"]
    assert {name: stage["status"] for name, stage in stages.items()} == {
        name: "ok" for name in ("env", "export", "pytest", "equality", "fp16", "graphs", "bench", "edits",
                                "cudagraphs")}, output


@pytest.mark.slow
def test_env_reports_onnxruntime_and_no_gpu(dry_run):
    env = json.loads((dry_run[2] / "check-env.json").read_text())
    assert env["onnxruntime"]["available_providers"]
    assert env["session_probe"]["providers"] == ["CPUExecutionProvider"]
    assert env["gpu"]["name"] is None or shutil.which("nvidia-smi")
    assert {m["module"] for m in env["modules"]} >= {"numpy", "tokenizers", "onnxruntime", "torch", "ctranslate2"}
    assert env["environment"]["NVIDIA_TF32_OVERRIDE"] == "0"  # check.sh turns TF32 off for every stage


@pytest.mark.slow
def test_device_equals_cpu_in_every_exact_mode_and_batch(dry_run):
    equality = json.loads((dry_run[2] / "check-equality.json").read_text())
    section = equality["bundles"]["tiny"]
    assert section["sentences"] == 11  # random_texts(count=10) gives 11 texts
    assert {(run["mode"], run["batch_size"]) for run in section["runs"]} == {
        (mode, batch) for mode in ("greedy", "iad", "gad") for batch in (1, 4)}
    for run in section["runs"]:
        assert run["vs_cpu_greedy"]["equal"] == run["vs_cpu_greedy"]["sentences"] == 11, run


@pytest.mark.slow
def test_fp16_block_vs_alone_and_modes_equal_fp16_greedy(dry_run):
    section = json.loads((dry_run[2] / "check-fp16.json").read_text())["bundles"]["tiny"]
    for precision in ("fp32", "fp16"):
        for key in ("block_vs_alone", "block_vs_alone_static"):  # as the runtime calls it, and at one shape
            checked = section[key][precision]
            assert checked["bitwise_equal"] and checked["positions"] > 100, (key, checked)
    assert {(run["mode"], run["batch_size"]) for run in section["runs"]} == {
        ("iad", 1), ("gad", 1), ("greedy", 4), ("iad", 4), ("gad", 4)}
    assert all(run["vs_fp16_greedy"]["equal"] == section["sentences"] for run in section["runs"])
    assert section["fp16_greedy_vs_fp32_cpu_greedy"]["sentences"] == section["sentences"]


@pytest.mark.slow
def test_graphs_stage_times_the_call_and_says_cuda_graphs_need_cuda(dry_run):
    graphs = json.loads((dry_run[2] / "check-graphs.json").read_text())
    assert any("not applicable on cpu" in note for note in graphs["notes"])
    assert graphs["wired_into_runtime"] is True  # Generator(cuda_graphs=True); the cudagraphs stage decodes with it
    for key in ("tiny-fp32", "tiny-fp16"):
        shapes = graphs["bundles"][key]
        assert [(s["rows"], s["tokens"]) for s in shapes] == [(1, 1), (1, 16), (8, 1), (32, 1)]
        assert all(s["runtime_style_ms"] > 0 and s["all_bound_ms"] > 0 and "cuda_graph_ms" not in s for s in shapes)
        assert all(s["all_bound_equals_runtime_style"] is True for s in shapes)


@pytest.mark.slow
def test_cudagraphs_stage_compares_fixed_calls_with_the_static_path(dry_run):
    """On the CPU there are no CUDA graphs: the stage decodes with the fixed calls they replay
    (every input and output bound once) against the static path, and says so."""
    record = json.loads((dry_run[2] / "check-cudagraphs.json").read_text())
    assert record["cuda_graphs"] is False
    assert any("CUDA graphs need onnxruntime's CUDA provider" in note for note in record["notes"])
    for key in ("tiny-fp32", "tiny-fp16"):
        section = record["bundles"][key]
        assert {(run["mode"], run["batch_size"]) for run in section["runs"]} == {
            (mode, batch) for mode in ("greedy", "iad", "gad") for batch in (1, 4)}
        for run in section["runs"]:
            assert run["vs_static_plain"]["equal"] == run["vs_static_plain"]["sentences"] == section["sentences"] > 0
            assert run["seconds"]["plain"] > 0 and run["seconds"]["graphs"] > 0
            assert run["encoder_seconds"]["plain"] > 0 and run["encoder_seconds"]["graphs"] > 0  # its fixed call's too
        assert section["fixed_calls_made"] >= 2 and section["graph_refused_at_run"] is None
    report = (dry_run[2] / "README.md").read_text()
    assert "CUDA graphs in the decode loop == static shapes without them" in report


@pytest.mark.slow
def test_edits_stage_times_host_and_device_edits_and_compares_them(dry_run):
    """Both edit paths ran (CPU onnxruntime values in the dry run) at each batch size and for
    beams, gave the same outputs, and the report has their table."""
    code, output, results, _ = dry_run
    edits = json.loads((results / "check-edits.json").read_text())
    runs = edits["bundles"]["tiny"]["runs"]
    assert [(r["batch_size"], r.get("num_beams", 1)) for r in runs] == [(1, 1), (4, 1), (4, 4)], output
    for run in runs:
        assert run["graphs_vs_host"]["equal"] == run["graphs_vs_host"]["sentences"] > 0
        assert all(run["sentences_per_second"][path] > 0 for path in ("host", "graphs"))
    assert "## Cache edits: through the host against on the device" in (results / "README.md").read_text()


@pytest.mark.slow
def test_bench_runs_fp32_and_fp16_systems_and_writes_its_report(dry_run):
    results = dry_run[2]
    section = json.loads((results / "check-bench.json").read_text())["bundles"]["tiny"]
    rows = {(f["system"], f["batch_size"]) for f in section["figures"]}
    assert rows == {(s, b) for s in ("aggdec-greedy", "aggdec-iad", "aggdec-gad", "aggdec-fp16-greedy",
                                     "aggdec-fp16-iad", "aggdec-fp16-gad") for b in (1, 4)}
    assert all(f["exact_match_vs_greedy"] == 1.0 for f in section["figures"])
    assert (results / "bench-tiny" / "bench.json.gz").is_file() and (results / "bench-tiny" / "bench.md").is_file()
    assert not (results / "bench-tiny" / "outputs").exists()  # kept in WORK, not in what is committed


@pytest.mark.slow
def test_pytest_stage_ran_the_gpu_tests_which_skip_here(dry_run):
    record = json.loads((dry_run[2] / "check-pytest.json").read_text())
    assert record["returncode"] == 0
    assert record["counts"]["tests"] > 0 and record["counts"]["skipped"] == record["counts"]["tests"]


@pytest.mark.slow
def test_results_come_back_as_one_tarball_in_the_committed_layout(dry_run):
    _, _, results, out = dry_run
    assert sorted(p.name for p in out.iterdir()) == ["check.log", "results.tar.gz", "summary.md"]
    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
    for name in ("README.md", "check.json", "check-env.json", "check-equality.json", "bench-tiny/bench.md",
                 "pytest-gpu.log"):
        assert f"gpu-check-dry-run/{name}" in names
    readme = (results / "README.md").read_text()
    assert "A dry run on the CPU" in readme and "| equality | ok |" in readme


@pytest.mark.slow
def test_a_later_call_runs_one_bundle_again_and_keeps_the_earlier_records(dry_run, tiny_model):
    """`equality --only tiny` in a later call: its own record beside the first, and a call after it
    sets that record aside; `carry` alone runs nothing."""
    _, _, results, out = dry_run
    work = results.parent
    env = {**os.environ, "GPU_CHECK_WORK": str(work), "PYTHON": sys.executable, "OUT": str(out)}
    common = ["--dry-run", "--model", f"tiny={tiny_model}", "--data", str(work.parent / "data.txt")]
    again = subprocess.run(["bash", str(GPU / "check.sh"), "equality", "--only", "tiny", *common], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    record = json.loads((results / "check-equality-tiny.json").read_text())
    assert record["stage"] == "equality" and record["status"] == "ok" and set(record["bundles"]) == {"tiny"}
    assert (results / "check-equality.json").is_file()
    # the same stage again: the earlier record (and its log) set aside in replaced/, not lost
    twice = subprocess.run(["bash", str(GPU / "check.sh"), "equality", "--only", "tiny", *common], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert twice.returncode == 0, twice.stdout + twice.stderr
    kept = sorted((results / "replaced").glob("check-equality-tiny.*.json"))
    assert [json.loads(path.read_text()) for path in kept] == [record]
    assert sorted((results / "replaced").glob("equality-tiny.*.log"))
    assert json.loads((results / "check-equality-tiny.json").read_text())["status"] == "ok"
    nothing = subprocess.run(["bash", str(GPU / "check.sh"), "carry", *common], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    assert nothing.returncode == 0 and "== equality" not in nothing.stdout, nothing.stdout + nothing.stderr
    readme = (results / "README.md").read_text()
    assert "| equality | ok |" in readme and "| equality-tiny | ok |" in readme
    # a bundle exported elsewhere and carried: registered, checked, converted (here: reused) to fp16
    exported = json.loads((work / "bundles.json").read_text())["tiny"]["bundle"]
    given = subprocess.run(["bash", str(GPU / "check.sh"), "export", "--only", "given", "--bundle",
                            f"given={exported}", *common], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert given.returncode == 0, given.stdout + given.stderr
    entry = json.loads((work / "bundles.json").read_text())["given"]
    assert entry["bundle"] == exported and entry["checkpoint"] is None and entry["drafter"] and "fp16" in entry


@pytest.mark.slow
def test_static_shapes_equality_and_fp16_compare_every_mode_with_static_greedy(dry_run, tiny_model):
    """`--static-shapes equality fp16` in a later call: records of their own beside the ordinary
    ones, every mode at each batch compared with static greedy at that batch."""
    _, _, results, out = dry_run
    work = results.parent
    env = {**os.environ, "GPU_CHECK_WORK": str(work), "PYTHON": sys.executable, "OUT": str(out)}
    done = subprocess.run(["bash", str(GPU / "check.sh"), "equality", "fp16", "--static-shapes", "--dry-run", "--model",
                           f"tiny={tiny_model}", "--data", str(work.parent / "data.txt")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for stage, against in (("equality", "cpu_greedy"), ("fp16", "fp16_greedy")):
        record = json.loads((results / f"check-{stage}-static.json").read_text())
        assert record["status"] == "ok", record["notes"]
        section = record["bundles"]["tiny-static"]
        assert section["static_shapes"]["width"] > 2
        runs = section["runs"]
        assert {(run["mode"], run["batch_size"]) for run in runs} == {
            (mode, batch) for mode in ("greedy", "iad", "gad") for batch in (1, 4)}
        for run in runs:
            checked = run["vs_static_greedy"] if run["mode"] != "greedy" else run[f"static_greedy_vs_{against}"]
            assert checked["equal"] == checked["sentences"] == 11, (stage, run)  # the CPU: equal to greedy too
        assert (results / f"check-{stage}.json").is_file()  # the ordinary record stays
    readme = (results / "README.md").read_text()
    assert "| equality-static | ok |" in readme and "| equality | ok |" in readme
    # 88 decodes a bundle (2 stages x 2 modes x 2 batches x 11); an earlier test may have added one
    assert re.search(r"\| static shapes: every exact mode == static greedy at its batch \| (\d+)/\1 decodes \| yes",
                     readme), readme


@pytest.mark.slow
def test_without_pip_the_tree_is_linked_in_as_the_package(tmp_path):
    """check.sh's fallback when pip cannot install aggdec (GPU_CHECK_INSTALL=links forces it): the
    env stage imports aggdec from the links, and says it is no GPU check on the CPU."""
    env = {**os.environ, "GPU_CHECK_WORK": str(tmp_path), "PYTHON": sys.executable, "GPU_CHECK_INSTALL": "links"}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(GPU / "check.sh"), "env", "--device", "cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "results" / "check-env.json").read_text())
    aggdec = next(m for m in record["modules"] if m["module"] == "aggdec")
    assert aggdec["path"] == str(tmp_path / "src" / "aggdec")
    assert record["aggdec_install"].startswith(f"source links in {tmp_path / 'src'}")
    assert "device cpu: this is not a GPU check" in record["notes"]


def test_a_stage_without_time_left_is_skipped_with_a_note(tmp_path):
    done = subprocess.run([sys.executable, str(GPU / "check.py"), "--dry-run", "--work", str(tmp_path),
                           "--deadline-s", "30", "env", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for stage in ("env", "bench"):
        record = json.loads((tmp_path / "results" / f"check-{stage}.json").read_text())
        assert record["status"] == "skipped" and "not started" in record["notes"][0]


# ------------------------------------------------------------------ carry.py


def _tiny_wheel(folder: Path) -> Path:
    wheel = folder / "gpu_check_probe-0.1-py3-none-any.whl"
    info = "gpu_check_probe-0.1.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("gpu_check_probe/__init__.py", "VALUE = 42\n")
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: gpu-check-probe\nVersion: 0.1\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", f"gpu_check_probe/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n"
                                           f"{info}/RECORD,,\n")
    return wheel


def test_carried_parts_are_gathered_across_calls_then_unpacked(tmp_path):
    carry = _module("carry")
    source = tmp_path / "model"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(300_000))
    (source / "config.json").write_text("{}")
    repo, work = tmp_path / "repo", tmp_path / "work"
    archive_parts = carry.pack("base", [source], chunk_bytes=100_000, root=tmp_path / "packs")
    assert len(archive_parts) > 1  # 300 kB of random bytes in parts of 100 kB
    # the device's view: each call carries one folder under .gpu-pack/NAME/
    for index, folder in enumerate(archive_parts):
        call = repo / ".gpu-pack" / "base"
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(folder, call / folder.name)
        state = carry.stage(repo, work)["base"]
        if index < len(archive_parts) - 1:
            assert state["present"] == index + 1 and state["state"].startswith("waiting for part")
    assert state["state"].startswith("extracted into")
    assert (work / "carried" / "base" / "model" / "weights.bin").read_bytes() == (source / "weights.bin").read_bytes()
    assert carry.stage(repo, work)["base"]["state"] == state["state"]  # a later call does not unpack it again


def test_a_corrupt_part_is_refused_by_its_sha256(tmp_path):
    carry = _module("carry")
    payload = tmp_path / "blob.tar.gz"
    payload.write_bytes(os.urandom(50_000))
    folders = carry.split_file(payload, tmp_path / "cut", 20_000, {"name": "blob", "kind": "tar"})
    repo = tmp_path / "repo"
    for folder in folders:
        shutil.copytree(folder, repo / ".gpu-pack" / "blob" / folder.name)
    last = next((repo / ".gpu-pack" / "blob" / folders[-1].name).glob("part*"))
    data = last.read_bytes()
    last.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # one byte changed
    state = carry.stage(repo, tmp_path / "work")["blob"]
    assert state["error"] and "sha256 mismatch" in state["state"]


def test_a_wheel_carried_in_parts_is_installed_into_site(tmp_path):
    carry = _module("carry")
    chunks = tmp_path / ".ort-gpu"
    (chunks / "dl").mkdir(parents=True)
    wheel = _tiny_wheel(chunks / "dl")
    data = wheel.read_bytes()
    half = len(data) // 2 + 1
    for index, piece in enumerate((data[:half], data[half:])):  # as ort-gpu-chunks.sh leaves them
        (chunks / f"w{index + 1}").mkdir()
        (chunks / f"w{index + 1}" / f"part{index:02d}").write_bytes(piece)
    assert len(carry.describe_wheel(chunks)) == 2
    work = tmp_path / "work"
    state = carry.stage(tmp_path, work)["gpu-check-probe"]
    assert state["state"] == f"installed into {work / 'site'}", state
    probe = subprocess.run([sys.executable, "-c", "import gpu_check_probe; print(gpu_check_probe.VALUE)"],
                           env={**os.environ, "PYTHONPATH": str(work / "site")}, capture_output=True, text=True)
    assert probe.stdout.strip() == "42", probe.stderr


def _fatbin(images: list[tuple[int, bytes]]) -> bytes:
    """A fatbin as nvcc lays one out: its header, then per kernel image a 64-byte header (kind 2,
    cubin; the architecture at byte 28) and the payload."""
    import struct

    entries = b""
    for arch, payload in images:
        header = bytearray(64)
        struct.pack_into("<HHIQ", header, 0, 2, 0x101, 64, len(payload))
        struct.pack_into("<I", header, 28, arch)
        entries += bytes(header) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(entries)) + entries


def _elf_with_fatbins(fatbins: list[bytes]) -> bytes:
    """A 64-bit little-endian ELF file whose .nv_fatbin section holds ``fatbins`` (8-byte aligned,
    zero padding between, as in a CUDA library); nothing else in it is meant to run."""
    import struct

    section = b"".join(f + bytes(-len(f) % 8) for f in fatbins)
    names = b"\0.shstrtab\0.nv_fatbin\0"
    body_at = 64
    names_at = body_at + len(section)
    headers_at = (names_at + len(names) + 7) // 8 * 8
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, headers_at)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)

    def section_header(name: int, offset: int, size: int) -> bytes:
        entry = bytearray(64)
        struct.pack_into("<I", entry, 0, name)
        struct.pack_into("<QQ", entry, 0x18, offset, size)
        return bytes(entry)

    table = bytes(64) + section_header(1, names_at, len(names)) + section_header(11, body_at, len(section))
    return bytes(header) + section + names + bytes(headers_at - names_at - len(names)) + table


def test_slimming_keeps_the_chips_kernels_and_every_offset(tmp_path):
    slim = _module("slim_ort")
    sm80, sm90, sm120 = os.urandom(3000), os.urandom(2000), os.urandom(1000)
    library = _elf_with_fatbins([_fatbin([(80, sm80), (90, sm90)]), _fatbin([(120, sm120)])])
    data, zeroed = slim.keep_one_architecture(library, 90)
    assert len(data) == len(library) and zeroed == {80: 3000}
    assert library.replace(sm80, bytes(3000)) == bytes(data)  # sm_90 and the sm_120-only fatbin untouched
    with pytest.raises(slim.SlimError, match="no kernel image for sm_86"):
        slim.keep_one_architecture(library, 86)
    with pytest.raises(slim.SlimError, match="no .nv_fatbin section"):
        slim.keep_one_architecture(_elf_with_fatbins([])[:64] + bytes(64 * 3), 90)


def test_a_slimmed_package_is_carried_in_parts_and_unpacked_into_site(tmp_path):
    slim, carry = _module("slim_ort"), _module("carry")
    wheel = tmp_path / "probe_gpu-1.0-cp312-cp312-linux_x86_64.whl"
    cubin = os.urandom(40_000)
    library = _elf_with_fatbins([_fatbin([(75, os.urandom(40_000)), (90, cubin)])])
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("probe_gpu/__init__.py", "VALUE = 7\n")
        archive.writestr("probe_gpu/capi/libonnxruntime_providers_cuda.so", library)
        archive.writestr("probe_gpu/capi/libonnxruntime.so.1.31.1", b"left out")
        archive.writestr("probe_gpu-1.0.dist-info/METADATA", "Name: probe-gpu\n")
    packed = tmp_path / "site.tar.xz"
    done = slim.slim_wheel(wheel, packed, 90)
    assert done["left_out"] == ["probe_gpu/capi/libonnxruntime.so.1.31.1"] and done["zeroed_mib"] == {"sm_75": 0}
    folders = carry.pack_site("probe", packed, chunk_bytes=packed.stat().st_size // 2 + 1, root=tmp_path / "packs")
    assert len(folders) == 2
    repo, work = tmp_path / "repo", tmp_path / "work"
    for folder in folders:  # one part a call
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(folder, repo / ".gpu-pack" / "probe" / folder.name)
        state = carry.stage(repo, work)["probe"]
    assert state["state"] == f"unpacked into {work / 'site'}", state
    kept = (work / "site" / "probe_gpu" / "capi" / "libonnxruntime_providers_cuda.so").read_bytes()
    assert cubin in kept and len(kept) == len(library)
    assert not (work / "site" / "probe_gpu" / "capi" / "libonnxruntime.so.1.31.1").exists()
    probe = subprocess.run([sys.executable, "-c", "import probe_gpu; print(probe_gpu.VALUE)"],
                           env={**os.environ, "PYTHONPATH": str(work / "site")}, capture_output=True, text=True)
    assert probe.stdout.strip() == "7", probe.stderr


# ------------------------------------------------------------------ what a GPU run's findings look like


def test_a_difference_is_reported_with_where_it_starts():
    check = _module("check_stages")
    texts = ["a", "b", "c"]
    report = check.compare([[5, 6, 7], [5, 6, 9, 2], [1]], [[5, 6, 7], [5, 6, 8, 2], [1]], texts)
    assert report["equal"] == 2 and report["differing"] == [1]
    (example,) = report["examples"]
    assert example["index"] == 1 and example["source"] == "b" and example["first_difference_at_token"] == 2
    assert example["got"] == [5, 6, 9, 2] and example["want"] == [5, 6, 8, 2]
    shorter = check.compare([[5, 6]], [[5, 6, 7]], ["a"])["examples"][0]
    assert shorter["first_difference_at_token"] == 2  # one output is a prefix of the other
    # a result's ids (a tuple) against a reference read back from JSON (a list): equal when the tokens are
    assert check.compare([(5, 6, 7)], [[5, 6, 7]], ["a"]) == {"sentences": 1, "equal": 1, "differing": []}


def test_the_report_weighs_the_issue_targets():
    """From records as the stages write them: every equality and fp16 run summed, the bench's
    batch-1 speedups and batch-32 throughput, the CUDA-graph greedy call."""
    check = _module("check_report")

    def figure(system, batch, speedup, rate):
        return {"system": system, "batch_size": batch, "device": "cuda", "speedup_vs_aggdec_greedy": speedup,
                "sentences_per_second": rate}

    found = {
        "equality": {"stage": "equality", "bundles": {"m": {"runs": [
            {"vs_cpu_greedy": {"equal": 10, "sentences": 10}}, {"vs_cpu_greedy": {"equal": 9, "sentences": 10}}]}}},
        "fp16": {"stage": "fp16", "bundles": {"m": {"runs": [{"vs_fp16_greedy": {"equal": 10, "sentences": 10}}]}}},
        "bench": {"stage": "bench", "bundles": {"m": {"figures": [
            figure("aggdec-greedy", 1, 1.0, 30.0), figure("aggdec-iad", 1, 8.5, 255.0),
            figure("aggdec-gad", 1, 3.0, 90.0), figure("aggdec-greedy", 32, 1.0, 330.0)]}}},
        "graphs": {"stage": "graphs", "bundles": {"m-fp32": [
            {"rows": 1, "tokens": 1, "cuda_graph_ms": 0.25, "all_bound_ms": 0.9, "runtime_style_ms": 1.0}]}},
    }
    rows = {goal: (measured, met) for goal, measured, met in check.targets(found, "cuda")}
    assert rows["cuda == CPU greedy, every exact mode and batch"] == ("19/20 decodes", "NO")
    assert rows["fp16 modes == fp16 greedy"] == ("10/10 decodes", "yes")
    assert rows["m: aggdec-iad >= 8x greedy at batch 1"] == ("8.5x", "yes")
    assert rows["m: aggdec-gad >= 4x greedy at batch 1"] == ("3.0x", "no")
    assert rows["m: greedy batch 32 >= 10x batch 1 throughput"] == ("11.00x", "yes")
    assert rows["m-fp32: greedy verifier call <= 0.3 ms with CUDA graphs"][1] == "yes"


def test_the_ctranslate2_probe_answers_in_a_process_of_its_own():
    check = _module("check_stages")
    usable, said = check.ct2_on_device("cpu")
    assert usable and said.startswith("ctranslate2 "), said  # the [bench] extra installs it
    if said.endswith(" 0 CUDA device(s)"):  # no GPU here: it is left out of a CUDA bench, saying why
        usable, said = check.ct2_on_device("cuda")
        assert not usable and "sees no CUDA device" in said


def test_a_later_finding_never_hides_a_worse_one():
    context = _module("check_context")
    assert context.worse("failed", "partial") == "failed" and context.worse("partial", "failed") == "failed"
    assert context.worse("ok", "partial") == "partial" and context.worse("error", "failed") == "error"
