"""A bundle is untrusted input: hostile paths, links and malformed manifests are clean BundleErrors."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggdec.cli import main
from aggdec.runtime.errors import BundleError, BundleNotFoundError, GraphRunError, InputError
from aggdec.runtime.generator import Generator
from aggdec.runtime.manifest import Manifest, load_manifest, manifest_digest


@pytest.fixture()
def bundle_copy(bundle, tmp_path):
    target = tmp_path / "bundle"
    shutil.copytree(bundle("marian"), target)
    return target


def read(root) -> dict:
    return json.loads((root / "manifest.json").read_text())


def write(root, manifest: dict) -> None:
    (root / "manifest.json").write_text(json.dumps(manifest))


def assert_cli_one_error(root, capsys, needle: str) -> None:
    """`aggdec generate` on the bundle: one `aggdec: error:` line, exit 2, no traceback."""
    code = main(["generate", str(root), "--input", os.devnull])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("aggdec: error:"), err
    assert needle in lines[0], lines[0]


HOSTILE_NAMES = ["../secret.txt", "/etc/passwd", "sub/file", "sub\\file", "", ".", "..", "x\0y", "C:secret",
                 "..secret", "a\nb", "manifest.json"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_file_names_must_be_plain(bundle_copy, name, capsys):
    manifest = read(bundle_copy)
    manifest["files"][name] = "0" * 64
    write(bundle_copy, manifest)
    with pytest.raises(BundleError, match="files key"):
        load_manifest(bundle_copy, verify=False)
    assert_cli_one_error(bundle_copy, capsys, "files key")


@pytest.mark.parametrize("name", ["../verifier.onnx", "/tmp/verifier.onnx", "nested/verifier.onnx"])
def test_graph_file_names_must_be_plain(bundle_copy, name):
    manifest = read(bundle_copy)
    manifest["graphs"]["verifier"]["file"] = name
    write(bundle_copy, manifest)
    with pytest.raises(BundleError, match=r"graphs\['verifier'\]\.file .*not a plain file name"):
        load_manifest(bundle_copy, verify=False)


def test_a_path_outside_reveals_nothing_about_it(bundle_copy, tmp_path):
    """Same message whether the outside file exists or not, and never its hash."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret")
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    messages = []
    for target in ("../secret.txt", "../missing.txt"):
        manifest = read(bundle_copy)
        manifest["files"] = {target: digest, **manifest["files"]}
        write(bundle_copy, manifest)
        with pytest.raises(BundleError) as error:
            Generator(bundle_copy)
        messages.append(str(error.value).replace(target, "NAME"))
    assert messages[0] == messages[1]
    assert digest[:8] not in messages[0] and "missing" not in messages[0]


def test_a_graph_file_not_listed_in_files_is_refused(bundle_copy):
    manifest = read(bundle_copy)
    shutil.copy(bundle_copy / "verifier.onnx", bundle_copy / "other.onnx")
    manifest["graphs"]["verifier"]["file"] = "other.onnx"
    write(bundle_copy, manifest)
    with pytest.raises(BundleError, match="'other.onnx' is not listed in files"):
        Generator(bundle_copy)


@pytest.mark.parametrize("verify", [True, False])
def test_symlinked_bundle_files_are_refused(bundle_copy, tmp_path, verify):
    # the link points at an identical copy, so the hash alone would accept it
    outside = tmp_path / "outside.onnx"
    shutil.move(bundle_copy / "verifier.onnx", outside)
    os.symlink(outside, bundle_copy / "verifier.onnx")
    with pytest.raises(BundleError, match="symlink") as error:
        Generator(bundle_copy, verify=verify)
    assert "verifier.onnx" in str(error.value)


def test_any_symlink_in_the_bundle_is_refused(bundle_copy, tmp_path):
    """Even unlisted: onnxruntime opens a graph's external data by name, listed or not."""
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    os.symlink(tmp_path / "weights.bin", bundle_copy / "weights.bin")
    with pytest.raises(BundleError, match="holds symlinks \\('weights.bin'\\)"):
        Generator(bundle_copy, verify=False)


def test_symlinked_manifest_is_refused(bundle_copy, tmp_path, capsys):
    shutil.move(bundle_copy / "manifest.json", tmp_path / "manifest.json")
    os.symlink(tmp_path / "manifest.json", bundle_copy / "manifest.json")
    with pytest.raises(BundleError, match="symlink"):
        load_manifest(bundle_copy)
    assert_cli_one_error(bundle_copy, capsys, "symlink")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_in_place_of_a_file_is_refused_without_hanging(bundle_copy):
    (bundle_copy / "tokenizer.json").unlink()
    os.mkfifo(bundle_copy / "tokenizer.json")
    with pytest.raises(BundleError, match="not a regular file"):
        load_manifest(bundle_copy)


# --------------------------------------------------------------------- schema


def _set(manifest: dict, path: tuple, value) -> dict:
    node = manifest
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return manifest


def _delete(manifest: dict, path: tuple) -> dict:
    node = manifest
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return manifest


MALFORMED = [
    # (edit, what the message must say)
    (lambda m: _set(m, ("files",), ["tokenizer.json"]), "files must be an object, got list"),
    (lambda m: _set(m, ("vocab_size",), True), "vocab_size must be an integer, got bool"),
    (lambda m: _set(m, ("vocab_size",), 0), "vocab_size must be an integer of at least 1, got 0"),
    (lambda m: _set(m, ("d_model",), 32.0), "d_model must be an integer, got float"),
    (lambda m: _set(m, ("eos_token_id",), 123), "eos_token_id must be an integer from 0 to 122 (vocab_size is 123)"),
    (lambda m: _set(m, ("pad_token_id",), -1), "pad_token_id must be an integer from 0 to 122"),
    (lambda m: _set(m, ("forced_bos_token_id",), "0"), "forced_bos_token_id must be an integer, got str"),
    (lambda m: _set(m, ("suppressed_token_ids",), [1, 500]),
     "suppressed_token_ids[1] must be an integer from 0 to 122"),
    (lambda m: _set(m, ("suppressed_token_ids",), 5), "suppressed_token_ids must be a list, got int"),
    (lambda m: _set(m, ("top_k",), 124), "top_k must be an integer from 1 to 123"),
    (lambda m: _set(m, ("max_source_len",), 1), "max_source_len must be an integer from 2 to 65536"),
    (lambda m: _set(m, ("max_target_len",), 65537), "max_target_len must be an integer from 2 to 65536"),
    (lambda m: _set(m, ("dtype",), "float8"), "dtype must be one of float32, float16, bfloat16"),
    (lambda m: _set(m, ("files", "tokenizer.json"), "abc"), "must be a sha256 digest"),
    (lambda m: _set(m, ("files", "tokenizer.json"), "A" * 64), "must be a sha256 digest"),
    (lambda m: _set(m, ("graphs", "verifier", "inputs", 0, "dims"), ["batch", 0]),
     "graphs['verifier'].inputs[0].dims[1] must be an integer of at least 1, got 0"),
    (lambda m: _set(m, ("graphs", "verifier", "inputs", 0, "dims"), ["batch", "new len"]), "must be an identifier"),
    (lambda m: _set(m, ("graphs", "verifier", "inputs", 0, "dtype"), "float128"), "dtype must be one of"),
    (lambda m: _set(m, ("graphs", "verifier", "inputs", 1, "name"), "input_ids"), "names 'input_ids' more than once"),
    (lambda m: _set(m, ("graphs", "verifier", "extra"), 1), "has unknown keys 'extra'"),
    (lambda m: _set(m, ("graphs",), {"encoder": m["graphs"]["encoder"]}), "graphs has no 'verifier' graph"),
    (lambda m: _set(m, ("draft_k",), 4), "draft_k must be set exactly when the bundle has a drafter graph"),
    (lambda m: _set(m, ("exporter",), {"torch": 2}), "exporter['torch'] must be a string"),
    (lambda m: _set(m, ("new_field",), 1), "has unknown keys 'new_field'"),
    (lambda m: _set(m, ("max_length_factor",), 0), "max_length_factor must be a number above 0 and at most 65536"),
    (lambda m: _set(m, ("max_length_factor",), "2.5"), "max_length_factor must be a finite number, got str"),
    (lambda m: _set(m, ("max_length_factor",), True), "max_length_factor must be a finite number, got bool"),
    (lambda m: _delete(m, ("eos_token_id",)), "is missing 'eos_token_id'"),
    (lambda m: _delete(m, ("files", "tokenizer.json")), "files does not list 'tokenizer.json'"),
    (lambda m: _set(m, ("format_version",), True), "format_version True"),
]


@pytest.mark.parametrize("edit, needle", MALFORMED)
def test_malformed_fields_are_named(bundle_copy, edit, needle, capsys):
    write(bundle_copy, edit(read(bundle_copy)))
    with pytest.raises(BundleError) as error:
        load_manifest(bundle_copy)
    assert needle in str(error.value)
    assert_cli_one_error(bundle_copy, capsys, needle)


@pytest.mark.parametrize("raw, needle", [
    (b"[]", "must hold a JSON object, not list"),
    (b"null", "must hold a JSON object, not NoneType"),
    (b"\xff\xfe{}", "is not UTF-8"),
    (b'{"a": 1, "a": 2}', "appears more than once"),
    (b'{"format_version": NaN}', "NaN is not JSON"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    (b'{"format_version": ' + b"1" * 5000 + b"}", "not valid JSON"),
    (b"", "not valid JSON"),
])
def test_malformed_manifest_files(bundle_copy, raw, needle, capsys):
    (bundle_copy / "manifest.json").write_bytes(raw)
    with pytest.raises(BundleError, match=needle):
        load_manifest(bundle_copy)
    assert_cli_one_error(bundle_copy, capsys, needle)


def test_a_manifest_directory_is_refused(bundle_copy):
    (bundle_copy / "manifest.json").unlink()
    (bundle_copy / "manifest.json").mkdir()
    with pytest.raises(BundleNotFoundError, match="has no manifest.json"):
        load_manifest(bundle_copy)


def test_a_missing_bundle_file_is_still_a_not_found_error(bundle_copy):
    (bundle_copy / "verifier.onnx").unlink()
    with pytest.raises(BundleNotFoundError, match="verifier.onnx"):
        load_manifest(bundle_copy, verify=False)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


def _paths(manifest: dict) -> list[tuple]:
    """Every key path of the manifest, nested ones included."""
    found = []

    def walk(node, path):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            found.append((*path, key))
            walk(child, (*path, key))

    walk(manifest, ())
    return found


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_json_in_any_field_is_accepted_or_a_bundle_error(bundle, data):
    """Property: whatever JSON value replaces whatever field, parsing never raises anything else."""
    base = json.loads((bundle("marian") / "manifest.json").read_text())
    path = data.draw(st.sampled_from(_paths(base)))
    edited = _set(json.loads(json.dumps(base)), path, data.draw(json_values))
    try:
        manifest = Manifest.from_json(json.dumps(edited))
    except BundleError:
        return
    assert isinstance(manifest.vocab_size, int) and 0 <= manifest.eos_token_id < manifest.vocab_size


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_any_bytes_are_a_bundle_error(raw):
    with pytest.raises(BundleError):
        Manifest.from_json(raw)


def test_manifest_pinning(bundle_copy):
    digest = manifest_digest(bundle_copy)
    assert load_manifest(bundle_copy, expected_sha256=digest).vocab_size > 0
    manifest = read(bundle_copy)
    manifest["max_source_len"] = 3  # a valid, re-hashed-nowhere edit: only the pin can tell
    write(bundle_copy, manifest)
    with pytest.raises(BundleError, match="pinned"):
        load_manifest(bundle_copy, expected_sha256=digest)


def test_the_exported_manifest_passes_the_schema(bundle):
    root = bundle("marian")
    assert Manifest.from_json((root / "manifest.json").read_bytes()) == load_manifest(root)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize(("graph", "side", "name", "needle"), [
    ("verifier", "input", "past_lengths", "verifier.onnx (verifier) inputs are not the ones this aggdec feeds: "
                                          "unexpected renamed (int64, rank 1); missing past_lengths (int64, rank 1)"),
    ("encoder", "output", "encoder_hidden_states", "encoder.onnx (encoder) outputs are not the ones this aggdec reads"),
])
def test_graphs_that_agree_with_their_manifest_on_other_io_are_refused_at_load(bundle_copy, graph, side, name,
                                                                                needle):
    """A graph and manifest renamed together pass every graph-against-manifest check; the
    runtime would then fail at its first call. They are refused when the bundle is opened."""
    import hashlib

    import onnx

    manifest = read(bundle_copy)
    # both verifier graphs, which the schema requires to take the same inputs
    for renamed in [graph] + (["verifier_argmax"] if graph == "verifier" else []):
        spec = manifest["graphs"][renamed]
        model = onnx.load(str(bundle_copy / spec["file"]))
        for value in (model.graph.input if side == "input" else model.graph.output):
            if value.name == name:
                value.name = "renamed"
        for node in model.graph.node:
            for where in (node.input, node.output):
                for index, used in enumerate(where):
                    if used == name:
                        where[index] = "renamed"
        onnx.save(model, str(bundle_copy / spec["file"]))
        for tensor in spec[f"{side}s"]:
            if tensor["name"] == name:
                tensor["name"] = "renamed"
        manifest["files"][spec["file"]] = hashlib.sha256((bundle_copy / spec["file"]).read_bytes()).hexdigest()
    write(bundle_copy, manifest)
    with pytest.raises(BundleError, match=re.escape(needle)):
        Generator(bundle_copy)


def _pad_output(bundle, graph: str, output: str, pads: list[int]) -> None:
    """Rewrite ``graph`` so that ``output`` comes out padded by ONNX Pad ``pads`` (its declared IO
    unchanged), and re-hash it in the manifest: a hostile graph every load check accepts."""
    import onnx
    from onnx import helper, numpy_helper

    manifest = read(bundle)
    spec = manifest["graphs"][graph]
    model = onnx.load(str(bundle / spec["file"]))
    for node in model.graph.node:  # its producer and any consumer inside the graph keep the real tensor
        for where in (node.input, node.output):
            for index, name in enumerate(where):
                if name == output:
                    where[index] = output + ".raw"
    model.graph.initializer.append(numpy_helper.from_array(np.array(pads, np.int64), output + ".pads"))
    model.graph.node.append(helper.make_node("Pad", [output + ".raw", output + ".pads"], [output]))
    onnx.save(model, str(bundle / spec["file"]))
    manifest["files"][spec["file"]] = hashlib.sha256((bundle / spec["file"]).read_bytes()).hexdigest()
    write(bundle, manifest)


def test_a_graph_that_computes_other_shapes_than_it_declares_is_a_bundle_error(bundle_copy):
    """The encoder's declared IO checks out, but it pads one cross-attention output by a source
    position: the first call says which graph and output, instead of failing somewhere later."""
    # one more source position (a new bundle's keys are [1, heads, head_dim, source]: Manifest.cross_key_layout)
    _pad_output(bundle_copy, "encoder", "cross_key.0", [0, 0, 0, 0, 0, 0, 0, 1])
    # the declared IO is the runtime's: the load-time probe's call is the first to see it
    with pytest.raises(BundleError, match=r"encoder.onnx \(encoder\) computed output 'cross_key.0' of shape "
                                          r"\[1, \d+, (\d+), \d+\], where its declared IO implies"):
        Generator(bundle_copy)


@pytest.mark.parametrize("binding", [True, False])
def test_a_verifier_that_computes_other_candidate_shapes_is_a_bundle_error(bundle_copy, binding):
    """The candidates are bound without a shape (their width varies), so the bound path checks
    them itself; the unbound path through its session."""
    _pad_output(bundle_copy, "verifier", "top_ids", [0, 0, 0, 0, 1, 0])  # one more candidate
    with pytest.raises(BundleError, match="does not compute what its manifest says"):  # at load, by the probe
        Generator(bundle_copy, io_binding=binding).generate(["w1 w2 w3"], max_new_tokens=4)


@pytest.mark.parametrize("binding", [True, False])
def test_a_cache_written_longer_in_batches_is_an_error_naming_the_output(bundle_copy, binding):
    """A verifier whose first self-attention key cache comes out one position longer per row
    after the first: the load-time probes' one-row calls pass, a batch's call does not. Bound,
    the cache is written into the batch's buffers by pointer with its shape, which onnxruntime
    refuses to overrun (its error names the output and the shape computed); unbound, the
    session checks each output against the shapes the inputs imply."""
    import onnx
    from onnx import helper, numpy_helper

    output = "self_key_out.0"
    manifest = read(bundle_copy)
    for graph in ("verifier", "verifier_argmax"):
        spec = manifest["graphs"][graph]
        model = onnx.load(str(bundle_copy / spec["file"]))
        assert output in {o.name for o in model.graph.output}
        for node in model.graph.node:
            for where in (node.input, node.output):
                for index, name in enumerate(where):
                    if name == output:
                        where[index] = output + ".raw"
        constants = {"one": [1], "head": [0, 0, 0, 0, 0, 0], "tail": [0]}
        model.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k)
                                       for k, v in constants.items())
        model.graph.node.extend([  # pads [0, 0, 0, 0, 0, 0, rows - 1, 0]: axis 2 grows
            helper.make_node("Shape", ["input_ids"], ["rows"], start=0, end=1),
            helper.make_node("Sub", ["rows", "one"], ["extra"]),
            helper.make_node("Concat", ["head", "extra", "tail"], ["pads"], axis=0),
            helper.make_node("Pad", [output + ".raw", "pads"], [output])])
        onnx.save(model, str(bundle_copy / spec["file"]))
        manifest["files"][spec["file"]] = hashlib.sha256((bundle_copy / spec["file"]).read_bytes()).hexdigest()
    write(bundle_copy, manifest)
    generator = Generator(bundle_copy, io_binding=binding)
    assert generator.generate(["w1 w2 w3"], mode="iad", max_new_tokens=8)[0].ids  # one row decodes
    with pytest.raises(GraphRunError if binding else BundleError) as caught:
        generator.generate(["w1 w2 w3 w4 w5", "w6 w7 w8"], mode="iad", max_new_tokens=8, batch_size=2)
    message = str(caught.value)
    assert "verifier" in message and output in message
    assert ("computed output shape" if binding else "does not compute what its manifest says") in message


def test_a_graph_that_fails_on_valid_inputs_is_an_error_naming_it(bundle_copy):
    import onnx
    from onnx import helper, numpy_helper

    manifest = read(bundle_copy)
    spec = manifest["graphs"]["encoder"]
    model = onnx.load(str(bundle_copy / spec["file"]))
    for node in model.graph.node:  # the graph's own nodes keep reading the real hidden states
        for where in (node.input, node.output):
            for index, name in enumerate(where):
                if name == "encoder_hidden_states":
                    where[index] = "hidden.raw"
    # squeezed to one row and back: it runs on the load-time probes' one-row sources and fails
    # on two rows at once, which no load-time check can see
    model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "row.axis"))
    model.graph.node.extend([helper.make_node("Squeeze", ["hidden.raw", "row.axis"], ["hidden.one"]),
                             helper.make_node("Unsqueeze", ["hidden.one", "row.axis"], ["encoder_hidden_states"])])
    onnx.save(model, str(bundle_copy / spec["file"]))
    manifest["files"][spec["file"]] = hashlib.sha256((bundle_copy / spec["file"]).read_bytes()).hexdigest()
    write(bundle_copy, manifest)
    generator = Generator(bundle_copy)
    assert generator.generate(["w1 w2 w3"], max_new_tokens=4)[0].ids  # one row decodes
    with pytest.raises(GraphRunError, match=r"encoder.onnx \(encoder\) failed on inputs input_ids \[2, \d+\]"):
        generator.generate(["w1 w2 w3", "w4 w5"], max_new_tokens=4, batch_size=2)


def test_a_manifest_promising_longer_sources_than_the_encoder_holds_is_refused_at_load(bundle_copy, capsys):
    """The tiny Marian's encoder has a position table of fixed size; a manifest that promises
    longer sources is refused when it is opened, naming the limit, not on the first long text.
    (The decoder's positions are clamped to its table, for a batch's padding past a row's end,
    so a longer max_target_len cannot be seen from its outputs: the export caps it.)"""
    manifest = read(bundle_copy)
    longer = 4 * manifest["max_source_len"]
    manifest["max_source_len"] = longer
    write(bundle_copy, manifest)
    with pytest.raises(BundleError, match=f"a source of {longer} tokens \\(the manifest's max_source_len"):
        Generator(bundle_copy)
    assert_cli_one_error(bundle_copy, capsys, "max_source_len")


# ------------------------------------------------- every byte the runtime reads is hashed


def _rehash(root, *names) -> None:
    manifest = read(root)
    for name in names:
        manifest["files"][name] = hashlib.sha256((root / name).read_bytes()).hexdigest()
    write(root, manifest)


def _externalize(root, graph_file: str, location: str) -> None:
    """Rewrite ``graph_file`` with its weights in the external-data file ``location`` (as onnx
    writes graphs over 2 GB), and re-hash the graph alone: its weights are no file the manifest lists."""
    import onnx

    model = onnx.load(str(root / graph_file))
    onnx.save(model, str(root / graph_file), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=0)
    _rehash(root, graph_file)


def test_external_data_no_hash_covers_is_refused(bundle_copy, capsys):
    """A flipped byte in weights that no hash covers would change the output silently."""
    _externalize(bundle_copy, "verifier.onnx", "verifier.weights")
    for verify in (True, False):  # the runtime reads no unlisted file, whether or not it checks hashes
        with pytest.raises(BundleError, match="keeps weights in external data that is not a file the manifest lists"):
            Generator(bundle_copy, verify=verify)
    assert_cli_one_error(bundle_copy, capsys, "external data")


def test_listed_external_data_loads_and_a_flipped_byte_in_it_is_refused(bundle, bundle_copy, capsys):
    _externalize(bundle_copy, "verifier.onnx", "verifier.weights")
    _rehash(bundle_copy, "verifier.weights")  # listed and hashed, as an exporter writing external data does
    texts = ["w1 w2 w3", "w4 w5"]
    expected = [r.ids for r in Generator(bundle("marian")).generate(texts, max_new_tokens=8)]
    assert [r.ids for r in Generator(bundle_copy).generate(texts, max_new_tokens=8)] == expected
    weights = bytearray((bundle_copy / "verifier.weights").read_bytes())
    weights[len(weights) // 2] ^= 0x01
    (bundle_copy / "verifier.weights").write_bytes(bytes(weights))
    with pytest.raises(BundleError, match="verifier.weights.* does not match its manifest"):
        Generator(bundle_copy)
    assert_cli_one_error(bundle_copy, capsys, "does not match its manifest")


@pytest.mark.parametrize("place", ["outside", "link"])
def test_external_data_outside_the_bundle_is_never_read(bundle_copy, tmp_path, place, capsys):
    """The graph names a path out of the bundle (or a link in it) holding the right weights:
    onnxruntime is given the listed files in memory and no directory, so it reads neither."""
    import onnx

    _externalize(bundle_copy, "verifier.onnx", "verifier.weights")
    shutil.move(bundle_copy / "verifier.weights", tmp_path / "verifier.weights")
    model = onnx.load(str(bundle_copy / "verifier.onnx"), load_external_data=False)
    location = "../verifier.weights" if place == "outside" else "linked.weights"
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(model, str(bundle_copy / "verifier.onnx"))
    _rehash(bundle_copy, "verifier.onnx")
    if place == "link":  # the right weights, through a link in the bundle
        os.symlink(tmp_path / "verifier.weights", bundle_copy / "linked.weights")
        match = "holds symlinks"
    else:  # the right weights, beside the bundle (bundle_copy.parent is tmp_path)
        match = "keeps weights in external data that is not a file the manifest lists"
    with pytest.raises(BundleError, match=match):
        Generator(bundle_copy)
    assert_cli_one_error(bundle_copy, capsys, match)


def _outside_constant(root, graph_file: str, outside) -> None:
    """Turn one of ``graph_file``'s float vectors into a Constant node whose tensor is external
    data at the absolute path ``outside`` (written there, with the right values), and re-hash the
    graph: a place the initializers' own check does not look, and a path no listed file has."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(root / graph_file))
    init = next(i for i in model.graph.initializer if len(i.dims) == 1 and i.data_type == TensorProto.FLOAT)
    values = numpy_helper.to_array(init)
    outside.write_bytes(values.astype("<f4").tobytes())
    tensor = TensorProto(name=init.name, data_type=TensorProto.FLOAT, dims=list(init.dims),
                         data_location=TensorProto.EXTERNAL)
    for key, value in (("location", str(outside)), ("offset", "0"), ("length", str(values.size * 4))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    model.graph.initializer.remove(init)
    model.graph.node.insert(0, helper.make_node("Constant", [], [init.name], value=tensor))
    onnx.save(model, str(root / graph_file))
    _rehash(root, graph_file)


def _hostile_graphs(root, kind: str, tmp_path) -> None:
    """The bundle's graphs made hostile, with the manifest's hashes rewritten to match."""
    import onnx
    from onnx import helper

    if kind == "random bytes":
        (root / "verifier.onnx").write_bytes(np.random.default_rng(0).bytes(5000))
        _rehash(root, "verifier.onnx")
    elif kind == "swapped":
        verifier, encoder = (root / "verifier.onnx").read_bytes(), (root / "encoder.onnx").read_bytes()
        (root / "verifier.onnx").write_bytes(encoder)
        (root / "encoder.onnx").write_bytes(verifier)
        _rehash(root, "verifier.onnx", "encoder.onnx")
    elif kind == "unknown domain":
        model = onnx.load(str(root / "encoder.onnx"))
        next(n for n in model.graph.node if n.op_type == "Add").domain = "evil.domain"
        model.opset_import.append(helper.make_opsetid("evil.domain", 1))
        onnx.save(model, str(root / "encoder.onnx"))
        _rehash(root, "encoder.onnx")
    elif kind == "external data outside":
        _outside_constant(root, "encoder.onnx", tmp_path / "outside.bin")


@pytest.mark.parametrize("kind", ["random bytes", "swapped", "unknown domain", "external data outside"])
def test_quantize_and_build_engines_refuse_what_the_runtime_refuses(bundle_copy, tmp_path, capsys, kind):
    """`aggdec quantize` read the graphs with onnx and onnxruntime by path, without the runtime's
    checks: random bytes, swapped graphs and an unknown operator domain were tracebacks, and
    external data outside the bundle was read. `build-engines` hands each graph's path to
    TensorRT, whose parser follows external-data paths the same way. Both now refuse any bundle
    the runtime refuses, with its BundleError, before reading a graph themselves."""
    _hostile_graphs(bundle_copy, kind, tmp_path)
    with pytest.raises(BundleError) as refused:
        Generator(bundle_copy)
    needle = str(refused.value)[:60]
    for command in (["quantize", str(bundle_copy), str(tmp_path / "int8")],
                    ["build-engines", str(bundle_copy), "--dry-run"]):
        code = main(command)
        captured = capsys.readouterr()
        lines = [line for line in captured.err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("aggdec: error:"), (command, lines)
        assert needle in lines[0], lines[0]
        assert not captured.out
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith((".int8", "int8"))]


def test_the_bytes_given_to_the_runtime_are_the_bytes_hashed(bundle_copy):
    """A file changed after the manifest's check (between hashing and loading) is refused when
    it is read for use: the read is checked, not only the earlier pass."""
    from aggdec.runtime.manifest import BundleFiles

    manifest = load_manifest(bundle_copy)  # every hash checks out here
    (bundle_copy / "tokenizer.json").write_text((bundle_copy / "tokenizer.json").read_text() + " ")
    files = BundleFiles(bundle_copy, manifest)
    assert files.read("verifier.onnx") == (bundle_copy / "verifier.onnx").read_bytes()
    with pytest.raises(BundleError, match="tokenizer.json.* does not match its manifest"):
        files.read("tokenizer.json")
    with pytest.raises(BundleError, match="not listed"):
        files.read("other.onnx")


# ------------------------------------------------- tokenizer, manifest and graphs agree


def test_a_tokenizer_from_another_model_of_the_same_size_is_refused(bundle_copy, capsys):
    """Its special tokens sit at other ids: the manifest's eos is an ordinary word there."""
    tokenizer = json.loads((bundle_copy / "tokenizer.json").read_text())
    eos = read(bundle_copy)["eos_token_id"]
    vocab = tokenizer["model"]["vocab"]
    word = next(token for token, index in vocab.items() if index == eos + 5)
    eos_token = next(token for token, index in vocab.items() if index == eos)
    vocab[word], vocab[eos_token] = eos, eos + 5  # the same tokens, two of them at each other's ids
    for added in tokenizer["added_tokens"]:
        if added["content"] == eos_token:
            added["id"] = eos + 5
    for processor in [tokenizer.get("post_processor") or {}]:
        for special in (processor.get("special_tokens") or {}).values():
            special["ids"] = [eos + 5 if i == eos else i for i in special["ids"]]
    (bundle_copy / "tokenizer.json").write_text(json.dumps(tokenizer))
    _rehash(bundle_copy, "tokenizer.json")
    needle = f"manifest eos_token_id is {eos}, which tokenizer.json has as an ordinary token"
    with pytest.raises(BundleError, match=needle):
        Generator(bundle_copy)
    assert_cli_one_error(bundle_copy, capsys, needle)


def test_a_manifest_vocabulary_larger_than_the_graphs_is_refused(bundle_copy, capsys):
    """The tokenizer fits in it, but the graphs have no rows for its last ids."""
    manifest = read(bundle_copy)
    manifest["vocab_size"] += 7
    write(bundle_copy, manifest)
    needle = f"the encoder graph fails at load on a probe with token id {manifest['vocab_size'] - 1}"
    with pytest.raises(BundleError, match=needle):
        Generator(bundle_copy)
    assert_cli_one_error(bundle_copy, capsys, needle)


def _foreign_drafter(root, **changes) -> None:
    """Replace the bundle's drafter graphs with one traced from a drafter of another model
    (``changes`` to its config), re-hashed and re-declared as the exporter would write it."""
    import torch

    from aggdec.export.drafter import Drafter, DrafterConfig, DrafterGraph
    from aggdec.export.tracing import drafter_dummy, trace
    from aggdec.export.specs import drafter_spec

    manifest = read(root)
    torch.manual_seed(0)
    fields = {"vocab_size": manifest["vocab_size"], "d_model": manifest["d_model"], "num_heads": 2, "ffn_dim": 32,
              "k": manifest["draft_k"], "max_positions": 64, **changes}
    config = DrafterConfig(head_dim=fields["d_model"] // 2, **fields)
    drafter = Drafter(config).eval()
    spec = drafter_spec(config.d_model, config.k)
    trace(DrafterGraph(drafter).eval(), drafter_dummy(drafter, config.d_model), root / spec.file, spec, 17)
    for name in ("drafter_int8", "drafter_source"):  # the bundle's other drafter graphs go
        if name in manifest["graphs"]:
            manifest["files"].pop(manifest["graphs"].pop(name)["file"])
    manifest["graphs"]["drafter"] = json.loads(json.dumps(dataclasses.asdict(spec)))
    write(root, manifest)
    _rehash(root, spec.file)


@pytest.fixture()
def gad_copy(drafter_bundle, tmp_path):
    from aggdec.export.drafter import new_drafter_from_verifier

    source, _ = drafter_bundle("marian", "gad", lambda model: new_drafter_from_verifier(model, layers=2, k=25, seed=1))
    shutil.copytree(source, tmp_path / "bundle")
    return tmp_path / "bundle"


@pytest.mark.parametrize("changes, needle", [
    ({"vocab_size": -9}, "the drafter graph fails at load on a probe with token id"),  # no row for its [MASK]
    ({"vocab_size": +400}, "the drafter graph returned token id"),  # drafts ids the verifier has no row for
    ({"d_model": 16}, "manifest d_model is 32 but drafter input 'encoder_hidden_states'"),
    ({"k": 7}, "manifest draft_k is 25 but drafter output 'draft_ids'"),
])
def test_a_drafter_from_another_model_is_refused_at_load(gad_copy, changes, needle, capsys):
    """A drafter graph traced for another vocabulary, width or k, declared (as the graph is)
    and hashed in its bundle's manifest."""
    vocab = read(gad_copy)["vocab_size"]
    _foreign_drafter(gad_copy, **{k: vocab + v if k == "vocab_size" else v for k, v in changes.items()})
    with pytest.raises(BundleError, match=re.escape(needle)):
        Generator(gad_copy)
    assert_cli_one_error(gad_copy, capsys, needle)


def test_a_mask_id_the_tokenizer_produces_is_refused(gad_copy, capsys):
    manifest = read(gad_copy)
    manifest["mask_token_id"] = 5
    write(gad_copy, manifest)
    needle = "manifest mask_token_id is 5, a token of tokenizer.json"
    with pytest.raises(BundleError, match=needle):
        Generator(gad_copy)
    assert_cli_one_error(gad_copy, capsys, needle)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_ids_a_graph_returns_are_checked_against_the_vocabulary(dtype):
    """check_ids runs on every verifier call (int64 ids: one reduction, a negative id read as
    unsigned); a negative id and one past the vocabulary are both refused, naming the id."""
    from aggdec.runtime.bundle_probe import check_ids

    check_ids(np.array([[0, 9], [3, 4]], dtype=dtype), 10, "the verifier")
    check_ids(np.zeros((2, 0), dtype=dtype), 10, "the verifier")
    strided = np.array([[1, -3, 2, 5]], dtype=dtype)[:, ::2]  # a view, as a slice of a graph's output is
    check_ids(strided, 10, "the verifier")
    for bad in (-1, 10, np.iinfo(dtype).min):
        ids = np.array([[2, bad], [0, 1]], dtype=dtype)
        with pytest.raises(BundleError, match=f"the verifier returned token id {bad}, outside"):
            check_ids(ids, 10, "the verifier")


# --------------------------------------------------------------------- what tokenizer.json may do


def _edit_tokenizer(root, edit) -> None:
    tokenizer = json.loads((root / "tokenizer.json").read_text())
    edit(tokenizer)
    (root / "tokenizer.json").write_text(json.dumps(tokenizer))
    _rehash(root, "tokenizer.json")


def _replace(pattern: dict, content: str) -> dict:
    return {"type": "Replace", "pattern": pattern, "content": content}


GROWING = [  # (part, step, the growth the message names)
    ("normalizer", {"type": "Sequence", "normalizers": [_replace({"String": "w"}, "w" * 1000)] * 3}, "1e+09"),
    ("normalizer", {"type": "Sequence", "normalizers": [
        {"type": "Sequence", "normalizers": [_replace({"Regex": "x*"}, "ab")] * 2},
        _replace({"String": "ab"}, "a" * 40)]},
     "180"),  # a regex may match nothing, between any two characters: (2 + 1) x (2 + 1) x 40 / 2
    ("decoder", {"type": "Sequence", "decoders": [_replace({"String": "w"}, "w" * 100)] * 2}, "1e+04"),
]


@pytest.mark.parametrize("part, step, growth", GROWING)
def test_a_tokenizer_that_can_grow_a_text_without_bound_is_refused_at_load(bundle_copy, capsys, part, step, growth):
    """Three chained Replace normalizers of "w" -> 100,000 w's got the process killed for memory
    on its first text; a decoder that grows its text does the same to every output."""
    _edit_tokenizer(bundle_copy, lambda tokenizer: tokenizer.update({part: step}))
    needle = f"'s {part} can make a text up to {growth} times longer"
    with pytest.raises(BundleError, match=re.escape(needle)):
        Generator(bundle_copy, threads=1)
    assert_cli_one_error(bundle_copy, capsys, needle)


def test_replacements_that_grow_a_text_a_little_load(bundle_copy):
    steps = [_replace({"String": " "}, "\u2581"), _replace({"Regex": " {2,}"}, " "), {"type": "NFKC"}]
    _edit_tokenizer(bundle_copy, lambda tokenizer: tokenizer.update(
        normalizer={"type": "Sequence", "normalizers": steps}))
    generator = Generator(bundle_copy, threads=1)
    assert generator.generate(["w1 w2"], max_new_tokens=2)[0].ids


def test_a_post_processor_naming_an_id_past_the_vocabulary_is_refused_at_load(bundle_copy, capsys):
    """It was a GraphRunError on every request (the encoder's embedding has no such row)."""
    def edit(tokenizer):
        tokenizer["post_processor"]["special_tokens"]["</s>"]["ids"] = [10**7]

    _edit_tokenizer(bundle_copy, edit)
    needle = "the tokenizer gave token id 10000000, outside the manifest's vocabulary of"
    with pytest.raises(BundleError, match=needle):
        Generator(bundle_copy, threads=1)
    assert_cli_one_error(bundle_copy, capsys, needle)


def test_a_vocabulary_whose_ids_pass_the_model_s_is_refused_at_load(bundle_copy, capsys):
    """As many tokens as the model's rows, but ids past them: it loaded, and the first text with
    such a word ended a whole `aggdec generate` run."""
    def edit(tokenizer):
        vocab = tokenizer["model"]["vocab"]
        for index in range(5):
            vocab[f"w{index}"] = 200 + index

    _edit_tokenizer(bundle_copy, edit)
    needle = "tokenizer.json has token ids up to 204 but manifest vocab_size is"
    with pytest.raises(BundleError, match=needle):
        Generator(bundle_copy, threads=1)
    assert_cli_one_error(bundle_copy, capsys, needle)


def test_a_tokenizer_that_fails_on_text_is_refused_at_load(bundle_copy, capsys):
    """A WordLevel model without its unknown token: tokenizers raises a bare Exception on any
    word it lacks, which reached the caller of generate (and a server's 500)."""
    _edit_tokenizer(bundle_copy, lambda tokenizer: tokenizer["model"].update(unk_token="<absent>"))
    needle = "cannot encode a text: WordLevel error: Missing [UNK] token from the vocabulary"
    with pytest.raises(BundleError, match=re.escape(needle)):
        Generator(bundle_copy, threads=1)
    assert_cli_one_error(bundle_copy, capsys, needle)


def test_a_bundle_path_that_is_a_file_says_so(tmp_path):
    path = tmp_path / "bundle"
    path.write_text("not a directory")
    with pytest.raises(BundleNotFoundError, match="is a file, not a directory"):
        Generator(path)


def backtracking_tokenizer(root) -> None:
    """The bundle's tokenizer with a pre-tokenizer regex that backtracks without bound on forty
    a's and a "!": Oniguruma stops at its retry limit and the tokenizers library panics."""
    _edit_tokenizer(root, lambda tokenizer: tokenizer.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False},
        tokenizer["pre_tokenizer"]]}))


BACKTRACKING_TEXT = "a" * 40 + "!"


def test_a_text_the_tokenizer_gives_up_on_is_that_texts_input_error(bundle_copy, tmp_path):
    """tokenizers' panic is a BaseException: it went past every `except Exception`, a traceback
    that ended the CLI's run (the lines after it lost) and a plain-text 500 from the server."""
    backtracking_tokenizer(bundle_copy)
    generator = Generator(bundle_copy, threads=1)
    with pytest.raises(InputError, match="text 1 cannot be tokenized: the bundle's tokenizer gave up on it"):
        generator.generate(["w1 w2", BACKTRACKING_TEXT], max_new_tokens=3)
    assert generator.check(BACKTRACKING_TEXT).startswith("input cannot be tokenized")
    source = tmp_path / "in.txt"
    source.write_text(f"w1 w2\n{BACKTRACKING_TEXT}\nw3\n")
    result = subprocess.run([sys.executable, "-m", "aggdec", "generate", str(bundle_copy), "--input", str(source),
                             "--max-new-tokens", "3"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "RUST_BACKTRACE": "0"})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "aggdec: line 2: input cannot be tokenized" in result.stderr
    want = [r.text for r in generator.generate(["w1 w2", "w3"], max_new_tokens=3)]
    assert result.stdout.split("\n") == [want[0], "", want[1], ""]
