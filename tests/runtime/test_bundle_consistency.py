"""check_consistency: a manifest that disagrees with its graphs or tokenizer fails at load, naming both values.

Real graphs only: the sessions are onnxruntime sessions over an exported bundle, a drafter
traced from another model, or small ONNX graphs built with `onnx.helper` for IO layouts the
exporter does not write yet (per-layer caches).
"""

from __future__ import annotations

import dataclasses

import onnxruntime as ort
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from aggdec.runtime.bundle_checks import check_consistency
from aggdec.runtime.errors import BundleError
from aggdec.runtime.manifest import GraphSpec, TensorSpec, load_manifest
from aggdec.runtime.session import OrtSession


@pytest.fixture(scope="module")
def loaded(bundle):
    root = bundle("marian")
    manifest = load_manifest(root)
    sessions = {name: ort.InferenceSession(str(root / g.file)) for name, g in manifest.graphs.items()}
    vocab = Tokenizer.from_file(str(root / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    return manifest, sessions, vocab


def test_an_exported_bundle_is_consistent(loaded, bundle):
    manifest, sessions, vocab = loaded
    check_consistency(manifest, sessions, vocab)
    root = bundle("marian")  # aggdec's own session wrapper is accepted too
    wrapped = {name: OrtSession(root / g.file) for name, g in manifest.graphs.items()}
    check_consistency(manifest, wrapped, vocab)


@pytest.mark.parametrize("field, value", [
    ("decoder_layers", 3), ("num_heads", 8), ("head_dim", 4), ("d_model", 16), ("top_k", 4),
])
def test_an_edited_size_is_refused_naming_the_field_and_both_values(loaded, field, value):
    manifest, sessions, vocab = loaded
    actual = getattr(manifest, field)
    # "has 2 at dim 0" for a stacked cache, "has 2 inputs 'key_cache.#'" for per-layer ones
    with pytest.raises(BundleError, match=rf"manifest {field} is {value} but .* has {actual}\b"):
        check_consistency(dataclasses.replace(manifest, **{field: value}), sessions, vocab)


def _edit_spec(manifest, graph: str, side: str, index: int, **changes):
    spec = manifest.graphs[graph]
    tensors = list(getattr(spec, side))
    tensors[index] = dataclasses.replace(tensors[index], **changes)
    graphs = {**manifest.graphs, graph: dataclasses.replace(spec, **{side: tuple(tensors)})}
    return dataclasses.replace(manifest, graphs=graphs)


def test_the_graph_io_must_be_the_manifests(loaded):
    manifest, sessions, vocab = loaded
    renamed = _edit_spec(manifest, "verifier", "inputs", 1, name="lengths")
    with pytest.raises(BundleError, match=r"verifier.onnx \(verifier\) has inputs .* \(missing \['lengths'\], "
                                          r"unexpected \['past_lengths'\]"):
        check_consistency(renamed, sessions, vocab)
    retyped = _edit_spec(manifest, "encoder", "inputs", 0, dtype="int32")
    with pytest.raises(BundleError, match="input 'input_ids' is int64 in the graph but int32 in the manifest"):
        check_consistency(retyped, sessions, vocab)
    reranked = _edit_spec(manifest, "encoder", "inputs", 1, dims=("batch",))
    with pytest.raises(BundleError, match="has 2 dims .* in the graph but 1"):
        check_consistency(reranked, sessions, vocab)
    # the manifest's top_k and its spec edited together: the graph itself still returns 8 candidates
    spec = manifest.graphs["verifier"]
    outputs = tuple(dataclasses.replace(t, dims=(*t.dims[:2], 4)) if len(t.dims) == 3 else t for t in spec.outputs)
    both = dataclasses.replace(manifest, top_k=4,
                               graphs={**manifest.graphs, "verifier": dataclasses.replace(spec, outputs=outputs)})
    with pytest.raises(BundleError, match="output 'top_logprobs' dim 2 is 8 in the graph but 4 in the manifest"):
        check_consistency(both, sessions, vocab)


def test_a_tokenizer_from_another_model_is_refused(loaded):
    manifest, sessions, _ = loaded
    other = Tokenizer(WordLevel({f"t{i}": i for i in range(500)}, unk_token="t0"))
    with pytest.raises(BundleError, match=rf"tokenizer.json has token ids up to 499 but manifest vocab_size is "
                                          rf"{manifest.vocab_size}"):
        check_consistency(manifest, sessions, other.get_vocab_size(with_added_tokens=True))
    with pytest.raises(BundleError, match=r"decoder_start_token_id is \d+ but tokenizer.json has token ids up to 0 only"):
        check_consistency(manifest, sessions, 1)


def test_every_graph_needs_a_session(loaded):
    manifest, sessions, vocab = loaded
    with pytest.raises(BundleError, match="verifier"):
        check_consistency(manifest, {"encoder": sessions["encoder"]}, vocab)


@pytest.fixture(scope="module")
def foreign_drafter(loaded, tmp_path_factory):
    """A drafter traced from a model with another d_model (16, not 32), and its spec."""
    import torch

    from aggdec.export.drafter import Drafter, DrafterConfig, DrafterGraph
    from aggdec.export.tracing import drafter_dummy, trace
    from aggdec.export.specs import drafter_spec

    manifest = loaded[0]
    torch.manual_seed(0)
    config = DrafterConfig(vocab_size=manifest.vocab_size, d_model=16, num_heads=2, head_dim=8, ffn_dim=32, k=4,
                           max_positions=64)
    drafter = Drafter(config).eval()
    spec = drafter_spec(16, 4)
    path = tmp_path_factory.mktemp("drafter") / spec.file
    trace(DrafterGraph(drafter).eval(), drafter_dummy(drafter, 16), path, spec, 17)
    return spec, ort.InferenceSession(str(path))


def test_a_drafter_from_another_model_is_refused(loaded, foreign_drafter):
    manifest, sessions, vocab = loaded
    spec, session = foreign_drafter
    with_drafter = dataclasses.replace(manifest, graphs={**manifest.graphs, "drafter": spec}, draft_k=4,
                                       mask_token_id=manifest.vocab_size)
    with pytest.raises(BundleError, match=r"manifest d_model is 32 but drafter input 'encoder_hidden_states' in "
                                          r"the manifest's graph spec has 16 at dim 2"):
        check_consistency(with_drafter, {**sessions, "drafter": session}, vocab)
    # the spec claims the drafter matches; the graph file still says 16
    honest = dataclasses.replace(with_drafter, graphs={**with_drafter.graphs, "drafter": dataclasses.replace(
        spec, inputs=tuple(dataclasses.replace(t, dims=(*t.dims[:2], 32)) if t.name == "encoder_hidden_states" else t
                           for t in spec.inputs))})
    with pytest.raises(BundleError, match="input 'encoder_hidden_states' dim 2 is 16 in the graph but 32"):
        check_consistency(honest, {**sessions, "drafter": session}, vocab)
    wrong_k = dataclasses.replace(with_drafter, draft_k=5)
    with pytest.raises(BundleError, match="manifest d_model is 32|manifest draft_k is 5"):
        check_consistency(wrong_k, {**sessions, "drafter": session}, vocab)


# ------------------------------------------------------------- per-layer caches


def _per_layer_verifier(tmp_path, layers: tuple[int, ...], heads: int, head_dim: int, top_k: int):
    """A real ONNX graph with the per-layer cache IO (key_cache.N / value_cache.N) and its spec."""
    import onnx
    from onnx import TensorProto, helper

    cache = ("batch", heads, "capacity", head_dim)
    inputs = [TensorSpec("input_ids", "int64", ("batch", "new_len")),
              TensorSpec("scores", "float32", ("batch", "new_len", top_k))]
    outputs = [TensorSpec("top_logprobs", "float32", ("batch", "new_len", top_k))]
    nodes = [helper.make_node("Identity", ["scores"], ["top_logprobs"])]
    for layer in layers:
        for kind in ("key", "value"):
            inputs.append(TensorSpec(f"{kind}_cache.{layer}", "float32", cache))
            outputs.append(TensorSpec(f"{kind}_cache_out.{layer}", "float32", cache))
            nodes.append(helper.make_node("Identity", [f"{kind}_cache.{layer}"], [f"{kind}_cache_out.{layer}"]))
    types = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}

    def info(t):
        return helper.make_tensor_value_info(t.name, types[t.dtype], list(t.dims))

    graph = helper.make_graph(nodes, "verifier", [info(t) for t in inputs], [info(t) for t in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "verifier.onnx"
    onnx.save(model, str(path))
    return GraphSpec("verifier.onnx", tuple(inputs), tuple(outputs)), ort.InferenceSession(str(path))


def test_per_layer_caches_are_counted_against_decoder_layers(loaded, tmp_path):
    manifest, sessions, vocab = loaded
    m = manifest
    spec, session = _per_layer_verifier(tmp_path, tuple(range(m.decoder_layers)), m.num_heads, m.head_dim, m.top_k)
    per_layer = dataclasses.replace(m, graphs={**m.graphs, "verifier": spec})
    # graph and manifest agree, and every size checks out: refused only as IO this runtime does
    # not drive (its verifier takes self_key.#/self_value.#)
    with pytest.raises(BundleError, match=r"verifier.onnx \(verifier\) inputs are not the ones this aggdec feeds"):
        check_consistency(per_layer, {**sessions, "verifier": session}, vocab)

    spec, session = _per_layer_verifier(tmp_path, (0,), m.num_heads, m.head_dim, m.top_k)  # a layer short
    one_short = dataclasses.replace(m, graphs={**m.graphs, "verifier": spec})
    with pytest.raises(BundleError, match=rf"manifest decoder_layers is {m.decoder_layers} but verifier in the "
                                          r"manifest's graph spec has 1 inputs 'key_cache.#' numbered \[0\]"):
        check_consistency(one_short, {**sessions, "verifier": session}, vocab)

    spec, session = _per_layer_verifier(tmp_path, tuple(range(m.decoder_layers)), m.num_heads + 1, m.head_dim,
                                        m.top_k)
    wider = dataclasses.replace(m, graphs={**m.graphs, "verifier": spec})
    with pytest.raises(BundleError, match=rf"manifest num_heads is {m.num_heads} but verifier input 'key_cache.0'"):
        check_consistency(wider, {**sessions, "verifier": session}, vocab)
