"""The GPU check's stages (check.py runs each in a process of its own; README.md beside it says
what each checks). A stage writes its record through its :class:`Context` after every unit of
work, so that one killed at its budget keeps what it finished.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from check_context import MIN_STAGE_S, REPO, Budget, Context, StageError

EXACT_MODES = ("greedy", "iad", "gad")
# the verifier shapes the graphs stage times: (rows, tokens per row); greedy is T = 1
GRAPH_SHAPES = ((1, 1), (1, 16), (8, 1), (32, 1))
GRAPH_PAST = 32  # cached positions before the timed call
GRAPH_SOURCE = 32  # source tokens
# Python modules the stages use: (module, what needs it)
MODULES = (
    ("numpy", "everything"), ("tokenizers", "the runtime"), ("onnxruntime", "the runtime"),
    ("onnx", "fp16 conversion (export, fp16, bench)"), ("torch", "export, pytest fixtures"),
    ("transformers", "export, pytest fixtures"), ("safetensors", "export"), ("sentencepiece", "export (Marian)"),
    ("pytest", "pytest"), ("hypothesis", "pytest (collection of some test modules)"),
    ("matplotlib", "bench plots"), ("tqdm", "bench"), ("ctranslate2", "bench's CTranslate2 peer (optional)"),
    ("ua_gec", "the UA-GEC corpus (optional: prepare.sh carries the test split as a file)"),
)




# ------------------------------------------------------------------ shared pieces


def decode(generator: Any, texts: list[str], mode: str, batch: int, max_new: int | None) -> tuple[list, float]:
    started = time.perf_counter()
    results = generator.generate(texts, mode=mode, batch_size=batch, max_new_tokens=max_new)
    return [r.ids for r in results], round(time.perf_counter() - started, 3)


def compare(got: list[list[int]], want: list[list[int]], texts: list[str], codec: Any = None) -> dict:
    """How many outputs are equal token for token, and the first few that are not."""
    # as lists: a result's ids are a tuple, a reference read back from JSON a list, and a tuple
    # never equals a list (the fp16-vs-fp32 figure of the third H100 run counted 0 of 1,000 so)
    got, want = [list(ids) for ids in got], [list(ids) for ids in want]
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
        ctx.note(f"missing here: {'; '.join(missing)}")
    print(f"GPU: {r['gpu']}")
    print(f"onnxruntime {ort.__version__} at {r['onnxruntime']['path']}: {ort.get_available_providers()}")
    print(f"session on {ctx.options.device}: {r['session_probe']}")
    if ctx.options.device == "cuda":
        if "CUDAExecutionProvider" not in r["session_probe"].get("providers", []):
            ctx.mark("failed")
            ctx.note("no CUDA session: onnxruntime-gpu is not installed yet (carry every .ort-gpu/wK), or cannot "
                     "start its CUDA provider (session_probe says why)")
        if r["gpu"].get("name") is None:
            ctx.mark("failed")
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
            ctx.mark("partial")
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
            ctx.mark("error")
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
            ctx.mark("failed")
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
            ctx.mark("partial")
            ctx.note(f"pytest stopped at the stage's budget ({budget.seconds:.0f} s); pytest-gpu.log has how far it got")
            return
    counts = _junit_counts(junit) if junit.is_file() else {}
    ctx.result["counts"] = counts
    tail = log.read_text(errors="replace").strip().splitlines()
    ctx.result["summary"] = tail[-1] if tail else ""
    print(ctx.result["summary"])
    ran = counts.get("tests", 0) - counts.get("skipped", 0)
    if ctx.result["returncode"] != 0:
        ctx.mark("failed")
        ctx.note(f"pytest -m gpu: {ctx.result['summary']} (pytest-gpu.log)")
    elif ran == 0 and ctx.options.device == "cuda":
        ctx.mark("failed")
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
        device = Generator(entry["bundle"], device=o.device, static_shapes=o.static_shapes)
        texts = usable_texts(cpu, texts_all, ctx, name)
        modes = [m for m in EXACT_MODES if m != "gad" or cpu.drafter is not None]
        if cpu.drafter is None:
            ctx.note(f"{name}: no drafter in the bundle, so no GAD")
        # static shapes: a section of its own (the report merges a stage's records by section)
        section = sections[static_key(name, o)] = {"name": name, "precision": "fp32", "sentences": len(texts),
                                                   "device": o.device, "runs": []}
        reference, seconds = decode(cpu, texts, "greedy", 1, o.max_new_tokens)
        section["cpu_greedy_seconds"] = seconds
        if o.static_shapes:
            check_static_runs(ctx, budget, section, device, texts, modes, reference, "cpu_greedy")
            continue
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
        if out_of_budget(ctx, budget, section, f"{mode} at batch {batch}"):
            return
        got, seconds = decode(generator, texts, mode, batch, o.max_new_tokens)
        run = {"mode": mode, "batch_size": batch, "seconds": seconds,
               f"vs_{against}": compare(got, reference, texts, generator.codec)}
        if run[f"vs_{against}"]["equal"] < len(texts) and explain is not None:
            explain(run, got)
        judge_run(ctx, section, run, against, mode, len(texts))


def out_of_budget(ctx: Context, budget: Budget, section: dict, before: str) -> bool:
    """Whether the stage's budget is spent (a run needs a few seconds); if so, the stage is
    partial, with a note of where it stopped."""
    if budget.left() >= 5:
        return False
    ctx.note(f"{section['name']}: budget ran out before {before} (and what follows it)")
    ctx.mark("partial")
    return True


def judge_run(ctx: Context, section: dict, run: dict, against: str, what: str, sentences: int) -> None:
    """Record ``run`` (its ``vs_AGAINST`` comparison made) in ``section``: a difference fails the
    stage with a note; saved after each run."""
    equal = run[f"vs_{against}"]["equal"]
    said = f"{section['name']}: {section['precision']} {what} at batch {run['batch_size']}"
    if equal < sentences:
        ctx.mark("failed")
        ctx.note(f"{said} on {ctx.options.device} differs from {against.replace('_', ' ')} in {sentences - equal} of "
                 f"{sentences} sentences")
    section["runs"].append(run)
    print(f"{said}: {equal}/{sentences} equal {against.replace('_', ' ')} ({run['seconds']} s)", flush=True)
    ctx.save()


def static_key(name: str, options: Any) -> str:
    """A bundle's section name in a stage's record: ``NAME-static`` with --static-shapes."""
    return f"{name}-static" if options.static_shapes else name


def check_static_runs(ctx: Context, budget: Budget, section: dict, generator: Any, texts: list[str], modes: list[str],
                      reference: list, against: str) -> None:
    """Static shapes (``generator`` made with ``static_shapes=True``): at each batch size, static
    greedy, then every other mode compared token for token with it (``vs_static_greedy``; a
    difference fails the stage). Static greedy against ``reference`` is recorded as a figure
    (``static_greedy_vs_AGAINST``): the device's arithmetic, not a mode, decides it."""
    o = ctx.options
    section["static_shapes"] = {"width": generator.static_width}
    for batch in o.batch_sizes:
        if out_of_budget(ctx, budget, section, f"static batch {batch}"):
            return
        greedy, seconds = decode(generator, texts, "greedy", batch, o.max_new_tokens)
        section["runs"].append({"mode": "greedy", "batch_size": batch, "seconds": seconds, "static_shapes": True,
                                f"static_greedy_vs_{against}": compare(greedy, reference, texts, generator.codec)})
        ctx.save()
        for mode in modes:
            if mode == "greedy":
                continue
            if out_of_budget(ctx, budget, section, f"static {mode} at batch {batch}"):
                return
            got, seconds = decode(generator, texts, mode, batch, o.max_new_tokens)
            run = {"mode": mode, "batch_size": batch, "seconds": seconds, "static_shapes": True,
                   "vs_static_greedy": compare(got, greedy, texts, generator.codec)}
            judge_run(ctx, section, run, "static_greedy", f"static {mode}", len(texts))


# ------------------------------------------------------------------ fp16 on the device


def static_check_width() -> int:
    """The one-shape check's block width: the widest block the validation cases verify."""
    from aggdec.export.positions import NEW_LENS

    return max(NEW_LENS)


def position_check(path: Path, device: str, static_width: int | None = None) -> dict:
    """The export's block-vs-alone bitwise check (and, where the bundle has the argmax verifier
    graph, its ids against the top-K graph's first), with the graphs on ``device``;
    ``static_width``: every call at one shape (export.positions.Driver), as a decode that kept
    its shapes fixed would make them."""
    from aggdec.export.positions import check_verifier_graphs, validation_cases
    from aggdec.runtime.bundle_schema import ACTIVATION_DTYPES
    from aggdec.runtime.errors import ValidationError
    from aggdec.runtime.graph_specs import VERIFIER_GRAPHS, argmax_graph_runs_on
    from aggdec.runtime.manifest import load_manifest
    from aggdec.runtime.session import OrtSession

    manifest = load_manifest(path)
    # the graphs the runtime runs there: off the CPU, not an argmax graph that returns logits
    names = ["encoder", *(name for name in VERIFIER_GRAPHS if name in manifest.graphs
                          and (name == "verifier" or argmax_graph_runs_on(manifest, device)))]
    sessions = {name: OrtSession(path / manifest.graph(name).file, device, name=name) for name in names}
    started = time.perf_counter()
    try:
        checked = check_verifier_graphs(sessions.pop("encoder"), sessions, manifest, validation_cases(manifest),
                                        ACTIVATION_DTYPES[manifest.precision], static_width=static_width)
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
        section = sections[static_key(name, o)] = {"name": name, "precision": "fp16", "device": o.device,
                                                   "block_vs_alone": {}, "runs": []}
        if o.static_shapes:  # the graph-level checks are the ordinary record's; here the decode loop
            generator = Generator(entry["fp16"], device=o.device, static_shapes=False)
            texts = usable_texts(generator, texts_all, ctx, name)
            modes = [m for m in EXACT_MODES if m != "gad" or generator.drafter is not None]
            reference, seconds = decode(generator, texts, "greedy", 1, o.max_new_tokens)
            section["sentences"], section["fp16_greedy_seconds"] = len(texts), seconds
            check_static_runs(ctx, budget, section, Generator(entry["fp16"], device=o.device, static_shapes=True),
                              texts, modes, reference, "fp16_greedy")
            continue
        for precision in ("fp32", "fp16"):
            path = Path(entry["bundle" if precision == "fp32" else "fp16"])
            checked = position_check(path, o.device)
            section["block_vs_alone"][precision] = checked
            print(f"{name} {precision} block vs alone on {o.device}: {checked}", flush=True)
            if not checked["bitwise_equal"]:
                ctx.mark("failed")
                ctx.note(f"{name}: {precision} block-vs-alone differs on {o.device}: {checked['error']}")
            # the same at one shape for every call (decision 034): whether fixed shapes make a
            # position's result independent of its block on this device's libraries
            width = static_check_width()
            static = position_check(path, o.device, static_width=width)
            section.setdefault("block_vs_alone_static", {})[precision] = {**static, "width": width}
            print(f"{name} {precision} block vs alone at one shape (width {width}) on {o.device}: {static}",
                  flush=True)
            if not static["bitwise_equal"]:
                ctx.mark("failed")
                ctx.note(f"{name}: {precision} block-vs-alone at one shape differs on {o.device}: {static['error']}")
            ctx.save()
        generator = Generator(entry["fp16"], device=o.device, static_shapes=False)
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
        from aggdec.runtime.decoding.cache import (bucket, cross_dims, cross_names, self_cache_names,
                                                   self_cache_out_names)
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
        self.cross = [rng.standard_normal(cross_dims(rows, m.num_heads, self.source, m.head_dim,
                                                     name.startswith("cross_key"), m.cross_key_layout)).astype(self.dtype)
                      for name in self.names[2]]

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
    r["wired_into_runtime"] = True
    ctx.note("one call measured at fixed shapes; the decode loop captures and replays graphs with static shapes "
             "and Generator(cuda_graphs=True) (runtime/decoding/fixed_calls.py), which the cudagraphs stage "
             "measures")
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
                    ctx.mark("partial")
                    break
                call = VerifierCall(Path(entry[key]), o.device, rows, new)
                row: dict = {"rows": rows, "tokens": new, "capacity": call.capacity, "source": call.source}
                plain = call.session(graph=False)
                # each way binds fresh buffers made from the same numbers: their results must agree bitwise
                row["runtime_style_ms"], runtime_last = time_calls(call.runtime_style(plain), o.graph_calls)
                row["all_bound_ms"], bound_last = time_calls(call.all_bound(plain), o.graph_calls)
                row["all_bound_equals_runtime_style"] = same_outputs(bound_last, runtime_last)
                if bound_last[0].shape != (rows, new, call.top_k):
                    ctx.mark("failed")
                    ctx.note(f"{name} {precision} rows {rows} T {new}: candidates of shape {bound_last[0].shape}")
                if not row["all_bound_equals_runtime_style"]:
                    ctx.mark("failed")
                    ctx.note(f"{name} {precision} rows {rows} T {new}: the call with every buffer on the device "
                             "differs from the call bound as the runtime binds it")
                if o.device == "cuda":
                    try:
                        graphed = call.session(graph=True)
                        row["cuda_graph_ms"], graph_last = time_calls(call.all_bound(graphed), o.graph_calls)
                        row["cuda_graph_equals_plain"] = same_outputs(graph_last, bound_last)
                        if not row["cuda_graph_equals_plain"]:
                            ctx.mark("failed")
                            ctx.note(f"{name} {precision} rows {rows} T {new}: CUDA graph replay differs from the "
                                     "plain run")
                    except Exception as exc:  # onnxruntime refuses capture: that is the finding
                        row["cuda_graph_error"] = f"{type(exc).__name__}: {str(exc)[:600]}"
                        ctx.mark("partial")
                        said = f"onnxruntime could not run the verifier under CUDA graphs: {row['cuda_graph_error']}"
                        if not any(said in note for note in r.get("notes", [])):  # once, not per shape
                            ctx.note(f"{name} {precision}: {said}")
                rows_out.append(row)
                print(f"{name} {precision} rows {rows} T {new}: {row}", flush=True)
                ctx.save()


# ------------------------------------------------------------------ CUDA graphs in the decode loop

GRAPH_ORDER = ("plain", "graphs", "graphs", "plain")  # alternated in one process: drift falls on both


def graph_generators(bundle: str, device: str) -> tuple[Any, Any, str | None]:
    """Two static-shape Generators over ``bundle``: without and with CUDA graphs (on the CPU,
    which has none, the second runs the same fixed calls with CPU values: the binding and the
    pool the graphs replay, without a graph); and what onnxruntime said if it refused them."""
    from aggdec import Generator
    from aggdec.runtime.decoding.fixed_calls import FixedCalls

    plain = Generator(bundle, device=device, static_shapes=True)
    if device == "cuda":
        graphs = Generator(bundle, device=device, static_shapes=True, cuda_graphs=True)
        return plain, graphs, graphs.cuda_graphs_refused
    graphs = Generator(bundle, device=device, static_shapes=True)
    graphs.verifier.fixed_calls = FixedCalls()
    return plain, graphs, None


def stage_cudagraphs(ctx: Context, budget: Budget) -> None:
    """Static-shape decodes (decision 034) without and with CUDA graphs (``Generator(cuda_graphs=True)``,
    runtime/decoding/fixed_calls.py), every exact mode at each batch size, alternated
    (:data:`GRAPH_ORDER`) on the same sentences: the outputs must be equal token for token (a
    difference fails the stage), and the time of each is recorded. Each batch size's shapes are
    captured in an untimed warm-up first (its time recorded: the first call of a shape runs
    twice and captures). The dry run has no CUDA graphs: there the second system is the fixed
    calls on CPU values (the same binding and pool, no graph)."""
    import warnings

    o = ctx.options
    ctx.result["cuda_graphs"] = o.device == "cuda"
    if o.device != "cuda":
        ctx.note(f"CUDA graphs need onnxruntime's CUDA provider: on {o.device} the 'graphs' system is the fixed "
                 "calls without a graph (every input and output bound once), compared with the static path")
    texts_all = ctx.sources(o.bench_limit)
    sections = ctx.result.setdefault("bundles", {})
    for name, entry in ctx.bundles().items():
        for precision, key in (("fp32", "bundle"), ("fp16", "fp16")):
            if key not in entry:
                continue
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                plain, graphs, refused = graph_generators(entry[key], o.device)
            texts = usable_texts(plain, texts_all, ctx, name)
            modes = [m for m in EXACT_MODES if m != "gad" or plain.drafter is not None]
            section = sections[f"{name}-{precision}"] = {"name": name, "precision": precision, "device": o.device,
                                                         "sentences": len(texts), "width": plain.static_width,
                                                         "runs": []}
            if refused:
                section["cuda_graphs_refused"] = refused
                ctx.mark("partial")
                ctx.note(f"{name} {precision}: onnxruntime refused CUDA graphs: {refused}")
            for batch in o.batch_sizes:
                if out_of_budget(ctx, budget, section, f"{precision} batch {batch}"):
                    return
                started = time.perf_counter()  # the shapes' first calls (and captures), untimed below
                for mode in modes:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        decode(graphs, texts[:batch], mode, batch, o.max_new_tokens)
                    said += caught
                    decode(plain, texts[:batch], mode, batch, o.max_new_tokens)
                warm_s = round(time.perf_counter() - started, 3)
                for mode in modes:
                    if out_of_budget(ctx, budget, section, f"{precision} {mode} at batch {batch}"):
                        return
                    seconds = dict.fromkeys(GRAPH_ORDER, 0.0)
                    verifier_s = dict.fromkeys(GRAPH_ORDER, 0.0)
                    encoder_s = dict.fromkeys(GRAPH_ORDER, 0.0)  # the encoder's calls: fixed ones too
                    outputs = {}
                    for system in GRAPH_ORDER:
                        generator = graphs if system == "graphs" else plain
                        before = generator.verifier.seconds
                        outputs[system], took = decode(generator, texts, mode, batch, o.max_new_tokens)
                        seconds[system] += took
                        verifier_s[system] += generator.verifier.seconds["verifier"] - before["verifier"]
                        encoder_s[system] += generator.verifier.seconds["encoder"] - before["encoder"]
                    run = {"mode": mode, "batch_size": batch, "warm_up_seconds": warm_s,
                           "seconds": {k: round(v / 2, 3) for k, v in seconds.items()},
                           "verifier_seconds": {k: round(v / 2, 3) for k, v in verifier_s.items()},
                           "encoder_seconds": {k: round(v / 2, 3) for k, v in encoder_s.items()},
                           "plain_over_graphs": round(seconds["plain"] / seconds["graphs"], 3),
                           "verifier_plain_over_graphs": round(verifier_s["plain"] / max(verifier_s["graphs"], 1e-9),
                                                               3),
                           "vs_static_plain": compare(outputs["graphs"], outputs["plain"], texts, plain.codec)}
                    judge_run(ctx, section, run, "static_plain", f"{mode} with CUDA graphs", len(texts))
            pool = graphs.verifier.fixed_calls
            section["fixed_calls_made"] = pool.made if pool is not None else 0
            section["graph_refused_at_run"] = pool.refused if pool is not None else None
            section["warnings"] = [str(w.message)[:600] for w in said]
            if section["graph_refused_at_run"]:
                ctx.mark("partial")
                ctx.note(f"{name} {precision}: a captured graph failed, the rest ran without: "
                         f"{section['graph_refused_at_run']}")
            ctx.save()


# ------------------------------------------------------------------ cache edits: on the device or through the host

EDIT_PATHS = ("host", "graphs")  # cache.DEVICE_EDITS: the old whole-buffer round trip, the device edit graphs
EDIT_BEAMS = 4  # the beam run (issue 29: a reorder every step): this many beams, at the largest batch size


def edit_runs(batch_sizes: tuple[int, ...]) -> list[dict]:
    """The stage's decodes, as generate() options: greedy at each batch size (batch 1 first), then
    beam search at the largest."""
    return [{"mode": "greedy", "batch_size": batch} for batch in batch_sizes] + [
        {"mode": "greedy", "batch_size": max(batch_sizes), "num_beams": EDIT_BEAMS}]


def stage_edits(ctx: Context, budget: Budget) -> None:
    """Greedy at each batch size, then beam search at the largest (:func:`edit_runs`), with the
    cache edits through the host (cache.DEVICE_EDITS = "host": every finished row, admission,
    growth and beam reorder downloads and uploads whole buffers) and on the device (the edit
    graphs, device_edits.py), the two alternated (host, graphs, graphs, host) in one process on
    the same sentences (beams: the first quarter of them); both must give the same outputs.
    In the dry run the buffers are CPU onnxruntime values (cache.ORT_BUFFERS_ON_CPU), so both
    paths run there too, at CPU speed."""
    from aggdec import Generator
    from aggdec.runtime.decoding import cache

    o = ctx.options
    cache.ORT_BUFFERS_ON_CPU = o.dry_run
    texts_all = ctx.sources(o.bench_limit)
    sections = ctx.result.setdefault("bundles", {})
    for name, entry in ctx.bundles().items():
        if "bundle" not in entry:
            continue
        generator = Generator(entry["bundle"], device=o.device)
        texts = usable_texts(generator, texts_all, ctx, name)
        section = sections[name] = {"name": name, "sentences": len(texts), "device": o.device, "runs": []}
        decode(generator, texts[:8], "greedy", 1, o.max_new_tokens)  # warm-up: sessions, edit graphs
        for options in edit_runs(o.batch_sizes):
            beams = options.get("num_beams", 1)
            what = f"{'greedy' if beams == 1 else f'{beams} beams'} at batch {options['batch_size']}"
            if out_of_budget(ctx, budget, section, what):
                break
            part = texts if beams == 1 else texts[: max(len(texts) // 4, 1)]
            seconds = dict.fromkeys(EDIT_PATHS, 0.0)
            outputs = {}
            for path in (*EDIT_PATHS, *EDIT_PATHS[::-1]):
                cache.DEVICE_EDITS = path  # read when a batch's buffers are made
                started = time.perf_counter()
                results = generator.generate(part, max_new_tokens=o.max_new_tokens, **options)
                seconds[path] += time.perf_counter() - started
                outputs[path] = [r.ids for r in results]
            cache.DEVICE_EDITS = "graphs"
            run = {**options, "sentences": len(part), "seconds": {p: round(t, 3) for p, t in seconds.items()},
                   "sentences_per_second": {p: round(2 * len(part) / t, 1) for p, t in seconds.items()},
                   "host_over_graphs": round(seconds["host"] / seconds["graphs"], 3),
                   "graphs_vs_host": compare(outputs["graphs"], outputs["host"], part)}
            if run["graphs_vs_host"]["equal"] < len(part):
                ctx.mark("failed")
                ctx.note(f"{name}: {what} with device edits differs from host edits in "
                         f"{len(part) - run['graphs_vs_host']['equal']} of {len(part)} sentences")
            section["runs"].append(run)
            print(f"{name}: {what}: {run['sentences_per_second']} sentences/s, host/graphs "
                  f"{run['host_over_graphs']}", flush=True)
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
            ctx.mark("partial")
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
                ctx.mark("partial")
                ctx.note(f"{name}: the bench stopped at the stage's budget (logs/bench-{name}.log)")
                ctx.save()
                continue
        if section["returncode"] == 1:
            ctx.mark("failed")
            ctx.note(f"{name}: an exact system differs from its greedy (bench.md's notes say which)")
        elif section["returncode"] != 0:
            ctx.mark("error")
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
    "fp16": stage_fp16, "graphs": stage_graphs, "bench": stage_bench, "edits": stage_edits,
    "cudagraphs": stage_cudagraphs}

