"""The int8 copy of an fp32 bundle's drafter (graph ``drafter_int8``), which GAD uses on the CPU.

A drafter only proposes; the fp32 verifier decides. So the int8 drafter may draft differently
from the float one, but never changes an output: test_gad.py and test_batched.py check GAD ==
greedy == transformers with it (it is the CPU's default) and with the float one. Here: the
export writes it with the drafter's IO, the manifest rules that tie it to the drafter, the
choice between the two, and `aggdec quantize` not carrying it into an int8 bundle.
"""

from __future__ import annotations

import shutil

import pytest

from aggdec.cli import main
from aggdec.runtime.errors import BundleError, InputError, ProviderError
from aggdec.runtime.generator import Generator, drafter_graph
from aggdec.runtime.manifest import load_manifest, sha256_of
from aggdec.runtime.tuning import Tuning
from tests.runtime.test_bundle_hostile import _delete, _set, assert_cli_one_error, read, write
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - the fixture
from tests.runtime.test_lossless import random_texts

pytest.importorskip("onnx")


@pytest.fixture()
def gad_copy(gad_bundle, tmp_path):  # noqa: F811
    target = tmp_path / "bundle"
    shutil.copytree(gad_bundle("marian"), target)
    return target


def test_export_writes_the_int8_drafter_with_the_drafters_io(gad_bundle):  # noqa: F811
    root = gad_bundle("marian")
    manifest = load_manifest(root)
    int8, fp32 = manifest.graphs["drafter_int8"], manifest.graphs["drafter"]
    assert int8.file == "drafter.int8.onnx" and int8.inputs == fp32.inputs and int8.outputs == fp32.outputs
    assert manifest.files[int8.file] == sha256_of(root / int8.file)
    import onnx

    ops = {node.op_type for node in onnx.load(str(root / int8.file)).graph.node}
    assert "MatMulInteger" in ops
    # and it drafts: GAD with it is greedy (the property tests cover families and batches)
    generator = Generator(root)
    texts = random_texts(seed=5, count=6)
    assert generator.drafter_graph == "drafter_int8"
    assert [r.ids for r in generator.generate(texts, mode="gad", max_new_tokens=16)] == \
        [r.ids for r in generator.generate(texts, mode="greedy", max_new_tokens=16)]
    # the rows' own sizing alone (DraftGate could measure a random drafter's calls not paying)
    drafting = Generator(root, tuning=Tuning(draft_payoff=False))
    assert drafting.generate(texts[:1], mode="gad", max_new_tokens=16)[0].stats.drafter_seconds > 0


def test_no_int8_drafter_option(tmp_path, random_checkpoint, gad_bundle):  # noqa: F811
    drafter_dir = gad_bundle("marian").parent / "drafter"
    out = tmp_path / "plain"
    assert main(["export", str(random_checkpoint("marian")), str(out), "--drafter", str(drafter_dir),
                 "--no-int8-drafter"]) == 0
    manifest = load_manifest(out)
    assert "drafter" in manifest.graphs and "drafter_int8" not in manifest.graphs
    assert not (out / "drafter.int8.onnx").exists()
    # such a bundle (or one exported before aggdec wrote int8 drafters) runs the float drafter
    assert Generator(out).drafter_graph == "drafter"
    with pytest.raises(BundleError, match="no int8 drafter"):
        Generator(out, int8_drafter=True)


def test_which_drafter_graph(gad_bundle, bundle):  # noqa: F811
    manifest = load_manifest(gad_bundle("marian"))
    assert drafter_graph(manifest, "cpu", None) == "drafter_int8"
    assert drafter_graph(manifest, "cpu", True) == "drafter_int8"
    assert drafter_graph(manifest, "cpu", False) == "drafter"
    for device in ("cuda", "tensorrt"):  # int8 products are a CPU kernel
        assert drafter_graph(manifest, device, None) == "drafter"
        with pytest.raises(ProviderError, match="'cpu' only"):
            drafter_graph(manifest, device, True)
    with pytest.raises(InputError, match="int8_drafter"):
        drafter_graph(manifest, "cpu", "yes")
    plain = load_manifest(bundle("marian"))
    assert drafter_graph(plain, "cpu", None) is None and drafter_graph(plain, "cpu", False) is None
    with pytest.raises(BundleError, match="has no drafter"):
        Generator(bundle("marian"), int8_drafter=True)


def test_generate_fp32_drafter_flag(gad_bundle, tmp_path, capsys):  # noqa: F811
    source = tmp_path / "in.txt"
    source.write_text("\n".join(random_texts(seed=8, count=4)) + "\n")
    outputs = []
    for extra in (["--mode", "greedy"], ["--mode", "gad"], ["--mode", "gad", "--fp32-drafter"]):
        assert main(["generate", str(gad_bundle("marian")), "--input", str(source), "--max-new-tokens", "12",
                     "--stats", *extra]) == 0
        captured = capsys.readouterr()
        outputs.append(captured.out)
        # GAD's --stats also says what its draft lengths were chosen from
        assert ("measured costs: a one-token verifier call" in captured.err) == ("gad" in extra), captured.err
    assert outputs[0].strip() and outputs[1] == outputs[0] and outputs[2] == outputs[0]


# a well-formed int8 manifest's quantization record (what `aggdec quantize` writes)
QUANTIZATION = {"scheme": "per-row-int8", "reference": "fp32 graphs", "output_projection": True,
                "quantized_matmuls": 10, "positions": 100, "top1_agreement": 0.99, "max_logprob_error": 0.5,
                "mean_logprob_error": 0.05, "draft_agreement": 1.0}


@pytest.mark.parametrize("edit, needle", [
    (lambda m: _delete(_delete(_delete(_delete(m, ("graphs", "drafter")), ("draft_k",)), ("mask_token_id",)),
                       ("draft_window",)), "no 'drafter' graph"),
    (lambda m: _set(m, ("graphs", "drafter_int8", "outputs", 0, "dims", 1), 3), "same IO"),
    (lambda m: _set(m, ("graphs", "drafter_int8", "inputs", 0, "name"), "ids"), "same IO"),
    (lambda m: _set(_set(m, ("precision",), "int8"), ("quantization",), QUANTIZATION), "only fp32 bundles"),
])
def test_manifest_rules_tie_the_int8_drafter_to_the_drafter(gad_copy, edit, needle, capsys):
    write(gad_copy, edit(read(gad_copy)))
    with pytest.raises(BundleError, match=needle):
        load_manifest(gad_copy, verify=False)
    assert_cli_one_error(gad_copy, capsys, needle)


def test_a_tampered_int8_drafter_is_refused_even_when_the_float_one_is_used(gad_copy):
    (gad_copy / "drafter.int8.onnx").write_bytes(b"not a graph")
    with pytest.raises(BundleError, match="drafter.int8.onnx"):
        Generator(gad_copy, int8_drafter=False)  # every listed file is checked, opened or not


def test_quantize_does_not_carry_the_int8_drafter_over(gad_bundle, tmp_path):  # noqa: F811
    from aggdec.export.quantize import quantize_bundle

    quantize_bundle(gad_bundle("marian"), tmp_path / "int8", progress=None)
    manifest = load_manifest(tmp_path / "int8")
    assert manifest.precision == "int8" and "drafter_int8" not in manifest.graphs
    assert "drafter.int8.onnx" not in manifest.files and not (tmp_path / "int8" / "drafter.int8.onnx").exists()
    assert Generator(tmp_path / "int8").drafter_graph == "drafter"  # int8 already
