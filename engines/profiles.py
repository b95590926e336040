"""TensorRT optimization profiles and the engines manifest: plain Python, no TensorRT needed.

A TensorRT engine built from a graph with dynamic dims runs only the shapes its optimization
profile allows (min <= shape <= max per dim) and is tuned for one (opt). Every dynamic dim of
an aggdec graph is a named dim of the bundle's manifest (``runtime/graph_specs.py``), so a profile is
derived from the manifest alone:

- ``batch``: rows per call, 1 .. ``--max-batch`` (the ``batch_size`` the runtime will be used at);
- ``source_len``: the encoder's padded source width and the verifier's/drafter's source
  capacity (a power-of-two bucket, ``runtime/decoding/cache.py``), 1 .. ``max_source_len``;
- ``new_len``: the verifier's block of new tokens T, 1 .. ``--max-block`` plus the two
  positions a row's decoder prefix may add (``runtime/decoding/verifier.SLACK``), never more
  than the cache holds;
- ``capacity``: the self-attention buffers' current capacity, a power of two from
  ``MIN_CAPACITY`` up to ``max_target_len + SLACK`` (format 2's fixed allocation);
- ``draft_len``: the drafter's input, the output tokens it reads (the last ``draft_window``
  of them, or all) plus k [MASK] slots, k + 1 .. ``min(draft_window, max_target_len + SLACK) + k``;
- ``output_rows`` and ``output_len`` (a shortlist bundle's ``output_ids``): one row per row or
  one row for all, 1 .. ``--max-batch``; a row's allowed ids, at most the whole vocabulary
  (``--no-shortlist`` feeds every id); ``matrix_rows`` and ``matrix_len``, the verifier's kept
  shortlist matrices (``output_rows``), empty when it gathers them itself.

Fixed dims (heads, head_dim, d_model, top-k) are the manifest's integers. A dim name this
module does not know is refused: an engine with a guessed range would fail at run time.

Engines are written to a directory beside the bundle (``BUNDLE.engines`` by default), never
into it: the bundle's manifest lists every file it holds and refuses unknown keys.
``engines.json`` there lists each engine with the key it was built for: the bundle (its
manifest's sha256), the graph, the GPU (name and compute capability), the TensorRT version,
the precision flags and the profile. An engine is only valid for exactly that key, so engines
for several GPUs or TensorRT versions can sit side by side and a mismatch is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aggdec.runtime.decoding.cache import MATRIX_STEP, MIN_CAPACITY
from aggdec.runtime.decoding.verifier import SLACK
from aggdec.runtime.errors import BundleError, InputError
from aggdec.runtime.graph_specs import argmax_graph_runs_on
from aggdec.runtime.manifest import Manifest
from aggdec.runtime.tuning import tuning_for

ENGINES_FORMAT = 1
ENGINES_MANIFEST = "engines.json"
TIMING_CACHE = "timing.cache"
DEFAULT_MAX_BLOCK = tuning_for("tensorrt").max_block  # the runtime's IAD max block on a GPU
GRAPHS = ("encoder", "verifier", "verifier_argmax", "drafter", "drafter_source")
# a typical sentence's shortlist: Marian's first ids plus a few dozen per source token
SHORTLIST_OPT_LEN = 512


@dataclass(frozen=True)
class ProfileOptions:
    max_batch: int = 16
    opt_batch: int = 1
    max_block: int = DEFAULT_MAX_BLOCK

    def check(self) -> None:
        for name in ("max_batch", "opt_batch", "max_block"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name.replace('_', '-')} must be an integer of at least 1, got {value!r}.")
        if self.opt_batch > self.max_batch:
            raise InputError(f"opt-batch {self.opt_batch} exceeds max-batch {self.max_batch}.")


Range = tuple[int, int, int]  # min, opt, max


def dim_ranges(manifest: Manifest, options: ProfileOptions) -> dict[str, Range]:
    """(min, opt, max) of every named dim of the bundle's graphs."""
    options.check()
    capacity_max = manifest.max_target_len + SLACK
    capacity_min = min(MIN_CAPACITY, capacity_max)
    # a GAD block is the drafter's k tokens after the row's missing ones: never cut it short
    new_max = min(max(options.max_block, int(manifest.draft_k or 0)) + SLACK, capacity_max)
    source_max = manifest.max_source_len
    ranges: dict[str, Range] = {
        "batch": (1, options.opt_batch, options.max_batch),
        "source_len": (1, min(64, source_max), source_max),
        "new_len": (1, min(16, new_max), new_max),
        "capacity": (capacity_min, max(capacity_min, min(64, capacity_max)), capacity_max),
    }
    if manifest.shortlist is not None:
        vocab = manifest.vocab_size
        # A row's list is at most the vocabulary, but where the slots keep their matrices
        # (decoding/cache.py) lists are padded to the store's width, which grows by a quarter
        # from below the vocabulary in MATRIX_STEPs; the verifier's kept matrices may also be
        # empty (it gathers them itself).
        longest = -(vocab * 5 // 4) // MATRIX_STEP * -MATRIX_STEP
        opt = min(SHORTLIST_OPT_LEN, vocab)
        ranges["output_rows"] = (1, options.opt_batch, options.max_batch)
        ranges["output_len"] = (1, opt, longest)
        ranges["matrix_rows"] = (1, options.opt_batch, options.max_batch)
        ranges["matrix_len"] = (0, opt, longest)
    if manifest.draft_k:
        k = int(manifest.draft_k)
        # the drafter reads the last draft_window output tokens (format 3; 0 or None: all of them)
        window = int(getattr(manifest, "draft_window", 0) or 0)
        prefix_max = min(window, capacity_max) if window else capacity_max
        ranges["draft_len"] = (k + 1, k + min(32, prefix_max), prefix_max + k)
    return ranges


def graph_profile(manifest: Manifest, graph: str, options: ProfileOptions) -> dict[str, dict[str, list[int]]]:
    """The optimization profile of one graph: per input, its min, opt and max shape."""
    if graph not in manifest.graphs:
        raise BundleError(f"the bundle has no {graph} graph (it has {', '.join(sorted(manifest.graphs))}).")
    ranges = dim_ranges(manifest, options)
    profile = {}
    for tensor in manifest.graph(graph).inputs:
        shapes: dict[str, list[int]] = {"min": [], "opt": [], "max": []}
        for dim in tensor.dims:
            if isinstance(dim, int):
                low = opt = high = dim
            elif dim in ranges:
                low, opt, high = ranges[dim]
            else:
                raise BundleError(f"{graph} input {tensor.name!r} has a dim {dim!r} that aggdec build-engines does "
                                  f"not know how to bound (known: {', '.join(sorted(ranges))}); this bundle "
                                  "format is newer than this aggdec.")
            shapes["min"].append(low)
            shapes["opt"].append(opt)
            shapes["max"].append(high)
        profile[tensor.name] = shapes
    return profile


def bundle_profiles(manifest: Manifest, options: ProfileOptions) -> dict[str, dict[str, dict[str, list[int]]]]:
    """Every graph's profile, in build order; not an argmax graph the GPU does not run
    (graph_specs.argmax_graph_runs_on: one that returns the logits)."""
    return {graph: graph_profile(manifest, graph, options) for graph in GRAPHS if graph in manifest.graphs
            and (graph != "verifier_argmax" or argmax_graph_runs_on(manifest, "tensorrt"))}


@dataclass(frozen=True)
class Target:
    """What an engine is valid for besides its graph and profile."""

    gpu: str  # the device name, e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: str  # "9.0"
    tensorrt: str  # TensorRT's version, e.g. "10.13.0.35"
    fp16: bool = False
    tf32: bool = False


def engine_key(manifest_sha256: str, graph: str, profile: dict, target: Target) -> str:
    """A digest of everything an engine depends on: equal keys mean an engine can be reused."""
    payload = json.dumps({"format": ENGINES_FORMAT, "bundle": manifest_sha256, "graph": graph, "profile": profile,
                          "target": asdict(target)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def engine_file(graph: str, key: str) -> str:
    return f"{graph}-{key[:16]}.engine"


@dataclass
class EngineEntry:
    graph: str
    file: str
    sha256: str
    key: str
    target: dict
    profile: dict
    workspace_mib: int
    build_seconds: float

    @classmethod
    def from_json(cls, data: dict) -> EngineEntry:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


@dataclass
class EnginesManifest:
    bundle_manifest_sha256: str
    engines: list[EngineEntry] = field(default_factory=list)
    format: int = ENGINES_FORMAT
    timing_cache: str = TIMING_CACHE

    def find(self, graph: str, key: str) -> EngineEntry | None:
        return next((e for e in self.engines if e.graph == graph and e.key == key), None)

    def put(self, entry: EngineEntry) -> None:
        self.engines = [e for e in self.engines if not (e.graph == entry.graph and e.key == entry.key)] + [entry]

    def to_json(self) -> dict:
        return {"format": self.format, "bundle_manifest_sha256": self.bundle_manifest_sha256,
                "timing_cache": self.timing_cache, "engines": [asdict(e) for e in self.engines]}


def default_engines_dir(bundle: Path) -> Path:
    bundle = Path(bundle)
    return bundle.parent / f"{bundle.name}.engines"


# the JSON type each engines.json entry field must have (EngineEntry's fields)
_ENTRY_TYPES = {"graph": str, "file": str, "sha256": str, "key": str, "target": dict, "profile": dict,
                "workspace_mib": int, "build_seconds": (int, float)}


def _engines_from_json(data: Any) -> EnginesManifest:
    """``engines.json``'s object as an EnginesManifest, or ValueError saying what is wrong.

    The directory is as untrusted as a bundle: every file it names (each engine, the timing
    cache) must be a plain name inside it, checked like a bundle's (bundle_schema.check_file_name).
    A name such as ``/etc/passwd`` or ``../x`` would otherwise have had build-engines read the
    timing cache from there and write it back there (``os.replace``), and the runtime load an
    engine from there (its sha256 comes from the same file, so it proves nothing)."""
    from aggdec.runtime.bundle_schema import Invalid, check_file_name

    def plain(name: Any, where: str) -> str:
        try:
            return check_file_name(name)
        except Invalid as exc:
            raise ValueError(f"{where} {exc.message}") from None

    if not isinstance(data, dict):
        raise ValueError(f"it must hold a JSON object, not {type(data).__name__}")
    if data.get("format") != ENGINES_FORMAT:
        raise ValueError(f"it is engines format {str(data.get('format'))[:20]!r}; this aggdec reads {ENGINES_FORMAT}")
    digest, entries = data.get("bundle_manifest_sha256"), data.get("engines")
    if not isinstance(digest, str) or len(digest) != 64:
        raise ValueError("bundle_manifest_sha256 must be a sha256 in hex")
    if not isinstance(entries, list):
        raise ValueError("engines must be a list")
    engines = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not set(_ENTRY_TYPES) <= set(entry):
            raise ValueError(f"engines[{index}] must be an object with {', '.join(_ENTRY_TYPES)}")
        for name, kind in _ENTRY_TYPES.items():
            if not isinstance(entry[name], kind) or isinstance(entry[name], bool):
                raise ValueError(f"engines[{index}].{name} has the wrong type ({type(entry[name]).__name__})")
        plain(entry["file"], f"engines[{index}].file")
        engines.append(EngineEntry.from_json(entry))
    return EnginesManifest(digest, engines, timing_cache=plain(data.get("timing_cache", TIMING_CACHE), "timing_cache"))


def read_engines_manifest(directory: Path, manifest_sha256: str) -> EnginesManifest:
    """The engines manifest in ``directory`` for this bundle (an empty one if there is none)."""
    from aggdec.runtime.manifest import read_capped

    path = Path(directory) / ENGINES_MANIFEST
    if not path.exists() and not path.is_symlink():
        return EnginesManifest(manifest_sha256)
    # a regular file of bounded size (not a link, not a FIFO that would block the read)
    raw = read_capped(path, what="an engines manifest")
    try:
        engines = _engines_from_json(json.loads(raw.decode("utf-8")))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise BundleError(f"{path} is not a readable engines manifest: {str(exc)[:300]}") from None
    if engines.bundle_manifest_sha256 != manifest_sha256:
        raise BundleError(f"the engines in {directory} were built from another bundle (manifest sha256 "
                          f"{engines.bundle_manifest_sha256[:12]}..., this one {manifest_sha256[:12]}...); "
                          "give another --out or remove that directory.")
    return engines


def write_engines_manifest(directory: Path, engines: EnginesManifest) -> None:
    """Written atomically: a temporary file beside it, renamed over it."""
    directory = Path(directory)
    fd, temporary = tempfile.mkstemp(prefix=".engines-", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(engines.to_json(), handle, indent=2)
        handle.write("\n")
    os.replace(temporary, directory / ENGINES_MANIFEST)


def select_engine(engines: EnginesManifest, graph: str, target: Target, directory: Path) -> EngineEntry:
    """The engine for ``graph`` built for ``target`` (any profile), or a BundleError saying what exists."""
    matching = [e for e in engines.engines if e.graph == graph and e.target == asdict(target)]
    if not matching:
        have = sorted({f"{e.target.get('gpu')} / TensorRT {e.target.get('tensorrt')}"
                       f"{' fp16' if e.target.get('fp16') else ''}" for e in engines.engines if e.graph == graph})
        raise BundleError(f"no {graph} engine in {directory} for {target.gpu} with TensorRT {target.tensorrt}"
                          f"{' fp16' if target.fp16 else ''} (there are: {', '.join(have) or 'none'}); run "
                          "`aggdec build-engines` on this machine.")
    return matching[-1]


def shape_error(name: str, shape: tuple[int, ...], low: Any, high: Any) -> str | None:
    """Why ``shape`` is outside the profile range [low, high] of input ``name``, or None."""
    low, high = tuple(low), tuple(high)
    if len(shape) != len(low):
        return f"input {name!r} has rank {len(shape)}, the engine expects {len(low)}"
    for axis, (size, a, b) in enumerate(zip(shape, low, high)):
        if not a <= size <= b:
            return (f"input {name!r} dim {axis} is {size}, outside the engine's profile [{a}, {b}] "
                    "(rebuild with a larger --max-batch or --max-block)")
    return None
