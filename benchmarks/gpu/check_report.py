"""The GPU check's report: README.md and check.json from every stage's record, issue 32's
targets weighed, and the tarball a device call hands back ($OUT holds at most 8 files)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from check_context import REPO, STAGES, Context, Options

# targets from issue 32 (on the H100), evaluated in the report from what the stages measured
TARGET_IAD, TARGET_GAD, TARGET_GRAPH_MS, TARGET_BATCH32 = 8.0, 4.0, 0.3, 10.0


def source_digest() -> str:
    """sha256 over the Python sources that decide what runs (aggdec, runtime, export, engines, this folder)."""
    digest = hashlib.sha256()
    for folder in ("aggdec", "runtime", "export", "engines", "benchmarks/gpu"):
        for path in sorted((REPO / folder).rglob("*.py")):
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def commit_of(options: Options) -> str | None:
    if options.commit:
        return options.commit
    try:
        done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def results_name(options: Options, env: dict) -> str:
    if options.name:
        return options.name
    if options.dry_run:
        return "gpu-check-dry-run"
    gpu = (env.get("gpu") or {}).get("name")
    return f"gpu-check-{_slug(gpu)}" if gpu else "gpu-check-no-gpu"


def load_results(results: Path) -> dict[str, dict]:
    """Every stage record in ``results`` (``check-STAGE.json``, or ``check-STAGE-BUNDLES.json``
    for a run with --only), by the name after ``check-``, in stage order."""
    found = {}
    for path in sorted(results.glob("check-*.json")):
        record = json.loads(path.read_text())
        if isinstance(record, dict) and record.get("stage") in STAGES:
            found[path.stem[len("check-"):]] = record
    return dict(sorted(found.items(), key=lambda item: (STAGES.index(item[1]["stage"]), item[0])))


def sections(found: dict[str, dict], stage: str) -> dict[str, Any]:
    """A stage's per-bundle sections over all its records (a later --only run adds its bundles)."""
    merged: dict[str, Any] = {}
    for record in found.values():
        if record["stage"] == stage:
            merged.update(record.get("bundles", {}))
    return merged


def _find(figures: list[dict], system: str, batch: int, device: str) -> dict | None:
    return next((f for f in figures if f["system"] == system and f["batch_size"] == batch and f["device"] == device),
                None)


def targets(found: dict[str, dict], device: str) -> list[tuple[str, str, str]]:
    """(target, measured, met?) for issue 32's targets, from what the stages recorded."""
    rows = []
    static = [run for stage in ("equality", "fp16") for section in sections(found, stage).values()
              for run in section["runs"] if "vs_static_greedy" in run]
    if static:
        equal = sum(run["vs_static_greedy"]["equal"] for run in static)
        total = sum(run["vs_static_greedy"]["sentences"] for run in static)
        rows.append(("static shapes: every exact mode == static greedy at its batch", f"{equal}/{total} decodes",
                     "yes" if equal == total else "NO"))
    runs = [run for section in sections(found, "equality").values() for run in section["runs"]
            if "vs_cpu_greedy" in run]
    if runs:
        equal = sum(run["vs_cpu_greedy"]["equal"] for run in runs)
        total = sum(run["vs_cpu_greedy"]["sentences"] for run in runs)
        rows.append((f"{device} == CPU greedy, every exact mode and batch", f"{equal}/{total} decodes",
                     "yes" if equal == total else "NO"))
    fp16_runs = [run for section in sections(found, "fp16").values() for run in section["runs"]
                 if "vs_fp16_greedy" in run]
    if fp16_runs:
        equal = sum(run["vs_fp16_greedy"]["equal"] for run in fp16_runs)
        total = sum(run["vs_fp16_greedy"]["sentences"] for run in fp16_runs)
        rows.append(("fp16 modes == fp16 greedy", f"{equal}/{total} decodes", "yes" if equal == total else "NO"))
    for name, section in sections(found, "fp16").items():
        for key, label in (("block_vs_alone", "as the runtime calls it"), ("block_vs_alone_static", "at one shape")):
            for precision, checked in (section.get(key) or {}).items():
                rows.append((f"{name}: {precision} verifier position = alone on {device}, {label}",
                             f"{checked.get('positions')} positions equal" if checked.get("bitwise_equal")
                             else checked.get("error", "not run"), "yes" if checked.get("bitwise_equal") else "NO"))
    for name, section in sections(found, "bench").items():
        figures = section.get("figures") or []
        greedy1 = _find(figures, "aggdec-greedy", 1, device)
        for system, goal in (("aggdec-iad", TARGET_IAD), ("aggdec-gad", TARGET_GAD)):
            row = _find(figures, system, 1, device)
            if row and row["speedup_vs_aggdec_greedy"] is not None:
                rows.append((f"{name}: {system} >= {goal:g}x greedy at batch 1", f"{row['speedup_vs_aggdec_greedy']}x",
                             "yes" if row["speedup_vs_aggdec_greedy"] >= goal else "no"))
        greedy32 = _find(figures, "aggdec-greedy", 32, device)
        if greedy1 and greedy32:
            ratio = greedy32["sentences_per_second"] / greedy1["sentences_per_second"]
            rows.append((f"{name}: greedy batch 32 >= {TARGET_BATCH32:g}x batch 1 throughput", f"{ratio:.2f}x",
                         "yes" if ratio >= TARGET_BATCH32 else "no"))
    graph_runs = [run for section in sections(found, "cudagraphs").values() for run in section.get("runs", [])]
    if graph_runs:
        equal = sum(run["vs_static_plain"]["equal"] for run in graph_runs)
        total = sum(run["vs_static_plain"]["sentences"] for run in graph_runs)
        rows.append(("CUDA graphs in the decode loop == static shapes without them", f"{equal}/{total} decodes",
                     "yes" if equal == total else "NO"))
    for key, shapes in sections(found, "graphs").items():
        one = next((s for s in shapes if s["rows"] == 1 and s["tokens"] == 1), None)
        if one and "cuda_graph_ms" in one:
            rows.append((f"{key}: greedy verifier call <= {TARGET_GRAPH_MS} ms with CUDA graphs",
                         f"{one['cuda_graph_ms']} ms (without: {one['all_bound_ms']} ms all bound, "
                         f"{one['runtime_style_ms']} ms as the runtime binds)",
                         "yes" if one["cuda_graph_ms"] <= TARGET_GRAPH_MS else "no"))
    return rows


def _table(title: str, header: tuple[str, ...], rows: list[tuple], intro: str | None = None) -> list[str]:
    """A report section: its heading, ``intro`` (a line) if given, and a Markdown table."""
    lines = ["", f"## {title}", ""] + ([intro, ""] if intro is not None else [])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def write_report(options: Options, results: Path) -> tuple[str, dict]:
    found = load_results(results)
    env = found.get("env", {})
    name = results_name(options, env)
    lines = [f"# GPU check: `{name}`", ""]
    if options.dry_run:
        lines += ["**A dry run on the CPU** (tests/test_gpu_check.py): tiny models, the CPU provider. No figure here "
                  "says anything about a GPU.", ""]
    gpu = env.get("gpu") or {}
    ort = env.get("onnxruntime") or {}
    data = Context(options).data_file()
    lines += ["## Machine", "",
              f"- GPU: {gpu.get('name')} (driver {gpu.get('driver')}, CUDA {gpu.get('cuda_version')}, "
              f"{gpu.get('memory_mib')} MiB, compute capability {gpu.get('compute_capability')})",
              f"- onnxruntime {ort.get('version')} ({', '.join(ort.get('distributions', []))}), providers "
              f"{ort.get('available_providers')}; session probe: {env.get('session_probe')}",
              f"- Python {env.get('python')}, {env.get('platform')}, {env.get('cpu_count')} CPUs; torch "
              f"{(env.get('torch') or {}).get('version')}",
              f"- aggdec commit {commit_of(options)}, source digest {source_digest()[:16]} "
              f"(`python benchmarks/gpu/check.py --digest` at a commit prints its digest)",
              f"- aggdec installed: {env.get('aggdec_install')}",
              f"- NVIDIA_TF32_OVERRIDE={(env.get('environment') or {}).get('NVIDIA_TF32_OVERRIDE')}",
              f"- device checked: {options.device}; batch sizes {list(options.batch_sizes)}; data {_shown(data)}",
              ""]
    lines += ["## Stages", "", "| stage | status | seconds | budget | notes |", "|---|---|---|---|---|"]
    for stage in STAGES:
        records = {key: r for key, r in found.items() if r["stage"] == stage}
        if not records:
            lines.append(f"| {stage} | not run | | | |")
        for key, result in records.items():
            notes = "<br>".join(n.replace("|", "\\|") for n in result.get("notes", []))
            lines.append(f"| {key} | {result['status']} | {result.get('seconds', '')} | {result.get('budget_s', '')} | "
                         f"{notes} |")
    goals = targets(found, options.device)
    if goals:
        lines += _table("Issue 32's targets", ("target", "measured", "met"), goals)
    for bundle, section in sections(found, "bench").items():
        if section.get("figures"):
            lines += _table(f"aggdec bench: {bundle}", ("system", "batch", "median ms", "sent/s", "vs greedy", "= greedy"),
                            [(f["system"], f["batch_size"], f["median_ms"], f["sentences_per_second"],
                              f["speedup_vs_aggdec_greedy"], f["exact_match_vs_greedy"]) for f in section["figures"]],
                            intro=f"`{section['command']}`")
    edits = sections(found, "edits")
    if edits:
        lines += _table("Cache edits: through the host against on the device (sentences/s)",
                        ("bundle", "beams", "batch", "host edits", "device edits", "host time / device time",
                         "outputs equal"),
                        [(key, r.get("num_beams", 1), r["batch_size"], r["sentences_per_second"]["host"],
                          r["sentences_per_second"]["graphs"], r["host_over_graphs"],
                          f"{r['graphs_vs_host']['equal']}/{r['graphs_vs_host']['sentences']}")
                         for key, section in edits.items() for r in section["runs"]])
    decoded = sections(found, "cudagraphs")
    if decoded:
        lines += _table("Static shapes without and with CUDA graphs in the decode loop (seconds, and time without / "
                        "with)",
                        ("bundle", "mode", "batch", "without", "with", "whole decode", "verifier calls",
                         "encoder calls", "outputs equal"),
                        [(key, r["mode"], r["batch_size"], r["seconds"]["plain"], r["seconds"]["graphs"],
                          r["plain_over_graphs"], r["verifier_plain_over_graphs"], _encoder_ratio(r),
                          f"{r['vs_static_plain']['equal']}/{r['vs_static_plain']['sentences']}")
                         for key, section in decoded.items() for r in section["runs"]])
    graphs = sections(found, "graphs")
    if graphs:
        lines += _table("One verifier call (median ms)",
                        ("bundle", "rows", "T", "capacity", "as the runtime binds", "all bound", "CUDA graph",
                         "graph = plain"),
                        [(key, s["rows"], s["tokens"], s["capacity"], s["runtime_style_ms"], s["all_bound_ms"],
                          s.get("cuda_graph_ms", s.get("cuda_graph_error", "n/a")),
                          s.get("cuda_graph_equals_plain", "n/a")) for key, shapes in graphs.items() for s in shapes])
    lines += ["", "Every stage's full record is in `check-STAGE.json` (and `check.json`, all of them together); "
              "logs in `logs/`, pytest's in `pytest-gpu.log`.", ""]
    text = "\n".join(lines)
    (results / "README.md").write_text(text, encoding="utf-8")
    (results / "check.json").write_text(json.dumps({"name": name, "commit": commit_of(options),
                                                      "source_digest": source_digest(), "stages": found},
                                                     indent=1, default=str) + "\n", encoding="utf-8")
    return name, found


def _encoder_ratio(run: dict) -> float | str:
    """The encoder's time without / with CUDA graphs ("n/a" in records from before the encoder
    had a fixed call, which kept no encoder time)."""
    encoder = run.get("encoder_seconds")
    if not encoder or not encoder.get("graphs"):
        return "n/a"
    return round(encoder["plain"] / encoder["graphs"], 3)


def pack_out(options: Options, results: Path, name: str) -> None:
    """$OUT/results.tar.gz (everything so far, as benchmarks/results/NAME/) and $OUT/summary.md."""
    if options.out is None:
        return
    options.out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(options.out / "results.tar.gz", "w:gz") as tar:
        tar.add(results, arcname=name)
    shutil.copyfile(results / "README.md", options.out / "summary.md")


