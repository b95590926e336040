"""Figures from what the workers measured: latency, throughput, exactness, GEC or translation
scores, where aggdec's time goes, and acceptance against the edit ratio (Figure 5 of the IAD paper)."""

from __future__ import annotations

import statistics

from aggdec.bench.runner import Measured, WorkerInfo
from aggdec.bench.scoring import edit_ratio, score, translation_scores
from aggdec.bench.systems import BY_NAME, PRECISION_REFERENCE, REFERENCE, SYSTEMS, reference_of
from aggdec.sentences import Example

# edit-ratio buckets for the acceptance table: (label, low exclusive, high inclusive)
EDIT_BUCKETS = (("0 (unchanged)", -1.0, 0.0), ("(0, 0.1]", 0.0, 0.1), ("(0.1, 0.2]", 0.1, 0.2),
                ("(0.2, 0.4]", 0.2, 0.4), ("> 0.4", 0.4, float("inf")))
# greedy output-length buckets (tokens): a drafter whose cost grows with the output shows here
LENGTH_BUCKETS = (("1-16", 0, 16), ("17-32", 16, 32), ("33-64", 32, 64), ("65-128", 64, 128),
                  ("> 128", 128, float("inf")))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _ids(row: Measured) -> list[tuple[int, ...]]:
    return [tuple(o["ids"]) for o in row.outputs]


def _text_only(row: Measured) -> bool:
    """A peer that returns text only (Marian's engines): its ids are re-encoded, not generated."""
    return any(o.get("text_only") for o in row.outputs)


def _time_split(row: Measured) -> dict | None:
    """aggdec only: seconds in each graph and outside them. A batched call's time is already
    shared out among the rows it served (DecodeStats), so the rows' figures add up."""
    stats = [o.get("stats") for o in row.outputs]
    if not stats or stats[0] is None:
        return None

    def total(key: str) -> float:
        return sum(s[key] for s in stats)

    wall = total("total_seconds")
    graphs = {key: total(f"{key}_seconds") for key in ("encoder", "verifier", "drafter")}
    iterations = sum(s["iterations"] for s in stats)  # each row's own verifier calls
    tokens = sum(len(o["ids"]) + 1 for o in row.outputs)  # + EOS: one more accepted token a sentence
    drafted = sum(s["drafted"] for s in stats)
    return {
        "seconds": {**{k: round(v, 4) for k, v in graphs.items()}, "outside": round(max(wall - sum(graphs.values()), 0.0), 4),
                    "total": round(wall, 4)},
        "outside_share": round(max(wall - sum(graphs.values()), 0.0) / wall, 4) if wall else None,
        "iterations_per_sentence": round(iterations / len(stats), 3),
        "tokens_per_iteration": round(tokens / iterations, 3) if iterations else None,
        "drafted_per_iteration": round(drafted / iterations, 3) if iterations else None,
    }


def _equal(m: Measured, reference: Measured | None) -> tuple[float | None, int | None]:
    """The share of ``m``'s outputs whose token ids equal ``reference``'s, and how many differ."""
    if reference is None:
        return None, None
    if _text_only(m) or _text_only(reference):  # string for string
        same = sum(a["text"] == b["text"] for a, b in zip(m.outputs, reference.outputs))
    else:
        same = sum(a == b for a, b in zip(_ids(m), _ids(reference)))
    return round(same / len(m.outputs), 4), len(m.outputs) - same


def counterpart(name: str) -> str | None:
    """The fp32 aggdec system that decodes as ``name`` does (same mode and options), or None."""
    spec = BY_NAME[name]
    if spec.kind != "aggdec" or spec.precision == "fp32":
        return None
    return next((s.name for s in SYSTEMS if s.kind == "aggdec" and s.precision == "fp32" and s.options == spec.options),
                None)


def summarize(measured: list[Measured], examples: list[Example], infos: dict[tuple[str, str], WorkerInfo],
              task: str = "gec", back: dict[str, list[str]] | None = None) -> dict:
    """``task``: "gec" (targets are corrections: edit F0.5) or "translation" (chrF and BLEU
    against greedy, the targets and, with ``back`` (system@device -> its batch-1 outputs
    translated back), the round trip)."""
    sources = [e.source for e in examples]
    targets = [e.target for e in examples]
    has_targets = all(t is not None for t in targets)
    by_key = {(m.system, m.device, m.batch_size): m for m in measured}
    rows = []
    for m in measured:
        # "= greedy": against the greedy of the system's own precision (an int8 mode is lossless
        # against int8 greedy); "= fp32 greedy": what quantizing changed
        reference = by_key.get((reference_of(m.system), m.device, 1))
        exact, differing = _equal(m, reference)
        exact_fp32, differing_fp32 = _equal(m, by_key.get((REFERENCE, m.device, 1)))
        beam_reference = BY_NAME[m.system].beam_reference
        exact_beam, differing_beam = _equal(m, by_key.get((beam_reference, m.device, 1)))
        same_batch_greedy = by_key.get((REFERENCE, m.device, m.batch_size))
        ct2 = by_key.get(("ct2-fp32", m.device, m.batch_size))
        beam = by_key.get(("hf-beam5", m.device, m.batch_size))
        seconds = sum(m.latencies)
        tokens = sum(len(o["ids"]) for o in m.outputs)
        info = infos.get((m.system, m.device))
        row = {
            "system": m.system, "label": BY_NAME[m.system].label, "device": m.device, "batch_size": m.batch_size,
            "sentences": len(m.outputs), "seconds": round(seconds, 4),
            "latency_ms": {"median": round(1e3 * statistics.median(m.latencies), 3),
                           "p90": round(1e3 * percentile(m.latencies, 0.9), 3),
                           "mean": round(1e3 * seconds / len(m.latencies), 3)},
            "sentences_per_second": round(len(m.outputs) / seconds, 3),
            "tokens_per_second": round(tokens / seconds, 2),
            "output_tokens": tokens,
            "speedup_vs_aggdec_greedy": round(sum(same_batch_greedy.latencies) / seconds, 3) if same_batch_greedy else None,
            "speedup_vs_ct2_fp32": round(sum(ct2.latencies) / seconds, 3) if ct2 else None,
            "speedup_vs_hf_beam5": round(sum(beam.latencies) / seconds, 3) if beam else None,
            "greedy_reference": reference_of(m.system),
            "exact_match_vs_greedy": exact,
            "differing_from_greedy": differing,
            # the precision of the bundle an aggdec worker loaded, as it reports it (null for a peer)
            "bundle_precision": info.runtime.get("bundle_precision") if info else None,
            "exact_match_vs_fp32_greedy": exact_fp32,
            "differing_from_fp32_greedy": differing_fp32,
            # beam systems: against transformers' beam search of the same width (null if it did not run)
            "beam_reference": beam_reference,
            "exact_match_vs_beam_reference": exact_beam,
            "differing_from_beam_reference": differing_beam,
            "load_seconds": round(info.load_seconds, 3) if info else None,
            "prepare_seconds": round(info.prepare_seconds, 3) if info and info.prepare_seconds else None,
            "rss_after_load_mib": round(info.rss_after_load_mib, 1) if info else None,
            "peak_rss_mib": round(m.peak_rss_mib, 1),
            # how the system ran (null where it does not apply: TF32 on the CPU, a peer's ORT options)
            "tf32": (info.runtime.get("tf32") if info else None) if m.device == "cuda" else None,
            "provider_options": info.runtime.get("provider_options") if info else None,
            "drafter_graph": info.runtime.get("drafter_graph") if info else None,  # GAD: drafter or drafter_int8
            "time_split": _time_split(m),
        }
        first_batch = m.batch_size == min(x.batch_size for x in measured if x.system == m.system)
        greedy = by_key.get((REFERENCE, m.device, 1))
        if task == "translation" and first_batch and greedy is not None:
            row["translation"] = translation_scores([o["text"] for o in m.outputs], [o["text"] for o in greedy.outputs],
                                                    targets if has_targets else None, sources,
                                                    (back or {}).get(f"{m.system}@{m.device}"))
        if task == "gec" and has_targets and first_batch:
            hyps = [o["text"] for o in m.outputs]
            row["gec"] = score(sources, hyps, targets)
            if all(e.target2 is not None for e in examples):
                row["gec_a2"] = score(sources, hyps, [e.target2 for e in examples])
        rows.append(row)
    return {"rows": rows, "precisions": precisions(rows), "acceptance": acceptance(measured, sources),
            "copy_gec": score(sources, sources, targets) if has_targets and task == "gec" else None}


def not_lossless(rows: list[dict]) -> list[dict]:
    """The rows of exact aggdec systems that differ from their precision's greedy: a bug."""
    return [r for r in rows if BY_NAME[r["system"]].kind == "aggdec" and BY_NAME[r["system"]].exact
            and r["differing_from_greedy"]]


def not_transformers_beam(rows: list[dict]) -> list[dict]:
    """The rows of aggdec beam systems that differ from transformers' beam search: a bug."""
    return [r for r in rows if BY_NAME[r["system"]].kind == "aggdec" and r.get("differing_from_beam_reference")]


def precisions(rows: list[dict]) -> list[dict]:
    """Per bundle precision and device, at batch 1: what quantizing changed. Its greedy's exact
    match with fp32 greedy and F0.5 against fp32's, and each of its systems' speedup over the
    fp32 system that decodes the same way."""
    at = {(r["system"], r["device"]): r for r in rows if r["batch_size"] == 1}
    out = []
    for precision, reference in PRECISION_REFERENCE.items():
        for (system, device), greedy in at.items():
            if system != reference:
                continue
            fp32 = at.get((REFERENCE, device))
            members = []
            for (name, where), r in at.items():
                if where != device or r["bundle_precision"] != precision:
                    continue
                twin = at.get((counterpart(name), device))
                members.append({"system": name, "counterpart": twin["system"] if twin else None,
                                "speedup_vs_counterpart": round(twin["seconds"] / r["seconds"], 3) if twin else None,
                                "exact_match_vs_greedy": r["exact_match_vs_greedy"],
                                "exact_match_vs_fp32_greedy": r["exact_match_vs_fp32_greedy"],
                                "f0.5": (r.get("gec") or {}).get("f0.5")})
            out.append({"precision": precision, "device": device, "reference": reference,
                        "sentences": greedy["sentences"],
                        "greedy_speedup_vs_fp32_greedy": greedy["speedup_vs_aggdec_greedy"],
                        "exact_match_vs_fp32_greedy": greedy["exact_match_vs_fp32_greedy"],
                        "differing_from_fp32_greedy": greedy["differing_from_fp32_greedy"],
                        "f0.5": (greedy.get("gec") or {}).get("f0.5"),
                        "fp32_f0.5": ((fp32 or {}).get("gec") or {}).get("f0.5"),
                        "systems": members})
    return out


def acceptance(measured: list[Measured], sources: list[str]) -> dict:
    """Per aggdec draft mode at batch 1: per-sentence speedup over greedy against the edit ratio
    and against greedy's output length. The greedy is the mode's own precision's, so that the
    figures are what drafting gains, not what quantizing gains as well."""
    by_key = {(m.system, m.device, m.batch_size): m for m in measured}
    out = {}
    for m in measured:
        spec = BY_NAME[m.system]
        reference = reference_of(m.system)
        greedy = by_key.get((reference, m.device, 1))
        if m.batch_size != 1 or spec.kind != "aggdec" or m.system == reference or greedy is None:
            continue
        points = []
        for source, mine, base, t_mine, t_base in zip(sources, m.outputs, greedy.outputs, m.latencies, greedy.latencies):
            stats = mine["stats"]
            points.append({"edit_ratio": round(edit_ratio(source, mine["text"]), 4),
                           "speedup": round(t_base / t_mine, 4), "output_tokens": len(base["ids"]),
                           "iterations": stats["iterations"], "greedy_iterations": base["stats"]["iterations"],
                           "tokens_per_iteration": round((len(mine["ids"]) + 1) / stats["iterations"], 3)})
        out[f"{m.system}@{m.device}"] = {
            "system": m.system, "device": m.device, "greedy": reference, "points": points,
            "buckets": _buckets(m, greedy, points, "edit_ratio", EDIT_BUCKETS),
            "length_buckets": _buckets(m, greedy, points, "output_tokens", LENGTH_BUCKETS)}
    return out


def _buckets(m: Measured, greedy: Measured, points: list[dict], key: str, edges: tuple) -> list[dict]:
    """Speedup over greedy of the sentences whose ``key`` falls in each (low, high] bucket."""
    buckets = []
    for label, low, high in edges:
        members = [i for i, p in enumerate(points) if low < p[key] <= high]
        if not members:
            continue
        mine_s = sum(m.latencies[i] for i in members)
        base_s = sum(greedy.latencies[i] for i in members)
        iterations = sum(points[i]["iterations"] for i in members)
        buckets.append({key: label, "sentences": len(members), "speedup": round(base_s / mine_s, 3),
                        "iterations_per_sentence": round(iterations / len(members), 3),
                        "tokens_per_iteration": round(sum(len(m.outputs[i]["ids"]) + 1 for i in members)
                                                      / iterations, 3)})
    return buckets
