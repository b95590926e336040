"""TensorRT engines built and run for real: skipped unless TensorRT, cuda-python and a GPU are
here. NOT RUN YET: no machine this was written on had TensorRT (README, TensorRT)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.runtime.test_lossless import MAX_NEW, random_texts


def _tensorrt_ready() -> bool:
    try:
        import tensorrt  # noqa: F401

        from aggdec.engines.trt import current_target

        current_target()
    except Exception:
        return False
    return True


pytestmark = [pytest.mark.tensorrt, pytest.mark.gpu,
              pytest.mark.skipif(not _tensorrt_ready(), reason="needs TensorRT, cuda-python and a CUDA GPU")]


@pytest.fixture(scope="module")
def engines(bundle, tmp_path_factory):
    from aggdec.engines import BuildOptions, ProfileOptions, build_engines

    out = tmp_path_factory.mktemp("engines") / "marian.engines"
    options = BuildOptions(profile=ProfileOptions(max_batch=4, max_block=16), workspace_mib=1024)
    build_engines(bundle("marian"), out, options)
    return out, options


def test_engines_are_keyed_listed_and_reused(bundle, engines):
    from aggdec.engines import build_engines
    from aggdec.engines.trt import current_target

    out, options = engines
    listed = json.loads((out / "engines.json").read_text())
    assert {e["graph"] for e in listed["engines"]} == {"encoder", "verifier"}
    target = current_target()
    assert all(e["target"]["gpu"] == target.gpu and e["target"]["tensorrt"] == target.tensorrt
               for e in listed["engines"])
    assert (out / "timing.cache").stat().st_size > 0
    before = {e["file"]: (out / e["file"]).stat().st_mtime_ns for e in listed["engines"]}
    build_engines(bundle("marian"), out, options)  # same key: nothing rebuilt
    assert {f: (out / f).stat().st_mtime_ns for f in before} == before


@pytest.mark.parametrize("io_binding", [True, False])
def test_tensorrt_outputs_equal_the_cpu(bundle, engines, io_binding):
    from aggdec.runtime.generator import Generator

    texts = random_texts(seed=5, count=8)
    cpu = Generator(bundle("marian"))
    trt = Generator(bundle("marian"), device="tensorrt", engines=engines[0], io_binding=io_binding)
    for mode in ("greedy", "iad"):
        expected = [r.ids for r in cpu.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=4)]
        assert [r.ids for r in trt.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=4)] == expected


def test_a_shape_outside_the_profile_is_refused_by_name(bundle, engines):
    from aggdec.engines.trt import TrtSession
    from aggdec.runtime.errors import ProviderError

    listed = json.loads((engines[0] / "engines.json").read_text())
    entry = next(e for e in listed["engines"] if e["graph"] == "encoder")
    session = TrtSession(engines[0] / entry["file"], expected_sha256=entry["sha256"])
    ids = np.ones((5, 4), dtype=np.int64)  # max batch is 4
    with pytest.raises(ProviderError, match="'input_ids' dim 0 is 5"):
        session.run({"input_ids": ids, "attention_mask": ids})
