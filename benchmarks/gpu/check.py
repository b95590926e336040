"""The GPU check: everything aggdec promises on CUDA, checked and measured in stages that each
fit a device call (benchmarks/gpu/README.md has the calls; check.sh runs this).

Stages, in order (each in a process of its own, killed at its budget; one that cannot start in
what is left of the call is skipped with a note, as is the rest of one that runs out):

- ``env``: the GPU (nvidia-smi), driver, CUDA, onnxruntime (version, path, providers, whether a
  CUDA session really starts and with which options), the Python packages the stages need.
- ``export``: the reference model (and the larger one, if it is here) exported with its drafter
  by ``aggdec.bench.bundles.exported_bundle``, and converted to fp16 by ``quantized_bundle``
  (``aggdec quantize --precision fp16``, with its own CPU checks), once per work directory.
- ``pytest``: ``pytest -m gpu`` (TF32 off: check.sh sets NVIDIA_TF32_OVERRIDE=0).
- ``equality``: every exact mode (greedy, IAD, GAD) at every batch size on the device against
  CPU greedy, token for token, on every fp32 bundle.
- ``fp16``: the block-vs-alone bitwise check of both verifier graphs (``export.positions.check_verifier_graphs``)
  run on the device for the fp32 and fp16 graphs, then fp16 IAD/GAD (and batched greedy) on
  the device against fp16 greedy at batch 1.
- ``graphs``: one verifier call at fixed shapes, timed three ways: as the runtime binds it
  today, with every input and output a device buffer, and the latter under onnxruntime's CUDA
  graphs (``enable_cuda_graph``); the graph's outputs compared bitwise with the plain run's.
- ``cudagraphs``: static-shape decodes without and with CUDA graphs (``Generator(cuda_graphs=True)``),
  every exact mode at each batch size, alternated in one process: outputs equal token for token,
  and the time of each (on the CPU, the fixed calls without a graph).
- ``bench``: ``aggdec bench --device cuda`` at the batch sizes, fp32 and fp16 systems, and
  CTranslate2 on CUDA when its wheel is installed and sees the GPU.
- ``edits``: greedy at the batch sizes (and beam search at the largest) with the cache edits
  through the host (as before device_edits.py) and on the device, alternated in one process:
  sentences/s of each and whether their outputs are equal (issue 32's batching regression,
  read from the code as the host round trip; this measures it).

The stages are in check_stages.py, what they share in check_context.py, the report in
check_report.py; carry.py gathers what the calls carried (check.sh runs it first).

Results go to ``WORK/results/`` (a ``check-STAGE.json`` each, logs, the bench reports, README.md and
check.json), a layout to commit as ``benchmarks/results/<name>/``; at the end of every call it
is packed into ``$OUT/results.tar.gz`` (the device tool returns at most 8 files a call).

``--dry-run``: the same stages on the CPU provider with the tiny models given by ``--model``,
small batches and few sentences (tests/test_gpu_check.py runs it), so that nothing here rots
between GPU sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from check_context import (BUDGETS, DRY_BUDGETS, LARGER_MODEL, MIN_STAGE_S, REFERENCE_MODELS, REPO, STAGES, Budget,
                           Context, Options, StageError, worse)
from check_report import pack_out, source_digest, write_report
from check_stages import STAGE_FUNCTIONS

GRACE_S = 30  # past its budget a stage's process is killed (it stops by itself at its budget)
REPORT_RESERVE_S = 20  # kept at the end of a call for the report and the tarball


def named_path(text: str) -> tuple[str, Path]:
    """NAME=PATH, for --model and --bundle."""
    name, _, path = text.partition("=")
    if not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=PATH")
    return name, Path(path).resolve()


def stage_seconds(text: str) -> tuple[str, float]:
    """STAGE=SECONDS, for --budget."""
    stage, _, seconds = text.partition("=")
    try:
        value = float(seconds)
    except ValueError:
        value = -1.0
    if stage not in STAGES or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected STAGE=SECONDS, STAGE one of {', '.join(STAGES)}")
    return stage, value


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, Options]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stages", nargs="*", metavar="STAGE", help=f"stages to run (default all): {', '.join(STAGES)}; "
                        "'carry' alone: stage what the call carried, run nothing")
    parser.add_argument("--dry-run", action="store_true", help="CPU provider, tiny models (--model), small batches")
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("GPU_CHECK_WORK", "/tmp/gpu-check")),
                        help="kept between calls: bundles, carried files, results (/tmp/gpu-check)")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                        help="where results.tar.gz and summary.md go at the end (default $OUT; none if unset)")
    parser.add_argument("--name", help="the results folder's name (default gpu-check-<the GPU's name>)")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=CHECKPOINT", type=named_path,
                        help="a checkpoint to export and check (default: the reference models)")
    parser.add_argument("--bundle", action="append", default=[], metavar="NAME=BUNDLE", type=named_path,
                        help="an fp32 bundle exported elsewhere (and carried), checked instead of exporting NAME")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="only this model's bundles (repeatable; default every model)")
    parser.add_argument("--data", type=Path, help="sentences, one per line, TAB targets optional (default: the "
                        "carried UA-GEC test split, else examples/uagec_test_sample.tsv)")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="the device checked (cuda; cpu in the dry run)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="(1 8 32; 1 4 in the dry run)")
    parser.add_argument("--limit", type=int, help="sentences for equality and fp16 (1000; 12 in the dry run)")
    parser.add_argument("--bench-limit", type=int, help="sentences for the bench (200; 8 in the dry run)")
    parser.add_argument("--max-new-tokens", type=int, help="(the bundle's limit; 24 in the dry run)")
    parser.add_argument("--deadline-s", type=float, help="this call's seconds for stages (540 on the GPU, 300 in the "
                        "dry run, less what check.sh spent before: $GPU_CHECK_SPENT)")
    parser.add_argument("--budget", action="append", default=[], metavar="STAGE=SECONDS", type=stage_seconds,
                        help="a stage's budget")
    parser.add_argument("--pytest-path", action="append", default=[], help="what pytest -m gpu runs (tests)")
    parser.add_argument("--ct2", choices=("auto", "off"), help="CTranslate2 in the bench when it runs (auto; off dry)")
    parser.add_argument("--commit", default=os.environ.get("AGGDEC_COMMIT"), help="the commit this tree is "
                        "(default $AGGDEC_COMMIT, else git's)")
    parser.add_argument("--graph-calls", type=int, help="timed calls per shape in the graphs stage (300; 20 dry)")
    parser.add_argument("--static-shapes", action="store_true",
                        help="equality and fp16: decode with static shapes (one verifier shape per batch, decision "
                             "034); every mode compared with static greedy at the same batch size; records "
                             "check-STAGE-static.json beside the ordinary ones")
    parser.add_argument("--digest", action="store_true", help="print the source digest the report records, and exit")
    parser.add_argument("--worker", choices=STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--budget-s", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dry = args.dry_run
    budgets = {**(DRY_BUDGETS if dry else BUDGETS), **dict(args.budget)}
    models: dict[str, Path] = dict(args.model)
    given: dict[str, Path] = dict(args.bundle)
    if not models and not dry:
        models = dict(REFERENCE_MODELS)
        for candidate in (args.work / "carried" / LARGER_MODEL / "model", REPO.parent / "shared" / "models" /
                          LARGER_MODEL / "model"):
            if (candidate / "config.json").is_file():
                models[LARGER_MODEL] = candidate
                break
        for name in given:  # a carried bundle stands in for its model's export
            models.pop(name, None)
    unknown = [s for s in args.stages if s not in (*STAGES, "carry")]
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    options = Options(
        dry_run=dry, work=args.work.resolve(), out=args.out, name=args.name,
        device=args.device or ("cpu" if dry else "cuda"),
        batch_sizes=tuple(args.batch_sizes or ((1, 4) if dry else (1, 8, 32))),
        limit=args.limit or (12 if dry else 1000), bench_limit=args.bench_limit or (8 if dry else 200),
        max_new_tokens=args.max_new_tokens or (24 if dry else None),
        deadline_s=args.deadline_s or max((300 if dry else 540) - float(os.environ.get("GPU_CHECK_SPENT", 0)), 60),
        budgets=budgets,
        pytest_paths=tuple(args.pytest_path or (("tests/runtime/test_gpu.py",) if dry else ("tests",))),
        ct2=args.ct2 or ("off" if dry else "auto"), commit=args.commit, models=models, given_bundles=given,
        data=args.data.resolve() if args.data else None, graph_calls=args.graph_calls or (20 if dry else 300),
        only=tuple(args.only), static_shapes=args.static_shapes)
    return args, options




def run_worker(stage: str, options: Options, budget_s: float) -> int:
    ctx = Context(options, stage, {"stage": stage, "status": "ok", "budget_s": round(budget_s), "notes": [],
                                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    budget = Budget(budget_s)
    started = time.perf_counter()
    try:
        STAGE_FUNCTIONS[stage](ctx, budget)
    except StageError as exc:
        ctx.result["status"] = "skipped"
        ctx.note(str(exc))
    except Exception as exc:
        ctx.mark("error")
        ctx.result["traceback"] = traceback.format_exc()
        ctx.note(f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    ctx.result["seconds"] = round(time.perf_counter() - started, 1)
    ctx.save()
    return 0



# ------------------------------------------------------------------ the orchestrator


def set_aside(record: Path, log: Path) -> None:
    """Move an earlier call's record of a stage (and its log) into ``replaced/``, named by when
    it started: a later call of the stage, a shorter one say, must not silently lose a complete
    record. The report reads the top folder only."""
    if not record.is_file():
        return
    try:
        started = json.loads(record.read_text()).get("started")
    except (ValueError, AttributeError):
        started = None
    replaced = record.parent / "replaced"
    replaced.mkdir(exist_ok=True)
    stamp = str(started or "unstarted").replace(":", "")
    record.replace(replaced / f"{record.stem}.{stamp}.json")
    if log.is_file():
        log.replace(replaced / f"{log.stem}.{stamp}.log")


def run_stages(argv: list[str], options: Options, stages: list[str]) -> int:
    started = time.monotonic()
    results = options.work / "results"
    (results / "logs").mkdir(parents=True, exist_ok=True)
    for stage in stages:
        left = options.deadline_s - (time.monotonic() - started) - REPORT_RESERVE_S
        budget = min(options.budgets[stage], left - GRACE_S)
        record_name = options.record_name(stage)
        path = options.record_path(results, stage)
        if budget < MIN_STAGE_S:
            note = (f"not started: {max(left, 0):.0f} s were left of this call's {options.deadline_s:.0f} s; "
                    "run it in the next call")
            if not path.is_file():  # an earlier call's record of the stage stays
                path.write_text(json.dumps({"stage": stage, "status": "skipped", "notes": [note],
                                            "budget_s": options.budgets[stage]}, indent=1) + "\n")
            print(f"== {stage}: skipped ({note})", flush=True)
            continue
        print(f"== {record_name} (budget {budget:.0f} s)", flush=True)
        log = results / "logs" / f"{record_name}.log"
        set_aside(path, log)  # what follows is this call's record, or none
        command = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", stage, "--budget-s", f"{budget:.0f}"]
        began = time.monotonic()
        with log.open("w") as handle:
            try:
                subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, timeout=budget + GRACE_S)
                killed = False
            except subprocess.TimeoutExpired:
                killed = True
        record = json.loads(path.read_text()) if path.is_file() else {"stage": stage, "notes": []}
        if killed or record.get("started") is None or "seconds" not in record:
            record["status"] = worse(record.get("status", "ok"), "partial" if record.get("started") else "error")
            record["seconds"] = round(time.monotonic() - began, 1)
            record.setdefault("notes", []).append(
                f"its process was killed after {record['seconds']} s (budget {budget:.0f} s)" if killed
                else f"its process ended without a result (logs/{record_name}.log)")
            path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"   {record['status']} in {record.get('seconds')} s" +
              "".join(f"\n   - {note}" for note in record.get("notes", [])), flush=True)
        if record["status"] == "error":
            print("   log tail:\n" + "\n".join("     " + line for line in
                                               log.read_text(errors="replace").splitlines()[-15:]), flush=True)
    name, found = write_report(options, results)
    pack_out(options, results, name)
    print(f"== report: {results / 'README.md'}" + (f"; {options.out}/results.tar.gz holds {name}/" if options.out else ""))
    statuses = [found[options.record_name(s)]["status"] for s in stages if options.record_name(s) in found]
    if "error" in statuses:
        return 2
    return 1 if "failed" in statuses else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, options = parse_args(argv)
    if args.digest:
        print(source_digest())
        return 0
    if args.worker:
        return run_worker(args.worker, options, args.budget_s or options.budgets[args.worker])
    stages = [s for s in args.stages if s != "carry"] if args.stages else list(STAGES)
    passed = [a for a in argv if a not in args.stages]  # the workers get the options, not the stage list
    return run_stages(passed, options, stages)


if __name__ == "__main__":
    sys.exit(main())
