"""The cross-attention keys' layout (Manifest.cross_key_layout): a new bundle's encoder emits
each key transposed, [rows, heads, head_dim, source], once per sentence, and the verifier
multiplies by it as it is; a bundle with the keys as the values (every bundle from before the
field) still loads and decodes the same ids."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from aggdec.export import export_bundle
from aggdec.runtime.decoding.cache import KEYS_BY_SOURCE, KEYS_TRANSPOSED, SlotBuffers, cross_names, source_axis
from aggdec.runtime.errors import BundleError, ExportError
from aggdec.runtime.generator import Generator
from aggdec.runtime.manifest import load_manifest
from tests.runtime.test_lossless import MAX_NEW, random_texts
from tests.support.tiny import FAMILIES


@pytest.fixture(scope="module")
def old_layout(tmp_path_factory, random_checkpoint):
    """The marian checkpoint exported with its cross keys as the values, and its manifest
    without the field: a bundle as aggdec wrote them before the field."""
    out = tmp_path_factory.mktemp("old-layout") / "bundle"
    export_bundle(random_checkpoint("marian"), out, cross_key_layout=KEYS_BY_SOURCE, progress=None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest.pop("cross_key_layout") == KEYS_BY_SOURCE
    (out / "manifest.json").write_text(json.dumps(manifest))  # the manifest is not among the hashed files
    return out


def encode(root, texts):
    generator = Generator(root)
    sources = generator.encode(texts)
    width = max(len(ids) for ids in sources)
    ids = np.full((len(sources), width), generator.manifest.pad_token_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, source in enumerate(sources):
        ids[row, : len(source)], mask[row, : len(source)] = source, 1
    return generator.manifest, generator.verifier.encoder.run({"input_ids": ids, "attention_mask": mask}), width


@pytest.mark.parametrize("family", FAMILIES)
def test_a_new_bundle_has_its_cross_keys_transposed_by_the_encoder(family, bundle):
    import onnx

    root = bundle(family)
    manifest, out, width = encode(root, ["w1 w2 w3", "w4"])
    assert manifest.cross_key_layout == KEYS_TRANSPOSED
    heads, head_dim = manifest.num_heads, manifest.head_dim
    for name in cross_names(manifest.decoder_layers):
        want = (2, heads, head_dim, width) if name.startswith("cross_key") else (2, heads, width, head_dim)
        assert out[name].shape == want, name
    for graph in ("encoder", "verifier", "verifier_argmax"):
        dims = {t.name: t.dims for t in (*manifest.graph(graph).inputs, *manifest.graph(graph).outputs)}
        assert dims["cross_key.0"] == ("batch", heads, head_dim, "source_len")
        assert dims["cross_value.0"] == ("batch", heads, "source_len", head_dim)
    # the verifier reads each key as it is: no Transpose between an input key and its product
    for file in ("verifier.onnx", "verifier_argmax.onnx"):
        graph = onnx.load(str(root / file)).graph
        consumers: dict[str, list] = {}
        for node in graph.node:
            for name in node.input:
                consumers.setdefault(name, []).append(node)
        for name in cross_names(manifest.decoder_layers):
            seen, frontier = set(), [name]
            while frontier:  # follow the key through the isolation rewrite's Unsqueeze to its MatMul
                for node in consumers.get(frontier.pop(), []):
                    assert node.op_type != "Transpose", (file, name, node.name)
                    if node.op_type == "Unsqueeze" and node.output[0] not in seen:
                        seen.add(node.output[0])
                        frontier.append(node.output[0])


def test_the_encoder_transposes_exactly_the_old_keys(bundle, old_layout):
    new_manifest, new, _ = encode(bundle("marian"), ["w1 w2 w3 w1", "w5 w6"])
    old_manifest, old, _ = encode(old_layout, ["w1 w2 w3 w1", "w5 w6"])
    assert old_manifest.cross_key_layout is None
    for name in cross_names(new_manifest.decoder_layers):
        want = old[name].swapaxes(-1, -2) if name.startswith("cross_key") else old[name]
        assert np.array_equal(new[name], want), name


def test_a_bundle_with_keys_as_the_values_decodes_the_same_ids(bundle, old_layout, converted):
    """Greedy, IAD and beams, one row and batches whose rows leave and join (the buffers re-lay
    the keys along their own source axis), IO binding on and off; and its int8 copy (whose
    check encodes one source per call, padded along each tensor's source axis) as the new
    bundle's int8 copy."""
    texts = random_texts(seed=11, count=12)
    for precision in ("fp32", "int8"):
        roots = [bundle("marian"), old_layout]
        if precision == "int8":
            roots = [converted(root, "int8") for root in roots]
        assert load_manifest(roots[1]).cross_key_layout is None
        results = []
        for root in roots:
            for io_binding in (True, False):
                generator = Generator(root, io_binding=io_binding)
                got = {}
                for batch_size in (1, 5):
                    for mode in ("greedy", "iad"):
                        got[mode, batch_size] = [r.ids for r in generator.generate(
                            texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size)]
                    got["beam", batch_size] = [r.ids for r in generator.generate(
                        texts[:6], mode="greedy", num_beams=3, max_new_tokens=MAX_NEW, batch_size=batch_size)]
                assert got["iad", 1] == got["greedy", 1] == got["greedy", 5] == got["iad", 5]
                results.append(got)
        assert all(got == results[0] for got in results[1:]), precision


@pytest.mark.parametrize("layout", [None, KEYS_TRANSPOSED])
def test_the_buffers_keep_each_kind_along_its_own_source_axis(layout):
    """Rows join with sources of different widths, the source capacity grows and shrinks, a
    row moves: every cross key and value keeps its row's values at its source positions."""
    layers, heads, head_dim = 2, 2, 3
    buffers = SlotBuffers(layers, heads, head_dim, d_model=6, slots=3, max_target=16, max_source=40, device="cpu",
                          bound=True, keep_hidden=False, cross_key_layout=layout)
    rng = np.random.default_rng(0)

    def rows(count, length):
        cross = []
        for name in cross_names(layers):
            shape = [count, heads, length, head_dim]
            values = rng.standard_normal(shape).astype(np.float32)
            cross.append(np.moveaxis(values, 2, source_axis(name.startswith("cross_key"), layout)).copy())
        return cross, np.ones((count, length), dtype=np.int64)

    def by_source(index):  # the index-th cross buffer, [rows, heads, source, head_dim]
        key = name_of(index).startswith("cross_key")
        feeds = buffers.feeds([], cross_names(layers))
        return np.moveaxis(feeds[name_of(index)], source_axis(key, layout), 2)

    def name_of(index):
        return cross_names(layers)[index]

    first, wide, last = rows(1, 3), rows(1, 20), rows(1, 5)
    buffers.add_rows(*first, None)
    assert buffers.source_capacity == 16
    buffers.add_rows(*wide, None)  # grows the source capacity: the first row is re-laid
    buffers.add_rows(*last, None)
    assert buffers.source_capacity == 32
    buffers.remove_row(1)  # the last row moves into slot 1
    buffers.shrink(4)  # and the source capacity comes back to 16
    assert (buffers.rows, buffers.source_capacity) == (2, 16)
    for index in range(2 * layers):
        kept = by_source(index)
        key = name_of(index).startswith("cross_key")
        for slot, (cross, mask) in enumerate((first, last)):
            length = mask.shape[1]
            want = np.moveaxis(cross[index], source_axis(key, layout), 2)[0]
            assert np.array_equal(kept[slot, :, :length], want)
            assert not kept[slot, :, length:].any()  # zeros past the row's source, as masked


def test_a_manifest_and_graphs_of_different_layouts_are_refused(bundle, tmp_path):
    root = tmp_path / "bundle"
    shutil.copytree(bundle("marian"), root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["cross_key_layout"] = KEYS_BY_SOURCE  # the graphs take transposed keys
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="cross_key.0"):
        Generator(root)
    manifest["cross_key_layout"] = "sideways"
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="cross_key_layout"):
        Generator(root)


def test_export_refuses_an_unknown_layout(random_checkpoint, tmp_path):
    with pytest.raises(ExportError, match="cross_key_layout"):
        export_bundle(random_checkpoint("marian"), tmp_path / "out", cross_key_layout="sideways", progress=None)
