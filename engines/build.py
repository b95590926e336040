"""`aggdec build-engines`: TensorRT engines for a bundle's graphs, beside the bundle.

Checks everything that needs no TensorRT first (the bundle, the options, the profiles), then
imports TensorRT, and for each graph builds an engine unless ``engines.json`` already has one
with the same key (bundle, graph, profile, GPU, TensorRT version, precision). The timing
cache (``timing.cache``) is read before and written after every build, so rebuilding for a new
profile or graph reuses the kernel timings measured before on this GPU.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from aggdec.runtime.errors import InputError
from aggdec.runtime.loader import check_precision, open_bundle
from aggdec.runtime.manifest import Manifest, load_manifest, manifest_digest

from .profiles import (
    EngineEntry,
    ProfileOptions,
    bundle_profiles,
    default_engines_dir,
    engine_file,
    engine_key,
    read_engines_manifest,
    write_engines_manifest,
)


@dataclass(frozen=True)
class BuildOptions:
    profile: ProfileOptions = ProfileOptions()
    fp16: bool = False
    tf32: bool = False
    workspace_mib: int = 4096
    force: bool = False  # rebuild even when an engine with the same key exists

    def check(self) -> None:
        self.profile.check()
        if isinstance(self.workspace_mib, bool) or not isinstance(self.workspace_mib, int) or self.workspace_mib < 16:
            raise InputError(f"workspace must be at least 16 MiB, got {self.workspace_mib!r}.")


@dataclass
class Plan:
    """What would be built, known before TensorRT is imported."""

    bundle: Path
    out: Path
    manifest: Manifest
    manifest_sha256: str
    profiles: dict


def plan(bundle: str | Path, out: str | Path | None, options: BuildOptions) -> Plan:
    options.check()
    bundle = Path(bundle)
    manifest = load_manifest(bundle)  # the bundle must be intact before minutes of building
    check_precision(manifest, "tensorrt", bundle)  # engines come from fp32 graphs (--fp16 for fp16 engines)
    digest = manifest_digest(bundle)
    target = Path(out) if out is not None else default_engines_dir(bundle)
    resolved = target.resolve()
    if resolved == bundle.resolve() or bundle.resolve() in resolved.parents:
        raise InputError(f"--out {str(target)!r} is inside the bundle; engines go beside it (the bundle's manifest "
                         "lists every file the bundle may hold).")
    if target.exists() and not target.is_dir():
        raise InputError(f"--out {str(target)!r} exists and is not a directory.")
    read_engines_manifest(target, digest)  # refuse a directory holding another bundle's engines now
    profiles = bundle_profiles(manifest, options.profile)
    # TensorRT's parser reads each graph by its path, and its external data by the paths the
    # graph names, wherever they lead (../.., an absolute path): the runtime's load reads
    # external data only from the files the manifest lists and checks every graph against the
    # manifest, so a bundle it refuses is refused here, before TensorRT reads anything
    open_bundle(bundle, device="cpu", threads=1)
    return Plan(bundle, target, manifest, digest, profiles)


def build_engines(bundle: str | Path, out: str | Path | None = None, options: BuildOptions = BuildOptions(),
                  progress: Callable[[str], None] | None = None) -> Path:
    """Build (or reuse) an engine per graph; returns the engines directory."""
    from .trt import build_engine, current_target

    say = progress or (lambda message: None)
    planned = plan(bundle, out, options)
    target = current_target(fp16=options.fp16, tf32=options.tf32)  # imports TensorRT: its error comes here
    planned.out.mkdir(parents=True, exist_ok=True)
    engines = read_engines_manifest(planned.out, planned.manifest_sha256)
    cache_path = planned.out / engines.timing_cache
    timing = cache_path.read_bytes() if cache_path.is_file() else b""
    say(f"building for {target.gpu} (compute capability {target.compute_capability}), TensorRT {target.tensorrt}"
        f"{', fp16' if target.fp16 else ''}{', tf32' if target.tf32 else ''} into {planned.out}")
    for graph, profile in planned.profiles.items():
        key = engine_key(planned.manifest_sha256, graph, profile, target)
        existing = engines.find(graph, key)
        if existing is not None and not options.force and (planned.out / existing.file).is_file():
            say(f"{graph}: up to date ({existing.file})")
            continue
        say(f"{graph}: building (this takes minutes) ...")
        started = time.perf_counter()
        data, timing = build_engine(planned.bundle / planned.manifest.graph(graph).file, profile, options.fp16,
                                    options.tf32, options.workspace_mib, timing)
        name = engine_file(graph, key)
        temporary = planned.out / f".{name}.tmp"
        temporary.write_bytes(data)
        os.replace(temporary, planned.out / name)
        (planned.out / f".{engines.timing_cache}.tmp").write_bytes(timing)
        os.replace(planned.out / f".{engines.timing_cache}.tmp", cache_path)
        engines.put(EngineEntry(graph=graph, file=name, sha256=hashlib.sha256(data).hexdigest(), key=key,
                                target=asdict(target), profile=profile, workspace_mib=options.workspace_mib,
                                build_seconds=round(time.perf_counter() - started, 1)))
        write_engines_manifest(planned.out, engines)
        say(f"{graph}: {name} ({len(data) / 2**20:.1f} MiB, {time.perf_counter() - started:.0f} s)")
    return planned.out
