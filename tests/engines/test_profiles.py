"""TensorRT profiles, engine keys and the engines manifest, checked without TensorRT: the
profiles against the shapes the real runtime feeds its graphs, the CLI's refusals, and the
one-line error when TensorRT is missing. The engines themselves: tests/engines/test_tensorrt.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from aggdec.runtime.tuning import tuning_for
from aggdec.engines import BuildOptions, ProfileOptions, Target, bundle_profiles, engine_key, plan
from aggdec.engines.profiles import (
    EngineEntry,
    EnginesManifest,
    read_engines_manifest,
    select_engine,
    shape_error,
    write_engines_manifest,
)
from aggdec.runtime.errors import BundleError, InputError
from aggdec.runtime.generator import Generator
from aggdec.runtime.graph_specs import argmax_head
from aggdec.runtime.manifest import load_manifest, manifest_digest

H100 = Target(gpu="NVIDIA H100 80GB HBM3", compute_capability="9.0", tensorrt="10.13.0.35")


def _have_tensorrt() -> bool:
    try:
        import tensorrt  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def aggdec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aggdec", *args], capture_output=True, text=True, timeout=300)


def one_error_line(result: subprocess.CompletedProcess, needle: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("aggdec: error:") and needle in lines[0], result.stderr


def test_every_input_gets_a_profile_with_the_manifest_dims(reference_bundle):
    manifest = load_manifest(reference_bundle)
    options = ProfileOptions(max_batch=8, opt_batch=2, max_block=32)
    built = bundle_profiles(manifest, options)
    # its argmax graph returns the logits, which a GPU does not run (graph_specs.argmax_graph_runs_on)
    assert argmax_head(manifest) == "logits" and "verifier_argmax" in manifest.graphs
    assert list(built) == ["encoder", "verifier", "drafter"]
    for graph, profile in built.items():
        spec = manifest.graph(graph)
        assert list(profile) == [t.name for t in spec.inputs]
        for tensor in spec.inputs:
            shapes = profile[tensor.name]
            for axis, dim in enumerate(tensor.dims):
                low, opt, high = (shapes[k][axis] for k in ("min", "opt", "max"))
                assert 1 <= low <= opt <= high
                if isinstance(dim, int):
                    assert low == opt == high == dim
    verifier = built["verifier"]
    assert verifier["input_ids"]["max"] == [8, 32 + 2]  # max block plus a row's missing tokens
    assert verifier["self_key.0"]["max"][2] == manifest.max_target_len + 2  # format 2's fixed capacity
    assert verifier["input_ids"]["opt"][0] == 2 == verifier["past_lengths"]["opt"][0]
    assert built["drafter"]["input_ids"]["min"][1] == manifest.draft_k + 1


def _assert_fed_shapes_within_profiles(generator: Generator, texts: list[str], modes: tuple[str, ...],
                                       options: ProfileOptions) -> set[str]:
    """Decode ``texts`` batched in each mode, recording each graph call's input shapes (the
    unbound path feeds every input as an array, the same shapes the bound path binds), and
    require every one inside the bundle's profiles. Returns the graphs that were run."""
    seen: dict[str, list[dict]] = {name: [] for name in generator._sessions}
    for name, session in generator._sessions.items():
        original = session.run

        def recording(inputs, name=name, original=original):
            seen[name].append({k: tuple(v.shape) for k, v in inputs.items()})
            return original(inputs)

        session.run = recording
    for mode in modes:
        generator.generate(texts, mode=mode, batch_size=options.max_batch)
    built = bundle_profiles(generator.manifest, options)
    for graph, calls in seen.items():
        for call in calls:
            for name, shape in call.items():
                shapes = built[graph][name]
                assert shape_error(name, shape, shapes["min"], shapes["max"]) is None, (graph, name, shape, shapes)
    return {graph for graph, calls in seen.items() if calls}


def test_the_runtime_never_feeds_a_shape_outside_the_profiles(reference_bundle):
    # the float drafter: TensorRT builds engines of it (drafter_int8, the CPU's copy, has the same IO);
    # every mode on the top-K verifier graph, as on a GPU (its argmax graph returns the logits:
    # graph_specs.argmax_graph_runs_on), here by turning the CPU's argmax graph off
    tuning = dataclasses.replace(tuning_for("cpu"), argmax_graph=False)
    generator = Generator(reference_bundle, io_binding=False, int8_drafter=False, tuning=tuning)
    sample = Path(__file__).resolve().parents[2] / "examples" / "uagec_test_sample.tsv"
    texts = [line.split("\t")[0] for line in sample.read_text(encoding="utf-8").splitlines()[:24]]
    ran = _assert_fed_shapes_within_profiles(generator, texts, ("greedy", "iad", "gad", "gad++"),
                                             ProfileOptions(max_batch=8, max_block=64))
    assert ran == set(generator._sessions) - {"verifier_argmax"}
    # and a batch larger than the profile is what the engine would refuse, by name
    assert "dim 0 is 9" in shape_error("input_ids", (9, 1), [1, 1], [8, 66])


def test_shortlist_bundles_get_profiles_for_each_rows_output_ids(tmp_path):
    """A Marian bundle with a lexical shortlist: its graphs' output_ids are bounded too, with
    each sentence's own list and with --no-shortlist's one row of every id."""
    from aggdec.export import export_bundle
    from tests.support.marian import WORDS, add_shortlist, write_model

    folder = write_model(tmp_path / "model", "ssru")[0]
    add_shortlist(folder)
    export_bundle(folder, tmp_path / "bundle", progress=None, max_source_len=64, max_target_len=64)
    manifest = load_manifest(tmp_path / "bundle")
    options = ProfileOptions(max_batch=4, max_block=8)
    profiles = bundle_profiles(manifest, options)
    verifier = profiles["verifier"]["output_ids"]
    assert argmax_head(manifest) == "argmax" and "verifier_argmax" in profiles  # a shortlist bundle's ArgMax head runs
    assert verifier["max"][0] == 4 and verifier["max"][1] >= manifest.vocab_size and verifier["min"] == [1, 1]
    texts = [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(1 + i % 7)) for i in range(10)]
    # the runtime's IAD blocks as long as the profiles allow (on TensorRT its tuning's max_block is
    # the profiles' default; the CPU's 32 would let a draft of a whole source pass max_block=8)
    tuning = dataclasses.replace(tuning_for("cpu"), max_block=options.max_block)
    for shortlist in (True, False):
        generator = Generator(tmp_path / "bundle", io_binding=False, shortlist=shortlist, tuning=tuning)
        ran = _assert_fed_shapes_within_profiles(generator, texts, ("greedy", "iad"), options)
        assert {"encoder", "verifier_argmax"} <= ran


def test_unknown_dims_and_bad_options_are_refused(reference_bundle):
    manifest = load_manifest(reference_bundle)
    spec = manifest.graph("verifier")
    odd = dataclasses.replace(spec, inputs=(dataclasses.replace(spec.inputs[0], dims=("batch", "mystery")),))
    strange = dataclasses.replace(manifest, graphs={**manifest.graphs, "verifier": odd})
    with pytest.raises(BundleError, match="'mystery'"):
        bundle_profiles(strange, ProfileOptions())
    for bad, needle in ((ProfileOptions(max_batch=0), "max-batch"), (ProfileOptions(max_batch=2, opt_batch=4),
                                                                     "opt-batch 4 exceeds max-batch 2")):
        with pytest.raises(InputError, match=needle):
            bundle_profiles(manifest, bad)
    with pytest.raises(InputError, match="workspace"):
        plan(reference_bundle, None, BuildOptions(workspace_mib=1))


def test_engine_keys_change_with_everything_an_engine_depends_on(reference_bundle):
    manifest = load_manifest(reference_bundle)
    digest = manifest_digest(reference_bundle)
    profile = bundle_profiles(manifest, ProfileOptions())["verifier"]
    key = engine_key(digest, "verifier", profile, H100)
    assert key == engine_key(digest, "verifier", json.loads(json.dumps(profile)), H100)
    others = [
        engine_key("0" * 64, "verifier", profile, H100),
        engine_key(digest, "encoder", profile, H100),
        engine_key(digest, "verifier", bundle_profiles(manifest, ProfileOptions(max_batch=32))["verifier"], H100),
        engine_key(digest, "verifier", profile, dataclasses.replace(H100, gpu="NVIDIA A100-SXM4-80GB",
                                                                    compute_capability="8.0")),
        engine_key(digest, "verifier", profile, dataclasses.replace(H100, tensorrt="10.14.1")),
        engine_key(digest, "verifier", profile, dataclasses.replace(H100, fp16=True)),
        engine_key(digest, "verifier", profile, dataclasses.replace(H100, tf32=True)),
    ]
    assert len({key, *others}) == 1 + len(others)


def test_engines_manifest_round_trip_selection_and_refusals(reference_bundle, tmp_path):
    digest = manifest_digest(reference_bundle)
    engines = read_engines_manifest(tmp_path, digest)
    assert engines.engines == []
    entry = EngineEntry(graph="verifier", file="verifier-0123.engine", sha256="ab" * 32, key="k1",
                        target=dataclasses.asdict(H100), profile={}, workspace_mib=4096, build_seconds=1.0)
    engines.put(entry)
    engines.put(dataclasses.replace(entry, build_seconds=2.0))  # same key: replaced, not added
    write_engines_manifest(tmp_path, engines)
    again = read_engines_manifest(tmp_path, digest)
    assert len(again.engines) == 1 and again.engines[0].build_seconds == 2.0
    assert select_engine(again, "verifier", H100, tmp_path).file == "verifier-0123.engine"
    with pytest.raises(BundleError, match="no verifier engine .* for NVIDIA L4 .*there are: NVIDIA H100"):
        select_engine(again, "verifier", dataclasses.replace(H100, gpu="NVIDIA L4"), tmp_path)
    with pytest.raises(BundleError, match="built from another bundle"):
        read_engines_manifest(tmp_path, "f" * 64)
    (tmp_path / "engines.json").write_text("{not json")
    with pytest.raises(BundleError, match="not a readable engines manifest"):
        read_engines_manifest(tmp_path, digest)


_ENTRY = {"graph": "verifier", "file": "verifier-0123.engine", "sha256": "ab" * 32, "key": "k1", "target": {},
          "profile": {}, "workspace_mib": 4096, "build_seconds": 1.0}


@pytest.mark.parametrize("data, needle", [
    ([], "must hold a JSON object, not list"),
    ("engines", "must hold a JSON object, not str"),
    ({"format": 1, "bundle_manifest_sha256": "d" * 64, "engines": {"verifier": _ENTRY}}, "engines must be a list"),
    ({"format": 1, "bundle_manifest_sha256": ["d"], "engines": []}, "bundle_manifest_sha256 must be a sha256"),
    # a timing cache build-engines would read from there and os.replace back over it
    ({"format": 1, "bundle_manifest_sha256": "d" * 64, "engines": [], "timing_cache": "/etc/passwd"},
     "timing_cache '/etc/passwd' is not a plain file name"),
    ({"format": 1, "bundle_manifest_sha256": "d" * 64, "engines": [], "timing_cache": "../timing.cache"},
     "timing_cache '../timing.cache' is not a plain file name"),
    # an engine the runtime would load from outside the directory (its sha256 comes from the same file)
    ({"format": 1, "bundle_manifest_sha256": "d" * 64, "engines": [{**_ENTRY, "file": "../../elsewhere.engine"}]},
     "engines[0].file '../../elsewhere.engine' is not a plain file name"),
    ({"format": 1, "bundle_manifest_sha256": "d" * 64, "engines": [{**_ENTRY, "target": ["gpu"]}]},
     "engines[0].target has the wrong type (list)"),
    ({"format": 1, "bundle_manifest_sha256": "d" * 64, "engines": [{"graph": "verifier"}]},
     "engines[0] must be an object with"),
])
def test_a_hostile_engines_manifest_is_a_bundle_error(tmp_path, data, needle):
    """engines.json is as untrusted as a bundle: any JSON is read or refused with a BundleError,
    and no file name in it may lead out of its directory."""
    (tmp_path / "engines.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="not a readable engines manifest") as error:
        read_engines_manifest(tmp_path, "d" * 64)
    assert needle in str(error.value)


def test_an_engines_manifest_that_is_a_fifo_is_refused_without_hanging(tmp_path):
    import os

    os.mkfifo(tmp_path / "engines.json")
    with pytest.raises(BundleError, match="not a regular file"):
        read_engines_manifest(tmp_path, "d" * 64)


def test_build_engines_refuses_a_hostile_engines_manifest_in_one_line(bundle, tmp_path):
    out = tmp_path / "engines"
    out.mkdir()
    digest = manifest_digest(bundle("marian"))
    (out / "engines.json").write_text(json.dumps({"format": 1, "bundle_manifest_sha256": digest, "engines": [],
                                                  "timing_cache": str(tmp_path / "victim")}))
    one_error_line(aggdec("build-engines", str(bundle("marian")), "--out", str(out), "--dry-run"),
                   "is not a plain file name")
    (out / "engines.json").write_text("[]")
    one_error_line(aggdec("build-engines", str(bundle("marian")), "--out", str(out), "--dry-run"),
                   "must hold a JSON object, not list")


def test_build_engines_cli_checks_then_needs_tensorrt(reference_bundle, tmp_path):
    dry = aggdec("build-engines", str(reference_bundle), "--dry-run", "--max-batch", "4", "--max-block", "8")
    assert dry.returncode == 0, dry.stderr
    lines = [json.loads(line) for line in dry.stdout.splitlines()]
    assert lines[0]["out"].endswith("bundle.engines")
    verifier_ids = next(x for x in lines[1:] if x["graph"] == "verifier" and x["input"] == "input_ids")
    # --max-block 8 is below the drafter's k: a GAD block (k drafts + 2) must still fit
    k = json.loads((reference_bundle / "manifest.json").read_text())["draft_k"]
    assert k > 8
    assert verifier_ids == {"graph": "verifier", "input": "input_ids", "min": "1x1", "opt": f"1x{min(16, k + 2)}",
                            "max": f"4x{k + 2}"}
    assert {x["graph"] for x in lines[1:]} == {"encoder", "verifier", "drafter"}  # no logits argmax engine

    one_error_line(aggdec("build-engines", str(reference_bundle), "--out", str(reference_bundle / "engines")),
                   "inside the bundle")
    one_error_line(aggdec("build-engines", str(reference_bundle), "--max-batch", "2", "--opt-batch", "4"),
                   "opt-batch 4 exceeds max-batch 2")
    one_error_line(aggdec("build-engines", str(tmp_path / "nothing")), "nothing")
    if _have_tensorrt():
        pytest.skip("TensorRT is installed here: the missing-TensorRT errors cannot be seen")
    one_error_line(aggdec("build-engines", str(reference_bundle), "--out", str(tmp_path / "e")), "TensorRT is not installed")
    assert not (tmp_path / "e").exists()  # nothing written before TensorRT was found
    one_error_line(aggdec("generate", str(reference_bundle), "--device", "tensorrt", "--input", "/dev/null"),
                   "TensorRT is not installed")
    one_error_line(aggdec("generate", str(reference_bundle), "--engines", str(tmp_path)), "--device tensorrt only")


def test_engines_manifest_class_defaults():
    fresh = EnginesManifest("d" * 64)
    assert fresh.to_json() == {"format": 1, "bundle_manifest_sha256": "d" * 64, "timing_cache": "timing.cache",
                               "engines": []}
