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
- ``fp16``: the block-vs-alone bitwise check (``export.positions.check_position_independence``)
  run on the device for the fp32 and fp16 graphs, then fp16 IAD/GAD (and batched greedy) on
  the device against fp16 greedy at batch 1.
- ``graphs``: one verifier call at fixed shapes, timed three ways: as the runtime binds it
  today, with every input and output a device buffer, and the latter under onnxruntime's CUDA
  graphs (``enable_cuda_graph``); the graph's outputs compared bitwise with the plain run's.
- ``bench``: ``aggdec bench --device cuda`` at the batch sizes, fp32 and fp16 systems, and
  CTranslate2 on CUDA when its wheel is installed and sees the GPU.

Results go to ``WORK/results/`` (a ``STAGE.json`` each, logs, the bench reports, README.md and
check.json), a layout to commit as ``benchmarks/results/<name>/``; at the end of every call it
is packed into ``$OUT/results.tar.gz`` (the device tool returns at most 8 files a call).

``--dry-run``: the same stages on the CPU provider with the tiny models given by ``--model``,
small batches and few sentences (tests/test_gpu_check.py runs it), so that nothing here rots
between GPU sessions.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
STAGES = ("env", "export", "pytest", "equality", "fp16", "graphs", "bench")
# seconds per stage: on the GPU (sized for one H100 call each) and in the dry run
BUDGETS = {"env": 60, "export": 240, "pytest": 240, "equality": 240, "fp16": 180, "graphs": 120, "bench": 480}
DRY_BUDGETS = dict.fromkeys(STAGES, 120)
MIN_STAGE_S = 15  # a stage is not started with less than this left
GRACE_S = 30  # past its budget a stage's process is killed (it stops by itself at its budget)
REPORT_RESERVE_S = 20  # kept at the end of a call for the report and the tarball
EXACT_MODES = ("greedy", "iad", "gad")
REFERENCE_MODELS = {"uagec": REPO / "benchmarks" / "models" / "uagec" / "model"}
LARGER_MODEL = "uagec-base"
SAMPLE_DATA = REPO / "examples" / "uagec_test_sample.tsv"
CARRIED_DATA = "data/uagec-test.tsv"  # in WORK/carried: prepare.sh packs the UA-GEC test split
# the verifier shapes the graphs stage times: (rows, tokens per row); greedy is T = 1
GRAPH_SHAPES = ((1, 1), (1, 16), (8, 1), (32, 1))
GRAPH_PAST = 32  # cached positions before the timed call
GRAPH_SOURCE = 32  # source tokens
# targets from issue 32 (on the H100), evaluated in the report from what the stages measured
TARGET_IAD, TARGET_GAD, TARGET_GRAPH_MS, TARGET_BATCH32 = 8.0, 4.0, 0.3, 10.0
# Python modules the stages use: (module, what needs it)
MODULES = (
    ("numpy", "everything"), ("tokenizers", "the runtime"), ("onnxruntime", "the runtime"),
    ("onnx", "fp16 conversion (export, fp16, bench)"), ("torch", "export, pytest fixtures"),
    ("transformers", "export, pytest fixtures"), ("safetensors", "export"), ("sentencepiece", "export (Marian)"),
    ("pytest", "pytest"), ("hypothesis", "pytest (collection of some test modules)"),
    ("matplotlib", "bench plots"), ("tqdm", "bench"), ("ctranslate2", "bench's CTranslate2 peer (optional)"),
    ("ua_gec", "the UA-GEC corpus (optional: prepare.sh carries the test split as a file)"),
)


# ------------------------------------------------------------------ options and context


@dataclass
class Options:
    dry_run: bool
    work: Path
    out: Path | None
    name: str | None
    device: str
    batch_sizes: tuple[int, ...]
    limit: int
    bench_limit: int
    max_new_tokens: int | None
    deadline_s: float
    budgets: dict[str, float]
    pytest_paths: tuple[str, ...]
    ct2: str
    commit: str | None
    models: dict[str, Path]
    given_bundles: dict[str, Path]
    data: Path | None
    graph_calls: int
    only: tuple[str, ...] = ()

    def record_name(self, stage: str) -> str:
        """The stage's result file (without .json): one per selection of bundles, so that a stage
        run for another bundle in a later call keeps what the earlier call recorded."""
        return stage if not self.only else f"{stage}-{'+'.join(self.only)}"


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
    parser.add_argument("--model", action="append", default=[], metavar="NAME=CHECKPOINT",
                        help="a checkpoint to export and check (default: the reference models)")
    parser.add_argument("--bundle", action="append", default=[], metavar="NAME=BUNDLE",
                        help="an fp32 bundle exported elsewhere (and carried), checked instead of exporting NAME")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="only this model's bundles (repeatable; default every model)")
    parser.add_argument("--data", type=Path, help="sentences, one per line, TAB targets optional (default: the "
                        "carried UA-GEC test split, else examples/uagec_test_sample.tsv)")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="the device checked (cuda; cpu in the dry run)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="(1 8 32; 1 4 in the dry run)")
    parser.add_argument("--limit", type=int, help="sentences for equality and fp16 (1000; 12 in the dry run)")
    parser.add_argument("--bench-limit", type=int, help="sentences for the bench (360; 8 in the dry run)")
    parser.add_argument("--max-new-tokens", type=int, help="(the bundle's limit; 24 in the dry run)")
    parser.add_argument("--deadline-s", type=float, help="this call's seconds for stages (510; 300 in the dry run)")
    parser.add_argument("--budget", action="append", default=[], metavar="STAGE=SECONDS", help="a stage's budget")
    parser.add_argument("--pytest-path", action="append", default=[], help="what pytest -m gpu runs (tests)")
    parser.add_argument("--ct2", choices=("auto", "off"), help="CTranslate2 in the bench when it runs (auto; off dry)")
    parser.add_argument("--commit", default=os.environ.get("AGGDEC_COMMIT"), help="the commit this tree is "
                        "(default $AGGDEC_COMMIT, else git's)")
    parser.add_argument("--graph-calls", type=int, help="timed calls per shape in the graphs stage (300; 20 dry)")
    parser.add_argument("--digest", action="store_true", help="print the source digest the report records, and exit")
    parser.add_argument("--worker", choices=STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--budget-s", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dry = args.dry_run
    budgets = dict(DRY_BUDGETS if dry else BUDGETS)
    for item in args.budget:
        stage, _, seconds = item.partition("=")
        if stage not in STAGES or not seconds:
            parser.error(f"--budget {item!r}: expected STAGE=SECONDS with STAGE one of {', '.join(STAGES)}")
        budgets[stage] = float(seconds)
    models: dict[str, Path] = {}
    for item in args.model:
        name, _, path = item.partition("=")
        if not name or not path:
            parser.error(f"--model {item!r}: expected NAME=CHECKPOINT")
        models[name] = Path(path).resolve()
    given: dict[str, Path] = {}
    for item in args.bundle:
        name, _, path = item.partition("=")
        if not name or not path:
            parser.error(f"--bundle {item!r}: expected NAME=BUNDLE")
        given[name] = Path(path).resolve()
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
        limit=args.limit or (12 if dry else 1000), bench_limit=args.bench_limit or (8 if dry else 360),
        max_new_tokens=args.max_new_tokens or (24 if dry else None),
        deadline_s=args.deadline_s or (300 if dry else 510), budgets=budgets,
        pytest_paths=tuple(args.pytest_path or (("tests/runtime/test_gpu.py",) if dry else ("tests",))),
        ct2=args.ct2 or ("off" if dry else "auto"), commit=args.commit, models=models, given_bundles=given,
        data=args.data.resolve() if args.data else None, graph_calls=args.graph_calls or (20 if dry else 300),
        only=tuple(args.only))
    return args, options


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


@dataclass
class Context:
    options: Options
    stage: str = ""
    result: dict = field(default_factory=dict)

    @property
    def work(self) -> Path:
        return self.options.work

    @property
    def results(self) -> Path:
        return self.options.work / "results"

    @property
    def bundles_dir(self) -> Path:  # the bench's --work too, so that its fp16 conversions are these
        return self.options.work / "bundles"

    def note(self, message: str) -> None:
        self.result.setdefault("notes", []).append(message)
        print(f"[{self.stage}] {message}", flush=True)

    def save(self) -> None:
        """Write the stage's result so far (a stage killed at its budget keeps what it finished)."""
        self.results.mkdir(parents=True, exist_ok=True)
        path = self.results / f"{self.options.record_name(self.stage)}.json"
        path.write_text(json.dumps(self.result, indent=1, default=str) + "\n", encoding="utf-8")

    def bundles(self) -> dict[str, dict]:
        path = self.work / "bundles.json"
        if not path.is_file():
            raise StageError("no bundles: run the export stage first (in this call or an earlier one on this machine)")
        bundles = json.loads(path.read_text())
        if not self.options.only:
            return bundles
        unknown = [name for name in self.options.only if name not in bundles]
        if unknown:
            raise StageError(f"no bundle named {', '.join(unknown)} (exported: {', '.join(bundles)})")
        return {name: bundles[name] for name in self.options.only}

    def data_file(self) -> Path:
        if self.options.data is not None:
            return self.options.data
        carried = self.work / "carried" / CARRIED_DATA
        return carried if carried.is_file() else SAMPLE_DATA

    def sources(self, limit: int) -> list[str]:
        from aggdec.bench.data import load_examples

        return [example.source for example in load_examples(str(self.data_file()), limit)]


class StageError(Exception):
    """A stage that cannot run at all (its message is the note)."""


# ------------------------------------------------------------------ shared pieces


def decode(generator: Any, texts: list[str], mode: str, batch: int, max_new: int | None) -> tuple[list, float]:
    started = time.perf_counter()
    results = generator.generate(texts, mode=mode, batch_size=batch, max_new_tokens=max_new)
    return [r.ids for r in results], round(time.perf_counter() - started, 3)


def compare(got: list[list[int]], want: list[list[int]], texts: list[str], codec: Any = None) -> dict:
    """How many outputs are equal token for token, and the first few that are not."""
    differing = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    report: dict = {"sentences": len(want), "equal": len(want) - len(differing), "differing": differing[:50]}
    examples = []
    for index in differing[:3]:
        a, b = got[index], want[index]
        position = next((p for p, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        example = {"index": index, "source": texts[index], "first_difference_at_token": position,
                   "got": a[max(0, position - 2): position + 3], "want": b[max(0, position - 2): position + 3]}
        if codec is not None:
            example["got_text"], example["want_text"] = codec.decode(a), codec.decode(b)
        examples.append(example)
    if examples:
        report["examples"] = examples
    return report


def usable_texts(generator: Any, texts: list[str], ctx: Context, name: str) -> list[str]:
    kept = [t for t in texts if generator.check(t) is None]
    if len(kept) < len(texts):
        ctx.note(f"{name}: {len(texts) - len(kept)} sentence(s) longer than the bundle's source limit left out")
    return kept


def ordered_runs(batch_sizes: tuple[int, ...], modes: list[str]) -> list[tuple[int, str]]:
    """(batch, mode) pairs, batch 1 first: when the budget runs out, what is left is the larger batches."""
    return [(batch, mode) for batch in batch_sizes for mode in modes]


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


# ------------------------------------------------------------------ env


def _module_versions() -> list[dict]:
    import importlib
    import importlib.metadata

    found = []
    for module, purpose in MODULES:
        entry: dict = {"module": module, "for": purpose}
        try:
            imported = importlib.import_module(module)
            entry["version"] = getattr(imported, "__version__", None)
            entry["path"] = str(Path(getattr(imported, "__file__", "") or "").parent)
        except Exception as exc:  # missing, or broken (a wheel for another CUDA, say): both say why
            entry["missing"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        found.append(entry)
    try:
        entry = {"module": "aggdec", "version": importlib.metadata.version("aggdec")}
    except importlib.metadata.PackageNotFoundError:
        entry = {"module": "aggdec", "version": None}
    import aggdec

    entry["path"] = str(Path(aggdec.__file__).parent)
    found.append(entry)
    return found


def _tiny_graph(path: Path) -> None:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def stage_env(ctx: Context, budget: Budget) -> None:
    import platform

    from aggdec.bench.report import gpu_environment
    from aggdec.runtime.session import installed_onnxruntime_distributions, preload_cuda_libraries, require_onnxruntime

    r = ctx.result
    r["gpu"] = gpu_environment()
    smi = shutil.which("nvidia-smi")
    r["nvidia_smi"] = None
    if smi:
        query = subprocess.run([smi, "--query-gpu=name,uuid,pci.bus_id,driver_version,memory.total,compute_cap,"
                                "clocks.max.sm", "--format=csv"], capture_output=True, text=True, timeout=30)
        r["nvidia_smi"] = query.stdout.strip() or query.stderr.strip()
    nvcc = shutil.which("nvcc")
    if nvcc:
        r["nvcc"] = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    r["python"] = sys.version.split()[0]
    r["platform"] = platform.platform()
    r["cpu_count"] = os.cpu_count()
    r["modules"] = _module_versions()
    r["environment"] = {k: os.environ.get(k) for k in ("NVIDIA_TF32_OVERRIDE", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    install = ctx.work / "install.txt"
    r["aggdec_install"] = install.read_text().strip() if install.is_file() else None
    staging = ctx.work / "staging.json"
    r["staging"] = json.loads(staging.read_text()) if staging.is_file() else {}
    ort = require_onnxruntime()
    r["onnxruntime"] = {"version": ort.__version__, "path": str(Path(ort.__file__).parent),
                        "device": ort.get_device(), "available_providers": ort.get_available_providers(),
                        "distributions": installed_onnxruntime_distributions()}
    try:
        import torch

        r["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                      "cuda_available": torch.cuda.is_available(),
                      "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    except Exception as exc:  # no torch, or one that cannot see the GPU: said, not fatal
        r["torch"] = {"missing": f"{type(exc).__name__}: {exc}"}
    # does a session on the device really start, and with which options?
    from aggdec.runtime.session import OrtSession

    probe = ctx.work / "probe.onnx"
    try:
        _tiny_graph(probe)
        session = OrtSession(probe, ctx.options.device, name="probe")
        r["session_probe"] = {"providers": session.inference_session.get_providers(),
                              "provider_options": session.provider_options}
        if ctx.options.device == "cuda":
            r["session_probe"]["preload_messages"] = preload_cuda_libraries()
    except Exception as exc:
        r["session_probe"] = {"error": f"{type(exc).__name__}: {exc}"}
    missing = [f"{m['module']} ({m['for']})" for m in r["modules"] if "missing" in m]
    if missing:
        ctx.note(f"missing here: {'; '.join(missing)} (why each: env.json 'modules')")
    print(f"GPU: {r['gpu']}")
    print(f"onnxruntime {ort.__version__} at {r['onnxruntime']['path']}: {ort.get_available_providers()}")
    print(f"session on {ctx.options.device}: {r['session_probe']}")
    if ctx.options.device == "cuda":
        if "CUDAExecutionProvider" not in r["session_probe"].get("providers", []):
            r["status"] = "failed"
            ctx.note("no CUDA session: onnxruntime-gpu is not installed yet (carry every .ort-gpu/wK), or cannot "
                     "start its CUDA provider (session_probe says why)")
        if r["gpu"].get("name") is None:
            r["status"] = "failed"
            ctx.note("nvidia-smi did not name a GPU")
    elif not ctx.options.dry_run:
        ctx.note("device cpu: this is not a GPU check")


# ------------------------------------------------------------------ export


def stage_export(ctx: Context, budget: Budget) -> None:
    from aggdec.bench.bundles import exported_bundle, quantized_bundle
    from aggdec.runtime.manifest import load_manifest, manifest_digest

    path = ctx.work / "bundles.json"
    entries = json.loads(path.read_text()) if path.is_file() else {}
    made = ctx.result.setdefault("bundles", {})
    wanted = {**ctx.options.models, **ctx.options.given_bundles}
    wanted = {n: p for n, p in wanted.items() if not ctx.options.only or n in ctx.options.only}
    if not wanted:
        raise StageError(f"no model or bundle named {', '.join(ctx.options.only)} (given: "
                         f"{', '.join([*ctx.options.models, *ctx.options.given_bundles]) or 'none'})")
    for name, source in wanted.items():
        if budget.left() < MIN_STAGE_S:
            ctx.note(f"{name}: not exported, the stage's budget ran out")
            ctx.result["status"] = "partial"
            continue
        started = time.perf_counter()
        checkpoint = None if name in ctx.options.given_bundles else source
        try:
            bundle = source if checkpoint is None else exported_bundle(checkpoint, ctx.bundles_dir)[0]
            manifest = load_manifest(bundle)  # a given bundle is checked like any (schema, hashes)
            if manifest.precision != "fp32":
                raise StageError(f"{bundle} is an {manifest.precision} bundle; give the fp32 bundle")
        except Exception as exc:
            made[name] = {"source": str(source), "error": f"{type(exc).__name__}: {exc}"}
            ctx.result["status"] = "error"
            ctx.note(f"{name}: export failed: {exc}")
            continue
        entry = {"checkpoint": str(checkpoint) if checkpoint else None, "bundle": str(bundle),
                 "manifest_sha256": manifest_digest(bundle),
                 "drafter": "drafter" in manifest.graphs, "exporter": manifest.exporter,
                 "export_seconds": round(time.perf_counter() - started, 1)}
        started = time.perf_counter()
        try:
            fp16, _ = quantized_bundle(bundle, ctx.bundles_dir, "fp16")
            entry["fp16"] = str(fp16)
            entry["fp16_quantization"] = load_manifest(fp16).quantization
        except Exception as exc:  # an fp16 overflow or a failed position check: the finding itself
            entry["fp16_error"] = f"{type(exc).__name__}: {exc}"
            ctx.result["status"] = "failed"
            ctx.note(f"{name}: fp16 conversion refused: {exc}")
        entry["fp16_seconds"] = round(time.perf_counter() - started, 1)
        made[name] = entries[name] = entry
        path.write_text(json.dumps(entries, indent=1) + "\n")
        ctx.save()
        print(f"{name}: {bundle} ({entry['export_seconds']} s), fp16: {entry.get('fp16', entry.get('fp16_error'))}")


# ------------------------------------------------------------------ pytest -m gpu


def _junit_counts(path: Path) -> dict:
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")} if suite is not None else {}


def stage_pytest(ctx: Context, budget: Budget) -> None:
    log, junit = ctx.results / "pytest-gpu.log", ctx.results / "pytest-gpu.xml"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:randomly",
               "-o", f"cache_dir={ctx.work / 'pytest-cache'}", f"--junitxml={junit}", *ctx.options.pytest_paths]
    ctx.result["command"] = " ".join(command[1:])
    ctx.result["tf32_override"] = os.environ.get("NVIDIA_TF32_OVERRIDE")
    with log.open("w") as handle:
        try:
            done = subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                                  timeout=max(budget.left(), 1))
            ctx.result["returncode"] = done.returncode
        except subprocess.TimeoutExpired:
            ctx.result["status"] = "partial"
            ctx.note(f"pytest stopped at the stage's budget ({budget.seconds:.0f} s); pytest-gpu.log has how far it got")
            return
    counts = _junit_counts(junit) if junit.is_file() else {}
    ctx.result["counts"] = counts
    tail = log.read_text(errors="replace").strip().splitlines()
    ctx.result["summary"] = tail[-1] if tail else ""
    print(ctx.result["summary"])
    ran = counts.get("tests", 0) - counts.get("skipped", 0)
    if ctx.result["returncode"] != 0:
        ctx.result["status"] = "failed"
        ctx.note(f"pytest -m gpu: {ctx.result['summary']} (pytest-gpu.log)")
    elif ran == 0 and ctx.options.device == "cuda":
        ctx.result["status"] = "failed"
        ctx.note("every gpu test was skipped: onnxruntime has no CUDA provider here")
    elif ran == 0:
        ctx.note("every gpu test skipped, as expected without a GPU")


# ------------------------------------------------------------------ equality: the device against the CPU


def stage_equality(ctx: Context, budget: Budget) -> None:
    from aggdec import Generator

    o = ctx.options
    texts_all = ctx.sources(o.limit)
    sections = ctx.result.setdefault("bundles", {})
    for name, entry in ctx.bundles().items():
        if "bundle" not in entry:
            continue
        cpu = Generator(entry["bundle"], device="cpu")
        device = Generator(entry["bundle"], device=o.device)
        texts = usable_texts(cpu, texts_all, ctx, name)
        modes = [m for m in EXACT_MODES if m != "gad" or cpu.drafter is not None]
        if cpu.drafter is None:
            ctx.note(f"{name}: no drafter in the bundle, so no GAD")
        section = sections[name] = {"name": name, "precision": "fp32", "sentences": len(texts), "device": o.device,
                                    "runs": []}
        reference, seconds = decode(cpu, texts, "greedy", 1, o.max_new_tokens)
        section["cpu_greedy_seconds"] = seconds
        refs = ctx.work / "refs"
        refs.mkdir(exist_ok=True)
        (refs / f"{name}-cpu-greedy.json").write_text(json.dumps({"texts": texts, "ids": reference}))

        def explain(run: dict, got: list) -> None:  # whose difference: the device's, or the mode's on the CPU too?
            same, _ = decode(cpu, texts, run["mode"], run["batch_size"], o.max_new_tokens)
            run["cpu_same_mode_vs_cpu_greedy"] = compare(same, reference, texts)
            run["vs_cpu_same_mode"] = compare(got, same, texts)

        check_runs(ctx, budget, section, device, texts, reference, modes, "cpu_greedy", explain=explain)


def check_runs(ctx: Context, budget: Budget, section: dict, generator: Any, texts: list[str], reference: list,
               modes: list[str], against: str, skip: tuple[tuple[int, str], ...] = (),
               explain: Callable[[dict, list], None] | None = None) -> None:
    """Each of ``modes`` at each batch size (batch 1 first) decoded by ``generator`` and compared
    token for token with ``reference`` (recorded as ``vs_AGAINST``) into ``section["runs"]``,
    saved after each; a difference fails the stage (``explain`` adds to its run); the budget
    running out leaves the rest with a note."""
    o = ctx.options
    for batch, mode in ordered_runs(o.batch_sizes, modes):
        if (batch, mode) in skip:
            continue
        if budget.left() < 5:
            ctx.note(f"{section['name']}: budget ran out before {mode} at batch {batch} (and what follows it)")
            ctx.result["status"] = "partial"
            return
        got, seconds = decode(generator, texts, mode, batch, o.max_new_tokens)
        run = {"mode": mode, "batch_size": batch, "seconds": seconds,
               f"vs_{against}": compare(got, reference, texts, generator.codec)}
        equal = run[f"vs_{against}"]["equal"]
        if equal < len(texts):
            if explain is not None:
                explain(run, got)
            ctx.result["status"] = "failed"
            ctx.note(f"{section['name']}: {section['precision']} {mode} at batch {batch} on {o.device} differs from "
                     f"{against.replace('_', ' ')} in {len(texts) - equal} of {len(texts)} sentences")
        section["runs"].append(run)
        print(f"{section['name']} {section['precision']} {mode} batch {batch}: {equal}/{len(texts)} equal "
              f"{against.replace('_', ' ')} ({seconds} s)", flush=True)
        ctx.save()


# ------------------------------------------------------------------ fp16 on the device


def position_check(path: Path, device: str) -> dict:
    """The export's block-vs-alone bitwise check, with the graphs on ``device``."""
    from aggdec.export.positions import Driver, check_position_independence, validation_cases
    from aggdec.runtime.bundle_schema import ACTIVATION_DTYPES
    from aggdec.runtime.errors import ValidationError
    from aggdec.runtime.manifest import load_manifest
    from aggdec.runtime.session import OrtSession

    manifest = load_manifest(path)
    sessions = {name: OrtSession(path / manifest.graph(name).file, device, name=name) for name in ("encoder", "verifier")}
    driver = Driver(sessions["encoder"], sessions["verifier"], manifest, ACTIVATION_DTYPES[manifest.precision])
    started = time.perf_counter()
    try:
        checked = check_position_independence(driver, validation_cases(manifest))
        return {"bitwise_equal": True, "positions": checked, "seconds": round(time.perf_counter() - started, 2)}
    except ValidationError as exc:
        return {"bitwise_equal": False, "error": str(exc)}


def stage_fp16(ctx: Context, budget: Budget) -> None:
    from aggdec import Generator

    o = ctx.options
    texts_all = ctx.sources(o.limit)
    sections = ctx.result.setdefault("bundles", {})
    for name, entry in ctx.bundles().items():
        if "fp16" not in entry:
            ctx.note(f"{name}: no fp16 bundle ({entry.get('fp16_error', 'not exported')})")
            continue
        section = sections[name] = {"name": name, "precision": "fp16", "device": o.device, "block_vs_alone": {},
                                    "runs": []}
        for precision in ("fp32", "fp16"):
            checked = position_check(Path(entry["bundle" if precision == "fp32" else "fp16"]), o.device)
            section["block_vs_alone"][precision] = checked
            print(f"{name} {precision} block vs alone on {o.device}: {checked}", flush=True)
            if not checked["bitwise_equal"]:
                ctx.result["status"] = "failed"
                ctx.note(f"{name}: {precision} block-vs-alone differs on {o.device}: {checked['error']}")
        ctx.save()
        generator = Generator(entry["fp16"], device=o.device)
        texts = usable_texts(generator, texts_all, ctx, name)
        modes = [m for m in EXACT_MODES if m != "gad" or generator.drafter is not None]
        reference, seconds = decode(generator, texts, "greedy", 1, o.max_new_tokens)
        section["sentences"], section["fp16_greedy_seconds"] = len(texts), seconds
        refs = ctx.work / "refs" / f"{name}-cpu-greedy.json"
        if refs.is_file():  # a figure of fp16's accuracy, not a check: fp16 greedy may differ from fp32 greedy
            fp32 = json.loads(refs.read_text())
            if fp32["texts"] == texts:
                section["fp16_greedy_vs_fp32_cpu_greedy"] = compare(reference, fp32["ids"], texts, generator.codec)
        check_runs(ctx, budget, section, generator, texts, reference, modes, "fp16_greedy", skip=((1, "greedy"),))


# ------------------------------------------------------------------ CUDA graphs


class VerifierCall:
    """One verifier call at a fixed (rows, T, capacity, source), bound three ways (see stage_graphs)."""

    def __init__(self, bundle: Path, device: str, rows: int, new: int, seed: int = 0) -> None:
        import numpy as np

        from aggdec.runtime.bundle_schema import ACTIVATION_DTYPES
        from aggdec.runtime.decoding.cache import bucket, cross_names, self_cache_names, self_cache_out_names
        from aggdec.runtime.decoding.verifier import SLACK
        from aggdec.runtime.manifest import load_manifest

        m = load_manifest(bundle)
        self.path = bundle / m.graph("verifier").file
        self.device, self.rows, self.new = device, rows, new
        self.dtype = np.dtype(ACTIVATION_DTYPES[m.precision])
        past = min(GRAPH_PAST, m.max_target_len - new)
        self.capacity = bucket(past + new, m.max_target_len + SLACK)
        self.source = min(GRAPH_SOURCE, m.max_source_len)
        self.top_k = m.top_k
        rng = np.random.default_rng(seed)
        self.ids = rng.integers(min(3, m.vocab_size - 1), m.vocab_size, size=(rows, new)).astype(np.int64)
        self.lengths = np.full(rows, past, dtype=np.int64)
        self.mask = np.ones((rows, self.source), dtype=np.int64)
        self.names = (self_cache_names(m.decoder_layers), self_cache_out_names(m.decoder_layers),
                      cross_names(m.decoder_layers))
        shape = (rows, m.num_heads, self.capacity, m.head_dim)
        self.caches = [rng.standard_normal(shape).astype(self.dtype) for _ in self.names[0]]
        self.cross = [rng.standard_normal((rows, m.num_heads, self.source, m.head_dim)).astype(self.dtype)
                      for _ in self.names[2]]

    def session(self, graph: bool) -> Any:
        from aggdec.runtime.session import check_device, require_onnxruntime

        ort = require_onnxruntime()
        providers = check_device(self.device)
        if graph:
            name, values = providers[0]
            providers = [(name, {**values, "enable_cuda_graph": "1"}), *providers[1:]]
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        return ort.InferenceSession(str(self.path), options, providers=providers)

    def runtime_style(self, session: Any) -> Callable[[], tuple]:
        """As Batch.verify binds a device call today: ids and lengths from the host every call,
        candidates back to the host, the cache buffers on the device by pointer, written in place."""
        from aggdec.runtime.session import require_onnxruntime

        ort = require_onnxruntime()
        binding = session.io_binding()
        # outputs come back in the order they were first bound (as in Batch.verify): the candidates first
        binding.bind_output("top_logprobs", "cpu")
        binding.bind_output("top_ids", "cpu")
        keep = self._device_buffers(ort, binding)
        binding.bind_cpu_input("encoder_attention_mask", self.mask)

        def call() -> tuple:
            binding.bind_output("top_logprobs", "cpu")
            binding.bind_output("top_ids", "cpu")
            binding.bind_cpu_input("input_ids", self.ids)
            binding.bind_cpu_input("past_lengths", self.lengths)
            session.run_with_iobinding(binding)
            outputs = binding.get_outputs()
            return outputs[0].numpy().copy(), outputs[1].numpy().copy(), keep

        return call

    def all_bound(self, session: Any) -> Callable[[], tuple]:
        """Every input and output a buffer on the device at a fixed address (what CUDA graphs need):
        ids and lengths copied in place before the call, candidates copied out after it."""
        import numpy as np

        from aggdec.runtime.session import require_onnxruntime

        ort = require_onnxruntime()
        binding = session.io_binding()
        keep = self._device_buffers(ort, binding)
        ids = ort.OrtValue.ortvalue_from_numpy(self.ids, self.device, 0)
        lengths = ort.OrtValue.ortvalue_from_numpy(self.lengths, self.device, 0)
        mask = ort.OrtValue.ortvalue_from_numpy(self.mask, self.device, 0)
        top_logprobs = ort.OrtValue.ortvalue_from_shape_and_type([self.rows, self.new, self.top_k], np.float32,
                                                                 self.device, 0)
        top_ids = ort.OrtValue.ortvalue_from_shape_and_type([self.rows, self.new, self.top_k], np.int64, self.device, 0)
        for name, value in (("input_ids", ids), ("past_lengths", lengths), ("encoder_attention_mask", mask)):
            binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output("top_logprobs", top_logprobs)
        binding.bind_ortvalue_output("top_ids", top_ids)
        keep += [ids, lengths, mask, top_logprobs, top_ids]

        def call() -> tuple:
            ids.update_inplace(self.ids)
            lengths.update_inplace(self.lengths)
            session.run_with_iobinding(binding)
            return top_logprobs.numpy(), top_ids.numpy(), keep

        return call

    def _device_buffers(self, ort: Any, binding: Any) -> list:
        """The cache buffers (bound in and out, written in place) and cross K/V, each binding its own
        copy (on the CPU an OrtValue wraps the numpy array it is made from; the copies are kept
        alive, last in the list, for as long as the binding is used)."""
        values: list = []
        copies = [cache.copy() for cache in self.caches]
        for name, out, cache in zip(*self.names[:2], copies):
            value = ort.OrtValue.ortvalue_from_numpy(cache, self.device, 0)
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(out, value)  # written in place, as the runtime's buffers are
            values.append(value)
        for name, cross in zip(self.names[2], self.cross):
            value = ort.OrtValue.ortvalue_from_numpy(cross, self.device, 0)
            binding.bind_ortvalue_input(name, value)
            values.append(value)
        return values + [copies]


def time_calls(call: Callable[[], tuple], calls: int, warm: int = 5) -> tuple[float, tuple]:
    """Median milliseconds of ``calls`` calls after ``warm`` untimed ones (CUDA graphs capture then)."""
    for _ in range(warm):
        last = call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        last = call()
        times.append(time.perf_counter() - started)
    return round(1e3 * statistics.median(times), 4), last


def same_outputs(a: tuple, b: tuple) -> bool:
    """Bitwise: the candidates and every cache buffer after the calls."""
    import numpy as np

    caches = [(x, y) for x, y in zip(a[2], b[2]) if not isinstance(x, list)]  # the OrtValues, not the host copies
    return (a[0].shape == b[0].shape and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
            and all(np.array_equal(x.numpy(), y.numpy()) for x, y in caches))


def stage_graphs(ctx: Context, budget: Budget) -> None:
    o = ctx.options
    r = ctx.result
    r["wired_into_runtime"] = False
    ctx.note("measured at fixed shapes, not wired into the decode loop: a batch's rows, block width and cache "
             "capacity change between calls, so the loop would need a captured graph per (rows, T, capacity, "
             "source) and its ids, lengths, mask and candidates in device buffers at fixed addresses "
             "(runtime/decoding/verifier.py binds them from the host every call)")
    if o.device != "cuda":
        ctx.note(f"enable_cuda_graph is an option of onnxruntime's CUDA provider: not applicable on {o.device}; "
                 "the runtime-style and all-bound calls are still timed")
    sections = r.setdefault("bundles", {})
    for name, entry in ctx.bundles().items():
        for precision in ("fp32", "fp16"):
            key = "bundle" if precision == "fp32" else "fp16"
            if key not in entry:
                continue
            rows_out = sections.setdefault(f"{name}-{precision}", [])
            for rows, new in GRAPH_SHAPES:
                if budget.left() < 10:
                    ctx.note(f"{name} {precision}: budget ran out before rows {rows}, T {new}")
                    r["status"] = "partial"
                    break
                call = VerifierCall(Path(entry[key]), o.device, rows, new)
                row: dict = {"rows": rows, "tokens": new, "capacity": call.capacity, "source": call.source}
                plain = call.session(graph=False)
                # each way binds fresh buffers made from the same numbers: their results must agree bitwise
                row["runtime_style_ms"], runtime_last = time_calls(call.runtime_style(plain), o.graph_calls)
                row["all_bound_ms"], bound_last = time_calls(call.all_bound(plain), o.graph_calls)
                row["all_bound_equals_runtime_style"] = same_outputs(bound_last, runtime_last)
                if bound_last[0].shape != (rows, new, call.top_k):
                    r["status"] = "failed"
                    ctx.note(f"{name} {precision} rows {rows} T {new}: candidates of shape {bound_last[0].shape}")
                if not row["all_bound_equals_runtime_style"]:
                    r["status"] = "failed"
                    ctx.note(f"{name} {precision} rows {rows} T {new}: the call with every buffer on the device "
                             "differs from the call bound as the runtime binds it")
                if o.device == "cuda":
                    try:
                        graphed = call.session(graph=True)
                        row["cuda_graph_ms"], graph_last = time_calls(call.all_bound(graphed), o.graph_calls)
                        row["cuda_graph_equals_plain"] = same_outputs(graph_last, bound_last)
                        if not row["cuda_graph_equals_plain"]:
                            r["status"] = "failed"
                            ctx.note(f"{name} {precision} rows {rows} T {new}: CUDA graph replay differs from the "
                                     "plain run")
                    except Exception as exc:  # onnxruntime refuses capture: that is the finding
                        row["cuda_graph_error"] = f"{type(exc).__name__}: {str(exc)[:600]}"
                        r["status"] = "partial"
                        ctx.note(f"{name} {precision}: onnxruntime could not run the verifier under CUDA graphs: "
                                 f"{row['cuda_graph_error']}")
                rows_out.append(row)
                print(f"{name} {precision} rows {rows} T {new}: {row}", flush=True)
                ctx.save()


# ------------------------------------------------------------------ aggdec bench


def ct2_on_device(device: str) -> tuple[bool, str]:
    """Whether CTranslate2 imports and (for cuda) sees a GPU, asked in a process of its own (a
    wheel built for another CUDA can fail to load, or crash)."""
    probe = "import ctranslate2; print(ctranslate2.__version__, ctranslate2.get_cuda_device_count())"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False, "importing ctranslate2 took over 120 s"
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return False, f"ctranslate2 does not import here ({last[0]})"
    version, count = done.stdout.split()
    if device == "cuda" and int(count) < 1:
        return False, f"ctranslate2 {version} sees no CUDA device (its wheel's CUDA may not match this machine's)"
    return True, f"ctranslate2 {version}, {count} CUDA device(s)"


def bench_figures(report: dict) -> list[dict]:
    """The figures the report quotes, per row of an aggdec bench report."""
    return [{"system": row["system"], "device": row["device"], "batch_size": row["batch_size"],
             "median_ms": row["latency_ms"]["median"], "sentences_per_second": row["sentences_per_second"],
             "speedup_vs_aggdec_greedy": row["speedup_vs_aggdec_greedy"],
             "exact_match_vs_greedy": row["exact_match_vs_greedy"], "greedy_reference": row.get("greedy_reference")}
            for row in report["summary"]["rows"]]


def stage_bench(ctx: Context, budget: Budget) -> None:
    o = ctx.options
    ct2 = False
    if o.ct2 == "auto":
        ct2, said = ct2_on_device(o.device)
        ctx.note(f"CTranslate2: {said}" + ("" if ct2 else "; its systems are left out"))
    sections = ctx.result.setdefault("bundles", {})
    for name, entry in ctx.bundles().items():
        if "bundle" not in entry:
            continue
        if budget.left() < 60 and not o.dry_run:
            ctx.note(f"{name}: not benchmarked, {budget.left():.0f} s left of the stage's budget")
            ctx.result["status"] = "partial"
            continue
        systems = ["aggdec-greedy", "aggdec-iad"] + (["aggdec-gad"] if entry["drafter"] else [])
        if "fp16" in entry:
            systems += ["aggdec-fp16-greedy", "aggdec-fp16-iad"] + (["aggdec-fp16-gad"] if entry["drafter"] else [])
        if ct2 and entry["checkpoint"]:
            systems += ["ct2-fp32", "ct2-int8"]
        out = ctx.results / f"bench-{name}"
        command = [sys.executable, "-m", "aggdec", "bench", entry["bundle"], "--data", str(ctx.data_file()),
                   "--device", o.device, "--batch-size", *map(str, o.batch_sizes), "--systems", *systems,
                   "--limit", str(o.bench_limit), "--out", str(out), "--work", str(ctx.bundles_dir), "--no-progress"]
        if ct2 and entry["checkpoint"]:
            command += ["--checkpoint", entry["checkpoint"]]
        if o.max_new_tokens:
            command += ["--max-new-tokens", str(o.max_new_tokens)]
        section = sections[name] = {"command": " ".join(command[2:]), "systems": systems}
        log = ctx.results / "logs" / f"bench-{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as handle:
            try:
                done = subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                                      timeout=max(budget.left(), 1))
                section["returncode"] = done.returncode
            except subprocess.TimeoutExpired:
                section["returncode"] = None
                ctx.result["status"] = "partial"
                ctx.note(f"{name}: the bench stopped at the stage's budget (logs/bench-{name}.log)")
                ctx.save()
                continue
        if section["returncode"] == 1:
            ctx.result["status"] = "failed"
            ctx.note(f"{name}: an exact system differs from its greedy (bench.md's notes say which)")
        elif section["returncode"] != 0:
            ctx.result["status"] = "error"
            ctx.note(f"{name}: aggdec bench failed (exit {section['returncode']}; logs/bench-{name}.log)")
            ctx.save()
            continue
        report_path = out / "bench.json"
        report = json.loads(report_path.read_text())
        section["figures"] = bench_figures(report)
        section["notes"] = report.get("notes", [])
        # committed as the other results are: bench.json.gz, bench.md, plots; the per-sentence
        # outputs and worker logs stay in WORK (they are large and only for inspection)
        with report_path.open("rb") as raw, gzip.open(out / "bench.json.gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
        report_path.unlink()
        extras = ctx.work / "bench-extras" / name
        if extras.exists():
            shutil.rmtree(extras)
        extras.mkdir(parents=True)
        for folder in ("outputs", "logs"):
            if (out / folder).exists():
                shutil.move(str(out / folder), str(extras / folder))
        print(f"{name}: bench done, {len(section['figures'])} rows", flush=True)
        ctx.save()


STAGE_FUNCTIONS: dict[str, Callable[[Context, Budget], None]] = {
    "env": stage_env, "export": stage_export, "pytest": stage_pytest, "equality": stage_equality,
    "fp16": stage_fp16, "graphs": stage_graphs, "bench": stage_bench}


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
        ctx.result["status"] = "error"
        ctx.result["traceback"] = traceback.format_exc()
        ctx.note(f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
    ctx.result["seconds"] = round(time.perf_counter() - started, 1)
    ctx.save()
    return 0


# ------------------------------------------------------------------ the report


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
    """Every stage record in ``results`` by file name (``STAGE`` or ``STAGE-BUNDLES`` for a run
    with --only), in stage order."""
    found = {}
    for path in sorted(results.glob("*.json")):
        record = json.loads(path.read_text())
        if isinstance(record, dict) and record.get("stage") in STAGES:
            found[path.stem] = record
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
    runs = [run for section in sections(found, "equality").values() for run in section["runs"]]
    if runs:
        equal = sum(run["vs_cpu_greedy"]["equal"] for run in runs)
        total = sum(run["vs_cpu_greedy"]["sentences"] for run in runs)
        rows.append((f"{device} == CPU greedy, every exact mode and batch", f"{equal}/{total} decodes",
                     "yes" if equal == total else "NO"))
    fp16_runs = [run for section in sections(found, "fp16").values() for run in section["runs"]]
    if fp16_runs:
        equal = sum(run["vs_fp16_greedy"]["equal"] for run in fp16_runs)
        total = sum(run["vs_fp16_greedy"]["sentences"] for run in fp16_runs)
        rows.append(("fp16 modes == fp16 greedy", f"{equal}/{total} decodes", "yes" if equal == total else "NO"))
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
    for key, shapes in sections(found, "graphs").items():
        one = next((s for s in shapes if s["rows"] == 1 and s["tokens"] == 1), None)
        if one and "cuda_graph_ms" in one:
            rows.append((f"{key}: greedy verifier call <= {TARGET_GRAPH_MS} ms with CUDA graphs",
                         f"{one['cuda_graph_ms']} ms (without: {one['all_bound_ms']} ms all bound, "
                         f"{one['runtime_style_ms']} ms as the runtime binds)",
                         "yes" if one["cuda_graph_ms"] <= TARGET_GRAPH_MS else "no"))
    return rows


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
        lines += ["", "## Issue 32's targets", "", "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {goal} | {measured} | {met} |" for goal, measured, met in goals]
    for bundle, section in sections(found, "bench").items():
        if section.get("figures"):
            lines += ["", f"## aggdec bench: {bundle}", "", f"`{section['command']}`", "",
                      "| system | batch | median ms | sent/s | vs greedy | = greedy |", "|---|---|---|---|---|---|"]
            lines += [f"| {f['system']} | {f['batch_size']} | {f['median_ms']} | {f['sentences_per_second']} | "
                      f"{f['speedup_vs_aggdec_greedy']} | {f['exact_match_vs_greedy']} |" for f in section["figures"]]
    graphs = sections(found, "graphs")
    if graphs:
        lines += ["", "## One verifier call (median ms)", "",
                  "| bundle | rows | T | capacity | as the runtime binds | all bound | CUDA graph | graph = plain |",
                  "|---|---|---|---|---|---|---|---|"]
        for key, shapes in graphs.items():
            lines += [f"| {key} | {s['rows']} | {s['tokens']} | {s['capacity']} | {s['runtime_style_ms']} | "
                      f"{s['all_bound_ms']} | {s.get('cuda_graph_ms', s.get('cuda_graph_error', 'n/a'))} | "
                      f"{s.get('cuda_graph_equals_plain', 'n/a')} |" for s in shapes]
    lines += ["", "Every stage's full record is in `STAGE.json` (and `check.json`, all of them together); "
              "logs in `logs/`, pytest's in `pytest-gpu.log`.", ""]
    text = "\n".join(lines)
    (results / "README.md").write_text(text, encoding="utf-8")
    (results / "check.json").write_text(json.dumps({"name": name, "commit": commit_of(options),
                                                      "source_digest": source_digest(), "stages": found},
                                                     indent=1, default=str) + "\n", encoding="utf-8")
    return name, found


def pack_out(options: Options, results: Path, name: str) -> None:
    """$OUT/results.tar.gz (everything so far, as benchmarks/results/NAME/) and $OUT/summary.md."""
    if options.out is None:
        return
    options.out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(options.out / "results.tar.gz", "w:gz") as tar:
        tar.add(results, arcname=name)
    shutil.copyfile(results / "README.md", options.out / "summary.md")


# ------------------------------------------------------------------ the orchestrator


def run_stages(argv: list[str], options: Options, stages: list[str]) -> int:
    started = time.monotonic()
    results = options.work / "results"
    (results / "logs").mkdir(parents=True, exist_ok=True)
    for stage in stages:
        left = options.deadline_s - (time.monotonic() - started) - REPORT_RESERVE_S
        budget = min(options.budgets[stage], left - GRACE_S)
        record_name = options.record_name(stage)
        path = results / f"{record_name}.json"
        if budget < MIN_STAGE_S:
            note = (f"not started: {max(left, 0):.0f} s were left of this call's {options.deadline_s:.0f} s; "
                    "run it in the next call")
            if not path.is_file():  # an earlier call's record of the stage stays
                path.write_text(json.dumps({"stage": stage, "status": "skipped", "notes": [note],
                                            "budget_s": options.budgets[stage]}, indent=1) + "\n")
            print(f"== {stage}: skipped ({note})", flush=True)
            continue
        print(f"== {record_name} (budget {budget:.0f} s)", flush=True)
        path.unlink(missing_ok=True)  # what follows is this call's record, or none
        log = results / "logs" / f"{record_name}.log"
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
            record["status"] = "partial" if record.get("started") else "error"
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
