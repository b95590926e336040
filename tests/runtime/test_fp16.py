"""fp16 bundles (`aggdec quantize --precision fp16`, `aggdec export --precision fp16`): lossless
against their own greedy.

fp16 bundles are for CUDA; onnxruntime's CPU provider runs them too, which is where these
tests run them: IAD, GAD and GAD++ at beta 1 equal the fp16 bundle's greedy for every family,
at batch 1 and 4, with IO binding on and off (float16 buffers bound by pointer). Whether CUDA
keeps a block's positions bitwise apart is not tested here (no GPU; README, fp16 bundles).
"""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest

from aggdec.cli import main
from aggdec.runtime.errors import BundleError, ExportError, ProviderError
from aggdec.runtime.generator import Generator, check_precision
from aggdec.runtime.manifest import load_manifest
from tests.runtime.test_bundle_hostile import read, write
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - the fixture
from tests.runtime.test_int8 import MAX_NEW, assert_lossless, assert_lossless_with_and_without_io_binding
from tests.runtime.test_lossless import random_texts
from tests.support.tiny import FAMILIES

onnx = pytest.importorskip("onnx")

FLOAT16 = 10  # onnx.TensorProto.FLOAT16


@pytest.fixture(scope="session")
def fp16(converted):
    return lambda fp32_dir: converted(fp32_dir, "fp16")


def io_types(path) -> dict[str, int]:
    model = onnx.load(str(path), load_external_data=False)
    return {v.name: v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)}


@pytest.mark.parametrize("family", FAMILIES)
def test_fp16_iad_equals_fp16_greedy_for_every_family(family, bundle, fp16):
    root = fp16(bundle(family))
    manifest = load_manifest(root)
    q = manifest.quantization
    assert manifest.precision == "fp16" and q["scheme"] == "fp16" and q["reference"] == "fp32 graphs"
    assert q["quantized_matmuls"] > 0 and q["positions"] > 0
    assert 0.0 <= q["mean_logprob_error"] <= q["max_logprob_error"]
    # no accuracy bound here: a random tiny T5 is so sensitive that rounding its weights alone to
    # float16 moves its encoder output by a fifth (a scratch check); the trained model's test bounds it
    # every float tensor between graphs is float16, and so are the weights; the log-probs stay float32
    verifier = io_types(root / "verifier.onnx")
    assert verifier["top_logprobs"] == onnx.TensorProto.FLOAT
    assert verifier["self_key.0"] == verifier["self_key_out.0"] == verifier["cross_value.0"] == FLOAT16
    assert io_types(root / "encoder.onnx")["encoder_hidden_states"] == FLOAT16
    spec = {t.name: t.dtype for t in manifest.graphs["verifier"].inputs + manifest.graphs["verifier"].outputs}
    assert spec["self_key.0"] == "float16" and spec["top_logprobs"] == "float32"
    model = onnx.load(str(root / "verifier.onnx"))
    kept = {n.op_type for n in model.graph.node if n.op_type in ("LogSoftmax", "TopK", "Softmax")}
    assert kept == {"LogSoftmax", "TopK", "Softmax"}
    producers = {out: node for node in model.graph.node for out in node.output}
    for node in model.graph.node:  # each runs on float32: its input comes through a Cast to float
        if node.op_type in kept:
            cast = producers[node.input[0]]
            assert cast.op_type == "Cast" and cast.attribute[0].i == onnx.TensorProto.FLOAT, node.name
    texts = random_texts(seed=60 + FAMILIES.index(family), count=12)
    assert_lossless_with_and_without_io_binding(root, texts)


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_fp16_gad_equals_fp16_greedy_with_a_random_drafter(family, gad_bundle, fp16):  # noqa: F811
    root = fp16(gad_bundle(family))
    assert load_manifest(root).quantization["draft_agreement"] is not None
    assert io_types(root / "drafter.onnx")["encoder_hidden_states"] == FLOAT16
    for io_binding in (True, False):
        assert_lossless(Generator(root, io_binding=io_binding), random_texts(seed=61, count=10),
                        modes=("iad", "gad", "gad++"))


def test_a_trained_model_keeps_its_outputs_in_fp16(editing_bundle, fp16):
    """The trained toy editor: fp16 agrees with fp32 on the validation shapes, and on real
    sentences its greedy is fp32's nearly everywhere, with IAD still equal to it."""
    from tests.support import tiny
    import random

    root = fp16(editing_bundle)
    q = load_manifest(root).quantization
    assert q["top1_agreement"] >= 0.97 and q["mean_logprob_error"] < 0.05, q
    rng = random.Random("fp16-editing")
    texts = [tiny.make_editing_pair(rng)[0] for _ in range(40)]
    fp32 = [r.ids for r in Generator(editing_bundle).generate(texts, mode="greedy", max_new_tokens=MAX_NEW)]
    half = Generator(root)
    greedy = [r.ids for r in half.generate(texts, mode="greedy", max_new_tokens=MAX_NEW)]
    assert sum(a == b for a, b in zip(greedy, fp32)) >= 36
    assert [r.ids for r in half.generate(texts, mode="iad", max_new_tokens=MAX_NEW, batch_size=8)] == greedy


def test_export_precision_fp16_and_the_quantize_command(random_checkpoint, bundle, tmp_path, capsys):
    from aggdec.export import export_bundle

    manifest = export_bundle(random_checkpoint("bart"), tmp_path / "exported", precision="fp16", progress=None)
    assert manifest.precision == "fp16" and load_manifest(tmp_path / "exported") == manifest
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # the fp32 scratch bundle is gone
    code = main(["quantize", str(bundle("bart")), str(tmp_path / "cli"), "--precision", "fp16",
                 "--fp32-output-projection"])
    assert code == 0, capsys.readouterr().err
    cli = load_manifest(tmp_path / "cli")
    assert cli.precision == "fp16" and cli.quantization["output_projection"] is False
    # the output projection stays float32 in each verifier graph (the top-K one and the argmax one)
    assert cli.quantization["quantized_matmuls"] == manifest.quantization["quantized_matmuls"] - 2
    # the weights are float16: half their fp32 bytes
    for name in ("encoder.onnx", "verifier.onnx", "verifier_argmax.onnx"):
        weights = {dtype: sum(a.nbytes for a in arrays if a.dtype == dtype) for arrays in [[
            onnx.numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "exported" / name)).graph.initializer]]
            for dtype in (np.float16, np.float32)}
        assert weights[np.float16] > 100 * weights[np.float32], (name, weights)
    assert main(["quantize", str(tmp_path / "cli"), str(tmp_path / "again"), "--precision", "int8"]) == 2
    assert "is already converted (fp16)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_code:  # argparse's own error for an unknown choice
        main(["quantize", str(bundle("bart")), str(tmp_path / "x"), "--precision", "fp8"])
    assert exit_code.value.code == 2 and "invalid choice: 'fp8'" in capsys.readouterr().err


def test_an_fp16_bundle_is_refused_where_it_cannot_run(bundle, fp16, capsys):
    root = fp16(bundle("marian"))
    manifest = load_manifest(root)
    check_precision(manifest, "cuda", root)
    check_precision(manifest, "cpu", root)
    with pytest.raises(ProviderError, match="fp16 bundle, which runs on device 'cuda' or 'cpu' only, not 'tensorrt'"):
        check_precision(manifest, "tensorrt", root)
    # build-engines refuses it before looking for TensorRT
    assert main(["build-engines", str(root), "--out", str(root.parent / "engines")]) == 2
    err = capsys.readouterr().err
    assert "not 'tensorrt'" in err and "build-engines --fp16" in err and "Traceback" not in err
    assert not (root.parent / "engines").exists()


def test_an_fp32_bundle_relabelled_fp16_is_refused(bundle, fp16, tmp_path):
    """A manifest that says fp16 over fp32 graphs: the runtime would bind float16 buffers to
    float32 inputs; it is refused at load, naming the graph."""
    root = tmp_path / "bundle"
    shutil.copytree(bundle("marian"), root)
    manifest = read(root)
    manifest["precision"] = "fp16"
    manifest["quantization"] = load_manifest(fp16(bundle("marian"))).quantization
    write(root, manifest)
    with pytest.raises(BundleError, match=r"encoder\.onnx \(encoder\) outputs are not the ones this aggdec"):
        Generator(root)


def test_an_fp16_manifest_with_an_int8_encoder_setting_is_refused(bundle, fp16, tmp_path):
    root = tmp_path / "bundle"
    shutil.copytree(fp16(bundle("marian")), root)
    manifest = read(root)
    manifest["quantization"]["encoder"] = "per-call"
    write(root, manifest)
    with pytest.raises(BundleError, match="quantization.encoder is set in a 'fp16' bundle"):
        load_manifest(root, verify=False)


def test_a_checkpoint_that_overflows_float16_is_refused(bundle, tmp_path):
    """Activations past 65504 are inf in float16: the conversion says so and writes nothing,
    rather than a bundle whose outputs are NaN."""
    from aggdec.export.quantize import quantize_bundle

    root = tmp_path / "loud"
    shutil.copytree(bundle("marian"), root)
    encoder = onnx.load(str(root / "encoder.onnx"))
    inits = {init.name: init for init in encoder.graph.initializer}
    weight = next(inits[n.input[1]] for n in reversed(encoder.graph.node)
                  if n.op_type == "MatMul" and n.input[1] in inits)
    values = onnx.numpy_helper.to_array(weight) * np.float32(1e6)  # the last feed-forward product: ~1e5 and up
    weight.CopyFrom(onnx.numpy_helper.from_array(values, weight.name))
    onnx.save(encoder, str(root / "encoder.onnx"))
    manifest = read(root)
    manifest["files"]["encoder.onnx"] = hashlib.sha256((root / "encoder.onnx").read_bytes()).hexdigest()
    write(root, manifest)
    with pytest.raises(ExportError, match="non-finite log-probs where the fp32 one gives finite ones: the checkpoint's "
                                          "activations overflow float16"):
        quantize_bundle(root, tmp_path / "out", precision="fp16", progress=None)
    assert not (tmp_path / "out").exists()
    quantize_bundle(root, tmp_path / "int8", precision="int8", progress=None)  # int8 keeps float32 between products


def test_a_cast_the_converter_writes_twice_is_kept_once_and_two_different_nodes_of_one_name_refused():
    # onnxruntime 1.30/1.31's float16 converter writes the Cast back to float32 once per kept
    # operator reading a tensor; torch 2.11 exports the logits into both TopK and LogSoftmax
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from aggdec.export.half import _drop_repeated_casts

    cast = helper.make_node("Cast", ["x"], ["x32"], name="x_cast_to_fp32_node", to=TensorProto.FLOAT)
    nodes = [cast, helper.make_node("TopK", ["x32", "k"], ["values", "ids"], name="/TopK"), cast,
             helper.make_node("LogSoftmax", ["x32"], ["logprobs"], name="/LogSoftmax", axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 5])],
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 2]),
                               helper.make_tensor_value_info("logprobs", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor("k", TensorProto.INT64, [1], [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(Exception, match="same node name|two nodes"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _drop_repeated_casts(model.graph)
    assert [node.op_type for node in model.graph.node] == ["Cast", "TopK", "LogSoftmax"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(10, dtype=np.float16).reshape(2, 5)
    ids, logprobs = session.run(None, {"x": x})
    assert ids.tolist() == [[4, 3], [4, 3]] and np.allclose(np.exp(logprobs).sum(axis=1), 1.0)

    other = helper.make_node("Cast", ["x"], ["x32"], name="x_cast_to_fp32_node", to=TensorProto.DOUBLE)
    del model.graph.node[:]
    model.graph.node.extend([cast, other])
    with pytest.raises(ExportError, match="two different nodes named 'x_cast_to_fp32_node'"):
        _drop_repeated_casts(model.graph)
