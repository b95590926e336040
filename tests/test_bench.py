"""`aggdec bench`, run as users run it: the real CLI, real workers, real peers where installed,
on the committed UA-GEC reference model and real learner sentences."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from aggdec.bench.scoring import edit_distance, edit_ratio, score
from aggdec.runtime.generator import Generator
from tests.test_cli import aggdec, assert_one_clean_error

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "benchmarks" / "models" / "uagec" / "model"
SAMPLE = ROOT / "examples" / "uagec_test_sample.tsv"
SENTENCES = 12

pytestmark = pytest.mark.slow


def _has(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def bench_run(reference_bundle, tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    data = root / "data.tsv"
    data.write_text("\n".join(SAMPLE.read_text(encoding="utf-8").splitlines()[:SENTENCES]) + "\n", encoding="utf-8")
    systems = ["aggdec-greedy", "aggdec-iad", "aggdec-gad", "aggdec-gad++", "aggdec-int8-iad", "aggdec-int8-gad",
               "hf-greedy", "ct2-fp32", "ct2-int8"]  # aggdec-int8-greedy comes with the int8 modes, as their reference
    result = aggdec("bench", str(reference_bundle), "--checkpoint", str(MODEL), "--data", str(data),
                    "--systems", *systems, "--batch-size", "1", "4", "--out", str(root / "out"),
                    "--work", str(root / "work"), "--no-progress")
    return result, root, data


def test_bench_writes_every_figure_for_every_system(bench_run):
    result, root, _ = bench_run
    assert result.returncode == 0, result.stderr
    report = json.loads((root / "out" / "bench.json").read_text())
    rows = {(r["system"], r["batch_size"]): r for r in report["summary"]["rows"]}
    expected = {(system, size) for system in ("aggdec-greedy", "aggdec-iad", "aggdec-gad", "aggdec-gad++",
                                              "aggdec-int8-greedy", "aggdec-int8-iad", "aggdec-int8-gad", "hf-greedy")
                for size in (1, 4)}  # every aggdec mode batches, int8 too
    if _has("ctranslate2"):
        expected |= {("ct2-fp32", 1), ("ct2-fp32", 4), ("ct2-int8", 1), ("ct2-int8", 4)}
    else:
        assert any("ct2-fp32 skipped" in note for note in report["notes"])
    assert set(rows) == expected
    for row in rows.values():
        assert row["sentences"] == SENTENCES
        assert 0 < row["latency_ms"]["median"] <= row["latency_ms"]["p90"]
        assert row["sentences_per_second"] > 0 and row["peak_rss_mib"] > 0 and row["rss_after_load_mib"] > 0
        if row["batch_size"] == 1:
            assert "f0.5" in row["gec"] and "gec_a2" not in row  # the sample has one annotator
    assert len(report["latencies"]["aggdec-greedy@cpu"]) == SENTENCES
    assert report["environment"]["threads"] == 1 and report["environment"]["versions"]["onnxruntime"]
    assert report["config"]["command"].startswith("aggdec bench ")


def test_bench_confirms_lossless_modes_and_transformers_equal_greedy(bench_run):
    result, root, _ = bench_run
    rows = {(r["system"], r["batch_size"]): r for r in json.loads((root / "out" / "bench.json").read_text())["summary"]["rows"]}
    for key in [("aggdec-greedy", 4), ("aggdec-iad", 1), ("aggdec-gad", 1), ("hf-greedy", 1), ("hf-greedy", 4),
                ("aggdec-int8-greedy", 4), ("aggdec-int8-iad", 1), ("aggdec-int8-iad", 4), ("aggdec-int8-gad", 1)]:
        assert rows[key]["exact_match_vs_greedy"] == 1.0, key
    for (system, _), row in rows.items():
        int8 = "int8" in system and system.startswith("aggdec")
        assert row["greedy_reference"] == ("aggdec-int8-greedy" if int8 else "aggdec-greedy"), system
    # IAD on a mostly-copying model verifies whole blocks of the source per call
    split = rows[("aggdec-iad", 1)]["time_split"]
    assert split["tokens_per_iteration"] >= 3
    assert split["seconds"]["verifier"] > 0 and split["seconds"]["drafter"] == 0
    assert rows[("aggdec-gad", 1)]["time_split"]["seconds"]["drafter"] > 0


def test_bench_outputs_are_the_runtimes_outputs(bench_run, reference_bundle):
    """The worker reports what the runtime decodes, line for line with the data."""
    _, root, data = bench_run
    sources = [line.split("\t")[0] for line in data.read_text(encoding="utf-8").splitlines()]
    expected = [r.text for r in Generator(reference_bundle).generate(sources, mode="greedy", batch_size=1)]
    written = (root / "out" / "outputs" / "aggdec-greedy-cpu.txt").read_text(encoding="utf-8").splitlines()
    assert written == expected
    int8 = Path(json.loads((root / "out" / "bench.json").read_text())["config"]["converted_bundles"]["int8"])
    expected = [r.text for r in Generator(int8).generate(sources, mode="greedy", batch_size=1)]
    written = (root / "out" / "outputs" / "aggdec-int8-greedy-cpu.txt").read_text(encoding="utf-8").splitlines()
    assert written == expected


def test_int8_systems_run_the_quantized_bundle_and_are_reported_against_fp32(bench_run, reference_bundle):
    from aggdec.runtime.manifest import load_manifest

    _, root, _ = bench_run
    report = json.loads((root / "out" / "bench.json").read_text())
    config = report["config"]
    assert Path(config["converted_bundles"]["int8"]).parent == (root / "work").resolve()
    assert load_manifest(config["converted_bundles"]["int8"]).precision == "int8"
    assert config["quantize_seconds"]["int8"] > 0  # a fresh work directory: quantized in this run
    rows = {(r["system"], r["batch_size"]): r for r in report["summary"]["rows"]}
    for system in ("aggdec-int8-greedy", "aggdec-int8-iad", "aggdec-int8-gad"):
        assert rows[(system, 1)]["bundle_precision"] == "int8"  # what the worker loaded, by its own report
        assert rows[(system, 1)]["prepare_seconds"] == config["quantize_seconds"]["int8"]
    assert rows[("aggdec-iad", 1)]["bundle_precision"] == "fp32" and rows[("hf-greedy", 1)]["bundle_precision"] is None
    greedy = rows[("aggdec-int8-greedy", 1)]
    # speedups stay against fp32 greedy; int8 greedy's own is its gain from quantizing
    fp32_seconds = rows[("aggdec-greedy", 1)]["seconds"]
    assert greedy["speedup_vs_aggdec_greedy"] == pytest.approx(fp32_seconds / greedy["seconds"], rel=1e-2)
    int8 = next(e for e in report["summary"]["precisions"] if e["precision"] == "int8")
    assert (int8["device"], int8["reference"], int8["sentences"]) == ("cpu", "aggdec-int8-greedy", SENTENCES)
    assert int8["exact_match_vs_fp32_greedy"] == greedy["exact_match_vs_fp32_greedy"]
    assert int8["f0.5"] == greedy["gec"]["f0.5"] and int8["fp32_f0.5"] == rows[("aggdec-greedy", 1)]["gec"]["f0.5"]
    assert {m["system"]: m["counterpart"] for m in int8["systems"]} == {
        "aggdec-int8-greedy": "aggdec-greedy", "aggdec-int8-iad": "aggdec-iad", "aggdec-int8-gad": "aggdec-gad"}
    table = (root / "out" / "bench.md").read_text()
    assert "## int8 against fp32 (CPU, batch 1)" in table and "| aggdec int8 IAD | " in table
    assert f"int8 greedy equals fp32 greedy on {SENTENCES - int8['differing_from_fp32_greedy']} of {SENTENCES}" in table


def test_bench_markdown_plots_and_acceptance(bench_run):
    _, root, _ = bench_run
    report = json.loads((root / "out" / "bench.json").read_text())
    table = (root / "out" / "bench.md").read_text()
    assert "| aggdec IAD |" in table and "| transformers greedy |" in table and "batch 4" in table
    iad = report["summary"]["acceptance"]["aggdec-iad@cpu"]
    assert sum(b["sentences"] for b in iad["buckets"]) == SENTENCES == len(iad["points"])
    assert all(p["speedup"] > 0 and p["edit_ratio"] >= 0 for p in iad["points"])
    assert sum(b["sentences"] for b in iad["length_buckets"]) == SENTENCES
    assert "by output length" in table
    if _has("matplotlib"):
        assert set(report["plots"]) == {"speedup_vs_edit_ratio.png", "latency_cpu.png"}
        for name in report["plots"]:
            assert (root / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (root / "out" / "logs" / "aggdec-iad-cpu.log").is_file()


def test_a_peer_that_cannot_be_imported_is_skipped_with_a_note(reference_bundle, tmp_path):
    bare = tmp_path / "bare"  # a real python with nothing installed: optimum is not importable there
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    data = tmp_path / "data.txt"
    data.write_text("Привіт , світ .\nЦе речення .\n", encoding="utf-8")
    result = aggdec("bench", str(reference_bundle), "--checkpoint", str(MODEL), "--data", str(data),
                    "--systems", "aggdec-iad", "optimum-greedy", "--optimum-python", str(bare / "bin" / "python"),
                    "--device", "cpu", "cuda", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                    "--no-progress")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert {r["system"] for r in report["summary"]["rows"]} == {"aggdec-greedy", "aggdec-iad"}
    assert any(note.startswith("optimum-greedy skipped") for note in report["notes"])
    assert "optimum-greedy skipped" in result.stderr
    if "CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers():
        assert any(note.startswith("cuda skipped") for note in report["notes"])
    assert "gec" not in report["summary"]["rows"][0]  # no targets in a plain source file


def test_a_checkpoint_that_is_not_the_bundle_s_model_is_refused(reference_bundle, random_checkpoint, tmp_path):
    """The peers would decode another model and the report compare the two ("= greedy 0.0%")."""
    data = tmp_path / "data.txt"
    data.write_text("Це речення .\n", encoding="utf-8")
    result = aggdec("bench", str(reference_bundle), "--checkpoint", str(random_checkpoint("bart")), "--data",
                    str(data), "--systems", "hf-greedy", "--out", str(tmp_path / "out"), "--work",
                    str(tmp_path / "work"), "--no-progress")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "is not the model the bundle" in result.stderr and "its config.json has d_model" in result.stderr
    assert not (tmp_path / "out" / "bench.json").exists()


def test_peers_need_the_checkpoint(reference_bundle, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("Це речення .\n", encoding="utf-8")
    result = aggdec("bench", str(reference_bundle), "--data", str(data), "--systems", "hf-greedy",
                    "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--no-progress")
    assert result.returncode == 0, result.stderr
    notes = json.loads((tmp_path / "out" / "bench.json").read_text())["notes"]
    assert any("hf-greedy skipped: peers need the model the bundle was exported from" in note for note in notes)


@pytest.mark.parametrize("out", ["/dev/full", "FILE/under"])
def test_an_out_that_cannot_be_written_is_one_error_before_any_run(reference_bundle, tmp_path, out):
    """Checked before any system loads or decodes (aggdec/report_dir.py): it was an OSError
    traceback from mkdir."""
    if out == "/dev/full" and not Path(out).exists():
        pytest.skip("no /dev/full here")
    (tmp_path / "FILE").write_text("a file\n")
    out = out.replace("FILE", str(tmp_path / "FILE"))
    data = tmp_path / "data.txt"
    data.write_text("Це речення .\n", encoding="utf-8")
    result = aggdec("bench", str(reference_bundle), "--data", str(data), "--systems", "aggdec-greedy",
                    "--out", out, "--work", str(tmp_path / "work"), "--no-progress")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line, no traceback
    assert f"cannot write to --out {out!r}" in result.stderr


def test_a_checkpoint_without_a_bundle_is_exported_with_its_drafter_and_reused(trained_drafter_dir, editing_marian_dir,
                                                                              tmp_path):
    """--checkpoint alone: aggdec runs that checkpoint (not the reference model), with the drafter
    beside it, exported once into --work; a changed drafter is exported again."""
    import shutil

    root = tmp_path / "models"
    shutil.copytree(editing_marian_dir, root / "model")
    shutil.copytree(trained_drafter_dir, root / "drafter")
    data = tmp_path / "data.txt"
    data.write_text("the cat sat on the mat .\na dog ran .\n", encoding="utf-8")

    def run() -> tuple[subprocess.CompletedProcess, dict]:
        result = aggdec("bench", "--checkpoint", str(root / "model"), "--data", str(data), "--systems", "aggdec-gad",
                        "--batch-size", "1", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                        "--no-progress")
        assert result.returncode == 0, result.stderr
        return result, json.loads((tmp_path / "out" / "bench.json").read_text())

    first, report = run()
    bundle = Path(report["config"]["bundle"])
    assert bundle.parent == (tmp_path / "work").resolve() and "aggdec bench: [1/5]" in first.stderr
    assert Generator(bundle).drafter is not None  # the drafter beside the checkpoint came along
    assert {r["system"] for r in report["summary"]["rows"]} == {"aggdec-greedy", "aggdec-gad"}
    again, _ = run()
    assert "aggdec bench: [1/5]" not in again.stderr  # unchanged: reused
    (root / "drafter" / "drafter.json").write_text((root / "drafter" / "drafter.json").read_text() + "\n")
    changed, _ = run()
    assert "aggdec bench: [1/5]" in changed.stderr


def test_the_int8_bundle_is_quantized_once_and_again_when_the_bundle_changes(editing_bundle, tmp_path):
    """The int8 systems' bundle is made in --work and reused while the fp32 bundle (its manifest
    digest) and the quantizer are unchanged; int8 GAD without a drafter is skipped like GAD."""
    import shutil

    from aggdec.bench.bundles import QUANTIZER_SOURCES, source_digest

    bundle = tmp_path / "bundle"
    shutil.copytree(editing_bundle, bundle)
    data = tmp_path / "data.txt"
    data.write_text("the cat sat on the mat .\na dog ran .\n", encoding="utf-8")

    def run() -> tuple[subprocess.CompletedProcess, dict]:
        result = aggdec("bench", str(bundle), "--data", str(data), "--systems", "aggdec-int8-iad", "aggdec-int8-gad",
                        "--batch-size", "1", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                        "--no-progress")
        assert result.returncode == 0, result.stderr
        return result, json.loads((tmp_path / "out" / "bench.json").read_text())

    first, report = run()
    assert "aggdec bench: [1/3] converting" in first.stderr and report["config"]["quantize_seconds"]["int8"] > 0
    ran = {r["system"] for r in report["summary"]["rows"]}
    assert ran == {"aggdec-greedy", "aggdec-int8-greedy", "aggdec-int8-iad"}  # int8 greedy: the int8 IAD's reference
    assert "aggdec-int8-gad skipped: the bundle has no drafter (export it with --drafter)" in report["notes"]
    int8 = Path(report["config"]["converted_bundles"]["int8"])
    stamp = json.loads(int8.with_name(int8.name + ".made-from.json").read_text())
    assert stamp["quantizer_sha256"] == source_digest(QUANTIZER_SOURCES) != source_digest()

    again, report = run()
    assert "converting" not in again.stderr and report["config"]["quantize_seconds"]["int8"] is None
    assert Path(report["config"]["converted_bundles"]["int8"]) == int8
    assert all(r["prepare_seconds"] is None for r in report["summary"]["rows"])
    assert "reused from an earlier run" in (tmp_path / "out" / "bench.md").read_text()

    manifest = bundle / "manifest.json"  # another manifest digest: another bundle, as far as the stamp can tell
    manifest.write_text(manifest.read_text() + "\n")
    changed, report = run()
    assert "aggdec bench: [1/3] converting" in changed.stderr and report["config"]["quantize_seconds"]["int8"] > 0


def test_int8_systems_are_planned_for_the_cpu_only():
    """On --device cpu cuda the int8 systems run on the CPU and are left out on cuda with a note
    (Generator refuses an int8 bundle there); a cuda-only run quantizes nothing."""
    from aggdec.bench.runner import plan_systems
    from aggdec.bench.systems import with_references

    names = with_references(["aggdec-iad", "aggdec-int8-iad", "aggdec-int8-gad", "ct2-int8"])
    assert names == ["aggdec-greedy", "aggdec-int8-greedy", "aggdec-iad", "aggdec-int8-iad", "aggdec-int8-gad",
                     "ct2-int8"]
    runs, notes = plan_systems(names, ["cpu", "cuda"], has_drafter=True, model_format="huggingface")
    assert runs == {"aggdec-greedy": ["cpu", "cuda"], "aggdec-int8-greedy": ["cpu"], "aggdec-iad": ["cpu", "cuda"],
                    "aggdec-int8-iad": ["cpu"], "aggdec-int8-gad": ["cpu"], "ct2-int8": ["cpu", "cuda"]}
    assert "aggdec-int8-iad on cuda skipped: int8 bundles run on cpu only: its MatMulInteger products are a CPU " \
           "kernel (onnxruntime's CUDA provider would run them on the CPU, copying every activation across, and " \
           "TensorRT has no such layer)" in notes and len(notes) == 3
    runs, notes = plan_systems(names, ["cuda"], has_drafter=False, model_format=None)
    assert list(runs) == ["aggdec-greedy", "aggdec-iad"]
    assert "aggdec-int8-gad skipped: the bundle has no drafter (export it with --drafter)" in notes


def test_fp16_systems_run_the_fp16_bundle_against_fp16_greedy(editing_bundle, tmp_path):
    """The fp16 systems' bundle is converted into --work beside the int8 one; an fp16 mode is
    exact against fp16 greedy, and bench.md compares fp16 with fp32."""
    from aggdec.bench.runner import plan_systems
    from aggdec.runtime.manifest import load_manifest

    runs, notes = plan_systems(["aggdec-greedy", "aggdec-fp16-greedy"], ["cpu", "cuda"], has_drafter=False,
                               model_format=None)
    assert runs == {"aggdec-greedy": ["cpu", "cuda"], "aggdec-fp16-greedy": ["cpu", "cuda"]} and notes == []
    data = tmp_path / "data.txt"
    data.write_text("the cat sat on the mat .\na dog ran .\nthe the cat .\n", encoding="utf-8")
    result = aggdec("bench", str(editing_bundle), "--data", str(data), "--systems", "aggdec-fp16-iad",
                    "aggdec-int8-greedy", "--batch-size", "1", "--out", str(tmp_path / "out"), "--work",
                    str(tmp_path / "work"), "--no-progress")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    config = report["config"]
    assert set(config["converted_bundles"]) == {"int8", "fp16"} and config["quantize_seconds"]["fp16"] > 0
    assert load_manifest(config["converted_bundles"]["fp16"]).precision == "fp16"
    rows = {r["system"]: r for r in report["summary"]["rows"]}
    assert set(rows) == {"aggdec-greedy", "aggdec-int8-greedy", "aggdec-fp16-greedy", "aggdec-fp16-iad"}
    assert rows["aggdec-fp16-iad"]["bundle_precision"] == "fp16"
    assert rows["aggdec-fp16-iad"]["greedy_reference"] == "aggdec-fp16-greedy"
    assert rows["aggdec-fp16-iad"]["exact_match_vs_greedy"] == 1.0
    assert "## fp16 against fp32 (CPU, batch 1)" in (tmp_path / "out" / "bench.md").read_text()


def test_each_precision_is_exact_against_its_own_greedy():
    """int8 modes are compared with int8 greedy, not fp32 greedy: an int8 IAD that equals int8
    greedy where int8 greedy differs from fp32 greedy is lossless; one that equals fp32 greedy
    instead is a bug (the figures are computed from what the workers returned)."""
    from aggdec.bench.analysis import not_lossless, summarize
    from aggdec.sentences import Example
    from aggdec.bench.runner import Measured, WorkerInfo

    examples = [Example("a b c", "a b c"), Example("d e", "d x")]

    def outputs(*ids: tuple[int, ...]) -> list[dict]:
        stats = {"iterations": 2, "drafted": 4, "accepted": 3, "encoder_seconds": 0.001, "verifier_seconds": 0.002,
                 "drafter_seconds": 0.0, "total_seconds": 0.004, "batch_size": 1}
        return [{"ids": list(i), "text": text, "stats": stats} for i, text in zip(ids, ("a b c", "d x"))]

    fp32, int8 = ((1, 2, 3), (4, 5)), ((1, 2, 3), (4, 6))  # int8 greedy differs on the second sentence
    measured = [Measured("aggdec-greedy", "cpu", 1, outputs(*fp32), [0.02, 0.02]),
                Measured("aggdec-int8-greedy", "cpu", 1, outputs(*int8), [0.01, 0.01]),
                Measured("aggdec-int8-iad", "cpu", 1, outputs(*int8), [0.005, 0.005]),
                Measured("aggdec-int8-gad", "cpu", 1, outputs(*fp32), [0.005, 0.005])]
    infos = {(m.system, "cpu"): WorkerInfo(0.1, 100.0, runtime={"bundle_precision": "int8" if "int8" in m.system
                                                                 else "fp32"}) for m in measured}
    summary = summarize(measured, examples, infos)
    rows = {r["system"]: r for r in summary["rows"]}
    assert (rows["aggdec-int8-iad"]["exact_match_vs_greedy"], rows["aggdec-int8-iad"]["exact_match_vs_fp32_greedy"]) \
        == (1.0, 0.5)
    assert rows["aggdec-int8-iad"]["speedup_vs_aggdec_greedy"] == 4.0  # speedups: against fp32 greedy
    broken = not_lossless(summary["rows"])
    assert [(r["system"], r["differing_from_greedy"]) for r in broken] == [("aggdec-int8-gad", 1)]
    int8_summary = next(e for e in summary["precisions"] if e["precision"] == "int8")
    assert (int8_summary["exact_match_vs_fp32_greedy"], int8_summary["differing_from_fp32_greedy"]) == (0.5, 1)
    assert int8_summary["greedy_speedup_vs_fp32_greedy"] == 2.0
    assert summary["acceptance"]["aggdec-int8-iad@cpu"]["greedy"] == "aggdec-int8-greedy"
    assert [p["speedup"] for p in summary["acceptance"]["aggdec-int8-iad@cpu"]["points"]] == [2.0, 2.0]


@pytest.mark.parametrize("args, needle", [
    (["--systems", "nope"], "unknown system(s) nope"),
    (["--data", "/no/such/file"], "does not exist"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--limit", "0"], "--limit must be at least 1"),
    (["--tf32"], "--tf32 applies to --device cuda only"),
    # before any worker: 0 ran at the bundle's limit, and a limit past the bundle's failed every worker
    (["--max-new-tokens", "0", "--limit", "2"], "max_new_tokens must be an integer of at least 1, got 0"),
    (["--max-new-tokens", "100000", "--limit", "2"], "max_new_tokens 100000 exceeds this bundle's limit"),
])
def test_bad_bench_arguments_are_one_clean_error(reference_bundle, tmp_path, args, needle):
    result = aggdec("bench", str(reference_bundle), *args, "--out", str(tmp_path / "out"), "--no-progress")
    assert_one_clean_error(result, needle)


def test_bench_refuses_a_directory_that_is_not_a_bundle(tmp_path):
    assert_one_clean_error(aggdec("bench", str(tmp_path), "--no-progress"), "is not an aggdec bundle")


def test_edit_ratio_and_gec_scores():
    assert edit_distance("a b c".split(), "a x c d".split()) == 2
    assert edit_ratio("a b c d", "a b c d") == 0.0
    assert edit_ratio("a b c d", "a c d") == 0.25
    sources, refs = ["a b c", "d e"], ["a B c", "d e"]
    copy = score(sources, sources, refs)
    assert (copy["precision"], copy["recall"], copy["f0.5"], copy["exact_match"]) == (1.0, 0.0, 0.0, 0.5)
    perfect = score(sources, refs, refs)
    assert (perfect["precision"], perfect["recall"], perfect["exact_match"]) == (1.0, 1.0, 1.0)
    wrong = score(sources, ["a X c", "d e"], refs)  # one edit, at the right place but the wrong word
    assert (wrong["tp"], wrong["hyp_edits"], wrong["ref_edits"], wrong["f0.5"]) == (0, 1, 1, 0.0)


def test_the_default_data_is_the_uagec_test_split():
    pytest.importorskip("ua_gec")
    from aggdec.sentences import load_examples

    examples = load_examples("uagec-test")
    assert len(examples) == 2696
    assert all(e.source and e.target is not None and e.target2 is not None for e in examples)
    assert load_examples("uagec-test", limit=5) == examples[:5]


def test_a_data_file_with_an_empty_source_is_refused(tmp_path):
    from aggdec.sentences import load_examples
    from aggdec.runtime.errors import InputError

    data = tmp_path / "data.tsv"
    data.write_text("a b\tA b\n\tonly a target\n", encoding="utf-8")
    with pytest.raises(InputError, match="data.tsv:2: empty source"):
        load_examples(str(data))
    data.write_text("a b\tA b\tA B\nc d\n", encoding="utf-8")
    first, second = load_examples(str(data))
    assert (first.target, first.target2, second.target) == ("A b", "A B", None)


def test_a_cpu_run_records_how_aggdec_ran_and_no_gpu(bench_run):
    _, root, _ = bench_run
    report = json.loads((root / "out" / "bench.json").read_text())
    assert report["environment"]["gpu"] is None and report["config"]["tf32"] is False
    for row in report["summary"]["rows"]:
        assert row["tf32"] is None  # TF32 is a GPU setting
        if row["system"].startswith("aggdec"):
            assert "CPUExecutionProvider" in row["provider_options"]


def test_nvidia_smi_fields_are_parsed_and_missing_ones_are_null():
    from aggdec.bench.report import GPU_FIELDS, parse_nvidia_smi

    banner = ("+-----------------------------------------------------------------------------------------+\n"
              "| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |\n")
    info = parse_nvidia_smi("NVIDIA H100 80GB HBM3, 580.159.04, 81559, 9.0\n", banner)
    assert info == {"name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda_version": "13.0",
                    "memory_mib": 81559, "compute_capability": "9.0"}
    assert parse_nvidia_smi("", "") == dict.fromkeys(GPU_FIELDS)
    older = parse_nvidia_smi("Tesla T4, 470.82.01, 15109, [N/A]\n", "")
    assert older["compute_capability"] is None and older["cuda_version"] is None and older["name"] == "Tesla T4"


def test_every_heading_of_a_two_device_report_follows_a_blank_line():
    """The committed H100 report (CUDA then CPU): each `## ` heading starts its own block."""
    from aggdec.bench.report import markdown

    report = json.loads(gzip.decompress((ROOT / "benchmarks" / "results" / "uagec-h100" / "bench.json.gz").read_bytes()))
    lines = markdown(report).splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith("## ")]
    assert len(headings) >= 6 and any(lines[i].startswith("## CPU, batch 1") for i in headings)
    assert all(lines[i - 1] == "" for i in headings), [lines[i - 1] for i in headings]


def test_the_transformers_worker_does_not_warn_per_sentence():
    """The reference checkpoint's generation config sets max_length; with the bench's
    max_new_tokens, transformers warned at every generate call (once per sentence)."""
    script = ("import sys; from aggdec.bench.worker import TransformersSystem; "
              f"s = TransformersSystem({{'threads': 1, 'device': 'cpu', 'model': {str(MODEL)!r}, "
              "'max_new_tokens': 64, 'options': {'num_beams': 1}}); "
              "outs = [s.run([t]) for t in ('Привіт , як справи ?', 'Я йду до дому .')]; print(outs[1][0]['text'])")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Я йду до дому."
    assert "seem to have been set" not in result.stderr and "max_new_tokens" not in result.stderr, result.stderr


def test_quick_runs_a_short_subset_and_prints_the_result_table(reference_bundle, tmp_path):
    result = aggdec("bench", str(reference_bundle), "--checkpoint", str(MODEL), "--quick", "--systems", "aggdec-greedy",
                    "aggdec-iad", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--no-progress")
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "out" / "bench.json").read_text())["config"]
    assert (config["sentences"], config["batch_sizes"], config["quick"]) == (16, [1, 8], True)
    # the tables of bench.md, on the terminal
    assert "## CPU, batch 1 (one sentence at a time)" in result.stdout and "## CPU, batched" in result.stdout
    table = [line for line in result.stdout.splitlines() if line.startswith("| aggdec IAD |")]
    assert len(table) == 2 and "| 100.0% |" in table[0]  # batch 1 (equal to greedy) and batched
    assert result.stdout.strip().splitlines()[1] in (tmp_path / "out" / "bench.md").read_text()


def test_quick_defaults_to_aggdecs_exact_modes_and_two_peers():
    from aggdec.bench import QUICK_SYSTEMS, BenchOptions, _systems
    from aggdec.bench.systems import SYSTEMS

    assert _systems(BenchOptions(quick=True)) == QUICK_SYSTEMS
    assert set(QUICK_SYSTEMS) == {"aggdec-greedy", "aggdec-iad", "aggdec-gad", "hf-greedy", "ct2-fp32"}
    assert _systems(BenchOptions()) == tuple(spec.name for spec in SYSTEMS)
    assert _systems(BenchOptions(quick=True, systems=("aggdec-iad",))) == ("aggdec-iad",)


def test_beam_systems_are_compared_with_transformers_beam_of_their_width():
    """aggdec's beam systems must equal transformers' beam 4 (a difference is a BUG note and exit
    status 1); CTranslate2's beam is reported against it, never flagged."""
    from aggdec.bench.analysis import not_transformers_beam, summarize
    from aggdec.bench.report import _batch_one, _batch_one_table
    from aggdec.bench.runner import Measured, WorkerInfo
    from aggdec.sentences import Example

    examples = [Example("a b c", "a b c"), Example("d e", "d x")]

    def outputs(*ids: tuple[int, ...]) -> list[dict]:
        stats = {"iterations": 2, "drafted": 0, "accepted": 2, "encoder_seconds": 0.001, "verifier_seconds": 0.002,
                 "drafter_seconds": 0.0, "total_seconds": 0.004, "batch_size": 1}
        return [{"ids": list(i), "text": text, "stats": stats} for i, text in zip(ids, ("a b c", "d x"))]

    beam = ((1, 2, 3), (4, 5))
    measured = [Measured("aggdec-greedy", "cpu", 1, outputs((1, 2, 3), (4, 6)), [0.02, 0.02]),
                Measured("hf-beam4", "cpu", 1, outputs(*beam), [0.1, 0.1]),
                Measured("aggdec-beam4", "cpu", 1, outputs(*beam), [0.03, 0.03]),
                Measured("aggdec-iad-beam4", "cpu", 1, outputs((1, 2, 3), (4, 7)), [0.03, 0.03]),
                Measured("aggdec-gad-beam4", "cpu", 1, outputs(*beam), [0.03, 0.03]),
                Measured("ct2-beam4", "cpu", 1, outputs((1, 2, 3), (4, 8)), [0.02, 0.02])]
    infos = {(m.system, "cpu"): WorkerInfo(0.1, 100.0, runtime={}) for m in measured}
    rows = {r["system"]: r for r in summarize(measured, examples, infos)["rows"]}
    assert rows["aggdec-beam4"]["exact_match_vs_beam_reference"] == 1.0
    assert (rows["aggdec-gad-beam4"]["exact_match_vs_beam_reference"], rows["aggdec-gad-beam4"]["beam_reference"]) \
        == (1.0, "hf-beam4")
    assert (rows["ct2-beam4"]["exact_match_vs_beam_reference"], rows["ct2-beam4"]["beam_reference"]) == (0.5, "hf-beam4")
    assert rows["aggdec-greedy"]["exact_match_vs_beam_reference"] is None
    assert [r["system"] for r in not_transformers_beam(list(rows.values()))] == ["aggdec-iad-beam4"]
    table = "\n".join(_batch_one_table(_batch_one(list(rows.values()), "cpu"), "cpu"))
    assert "aggdec beam 4 = transformers beam 4: 100.0%" in table
