"""CUDA execution provider with IO binding: the same outputs as the CPU. Skipped without a GPU."""

from __future__ import annotations

import onnxruntime
import pytest

from aggdec.runtime.generator import Generator
from tests.runtime.test_lossless import MAX_NEW, random_texts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif("CUDAExecutionProvider" not in onnxruntime.get_available_providers(),
                       reason="needs onnxruntime-gpu and a CUDA GPU"),
]


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_cuda_matches_cpu(family, bundle):
    texts = random_texts(seed=5, count=12)
    cpu = Generator(bundle(family), device="cpu")
    cuda = Generator(bundle(family), device="cuda")
    for mode in ("greedy", "iad"):
        expected = [r.ids for r in cpu.generate(texts, mode=mode, max_new_tokens=MAX_NEW)]
        assert [r.ids for r in cuda.generate(texts, mode=mode, max_new_tokens=MAX_NEW)] == expected


def test_cuda_cache_stays_on_the_device(bundle):
    """The verifier's cache output is an OrtValue on the GPU, passed back without a host copy."""
    generator = Generator(bundle("marian"), device="cuda")
    state = generator.verifier.start(*generator._batch_arrays(generator.encode(["w1 w2 w3"])))
    import numpy as np

    state.verify(np.array([[generator.manifest.decoder_start_token_id]], dtype=np.int64))
    assert isinstance(state._cache, onnxruntime.OrtValue)
    assert state._cache.device_name().lower() == "cuda"
