"""A bundle is untrusted input: hostile paths, links and malformed manifests are clean BundleErrors."""

from __future__ import annotations

import hashlib
import json
import re
import os
import shutil
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggdec.cli import main
from aggdec.runtime.errors import BundleError, BundleNotFoundError, GraphRunError
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
    spec = manifest["graphs"][graph]
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
    for node in model.graph.node:
        for index, name in enumerate(node.output):
            if name == output:
                node.output[index] = output + ".raw"
    model.graph.initializer.append(numpy_helper.from_array(np.array(pads, np.int64), output + ".pads"))
    model.graph.node.append(helper.make_node("Pad", [output + ".raw", output + ".pads"], [output]))
    onnx.save(model, str(bundle / spec["file"]))
    manifest["files"][spec["file"]] = hashlib.sha256((bundle / spec["file"]).read_bytes()).hexdigest()
    write(bundle, manifest)


def test_a_graph_that_computes_other_shapes_than_it_declares_is_a_bundle_error(bundle_copy):
    """The encoder's declared IO checks out, but it pads one cross-attention output by a source
    position: the first call says which graph and output, instead of failing somewhere later."""
    _pad_output(bundle_copy, "encoder", "cross_key.0", [0, 0, 0, 0, 0, 0, 1, 0])  # one more source position
    generator = Generator(bundle_copy)  # loads: the declared IO is the runtime's
    with pytest.raises(BundleError, match=r"encoder.onnx \(encoder\) computed output 'cross_key.0' of shape "
                                          r"\[1, \d+, (\d+), \d+\], where its declared IO implies"):
        generator.generate(["w1 w2 w3"], max_new_tokens=4)


@pytest.mark.parametrize("binding", [True, False])
def test_a_verifier_that_computes_other_candidate_shapes_is_a_bundle_error(bundle_copy, binding):
    """The candidates are bound without a shape (their width varies), so the bound path checks
    them itself; the unbound path through its session."""
    _pad_output(bundle_copy, "verifier", "top_ids", [0, 0, 0, 0, 1, 0])  # one more candidate
    generator = Generator(bundle_copy, io_binding=binding)
    with pytest.raises(BundleError, match="does not compute what its manifest says"):
        generator.generate(["w1 w2 w3"], max_new_tokens=4)


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
    # position 1000 of every source: out of range at run time, which no load-time check can see
    model.graph.initializer.append(numpy_helper.from_array(np.array([1000], np.int64), "far.position"))
    model.graph.node.append(helper.make_node("Gather", ["hidden.raw", "far.position"], ["encoder_hidden_states"],
                                             axis=1))
    onnx.save(model, str(bundle_copy / spec["file"]))
    manifest["files"][spec["file"]] = hashlib.sha256((bundle_copy / spec["file"]).read_bytes()).hexdigest()
    write(bundle_copy, manifest)
    with pytest.raises(GraphRunError, match=r"encoder.onnx \(encoder\) failed on inputs input_ids \[1, \d+\]"):
        Generator(bundle_copy).generate(["w1 w2 w3"], max_new_tokens=4)
