"""The argmax verifier graph (graph_specs.VERIFIER_GRAPHS): greedy, IAD and GAD run a verifier
without log-softmax and top-k where the bundle has one, and decode exactly what the top-K
graph decodes, on every family; bundles without it decode as before; its contract is checked.

The argmax graph's ids equal the top-K graph's first, bitwise, because both choose on the
logits (export/graphs.py candidates): test_heads_choose_on_the_logits shows the case where
choosing on the log-probs would not (nor equal transformers' greedy, which takes the argmax of
the logits; tests/runtime/test_lossless.py checks greedy against it with the argmax graph on).

Bundles export it with a "logits" head (graph_specs.ARGMAX_HEADS, decision 039): the graph
outputs the logits and the runtime takes their argmax in numpy; bundles before it (and shortlist
bundles) output the best id, and decode the same.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from aggdec.runtime.errors import BundleError
from aggdec.runtime.generator import Generator
from aggdec.runtime.tuning import Tuning
from tests.runtime.test_lossless import MAX_NEW, random_texts
from tests.support.tiny import FAMILIES


def graph_seconds(generator: Generator) -> dict[str, float]:
    """Seconds spent in each verifier graph so far (the load-time probe runs both once)."""
    return {name: generator.bundle.sessions[name].seconds for name in ("verifier", "verifier_argmax")
            if name in generator.bundle.sessions}


def ran(generator: Generator, before: dict[str, float]) -> set[str]:
    return {name for name, seconds in graph_seconds(generator).items() if seconds > before[name]}


def decoded(generator: Generator, texts: list[str], mode: str, batch_size: int) -> list[tuple[int, ...]]:
    return [r.ids for r in generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size)]


@pytest.mark.parametrize("family", FAMILIES)
def test_argmax_graph_decodes_what_the_top_k_graph_decodes(family, bundle):
    texts = random_texts(seed=11, count=12)
    argmax = Generator(bundle(family))
    top_k = Generator(bundle(family), tuning=Tuning(argmax_graph=False))
    assert "verifier_argmax" in argmax.manifest.graphs and argmax.verifier.argmax is not None
    assert top_k.verifier.argmax is None
    before = {name: graph_seconds(generator) for name, generator in (("argmax", argmax), ("top_k", top_k))}
    for mode in ("greedy", "iad"):
        for batch_size in (1, 5):
            assert decoded(argmax, texts, mode, batch_size) == decoded(top_k, texts, mode, batch_size), (mode,
                                                                                                       batch_size)
    # each ran its own graph: the argmax one never touched the top-K graph, and the other way round
    assert ran(argmax, before["argmax"]) == {"verifier_argmax"}
    assert ran(top_k, before["top_k"]) == {"verifier"}


def test_gad_plus_plus_runs_the_top_k_graph_and_gad_the_argmax_one(drafter_bundle):
    from aggdec.export.drafter import new_drafter_from_verifier

    texts = random_texts(seed=5, count=6)
    bundle, _ = drafter_bundle("bart", "gad", lambda model: new_drafter_from_verifier(model, layers=2, k=25, seed=1))
    generator = Generator(bundle)
    before = graph_seconds(generator)
    generator.generate(texts, mode="gad++", max_new_tokens=MAX_NEW, beta=3, tau=2.0)
    assert ran(generator, before) == {"verifier"}
    before = graph_seconds(generator)
    assert decoded(generator, texts, "gad", 3) == decoded(generator, texts, "greedy", 1)
    assert ran(generator, before) == {"verifier_argmax"}


def test_int8_bundle_has_an_argmax_graph_that_decodes_what_its_top_k_graph_does(bundle, converted):
    int8 = converted(bundle("bart"), "int8")
    texts = random_texts(seed=3, count=10)
    argmax = Generator(int8)
    top_k = Generator(int8, tuning=Tuning(argmax_graph=False))
    assert argmax.verifier.argmax is not None
    for mode in ("greedy", "iad"):
        assert decoded(argmax, texts, mode, 4) == decoded(top_k, texts, mode, 4)


def without_argmax_graph(source, target):
    """A copy of bundle ``source`` as exported before the argmax graph: no verifier_argmax."""
    shutil.copytree(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    spec = manifest["graphs"].pop("verifier_argmax")
    del manifest["files"][spec["file"]]
    (target / spec["file"]).unlink()
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_bundle_without_the_argmax_graph_decodes_with_the_top_k_graph(bundle, tmp_path):
    old = without_argmax_graph(bundle("t5"), tmp_path / "old")
    texts = random_texts(seed=2, count=8)
    generator = Generator(old)
    assert generator.verifier.argmax is None
    expected = decoded(Generator(bundle("t5")), texts, "greedy", 1)
    for mode in ("greedy", "iad"):
        assert decoded(generator, texts, mode, 3) == expected


def test_export_without_the_argmax_graph(bundle, random_checkpoint, tmp_path):
    """`aggdec export --no-argmax-graph`: no verifier_argmax (the decoder's weights once), and
    the same output from the top-K graph."""
    from aggdec.cli import main

    out = tmp_path / "lean"
    assert main(["export", str(random_checkpoint("bart")), str(out), "--no-argmax-graph"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert "verifier_argmax" not in manifest["graphs"] and not (out / "verifier_argmax.onnx").exists()
    lean = Generator(out)
    assert lean.verifier.argmax is None
    texts = random_texts(seed=3, count=6)
    expected = decoded(Generator(bundle("bart")), texts, "greedy", 1)
    assert decoded(lean, texts, "greedy", 2) == expected and decoded(lean, texts, "iad", 2) == expected


def test_argmax_graph_with_other_inputs_is_refused(bundle, tmp_path):
    root = tmp_path / "b"
    shutil.copytree(bundle("bart"), root)
    manifest = json.loads((root / "manifest.json").read_text())
    inputs = manifest["graphs"]["verifier_argmax"]["inputs"]
    assert inputs[-1]["name"] == "head_positions"  # the one input it may have beyond the verifier's
    manifest["graphs"]["verifier_argmax"]["inputs"] = [*inputs[:-2], inputs[-1]]
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="verifier_argmax.inputs differ"):
        Generator(root)


def test_argmax_graph_of_another_decoder_is_refused_at_load(bundle, tmp_path):
    """A verifier_argmax from another export of the same architecture (other weights) has the
    right IO: the load-time probe catches it by its ids."""
    from aggdec.runtime.manifest import sha256_of

    root = tmp_path / "b"
    shutil.copytree(bundle("bart", 0), root)
    shutil.copyfile(bundle("bart", 1) / "verifier_argmax.onnx", root / "verifier_argmax.onnx")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"]["verifier_argmax.onnx"] = sha256_of(root / "verifier_argmax.onnx")
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="not one decoder"):
        Generator(root)


def without_head_positions(source, target):
    """A copy of bundle ``source`` as exported before decision 050: its argmax graph returns the
    logits of every block position, [batch, new_len, vocab], and takes no ``head_positions``
    (the gather taken out as an fp16 conversion takes it out: export/half.py)."""
    import onnx

    from aggdec.export.half import every_position_head
    from aggdec.runtime.graph_specs import HEAD_POSITIONS, LOGITS_OUTPUT
    from aggdec.runtime.manifest import sha256_of

    shutil.copytree(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    spec = manifest["graphs"]["verifier_argmax"]
    assert spec["inputs"][-1]["name"] == HEAD_POSITIONS and spec["outputs"][0]["name"] == LOGITS_OUTPUT
    path = target / spec["file"]
    model = onnx.load(str(path))
    assert every_position_head(model, manifest["vocab_size"])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    spec["inputs"].pop()
    spec["outputs"][0]["dims"] = ["batch", "new_len", manifest["vocab_size"]]
    manifest["files"][spec["file"]] = sha256_of(path)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def with_argmax_head(source, target):
    """A copy of bundle ``source`` as exported before decision 039: its argmax graph ends in
    ArgMax and outputs the best id (``top1_ids``), not the logits."""
    import onnx
    from onnx import TensorProto, helper

    from aggdec.runtime.graph_specs import LOGITS_OUTPUT
    from aggdec.runtime.manifest import sha256_of

    without_head_positions(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    spec = manifest["graphs"]["verifier_argmax"]
    assert spec["outputs"][0]["name"] == LOGITS_OUTPUT
    path = target / spec["file"]
    model = onnx.load(str(path))
    model.graph.node.append(helper.make_node("ArgMax", [LOGITS_OUTPUT], ["top1_ids"], axis=-1, keepdims=0))
    (logits,) = [output for output in model.graph.output if output.name == LOGITS_OUTPUT]
    index = list(model.graph.output).index(logits)
    model.graph.output.remove(logits)
    model.graph.output.insert(index, helper.make_tensor_value_info("top1_ids", TensorProto.INT64, ["batch", "new_len"]))
    onnx.save(model, str(path))
    spec["outputs"][0] = {"dims": ["batch", "new_len"], "dtype": "int64", "name": "top1_ids"}
    manifest["files"][spec["file"]] = sha256_of(path)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_the_argmax_graph_outputs_the_logits_and_the_runtime_takes_their_argmax(bundle):
    from aggdec.runtime.graph_specs import LOGITS_OUTPUT, argmax_head

    generator = Generator(bundle("marian"))
    assert argmax_head(generator.manifest) == "logits"
    assert generator.verifier.candidates_of(generator.verifier.argmax) == (LOGITS_OUTPUT,)
    spec = generator.manifest.graphs["verifier_argmax"]
    # of the positions it is told (decision 050): the verifier's inputs and those, last
    assert spec.outputs[0].dims == (1, "head_len", generator.manifest.vocab_size)
    assert spec.input_names()[-1] == "head_positions"
    assert spec.inputs[:-1] == generator.manifest.graphs["verifier"].inputs


@pytest.mark.parametrize("family", ["marian", "t5"])
@pytest.mark.parametrize("io_binding", [True, False])
def test_a_bundle_whose_argmax_graph_takes_no_head_positions_decodes_the_same(family, io_binding, bundle, tmp_path):
    """Bundles exported before decision 050: logits of every block position, the same outputs,
    bound and unbound, in every mode that runs the argmax graph."""
    from aggdec.runtime.graph_specs import takes_head_positions

    old = Generator(without_head_positions(bundle(family), tmp_path / "old"), io_binding=io_binding)
    new = Generator(bundle(family), io_binding=io_binding)
    assert not takes_head_positions(old.manifest) and takes_head_positions(new.manifest)
    texts = random_texts(seed=9, count=12)
    for mode in ("greedy", "iad"):
        for batch_size in (1, 5):
            assert decoded(old, texts, mode, batch_size) == decoded(new, texts, mode, batch_size), (mode, batch_size)


@pytest.mark.parametrize("io_binding", [True, False])
def test_a_call_for_each_rows_own_block_gives_its_ids_as_a_call_for_every_position(io_binding, bundle):
    """Batch.verify with each row's width: the ids of each row's block are those of a call that
    computes every position, bitwise, over calls of changing shapes (the binding's outputs
    follow the number of positions); past a row's width they are 0."""
    generator = Generator(bundle("marian"), io_binding=io_binding)
    manifest = generator.manifest
    rng = np.random.default_rng(0)
    sources = [rng.integers(3, manifest.vocab_size, size=int(n)).tolist() for n in (4, 7, 2, 5)]
    batches = [generator.verifier.batch(len(sources), io_binding, top_k=False) for _ in range(2)]
    for batch in batches:
        batch.admit(sources, manifest.pad_token_id)
    for step, new in enumerate((3, 6, 6, 1, 4)):
        tokens = rng.integers(3, manifest.vocab_size, size=(len(sources), new))
        widths = [1 + (row + step) % new for row in range(len(sources))]
        _, every = batches[0].verify(tokens.copy())
        _, own = batches[1].verify(tokens.copy(), widths)
        for row, width in enumerate(widths):
            assert np.array_equal(own[row, :width], every[row, :width]), (step, row)
            assert not own[row, width:].any()
        for batch in batches:
            batch.keep(np.array(widths, dtype=np.int64))


@pytest.mark.parametrize("family", ["marian", "t5"])
@pytest.mark.parametrize("io_binding", [True, False])
def test_a_bundle_whose_argmax_graph_outputs_the_best_id_decodes_the_same(family, io_binding, bundle, tmp_path):
    """Bundles exported before the logits head: the same outputs from their ArgMax, every mode
    that runs the argmax graph, bound and unbound."""
    from aggdec.runtime.graph_specs import argmax_head

    old = Generator(with_argmax_head(bundle(family), tmp_path / "old"), io_binding=io_binding)
    new = Generator(bundle(family), io_binding=io_binding)
    assert argmax_head(old.manifest) == "argmax" and old.verifier.candidates_of(old.verifier.argmax) == ("top1_ids",)
    texts = random_texts(seed=8, count=10)
    for mode in ("greedy", "iad"):
        for batch_size in (1, 4):
            assert decoded(old, texts, mode, batch_size) == decoded(new, texts, mode, batch_size), (mode, batch_size)


@pytest.mark.parametrize("io_binding", [True, False])
def test_logits_of_another_width_are_a_bundle_error(io_binding, bundle, tmp_path):
    """An argmax graph whose logits come out one column wider than the manifest's vocabulary
    (the extra column a zero, so the load-time probe's ids agree) is a BundleError, bound or not:
    at load, where the graph's own output shape says so, else at the first call that reads them."""
    from aggdec.runtime.graph_specs import LOGITS_OUTPUT
    from tests.runtime.test_bundle_hostile import _pad_output

    root = tmp_path / "b"
    shutil.copytree(bundle("bart"), root)
    _pad_output(root, "verifier_argmax", LOGITS_OUTPUT, [0, 0, 0, 0, 0, 1])  # [1, head_len, vocab]
    with pytest.raises(BundleError, match="'best_logits' dim 2 is|does not compute what its manifest says"):
        Generator(root, io_binding=io_binding).generate(random_texts(seed=1, count=2), max_new_tokens=4)


def test_heads_choose_on_the_logits(tmp_path):
    """Logits a < b, b at the higher id, among 8,000 equal ones: log-softmax subtracts
    log(sum exp) ~ 8.99 with rounding and makes them equal, so top-k over the log-probs takes
    a's lower id where torch's argmax (transformers' greedy) takes b. The graphs' heads choose
    on the logits: both take b, as ArgMax does."""
    import onnxruntime as ort
    import torch

    from aggdec.export.graphs import candidates

    logits = np.zeros((1, 1, 8000), dtype=np.float32)
    logits[0, 0, 1] = 2.0 ** -22  # below half the spacing of float32 numbers near 9
    expected = int(torch.argmax(torch.from_numpy(logits), dim=-1))
    assert expected == 1

    class Head(torch.nn.Module):
        def __init__(self, head: str) -> None:
            super().__init__()
            self.head = head

        def forward(self, x: torch.Tensor):  # noqa: ANN201
            if self.head == "log-probs":  # the head before: top-k over the log-softmax
                return torch.topk(torch.log_softmax(x, dim=-1), 4, dim=-1)[1]
            return candidates(x, 4, self.head)[-1]

    chosen = {}
    for head in ("top_k", "argmax", "logits", "log-probs"):
        path = str(tmp_path / f"{head}.onnx")
        torch.onnx.export(Head(head), (torch.from_numpy(logits),), path, input_names=["x"], output_names=["ids"],
                          opset_version=17, dynamo=False)
        (ids,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": logits})
        # the logits head's ids are the runtime's argmax of the logits it returns
        chosen[head] = int((ids.argmax(-1) if head == "logits" else ids).reshape(-1)[0])
    assert chosen["top_k"] == chosen["argmax"] == chosen["logits"] == expected
    assert chosen["log-probs"] == 0  # the tie log-softmax made


@pytest.mark.parametrize("family", FAMILIES)
def test_no_graph_output_is_a_copy_by_a_cast_to_its_own_type(family, bundle, converted):
    """A Cast to the type its input has already is a copy onnxruntime keeps where it makes a graph
    output: the argmax graph's logits, every position's vocabulary-wide row (export/graphs.py
    float32_logits). Neither the export nor the int8 conversion may write one."""
    import onnx

    fp32 = bundle(family)
    for folder in (fp32, converted(fp32, "int8")):
        for name in ("verifier", "verifier_argmax"):
            model = onnx.shape_inference.infer_shapes(onnx.load(str(folder / f"{name}.onnx")))
            graph = model.graph
            types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)}
            types.update({init.name: init.data_type for init in graph.initializer})
            outputs = {o.name for o in graph.output}
            copies = [node.name for node in graph.node if node.op_type == "Cast" and node.output[0] in outputs
                      and types.get(node.input[0]) == node.attribute[0].i]
            assert copies == [], (folder, name, copies)
