"""Static shapes (``Generator(static_shapes=True)``, decoding/verifier.StaticBatch).

Every verifier call of a batch at one shape and every source encoded alone at the source
allocation's width: every exact mode then equals static greedy token for token whatever the
batch (as in the dynamic loop), static greedy equals the ordinary loop's greedy on the CPU
(onnxruntime's CPU provider passes the export's block-vs-alone check, so padding a block or
a cache changes no real position), and the graphs really see one shape per batch.
"""

from __future__ import annotations

import warnings

import pytest

from aggdec.runtime.errors import InputError
from aggdec.runtime.generator import Generator, static_shapes_advice
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - a session fixture, shared with its tests
from tests.runtime.test_lossless import random_texts
from tests.support.tiny import FAMILIES

MAX_NEW = 24


def _ids(results) -> list[tuple[int, ...]]:
    return [result.ids for result in results]


class RecordingSession:
    """A real session whose calls' output shapes (and encoder input shapes) are recorded: the
    graphs run as they always do, through this object."""

    def __init__(self, session) -> None:
        self.__dict__["_session"] = session
        self.__dict__["shapes"] = []

    def __getattr__(self, name):
        return getattr(self._session, name)

    def __setattr__(self, name, value):
        setattr(self._session, name, value)

    def run(self, inputs):
        out = self._session.run(inputs)
        self.shapes.append(tuple(tuple(value.shape) for value in inputs.values())
                           + tuple(tuple(value.shape) for value in out.values()))
        return out

    def run_bound(self, binding):
        outputs = self._session.run_bound(binding)
        # every output, the cache buffers bound in place included: rows, width and capacities
        self.shapes.append(tuple(tuple(value.shape()) for value in outputs))
        return outputs


def _recording(generator: Generator) -> tuple[RecordingSession, RecordingSession, RecordingSession | None]:
    verifier = generator.verifier
    verifier.encoder = RecordingSession(verifier.encoder)
    verifier.verifier = RecordingSession(verifier.verifier)
    if verifier.argmax is not None:
        verifier.argmax = RecordingSession(verifier.argmax)
    return verifier.encoder, verifier.verifier, verifier.argmax


@pytest.mark.parametrize("family", FAMILIES)
def test_every_exact_mode_equals_static_greedy(family, gad_bundle):  # noqa: F811
    """Mixed lengths, so rows finish and others take their slots at different steps."""
    texts = random_texts(seed=40 + FAMILIES.index(family), count=14)
    expected = None
    for io_binding in (True, False):
        generator = Generator(gad_bundle(family), io_binding=io_binding, static_shapes=True)
        for batch_size in (1, 3, 8):
            greedy = _ids(generator.generate(texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=batch_size))
            if expected is None:
                expected = greedy
            assert greedy == expected, (io_binding, batch_size)
            for mode, extra in (("iad", {}), ("gad", {}), ("gad++", {"beta": 1, "tau": 5.0})):
                got = _ids(generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size,
                                              **extra))
                assert got == expected, (mode, io_binding, batch_size)
    assert len({len(ids) for ids in expected}) > 1  # rows of several lengths: they finished at different steps


@pytest.mark.parametrize("family", FAMILIES)
def test_static_greedy_equals_greedy_on_the_cpu(family, bundle):
    texts = random_texts(seed=50 + FAMILIES.index(family), count=12)
    plain = Generator(bundle(family))
    static = Generator(bundle(family), static_shapes=True)
    for batch_size in (1, 5):
        assert _ids(static.generate(texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=batch_size)) == \
            _ids(plain.generate(texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=batch_size))


@pytest.mark.parametrize("io_binding", (True, False))
def test_one_shape_per_batch(io_binding, bundle):
    """Recorded on the real sessions over a decode whose rows finish and join: one verifier
    shape and one encoder shape in static mode; several in the ordinary loop (so that the
    recording could see a difference)."""
    texts = random_texts(seed=60, count=10)
    shapes = {}
    for static in (False, True):
        generator = Generator(bundle("bart"), io_binding=io_binding, static_shapes=static)
        encoder, verifier, argmax = _recording(generator)
        for mode in ("greedy", "iad"):
            generator.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=4)  # one batch per call
        calls = verifier.shapes + (argmax.shapes if argmax is not None else [])
        assert len(calls) > 20
        shapes[static] = (set(calls), set(encoder.shapes))
    verifier_shapes, encoder_shapes = shapes[True]
    assert len(verifier_shapes) == 1, verifier_shapes if len(verifier_shapes) < 5 else len(verifier_shapes)
    (call,) = verifier_shapes
    generator = Generator(bundle("bart"), static_shapes=True)
    # the slots x the static width, every call: the ids fed, or (bound) the argmax graph's logits,
    # [1, every position, vocab] (decision 050)
    assert call[0][:2] in ((4, generator.static_width), (1, 4 * generator.static_width))
    m = generator.manifest
    assert encoder_shapes and all(shape[0] == (1, m.max_source_len) for shape in encoder_shapes)
    assert len(shapes[False][0]) > 1


def test_beams_equal_ordinary_beams(bundle):
    texts = random_texts(seed=70, count=6)
    plain = Generator(bundle("bart"))
    static = Generator(bundle("bart"), static_shapes=True)
    for mode in ("greedy", "iad"):
        expected = plain.generate(texts, mode=mode, num_beams=3, num_return_sequences=2, max_new_tokens=MAX_NEW,
                                  batch_size=2)
        got = static.generate(texts, mode=mode, num_beams=3, num_return_sequences=2, max_new_tokens=MAX_NEW,
                              batch_size=2)
        assert [[h.ids for h in r.sequences] for r in got] == [[h.ids for h in r.sequences] for r in expected], mode


@pytest.mark.parametrize("value", ("yes", 1, 0.0))
def test_static_shapes_must_be_a_bool(value, bundle):
    with pytest.raises(InputError, match="static_shapes must be True, False or None"):
        Generator(bundle("bart"), static_shapes=value)


def test_a_float16_bundle_on_cuda_is_told_about_static_shapes_unless_its_caller_chose(bundle):
    """The advice (a RuntimeWarning at construction) is for the one place a call's shape was seen
    to change an output: float16 on CUDA, static shapes not chosen either way."""
    advice = static_shapes_advice("cuda", "fp16", None)
    assert advice is not None and "static_shapes=True" in advice and "static_shapes=False" in advice
    for device, precision, chosen in (("cuda", "fp16", True), ("cuda", "fp16", False), ("cuda", "fp32", None),
                                      ("cpu", "fp16", None), ("cpu", "int8", None), ("tensorrt", "fp32", None)):
        assert static_shapes_advice(device, precision, chosen) is None, (device, precision, chosen)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not chosen, on the CPU: no warning, the ordinary loop
        generator = Generator(bundle("bart"))
    assert generator.static_shapes is False and generator.static_width is None


def test_marian_native_bundles_and_their_shortlist(tmp_path):
    """Marian's own models (an SSRU decoder: a recurrent cache, one state per position) decode
    under static shapes as they do without; over a lexical shortlist static shapes are refused
    (the verifier's output width follows the rows' lists), and shortlist=False decodes it."""
    from aggdec.export import export_bundle
    from tests.support.marian import WORDS, add_shortlist, write_model

    texts = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(1 + i % 9)) for i in range(10)]
    folder, _config, _weights = write_model(tmp_path / "model", "ssru")
    add_shortlist(folder)
    export_bundle(folder, tmp_path / "bundle", progress=None, max_source_len=32, max_target_len=32)
    with pytest.raises(InputError, match="static_shapes cannot decode .* over its lexical shortlist.*shortlist=False"):
        Generator(tmp_path / "bundle", static_shapes=True)
    plain = Generator(tmp_path / "bundle", shortlist=False)
    static = Generator(tmp_path / "bundle", shortlist=False, static_shapes=True)
    expected = _ids(plain.generate(texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=4))
    assert len({len(ids) for ids in expected}) > 1
    for mode in ("greedy", "iad"):
        assert _ids(static.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=4)) == expected, mode
