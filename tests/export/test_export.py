"""`export_bundle`: every family exports and validates; bad input and wrong graphs are refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from aggdec.export import export_bundle
from aggdec.export import families
from aggdec.runtime.decoding.cache import self_cache_out_names
from aggdec.runtime.errors import ExportError, UnsupportedModelError, ValidationError
from aggdec.runtime.manifest import load_manifest, sha256_of
from tests.support.tiny import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_export_validates_and_writes_a_complete_bundle(family, bundle):
    # the export itself ran the validation against torch at T in {1,2,7}, P in {0,5}, B in {1,3}
    root = bundle(family)
    manifest = load_manifest(root)
    assert set(manifest.files) == {"encoder.onnx", "verifier.onnx", "verifier_argmax.onnx", "tokenizer.json"}
    for name, digest in manifest.files.items():
        assert sha256_of(root / name) == digest
    verifier = manifest.graph("verifier")
    layers = manifest.decoder_layers
    assert [t.name for t in verifier.outputs] == ["top_logprobs", "top_ids", *self_cache_out_names(layers)]
    assert manifest.format_version == 3
    assert verifier.outputs[0].dims == ("batch", "new_len", manifest.top_k)  # never full logits
    # the same decoder, the logits of the positions it is told, whose argmax the runtime takes
    # (decisions 039 and 050)
    argmax = manifest.graph("verifier_argmax")
    assert argmax.inputs[:-1] == verifier.inputs and argmax.input_names()[-1] == "head_positions"
    assert [t.name for t in argmax.outputs] == ["best_logits", *self_cache_out_names(layers)]
    assert argmax.outputs[0].dims == (1, "head_len", manifest.vocab_size)
    assert manifest.family == ("t5" if family == "mt5" else family)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_attention_product_of_the_verifier_is_one_row_per_position(family, bundle):
    """A float GEMM may sum in another order for a block of T rows than for one row, so the
    verifier multiplies each position's attention as a one-row matrix, or (self-attention
    scores, K.q^T) its query as a one-column one (export/positions.py); the export then proved
    the result bitwise equal alone and in blocks (its check). The self-attention keys are read
    as the cache holds them: no call transposes a layer's whole key buffer."""
    import onnx

    from aggdec.runtime.decoding.cache import self_cache_out_names

    for file in ("verifier.onnx", "verifier_argmax.onnx"):
        graph = onnx.load(str(bundle(family) / file)).graph
        constants = {init.name for init in graph.initializer}
        producers = {out: node for node in graph.node for out in node.output}
        products = [node for node in graph.node if node.op_type == "MatMul" and not set(node.input) & constants]
        assert products  # Q.K^T and weights.V of every self- and cross-attention layer
        by_column = []
        for node in products:
            rows, columns = producers[node.input[0]], producers[node.input[1]]
            if columns.op_type == "Unsqueeze" and "IsolateColumns" in columns.name:
                assert rows.op_type == "Unsqueeze" and rows.input[0].startswith("self_key_out."), (file, node.name)
                by_column.append(rows.input[0])
            else:
                assert rows.op_type == "Unsqueeze" and "IsolateRows" in rows.name, (file, node.name)
        layers = len([o for o in graph.output if o.name.startswith("self_")]) // 2
        assert sorted(by_column) == sorted(self_cache_out_names(layers)[0::2]), file  # every layer's scores
        assert not any(node.op_type == "Transpose" and node.input[0].startswith("self_key") for node in graph.node)
    # the rewrite is idempotent: quantizing a bundle exported with it applies it again
    from aggdec.export.positions import isolate_positions

    model = onnx.load(str(bundle(family) / "verifier.onnx"))
    assert isolate_positions(model)[1] == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_the_verifiers_reshapes_are_constant_where_provable(family, bundle):
    """Each call runs every node, and a traced dynamic reshape's shape is computed by small nodes
    at every call: the export makes them constant (export/shape_folding.py) before its checks,
    so some Reshape has a constant shape and nothing the folding could make constant is left."""
    import onnx

    from aggdec.export.shape_folding import constant_reshapes

    for file in ("encoder.onnx", "verifier.onnx", "verifier_argmax.onnx"):
        model = onnx.load(str(bundle(family) / file))
        constants = {init.name for init in model.graph.initializer} | {
            out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
        reshapes = [node for node in model.graph.node if node.op_type == "Reshape"]
        assert any(node.input[1] in constants for node in reshapes), file
        assert constant_reshapes(model) == 0, file


def _with_scores(model):
    """``model`` with the input of its ArgMax (the drafter's scores) as an output too, so that a
    comparison sees every float, not only the ids they rank."""
    from onnx import TensorProto, helper

    argmax = next(node for node in model.graph.node if node.op_type == "ArgMax")
    model.graph.output.append(helper.make_tensor_value_info(argmax.input[0], TensorProto.FLOAT, None))
    return model.SerializeToString()


def test_the_drafter_graphs_reshapes_are_constant_and_compute_bitwise_the_same(drafter_bundle):
    """The drafter runs at every GAD iteration: the export makes its traced reshapes constant
    too, before its checks and before its int8 copy is quantized from it. Its graphs (with
    source layers: drafter.onnx and drafter_source.onnx) have nothing left to fold, and compute
    bitwise what the unfolded trace of the same drafter computes, scores included, at shapes
    other than the trace's."""
    import numpy as np
    import onnx

    from aggdec.export.drafter import Drafter, DrafterGraph, DrafterSourceGraph, drafter_inputs, \
        new_drafter_from_verifier
    from aggdec.export.shape_folding import constant_reshapes
    from aggdec.export.tracing import drafter_dummy, trace
    from aggdec.runtime.graph_specs import drafter_source_spec, drafter_spec
    from aggdec.runtime.session import ort

    root, drafter_dir = drafter_bundle("marian", "fold", lambda model: new_drafter_from_verifier(
        model, layers=2, k=5, seed=2, window=4, encoder_layers=1))
    drafter = Drafter.load(drafter_dir).eval()
    d_model, k = drafter.config.d_model, drafter.config.k
    specs = {"drafter": drafter_spec(d_model, k), "drafter_source": drafter_source_spec(d_model)}
    modules = {"drafter": DrafterGraph(drafter), "drafter_source": DrafterSourceGraph(drafter)}
    dummy = drafter_dummy(drafter, d_model)
    rng = np.random.default_rng(0)
    cpu = ["CPUExecutionProvider"]
    for name, spec in specs.items():
        exported = onnx.load(str(root / spec.file))
        assert constant_reshapes(exported) == 0, spec.file
        unfolded = root.parent / f"unfolded-{spec.file}"
        trace(modules[name].eval(), dummy if name == "drafter" else dummy[4:], unfolded, spec, 17)
        assert constant_reshapes(onnx.load(str(unfolded))) > 0, spec.file  # there was something to fold
        traced = onnx.load(str(unfolded))
        serialize = _with_scores if name == "drafter" else type(traced).SerializeToString
        graphs = [serialize(model) for model in (exported, traced)]
        # as written (onnxruntime's own ReshapeFusion would make the unfolded reshapes constant
        # too) and as the runtime loads them
        sessions = []
        for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
            options = ort.SessionOptions()
            options.graph_optimization_level = level
            sessions.append([ort.InferenceSession(graph, options, providers=cpu) for graph in graphs])
        for prefixes, source in (([[0]], 1), ([[0, 5, 6, 7, 8, 9], [0, 3], [0, 4, 4]], 7), ([[0, 9]] * 4, 3)):
            ids, mask, start, offset = (t.numpy() for t in drafter_inputs(
                prefixes, k, drafter.config.mask_token_id, drafter.config.pad_token_id, drafter.config.window))
            batch = len(prefixes)
            source_mask = np.ones((batch, source), np.int64)
            source_mask[0, source // 2 + 1:] = 0  # a padded source row
            hidden = rng.standard_normal((batch, source, d_model)).astype(np.float32)
            feeds = dict(zip(spec.input_names(), (ids, mask, start, offset, hidden, source_mask)
                             if name == "drafter" else (hidden, source_mask), strict=True))
            for folded, unfolded_session in sessions:
                for a, b in zip(folded.run(None, feeds), unfolded_session.run(None, feeds), strict=True):
                    assert a.shape == b.shape and np.array_equal(a, b), (spec.file, batch, source)


def test_the_position_check_catches_a_verifier_whose_positions_interact(bundle, tmp_path):
    """The export's check fails a verifier where one position's result depends on the others:
    here the block's log-probs are shifted by the block's own mean, as a per-tensor scale would."""
    import onnx
    from onnx import helper

    from aggdec.export.positions import Driver, check_position_independence, cpu_session, validation_cases
    from aggdec.runtime.session import ort

    root = bundle("marian")
    model = onnx.load(str(root / "verifier.onnx"))
    out = next(o for o in model.graph.output if o.name == "top_logprobs")
    for node in model.graph.node:
        node.output[:] = ["coupled_in" if o == out.name else o for o in node.output]
    model.graph.node.extend([
        helper.make_node("ReduceMean", ["coupled_in"], ["block_mean"], keepdims=1),
        helper.make_node("Sub", ["coupled_in", "block_mean"], [out.name]),
    ])
    onnx.save(model, str(tmp_path / "coupled.onnx"))
    manifest = load_manifest(root)
    coupled = Driver(cpu_session(ort, root / "encoder.onnx"), cpu_session(ort, tmp_path / "coupled.onnx"), manifest)
    with pytest.raises(ValidationError, match="depends on the block"):
        check_position_independence(coupled, validation_cases(manifest))
    plain = Driver(cpu_session(ort, root / "encoder.onnx"), cpu_session(ort, root / "verifier.onnx"), manifest)
    assert check_position_independence(plain, validation_cases(manifest)) > 0


def test_the_head_check_catches_logits_that_depend_on_the_positions_asked_for(bundle, tmp_path):
    """check_head_positions: an argmax graph whose logits for a position change with how many
    positions a call asks for (here shifted by their count, as a head quantized per call would
    be) fails, though a call of every position is block-independent; the exported one passes."""
    import onnx
    from onnx import TensorProto, helper

    from aggdec.export.positions import Driver, check_head_positions, cpu_session, validation_cases
    from aggdec.runtime.graph_specs import HEAD_POSITIONS, LOGITS_OUTPUT
    from aggdec.runtime.session import ort

    root = bundle("marian")
    model = onnx.load(str(root / "verifier_argmax.onnx"))
    for node in model.graph.node:
        node.output[:] = ["asked_in" if o == LOGITS_OUTPUT else o for o in node.output]
    model.graph.node.extend([
        helper.make_node("Size", [HEAD_POSITIONS], ["asked"]),
        helper.make_node("Cast", ["asked"], ["asked_float"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["asked_in", "asked_float"], [LOGITS_OUTPUT]),
    ])
    onnx.save(model, str(tmp_path / "asked.onnx"))
    manifest = load_manifest(root)
    encoder = cpu_session(ort, root / "encoder.onnx")
    asked = Driver(encoder, cpu_session(ort, tmp_path / "asked.onnx"), manifest, head_positions=True)
    with pytest.raises(ValidationError, match="logits for some positions"):
        check_head_positions(asked, validation_cases(manifest))
    own = Driver(encoder, cpu_session(ort, root / "verifier_argmax.onnx"), manifest, head_positions=True)
    assert check_head_positions(own, validation_cases(manifest)) > 0


def test_the_graph_check_catches_an_argmax_graph_of_another_decoder(bundle):
    """check_verifier_graphs: an argmax graph whose ids are not the top-K graph's first fails,
    though it is position-independent on its own (here: another seed's weights)."""
    from aggdec.export.positions import check_verifier_graphs, cpu_session, validation_cases
    from aggdec.runtime.session import ort

    root, other = bundle("marian"), bundle("marian", 1)
    manifest = load_manifest(root)
    encoder = cpu_session(ort, root / "encoder.onnx")
    own = {name: cpu_session(ort, root / f"{name}.onnx") for name in ("verifier", "verifier_argmax")}
    assert check_verifier_graphs(encoder, own, manifest, validation_cases(manifest)) > 0
    mixed = {**own, "verifier_argmax": cpu_session(ort, other / "verifier_argmax.onnx")}
    with pytest.raises(ValidationError, match="argmax verifier graph's best ids differ"):
        check_verifier_graphs(encoder, mixed, manifest, validation_cases(manifest))


def test_validation_catches_a_wrong_graph(random_checkpoint, tmp_path, monkeypatch):
    """A family adapter with BART's position offset applied to Marian must fail validation."""
    wrong = dataclasses.replace(
        families.MARIAN,
        decoder_parts=lambda m: families._bart_like_parts(
            m, embed=families._learned_positions(m, position_offset=2, scale_tokens=True), pre_norm=False),
    )
    monkeypatch.setitem(families.REGISTRY, "MarianConfig", wrong)
    with pytest.raises(ValidationError, match="verifier"):
        export_bundle(random_checkpoint("marian"), tmp_path / "out", progress=None)
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert [p.name for p in tmp_path.iterdir()] == []  # temporary directory removed


def test_refuses_to_overwrite_without_force(random_checkpoint, tmp_path):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="--force"):
        export_bundle(random_checkpoint("marian"), out, progress=None)
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ExportError, match="not an aggdec bundle"):  # --force replaces only a bundle
        export_bundle(random_checkpoint("marian"), out, force=True, progress=None)
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    export_bundle(random_checkpoint("marian"), out, force=True, progress=None)
    assert (out / "manifest.json").is_file()


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    from transformers import FSMTConfig

    FSMTConfig(langs=["en", "de"], src_vocab_size=50, tgt_vocab_size=50, d_model=16, encoder_layers=1,
               decoder_layers=1).save_pretrained(tmp_path / "ckpt")
    with pytest.raises(UnsupportedModelError) as error:
        export_bundle(tmp_path / "ckpt", tmp_path / "out", progress=None)
    message = str(error.value)
    assert "FSMTConfig" in message
    for name in ("MarianMTModel", "BartForConditionalGeneration", "MBartForConditionalGeneration",
                 "T5ForConditionalGeneration", "MT5ForConditionalGeneration", "M2M100ForConditionalGeneration",
                 "PegasusForConditionalGeneration"):
        assert name in message


def test_missing_checkpoint_directory(tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        export_bundle(tmp_path / "nope", tmp_path / "out", progress=None)


def test_generation_config_suppressions_are_baked_in(random_checkpoint, tmp_path):
    """bad_words_ids of one token (real Marian checkpoints ban <pad>) become a graph mask."""
    import shutil

    src = tmp_path / "ckpt"
    shutil.copytree(random_checkpoint("marian"), src)
    config = json.loads((src / "generation_config.json").read_text())
    config["bad_words_ids"] = [[5], [7]]
    (src / "generation_config.json").write_text(json.dumps(config))
    manifest = export_bundle(src, tmp_path / "out", progress=None)
    assert manifest.suppressed_token_ids == (5, 7)

    from aggdec.runtime.generator import Generator
    from tests.runtime.test_lossless import random_texts, transformers_greedy

    texts = random_texts(seed=11, count=8)
    expected = transformers_greedy(src, texts, 16)  # transformers applies bad_words_ids itself
    outputs = [r.ids for r in Generator(tmp_path / "out").generate(texts, mode="iad", max_new_tokens=16)]
    assert outputs == expected
    assert not {5, 7} & {token for ids in outputs for token in ids}


def test_the_manifest_hashes_every_file_an_exporter_writes(tmp_path):
    """Whatever lands in the bundle (ONNX external data included) is hashed, not only the files
    the exporter meant to list; a link is refused."""
    import hashlib
    import os

    import pytest

    from aggdec.runtime.errors import BundleError
    from aggdec.runtime.manifest import hash_files

    (tmp_path / "verifier.onnx").write_bytes(b"graph")
    (tmp_path / "verifier.weights").write_bytes(b"external data")
    (tmp_path / "manifest.json").write_text("{}")
    assert hash_files(tmp_path) == {name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
                                    for name in ("verifier.onnx", "verifier.weights")}
    os.symlink(tmp_path / "verifier.weights", tmp_path / "linked.weights")
    with pytest.raises(BundleError, match="not a regular file"):
        hash_files(tmp_path)
