"""What every stage of the GPU check shares: its options, the time it has, where it writes.

check.py parses the options and runs each stage (check_stages.py) in a process of its own with a
:class:`Context` and a :class:`Budget`; check_report.py reads what they wrote.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGES = ("env", "export", "pytest", "equality", "fp16", "graphs", "bench", "edits", "cudagraphs")
# seconds per stage: on the GPU (sized for one H100 call each) and in the dry run
# sized for a 15-minute lease: the last part's call runs env, equality, fp16, graphs, bench and
# pytest in its 540 s, each budget from that stage's time on the H100 (gpu-check-* results)
# (edits, last: a call of its own, ``check.sh edits``, after export; 178 s on the H100, most of it
# the host path's beams)
# (cudagraphs: 112 s on the H100 for 200 sentences, 3 modes, 3 batch sizes, 4 decodes each, fp32
# and fp16; it fits beside bench in one call)
BUDGETS = {"env": 30, "export": 120, "pytest": 70, "equality": 150, "fp16": 110, "graphs": 30, "bench": 130,
           "edits": 240, "cudagraphs": 180}
DRY_BUDGETS = dict.fromkeys(STAGES, 120)
MIN_STAGE_S = 15  # a stage is not started with less than this left
REFERENCE_MODELS = {"uagec": REPO / "benchmarks" / "models" / "uagec" / "model"}
LARGER_MODEL = "uagec-base"
SAMPLE_DATA = REPO / "examples" / "uagec_test_sample.tsv"
CARRIED_DATA = "data/uagec-test.tsv"  # in WORK/carried: prepare.sh packs the UA-GEC test split


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
    static_shapes: bool = False  # equality and fp16 decode with Generator(static_shapes=True)

    def record_name(self, stage: str) -> str:
        """The stage's result file (without .json): one per selection of bundles, so that a stage
        run for another bundle in a later call keeps what the earlier call recorded (and one
        for static shapes, beside the ordinary loop's)."""
        name = stage if not self.only else f"{stage}-{'+'.join(self.only)}"
        return f"{name}-static" if self.static_shapes and stage in STATIC_STAGES else name

    def record_path(self, results: Path, stage: str) -> Path:
        """RESULTS/check-RECORD.json (``check-``: not to be taken for the bench's own bench.json)."""
        return results / f"check-{self.record_name(stage)}.json"


# the stages --static-shapes changes (check_stages.check_static_runs)
STATIC_STAGES = ("equality", "fp16")

# a stage's status, least to most serious: a later finding never hides an earlier, worse one
SEVERITY = ("ok", "skipped", "partial", "failed", "error")


def worse(a: str, b: str) -> str:
    return max(a, b, key=SEVERITY.index)


class Budget:
    """The seconds a stage has: it stops starting work when too few are left."""

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

    def mark(self, status: str) -> None:
        """The stage's status becomes ``status`` unless it already is something worse."""
        self.result["status"] = worse(self.result.get("status", "ok"), status)

    def note(self, message: str) -> None:
        self.result.setdefault("notes", []).append(message)
        print(f"[{self.stage}] {message}", flush=True)

    def save(self) -> None:
        """Write the stage's result so far (a stage killed at its budget keeps what it finished)."""
        self.results.mkdir(parents=True, exist_ok=True)
        path = self.options.record_path(self.results, self.stage)
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
        from aggdec.sentences import load_examples

        return [example.source for example in load_examples(str(self.data_file()), limit)]


class StageError(Exception):
    """A stage that cannot run at all (its message is the note)."""

