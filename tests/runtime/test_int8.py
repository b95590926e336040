"""int8 bundles (`aggdec quantize`, `aggdec export --precision int8`): lossless against their own greedy.

The int8 bundle's greedy is its reference (it may differ from fp32's). IAD, GAD and GAD++ at
beta 1 must equal it token for token, for every family, at batch 1 and 4, with IO binding on
and off; the quantizer itself refuses to write a verifier whose result for a position depends
on the block it is verified in.
"""

from __future__ import annotations

import json
import shutil

import numpy as np

import pytest

from aggdec.cli import main
from aggdec.runtime.decoding.iad import BlockOptions
from aggdec.runtime.errors import BundleError, ProviderError, ValidationError
from aggdec.runtime.generator import Generator, check_precision
from aggdec.runtime.tuning import Tuning
from aggdec.runtime.manifest import load_manifest
from tests.runtime.test_bundle_hostile import _delete, _set, assert_cli_one_error, read, write
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - the fixture
from tests.runtime.test_lossless import random_texts
from tests.support.tiny import FAMILIES

onnx = pytest.importorskip("onnx")

MAX_NEW = 24


@pytest.fixture(scope="session")
def int8(converted):
    """fp32 bundle directory -> its int8 copy (quantized once per session)."""
    return lambda fp32_dir: converted(fp32_dir, "int8")


@pytest.fixture(scope="session")
def editing_gad_bundle(tmp_path_factory, editing_marian_dir, trained_drafter_dir):
    from aggdec.export import export_bundle

    out = tmp_path_factory.mktemp("editing-gad") / "bundle"
    export_bundle(editing_marian_dir, out, drafter_dir=trained_drafter_dir, progress=None)
    return out


def assert_lossless(generator: Generator, texts: list[str], modes=("iad",)) -> None:
    """Every mode (and IAD at fixed block sizes), at batch 1 and 4, equals the bundle's own greedy."""
    expected = [r.ids for r in generator.generate(texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=1)]
    assert [r.ids for r in generator.generate(texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=4)] == expected
    for batch_size in (1, 4):
        for mode in modes:
            extra = {"beta": 1, "tau": 5.0} if mode == "gad++" else {}
            got = generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size, **extra)
            assert [r.ids for r in got] == expected, f"{mode} at batch {batch_size} differs from greedy"
    for max_block in (2, 7, 64):
        got = generator.generate(texts, mode="iad", max_new_tokens=MAX_NEW, batch_size=4,
                                 block=BlockOptions(max_block=max_block, adaptive=False))
        assert [r.ids for r in got] == expected, f"IAD with blocks of {max_block} differs from greedy"


def assert_lossless_with_and_without_io_binding(root, texts: list[str]) -> None:
    """assert_lossless with IO binding, and greedy and IAD the same with it and without."""
    bound, unbound = Generator(root, io_binding=True), Generator(root, io_binding=False)
    assert_lossless(bound, texts)
    for mode in ("greedy", "iad"):
        assert [r.ids for r in bound.generate(texts, mode=mode, max_new_tokens=MAX_NEW)] == \
            [r.ids for r in unbound.generate(texts, mode=mode, max_new_tokens=MAX_NEW)]


def assert_figures(manifest) -> None:
    q = manifest.quantization
    assert manifest.precision == "int8" and q is not None
    assert q["scheme"] == "per-row-int8" and q["reference"] == "fp32 graphs" and q["quantized_matmuls"] > 0
    assert 0.0 <= q["top1_agreement"] <= 1.0 and q["positions"] > 0
    assert 0.0 <= q["mean_logprob_error"] <= q["max_logprob_error"]


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_iad_equals_int8_greedy_for_every_family(family, bundle, int8):
    root = int8(bundle(family))
    manifest = load_manifest(root)
    assert_figures(manifest)
    assert manifest.quantization["draft_agreement"] is None
    fp32 = load_manifest(bundle(family))
    assert manifest.graphs == fp32.graphs and manifest.files.keys() == fp32.files.keys()
    # every weight MatMul became MatMulInteger; the vocabulary projection included
    verifier = onnx.load(str(root / "verifier.onnx"))
    ops = [node.op_type for node in verifier.graph.node]
    initializers = {init.name for init in verifier.graph.initializer}
    assert ops.count("MatMulInteger") > 0 and ops.count("LogSoftmax") == 1 and ops.count("TopK") == 1
    # each quantized activation rounded and shifted by one QuantizeLinear (decision 042)
    assert "Round" not in ops and 0 < ops.count("QuantizeLinear") <= ops.count("MatMulInteger")
    assert not any(node.op_type == "MatMul" and any(i in initializers for i in node.input)
                   for node in verifier.graph.node)
    texts = random_texts(seed=40 + FAMILIES.index(family), count=12)
    assert_lossless_with_and_without_io_binding(root, texts)


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_int8_gad_equals_int8_greedy_with_a_random_drafter(family, gad_bundle, int8):  # noqa: F811
    root = int8(gad_bundle(family))
    assert load_manifest(root).quantization["draft_agreement"] is not None
    assert_lossless(Generator(root), random_texts(seed=50, count=10), modes=("iad", "gad", "gad++"))


def test_int8_editing_model_with_its_trained_drafter(editing_gad_bundle, int8):
    """The trained toy editor: real drafts are accepted, so blocks are long; IO binding on and off."""
    from tests.support import tiny
    import random

    rng = random.Random("int8-editing")
    texts = [tiny.make_editing_pair(rng)[0] for _ in range(16)]
    root = int8(editing_gad_bundle)
    assert_figures(load_manifest(root))
    for io_binding in (True, False):
        generator = Generator(root, io_binding=io_binding)
        assert_lossless(generator, texts, modes=("iad", "gad", "gad++"))
    # the rows decide (the gate, Tuning.draft_payoff, could measure drafting not paying here)
    gad = Generator(root, tuning=Tuning(draft_payoff=False)).generate(texts, mode="gad", max_new_tokens=MAX_NEW,
                                                                     batch_size=1)
    assert max(max(r.stats.accepted) for r in gad) > 2  # the drafter is really used


def test_export_precision_int8_and_the_quantize_command(random_checkpoint, bundle, tmp_path, capsys):
    from aggdec.export import export_bundle

    manifest = export_bundle(random_checkpoint("bart"), tmp_path / "exported", precision="int8", progress=None)
    assert_figures(manifest)
    assert load_manifest(tmp_path / "exported") == manifest
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # the fp32 scratch bundle is gone
    code = main(["quantize", str(bundle("bart")), str(tmp_path / "cli"), "--fp32-output-projection"])
    assert code == 0, capsys.readouterr().err
    cli = load_manifest(tmp_path / "cli")
    assert cli.quantization["output_projection"] is False
    # the output projection stays float32 in each verifier graph (the top-K one and the argmax one)
    assert cli.quantization["quantized_matmuls"] == manifest.quantization["quantized_matmuls"] - 2
    # an int8 bundle is not quantized twice; an existing OUT_DIR needs --force
    assert main(["quantize", str(tmp_path / "cli"), str(tmp_path / "again")]) == 2
    assert "is already converted (int8)" in capsys.readouterr().err
    assert main(["quantize", str(bundle("bart")), str(tmp_path / "cli")]) == 2
    assert "--force" in capsys.readouterr().err
    with pytest.raises(Exception, match="precision"):
        export_bundle(random_checkpoint("bart"), tmp_path / "x", precision="int4", progress=None)


def test_the_quantizer_refuses_a_verifier_that_couples_positions(bundle, tmp_path):
    """onnxruntime's own dynamic quantization (one activation scale per tensor) couples the
    positions of a block; the quantizer's check must catch it, and pass the per-row graph."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from aggdec.export.positions import Driver, check_position_independence, cpu_session, validation_cases
    from aggdec.runtime.session import ort

    fp32 = bundle("marian")
    manifest = load_manifest(fp32)
    quantize_dynamic(str(fp32 / "verifier.onnx"), str(tmp_path / "dynamic.onnx"), weight_type=QuantType.QInt8)
    encoder = cpu_session(ort, fp32 / "encoder.onnx")
    coupled = Driver(encoder, cpu_session(ort, tmp_path / "dynamic.onnx"), manifest)
    with pytest.raises(ValidationError, match="depends on the block"):
        check_position_independence(coupled, validation_cases(manifest))


def test_an_int8_bundle_is_refused_off_the_cpu(bundle, int8, monkeypatch):
    import aggdec.runtime.devices as devices_module

    root = int8(bundle("marian"))
    with pytest.raises(ProviderError, match="int8 bundle, which runs on device 'cpu' only, not 'cuda'"):
        check_precision(load_manifest(root), "cuda", root)
    check_precision(load_manifest(root), "cpu", root)
    check_precision(load_manifest(bundle("marian")), "cuda")  # fp32 runs anywhere
    # through Generator, on a machine without a GPU: the device check passes, no session is made
    monkeypatch.setattr(devices_module, "check_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(devices_module, "OrtSession", lambda *a, **k: pytest.fail("a session was made"))
    with pytest.raises(ProviderError, match="Use device 'cpu'"):
        Generator(root, device="cuda")


@pytest.fixture()
def int8_copy(bundle, int8, tmp_path):
    target = tmp_path / "bundle"
    shutil.copytree(int8(bundle("marian")), target)
    return target


@pytest.mark.parametrize("edit, needle", [
    (lambda m: _set(m, ("precision",), "int4"), "precision must be one of fp32, int8, fp16, got 'int4'"),
    (lambda m: _set(m, ("precision",), 8), "precision must be one of fp32, int8, fp16, got 8"),
    (lambda m: _set(m, ("precision",), "fp32"), "quantization must be set exactly when precision is not fp32"),
    (lambda m: _set(m, ("quantization",), None), "quantization must be set exactly when precision is not fp32"),
    (lambda m: _set(m, ("quantization", "top1_agreement"), 1.5), "top1_agreement must be a number from 0.0 to 1.0"),
    (lambda m: _set(m, ("quantization", "max_logprob_error"), "0.1"), "max_logprob_error must be a finite number"),
    (lambda m: _set(m, ("quantization", "output_projection"), 1), "output_projection must be true or false"),
    (lambda m: _set(m, ("quantization", "scheme"), "per-tensor"), "scheme must be one of per-row-int8, two-pass-int8, fp16"),
    (lambda m: _set(m, ("quantization", "extra"), 1), "has unknown keys 'extra'"),
    (lambda m: _set(m, ("quantization", "encoder"), "per-tensor"), "encoder must be one of per-row, per-call"),
    (lambda m: _set(m, ("quantization", "encoder"), None), "encoder must be one of per-row, per-call, got None"),
    (lambda m: _delete(m, ("quantization", "positions")), "is missing 'positions'"),
])
def test_hostile_precision_fields_are_refused(int8_copy, edit, needle, capsys):
    write(int8_copy, edit(read(int8_copy)))
    with pytest.raises(BundleError) as error:
        load_manifest(int8_copy, verify=False)
    assert needle in str(error.value)
    assert_cli_one_error(int8_copy, capsys, needle)


def test_a_manifest_without_precision_is_fp32(bundle, tmp_path):
    """Bundles written before precision existed still load, as fp32."""
    root = tmp_path / "old"
    shutil.copytree(bundle("marian"), root)
    manifest = read(root)
    assert manifest.pop("precision") == "fp32" and manifest.pop("quantization") is None
    (root / "manifest.json").write_text(json.dumps(manifest))
    loaded = load_manifest(root)
    assert loaded.precision == "fp32" and loaded.quantization is None
    Generator(root).generate(["w1 w2"], max_new_tokens=2)


def test_one_quantize_linear_rounds_rows_as_round_add_cast_did():
    """Decision 042: a row divided by its scale is rounded and shifted by one QuantizeLinear
    (step 1, zero point 128) where Round, Add 128 and Cast to uint8 did it before; on
    onnxruntime both give the same uint8 for every value a row can hold (|x| <= 127, with
    halves, which both round to even), so bundles made before and after decode alike."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    one, zero = (onnx.numpy_helper.from_array(np.array(v, dtype), n)
                 for v, dtype, n in ((1.0, np.float32, "one"), (128, np.uint8, "zero")))
    shift = onnx.numpy_helper.from_array(np.array(128.0, np.float32), "shift")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "one", "zero"], ["fused"]),
         helper.make_node("Round", ["x"], ["rounded"]), helper.make_node("Add", ["rounded", "shift"], ["shifted"]),
         helper.make_node("Cast", ["shifted"], ["chain"], to=TensorProto.UINT8)],
        "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info(n, TensorProto.UINT8, [None]) for n in ("fused", "chain")],
        initializer=[one, zero, shift])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    halves = np.arange(-127, 127, dtype=np.float32) + np.float32(0.5)
    x = np.concatenate([rng.uniform(-127, 127, 100_000).astype(np.float32), halves, np.float32([-127, 0, 127]),
                        np.nextafter(halves, np.float32(0)), np.nextafter(halves, np.float32(200))])
    fused, chain = session.run(None, {"x": x})
    assert np.array_equal(fused, chain)


def test_quantized_graph_is_rewritten_as_designed(bundle, int8):
    """What keeps positions apart, checked on the graph: activations are quantized by a per-row
    ReduceMax (never DynamicQuantizeLinear), and each activation x activation MatMul multiplies
    one row at a time."""
    model = onnx.load(str(int8(bundle("t5")) / "verifier.onnx"))
    ops = {node.op_type for node in model.graph.node}
    assert "DynamicQuantizeLinear" not in ops and "MatMulNBits" not in ops
    for node in model.graph.node:
        if node.op_type == "ReduceMax":
            axes = [list(a.ints) for a in node.attribute if a.name == "axes"]
            assert axes == [[-1]]
    producers = {out: node for node in model.graph.node for out in node.output}
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert matmuls and all(producers[n.input[0]].op_type == "Unsqueeze" for n in matmuls)
    zero_points = [init for init in model.graph.initializer if init.name.startswith("row_zero_point")]
    assert len(zero_points) == 1 and onnx.numpy_helper.to_array(zero_points[0]).tolist() == 128


def test_per_call_sources_admitted_together_hold_what_one_at_a_time_writes(bundle, int8, monkeypatch):
    """A per-call encoder's admission of several sources: one unpadded call per source, their
    rows then written into the buffers in one go (zero padded to the longest). Each row's cross
    keys and values over its source, and the source mask, are what admitting the sources one at
    a time writes (an int8 copy of a bundle with the keys laid out as the values decodes as
    before: tests/export/test_cross_key_layout.py)."""
    from aggdec.runtime.decoding.cache import cross_names, self_cache_names, source_axis

    root = int8(bundle("marian"))
    generator = Generator(root, io_binding=False)
    m = generator.manifest
    assert m.encodes_one_source_per_call and m.cross_key_layout is not None
    texts = ["w1 w2", " ".join(["w3"] * 12), "w4 w5 w6", "w7"]  # not shortest first: the span grows and shrinks
    sources = generator.encode(texts)
    names = cross_names(m.decoder_layers)
    calls: list[tuple[int, ...]] = []
    original = generator.verifier.encoder.run
    monkeypatch.setattr(generator.verifier.encoder, "run",
                        lambda feeds: calls.append(feeds["attention_mask"].shape) or original(feeds))

    layout = m.cross_key_layout
    written = []
    for together in (True, False):
        batch = generator.verifier.batch(6, bound=False)
        calls.clear()
        if together:
            assert batch.admit(sources, m.pad_token_id) == range(4)
        else:
            for source in sources:
                batch.admit([source], m.pad_token_id)
        assert calls == [(1, len(source)) for source in sources]  # alone and unpadded, either way
        feeds = batch.buffers.feeds(self_cache_names(m.decoder_layers), names)
        rows = {}
        for name in names:  # each row over its own source (past it, masked positions may hold anything)
            axis = source_axis(name.startswith("cross_key"), layout)
            rows[name] = [np.take(feeds[name][row], np.arange(len(source)), axis=axis - 1)
                          for row, source in enumerate(sources)]
        written.append((rows, batch.buffers.source_mask().copy(), batch.rows))
    (together_rows, together_mask, count), (alone_rows, alone_mask, alone_count) = written
    assert count == alone_count == 4
    assert np.array_equal(together_mask, alone_mask)
    assert together_mask.sum(axis=1).tolist() == [len(source) for source in sources]
    for name in names:
        for got, want in zip(together_rows[name], alone_rows[name]):
            assert np.array_equal(got, want), name


def test_reused_buffers_decode_int8_as_new_ones(bundle, int8):
    """A Generator's batches after the first take the buffers a finished batch gave back
    (Verifier.take_buffers), their old values masked: an int8 bundle (per-call encoder, the
    activation scales of every call computed over what it reads) decodes batch after batch,
    in every exact mode, at one batch size and the next, what a fresh Generator decodes."""
    root = int8(bundle("bart"))
    texts = random_texts(seed=61, count=10)
    reused = Generator(root)
    for mode in ("greedy", "iad", "greedy"):
        for part in (texts[:5], texts[5:], texts[:5]):
            for batch_size in (2, 5):
                got = [r.ids for r in reused.generate(part, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size)]
                fresh = Generator(root).generate(part, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size)
                assert got == [r.ids for r in fresh], (mode, batch_size)
    assert reused.verifier._spare  # the buffers were given back and taken again


def test_a_per_call_int8_encoder_is_given_one_source_per_call(bundle, int8, tmp_path, monkeypatch, capsys):
    """The default int8 encoder has one activation scale per call (onnxruntime's dynamic
    quantization): batched, a source's encoding would change with its batch mates, so the
    runtime encodes each source alone, and batch 4 equals batch 1. ``per-row`` batches."""
    from aggdec.export.quantize import QuantizeOptions, quantize_bundle
    from aggdec.runtime.errors import ExportError

    root = int8(bundle("marian"))
    manifest = load_manifest(root)
    assert manifest.quantization["encoder"] == "per-call" and manifest.encodes_one_source_per_call
    encoder_ops = {node.op_type for node in onnx.load(str(root / "encoder.onnx")).graph.node}
    assert "DynamicQuantizeLinear" in encoder_ops and "ReduceMax" not in encoder_ops
    generator = Generator(root)
    texts = ["w1 w2", " ".join(["w3"] * 12), "w4 w5 w6", "w7"]
    sources = generator.encode(texts)

    # the coupling is real: the short source's encoding, padded beside a long one, is not its own
    session = generator.verifier.encoder
    ids = np.full((2, len(sources[1])), manifest.pad_token_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, source in enumerate(sources[:2]):
        ids[row, : len(source)], mask[row, : len(source)] = source, 1
    batched = session.run({"input_ids": ids, "attention_mask": mask})["encoder_hidden_states"][0, : len(sources[0])]
    alone = session.run({"input_ids": ids[:1, : len(sources[0])],
                         "attention_mask": mask[:1, : len(sources[0])]})["encoder_hidden_states"][0]
    assert not np.array_equal(batched, alone)

    calls: list[np.ndarray] = []

    def spy_on(encoder) -> None:  # record each call's mask, then run the real session
        original = encoder.run
        monkeypatch.setattr(encoder, "run", lambda feeds: calls.append(feeds["attention_mask"]) or original(feeds))

    spy_on(session)
    together = generator.generate(texts, mode="iad", max_new_tokens=MAX_NEW, batch_size=4)
    assert len(calls) == 4 and all(mask.shape[0] == 1 and mask.all() for mask in calls)  # alone, unpadded
    assert [r.ids for r in together] == [r.ids for r in generator.generate(texts, mode="greedy", batch_size=1,
                                                                          max_new_tokens=MAX_NEW)]

    # per-row: no dynamic quantization, and a batch of equal lengths is one call
    assert main(["quantize", str(bundle("marian")), str(tmp_path / "rows"), "--encoder-quantization", "per-row"]) == 0
    rows = Generator(tmp_path / "rows")
    assert rows.manifest.quantization["encoder"] == "per-row" and not rows.manifest.encodes_one_source_per_call
    assert "DynamicQuantizeLinear" not in {n.op_type for n in onnx.load(str(tmp_path / "rows/encoder.onnx")).graph.node}
    calls.clear()
    spy_on(rows.verifier.encoder)
    same_length = ["w1 w2", "w3 w4", "w5 w6", "w7 w8"]
    assert_lossless(rows, same_length)
    assert {mask.shape[0] for mask in calls} == {1, 4}  # batch 1, and the batch of 4 in one call

    # a bundle written before the field (no "encoder" key) is per-row
    data = read(tmp_path / "rows")
    del data["quantization"]["encoder"]
    write(tmp_path / "rows", data)
    assert not load_manifest(tmp_path / "rows").encodes_one_source_per_call
    with pytest.raises(ExportError, match="per-row, or per-call, not 'per-token'"):
        quantize_bundle(bundle("marian"), tmp_path / "bad", options=QuantizeOptions(encoder="per-token"),
                        progress=None)
    assert main(["quantize", str(bundle("marian")), str(tmp_path / "half"), "--precision", "fp16",
                 "--encoder-quantization", "per-row"]) == 2
    assert "--encoder-quantization is for int8 bundles" in capsys.readouterr().err
    assert not (tmp_path / "half").exists()


def test_quantize_prints_no_preprocessing_advice(bundle, tmp_path):
    """onnxruntime's quantizer advises pre-processing on the root logger for every graph; it
    does not apply to aggdec's graphs and is silenced there, nothing else (export/quantize.py)."""
    from tests.test_cli import aggdec

    result = aggdec("quantize", str(bundle("marian")), str(tmp_path / "int8"))
    assert result.returncode == 0, result.stderr
    assert "pre-processing" not in result.stderr and "WARNING:root" not in result.stderr, result.stderr
    assert "done in" in result.stderr  # aggdec's own progress still shows
