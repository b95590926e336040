"""`aggdec export` never destroys user data, leaves no temporary directory when stopped, and
fails with one `aggdec: error:` line (exit 2), never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aggdec.cli import main
from aggdec.export.safety import MIN_OPSET, max_opset
from aggdec.runtime.manifest import manifest_digest
from tests.support import interruptible


def export(capsys, *args: str) -> tuple[int, list[str]]:
    code = main(["export", *map(str, args)])
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()]


def assert_refused(capsys, needle: str, *args) -> str:
    code, lines = export(capsys, *args)
    errors = [line for line in lines if line.startswith("aggdec:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("aggdec: error:"), lines
    assert not any("Traceback" in line for line in lines)
    assert needle in errors[0], errors[0]
    return errors[0]


def leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


@pytest.fixture()
def source(random_checkpoint, tmp_path):
    src = tmp_path / "ckpt"
    shutil.copytree(random_checkpoint("marian"), src)
    return src


def test_out_dir_and_checkpoint_must_not_overlap(source, capsys):
    before = sorted(p.name for p in source.iterdir())
    assert_refused(capsys, "is the checkpoint directory", source, source, "--force")
    assert_refused(capsys, "is inside the checkpoint directory", source, source / "bundle", "--force")
    assert_refused(capsys, "contains the checkpoint directory", source, source.parent, "--force")
    assert_refused(capsys, "is inside the checkpoint directory", source, source / "x" / ".." / "b")
    assert sorted(p.name for p in source.iterdir()) == before


def test_the_current_directory_is_refused_as_out_dir(source, tmp_path, capsys, monkeypatch):
    """`aggdec export SRC . --force` in an empty directory ran the whole export, then failed to
    rename "." (EBUSY)."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert_refused(capsys, "is the current directory", source, ".", "--force")
    assert list((tmp_path / "here").iterdir()) == []


def test_out_dir_that_is_a_file_is_refused(source, tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    assert_refused(capsys, "is a file, not a directory", source, target, "--force")
    assert target.read_text() == "mine"


def test_force_replaces_only_a_bundle_or_an_empty_directory(source, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    assert_refused(capsys, "not an aggdec bundle", source, out, "--force")
    assert (out / "thesis.tex").read_text() == "years of work"

    (out / "manifest.json").write_text(json.dumps({"name": "someone else's manifest"}))
    assert_refused(capsys, "is not an aggdec manifest", source, out, "--force")
    (out / "thesis.tex").unlink()
    (out / "manifest.json").unlink()

    code, lines = export(capsys, source, out, "--force")  # empty: replaced
    assert code == 0 and (out / "manifest.json").is_file()
    # the last line gives the digest that pins the bundle
    assert lines[-1].endswith(f"(manifest sha256 {manifest_digest(out)})"), lines
    first = (out / "manifest.json").read_text()
    code, _ = export(capsys, source, out, "--force", "--top-k", "4")  # a bundle: replaced
    assert code == 0 and (out / "manifest.json").read_text() != first
    assert leftovers(tmp_path, "out") == []

    (out / "my-notes.txt").write_text("keep me")  # a bundle with someone's file in it: refused
    assert_refused(capsys, "my-notes.txt", source, out, "--force")
    assert (out / "my-notes.txt").read_text() == "keep me"


def test_force_never_follows_a_symlinked_out_dir(source, tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    assert_refused(capsys, "is a symbolic link", source, tmp_path / "link", "--force")
    assert real.is_dir()


def test_a_checkpoint_without_weights(source, tmp_path, capsys):
    for weights in source.glob("*.safetensors"):
        weights.unlink()
    assert_refused(capsys, "could not load the model weights", source, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path, "out") == []


def test_corrupt_weights(source, tmp_path, capsys):
    for weights in source.glob("*.safetensors"):
        weights.write_bytes(b"\x00" * weights.stat().st_size)  # as long as they were: the size check passes
    assert_refused(capsys, "could not load the model weights", source, tmp_path / "out")
    for weights in source.glob("*.safetensors"):
        weights.write_bytes(b"\x00" * 64)
    assert_refused(capsys, "weight files hold only 64 bytes: the weights are cut short", source, tmp_path / "out")


def _sharded(source: Path, shard: str) -> None:
    """``source`` as a sharded checkpoint whose index maps every tensor to ``shard``."""
    from safetensors import safe_open

    (weights,) = source.glob("*.safetensors")
    with safe_open(str(weights), "np") as handle:
        names = list(handle.keys())
    (source / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        name: shard for name in names}}))
    weights.rename(source / "shard-1.safetensors")


@pytest.mark.parametrize("shard, needle", [
    ("fifo", "which is not a regular file (a device, a FIFO"),  # opened by transformers: blocked for good
    ("/dev/zero", "not a file name in the checkpoint folder"),  # read until memory ran out
    ("../outside.safetensors", "not a file name in the checkpoint folder"),  # weights from elsewhere, unsized
    ("link", "which is not a regular file (a device, a FIFO"),  # a name in the folder for a FIFO elsewhere
    ("absent.safetensors", "which the checkpoint folder does not hold"),
])
def test_a_sharded_index_may_name_only_regular_files_beside_it(source, tmp_path, capsys, shard, needle):
    _sharded(source, shard)
    if shard == "fifo":
        os.mkfifo(source / "fifo")
    if shard == "link":
        os.mkfifo(tmp_path / "elsewhere")
        (source / "link").symlink_to(tmp_path / "elsewhere")
    assert_refused(capsys, needle, source, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path, "out") == []


def test_a_sharded_checkpoint_of_shards_beside_its_index_exports(source, tmp_path, capsys):
    """Shards beside the index, here a link to a file elsewhere as the Hub's cache lays out a
    snapshot (the size check counts what it points to)."""
    _sharded(source, "shard-1.safetensors")
    (source / "shard-1.safetensors").rename(tmp_path / "blob")
    (source / "shard-1.safetensors").symlink_to(tmp_path / "blob")
    code, lines = export(capsys, source, tmp_path / "out")
    assert code == 0, lines


def test_a_config_without_a_pad_token_is_one_error_line(source, tmp_path, capsys):
    config = json.loads((source / "config.json").read_text())
    config["pad_token_id"] = None
    (source / "config.json").write_text(json.dumps(config))
    assert_refused(capsys, "sets no pad_token_id", source, tmp_path / "out")  # was int(None)'s TypeError


def _drop_tensor(checkpoint: Path, fragment: str) -> str:
    """Deletes the first stored tensor whose name holds ``fragment``; returns its name."""
    from safetensors.torch import load_file, save_file

    (weights,) = checkpoint.glob("*.safetensors")
    tensors = load_file(weights)
    name = next(key for key in tensors if fragment in key)
    del tensors[name]
    save_file(tensors, weights, metadata={"format": "pt"})
    return name


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_weights_that_lack_a_tensor_are_refused(random_checkpoint, tmp_path, capsys, family):
    """transformers fills a missing tensor with random values and only logs it: the export then
    validated its graphs against that random draw and published it."""
    source = tmp_path / "ckpt"
    shutil.copytree(random_checkpoint(family), source)
    dropped = _drop_tensor(source, "decoder")
    error = assert_refused(capsys, "lack 1 tensor(s) its config.json describes", source, tmp_path / "out")
    assert dropped in error
    assert not (tmp_path / "out").exists() and leftovers(tmp_path, "out") == []


def test_weights_holding_nan_are_refused_by_name(source, tmp_path, capsys):
    """They failed the export's position-independence check, as if a graph were wrong."""
    from safetensors.torch import load_file, save_file

    (weights,) = source.glob("*.safetensors")
    tensors = load_file(weights)
    name = next(key for key in tensors if "fc1.weight" in key)
    tensors[name][0, :3] = float("nan")
    save_file(tensors, weights, metadata={"format": "pt"})
    error = assert_refused(capsys, "hold 3 NaN or infinite value(s) in", source, tmp_path / "out")
    assert name in error


def test_a_config_with_more_layers_than_stored_is_refused(source, tmp_path, capsys):
    config = json.loads((source / "config.json").read_text())
    config["decoder_layers"] += 1
    (source / "config.json").write_text(json.dumps(config))
    error = assert_refused(capsys, "tensor(s) its config.json describes", source, tmp_path / "out")
    assert f"model.decoder.layers.{config['decoder_layers'] - 1}." in error


def test_stored_tensors_the_model_has_no_place_for_are_named_and_ignored(source, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    (weights,) = source.glob("*.safetensors")
    tensors = load_file(weights)
    tensors["model.decoder.stray.weight"] = tensors[next(iter(tensors))].clone()
    save_file(tensors, weights, metadata={"format": "pt"})
    code, lines = export(capsys, source, tmp_path / "out")
    assert code == 0, lines
    assert any("1 tensor(s) the config's model has no place for (model.decoder.stray.weight)" in line
               for line in lines), lines


@pytest.mark.parametrize("field, value, needle", [
    ("encoder_layers", 10**7, "encoder_layers must be an integer from 1 to 512, got 10000000"),  # built for minutes
    ("d_model", 10**6, "d_model must be an integer from 1 to 65536, got 1000000"),
    ("vocab_size", 0, "vocab_size must be an integer from 1 to"),
    ("encoder_layers", True, "Field 'encoder_layers' expected int, got bool"),  # transformers' own check
    ("encoder_ffn_dim", 1 << 18, "describes a model of"),  # 50 million parameters to initialize from 0.2 MB
])
def test_config_sizes_are_checked_before_transformers_builds_anything(source, tmp_path, capsys, field, value, needle):
    """A config claiming ten million layers kept export building modules until it was stopped;
    one claiming wider layers than its weights hold makes transformers allocate and initialize
    the difference (64 such layers: 1.1 billion parameters from a 0.2 MB checkpoint)."""
    config = json.loads((source / "config.json").read_text())
    config[field] = value
    (source / "config.json").write_text(json.dumps(config))
    assert_refused(capsys, needle, source, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path, "out") == []


@pytest.mark.parametrize("opset", [MIN_OPSET - 1, max_opset() + 1, 0])
def test_unsupported_opsets_are_refused_before_loading(source, tmp_path, capsys, opset):
    started = time.perf_counter()
    line = assert_refused(capsys, f"--opset {opset} is not supported", source, tmp_path / "out", "--opset", opset)
    assert f"{MIN_OPSET}..{max_opset()}" in line
    assert time.perf_counter() - started < 5  # refused before loading or tracing anything
    assert list(tmp_path.iterdir()) == [source]


@pytest.mark.parametrize("flag, value", [("--max-source-len", "70000"), ("--max-target-len", "1")])
def test_impossible_lengths_are_refused(source, tmp_path, capsys, flag, value):
    assert_refused(capsys, f"{flag} must be between 2 and 65536, got {value}", source, tmp_path / "out", flag, value)


def test_an_unwritable_destination_is_one_error_line(source, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        assert_refused(capsys, "export failed", source, parent / "out")
    finally:
        parent.chmod(0o700)


def test_the_highest_supported_opset_exports(source, tmp_path, capsys):
    code, lines = export(capsys, source, tmp_path / "out", "--opset", max_opset())
    assert code == 0, lines


@pytest.mark.slow
@pytest.mark.parametrize("signum, stage, status", [
    (signal.SIGTERM, "[3/5]", -signal.SIGTERM),  # the default SIGTERM still ends the process...
    (signal.SIGTERM, "[4/5]", -signal.SIGTERM),
    (signal.SIGINT, "[3/5]", 130),  # ...and Ctrl-C is still KeyboardInterrupt: exit 130, no traceback
])
def test_a_signal_at_any_stage_leaves_no_temporary_directory(source, tmp_path, signum, stage, status):
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "aggdec", "export", str(source), str(out)],
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                               preexec_fn=interruptible)
    seen = []
    try:
        for line in process.stderr:
            seen.append(line)
            if line.startswith(stage):
                process.send_signal(signum)
                break
        rest = process.stderr.read()
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert any(line.startswith(stage) for line in seen), seen
    assert process.returncode == status, (seen, rest)
    assert "Traceback" not in rest, rest
    assert leftovers(tmp_path, "out") == [] and not out.exists()


def test_a_signal_stays_the_signal_when_a_library_cleanup_raises_on_the_way_out():
    """torch's ONNX exporter asserts its own state while unwinding from the interrupt (seen once
    in a full test run); the export must still end as the signal, Ctrl-C as KeyboardInterrupt,
    not as the library's assertion with a traceback."""
    import contextlib

    from aggdec.export.safety import _SignalGuard

    @contextlib.contextmanager
    def fragile_library_state():
        try:
            yield
        finally:
            raise AssertionError("the library's export state is not what it expected")

    # Python's own Ctrl-C handler, whatever this process inherited (a background job starts with
    # SIGINT ignored, and an ignored signal stays ignored under the guard)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with _SignalGuard():
                with fragile_library_state():
                    signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the caller's handler is back
    finally:
        signal.signal(signal.SIGINT, inherited)


@pytest.mark.parametrize("text, needle", [
    # an OverflowError from tokenizers ("while processing 'id'"): a traceback
    ('{"decoder_start_token_id": -5}', "decoder_start_token_id is -5, which is not a token id (0 to"),
    # int('x'): a ValueError traceback
    ('{"bad_words_ids": [[1, 2], "x"]}', "bad_words_ids holds 'x', which is not a list of token ids"),
    ('{"suppress_tokens": ["a"]}', "suppress_tokens entry is 'a', which is not a token id"),
    ('{"forced_bos_token_id": 99999}', "forced_bos_token_id is 99999, which is not a token id"),
    # was "could not load the model weights" (transformers reads it with the model)
    ("[]", "could not read"),
    ("[" * 100000 + "]" * 100000, "generation_config.json': maximum recursion depth"),
])
def test_a_hostile_generation_config_is_named_in_one_line(source, tmp_path, capsys, text, needle):
    (source / "generation_config.json").write_text(text)
    assert_refused(capsys, needle, source, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path, "out")
