"""A bundle that does not match its manifest, or bad requests, get clear typed errors."""

from __future__ import annotations

import json
import shutil

import pytest

from aggdec.runtime.errors import AggdecError, BundleError, BundleNotFoundError, InputError, ProviderError
from aggdec.runtime.generator import Generator


@pytest.fixture()
def bundle_copy(bundle, tmp_path):
    target = tmp_path / "bundle"
    shutil.copytree(bundle("marian"), target)
    return target


def test_modified_graph_is_refused_naming_the_file(bundle_copy):
    with open(bundle_copy / "verifier.onnx", "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(BundleError, match="verifier.onnx"):
        Generator(bundle_copy)


def test_missing_file_is_refused(bundle_copy):
    (bundle_copy / "tokenizer.json").unlink()
    with pytest.raises(BundleNotFoundError, match="tokenizer.json"):
        Generator(bundle_copy)


def test_newer_format_is_refused(bundle_copy):
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    manifest["format_version"] = 99
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="format_version"):
        Generator(bundle_copy)


def test_not_a_bundle(tmp_path):
    with pytest.raises(BundleNotFoundError, match="aggdec export"):
        Generator(tmp_path)
    with pytest.raises(FileNotFoundError):  # the typed errors are also the builtin ones
        Generator(tmp_path / "missing")


def test_bad_requests(bundle):
    generator = Generator(bundle("marian"))
    with pytest.raises(InputError, match="empty"):
        generator.generate(["w1", "   "])
    with pytest.raises(InputError, match="list of strings"):
        generator.generate("w1 w2")
    with pytest.raises(InputError, match="mode"):
        generator.generate(["w1"], mode="beam")
    with pytest.raises(InputError, match="max_new_tokens"):
        generator.generate(["w1"], max_new_tokens=0)
    too_long = " ".join(["w1"] * generator.manifest.max_source_len)
    with pytest.raises(InputError, match="at most"):
        generator.generate([too_long])
    assert generator.check(too_long) is not None and generator.check("w1 w2") is None
    with pytest.raises(ValueError):  # InputError is a ValueError
        generator.generate([""])


def test_cuda_without_a_gpu_says_how_to_fix_it(bundle):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has the CUDA provider")
    with pytest.raises(ProviderError, match=r"aggdec\[gpu\]"):
        Generator(bundle("marian"), device="cuda")


def test_errors_share_one_root():
    for error in (BundleError, BundleNotFoundError, InputError, ProviderError):
        assert issubclass(error, AggdecError)
