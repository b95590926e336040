"""The tuning record: per-device defaults, passed to a Generator, changing speed never output."""

from __future__ import annotations

import dataclasses

import pytest

from aggdec.runtime.decoding.alignment import MIN_REPEAT
from aggdec.runtime.decoding.gad import DECAY
from aggdec.runtime.decoding.loop import WIDTH_QUANTILE
from aggdec.runtime.decoding.sizing import MAX_REST
from aggdec.runtime.decoding.verifier import ENCODER_CALL_TOKENS
from aggdec.runtime.errors import InputError
from aggdec.runtime.generator import Generator
from aggdec.runtime.tuning import PROFILES, Tuning, tuning_for
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - a fixture
from tests.runtime.test_lossless import random_texts

MAX_NEW = 32


def test_profiles_hold_the_defaults_the_decoder_had():
    cpu, cuda = tuning_for("cpu"), tuning_for("cuda")
    assert (cpu.cost_ratio, cpu.max_block, cpu.length_classes, cpu.encoder_call_tokens) == (0.05, 32, (48,), 6)
    assert (cuda.cost_ratio, cuda.max_block, cuda.length_classes, cuda.encoder_call_tokens) == (0.005, 64, (), 2048)
    assert tuning_for("tensorrt") == cuda and set(PROFILES) == {"cpu", "cuda", "tensorrt"}
    for profile in PROFILES.values():
        assert (profile.gad_decay, profile.width_quantile, profile.min_repeat, profile.max_rest) == \
            (DECAY, WIDTH_QUANTILE, MIN_REPEAT, MAX_REST)
        assert profile.encoder_call_tokens in ENCODER_CALL_TOKENS.values() and profile.shared_prior
    with pytest.raises(InputError, match="no tuning profile for device 'tpu'"):
        tuning_for("tpu")


@pytest.mark.parametrize("fields, message", [
    ({"max_block": 0}, "max_block must be an integer between 1 and 65,536, got 0"),
    ({"max_block": 10**7}, "max_block must be an integer between 1 and 65,536, got 10,000,000"),
    ({"min_repeat": 2.5}, "min_repeat must be an integer"),
    ({"cost_ratio": float("inf")}, "cost_ratio must be a finite number >= 0"),
    ({"beam_cost_ratio": -0.1}, "beam_cost_ratio must be a finite number >= 0"),
    ({"gad_decay": 0}, "gad_decay must be a number in \\(0, 1\\]"),
    ({"width_quantile": 1.5}, "width_quantile must be a number in \\(0, 1\\]"),
    ({"length_classes": (64, 32)}, "length_classes must be a tuple of ascending positive integers"),
    ({"length_classes": [32]}, "length_classes must be a tuple"),
    ({"shared_prior": 1}, "shared_prior must be True or False"),
])
def test_a_bad_field_is_refused_by_name(fields, message):
    with pytest.raises(InputError, match=message):
        Tuning(**fields)
    with pytest.raises(InputError, match=message):
        tuning_for("cpu").replace(**fields)


def test_replace_refuses_unknown_fields_and_records_are_frozen():
    with pytest.raises(InputError, match="unknown tuning field 'decay'"):
        tuning_for("cpu").replace(decay=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tuning_for("cpu").max_block = 3  # type: ignore[misc]


def test_the_generator_uses_its_tuning_and_no_module_state(gad_bundle):  # noqa: F811
    plain = Generator(gad_bundle("marian"))
    assert plain.tuning == tuning_for("cpu")
    tuned = tuning_for("cpu").replace(max_block=5, cost_ratio=0.2, encoder_call_tokens=3, max_rest=7, min_repeat=2)
    generator = Generator(gad_bundle("marian"), tuning=tuned)
    assert generator.tuning is tuned and generator.verifier.encoder_call_tokens == 3
    block = generator._block_options(None)
    assert (block.max_block, block.cost_ratio, block.max_rest, block.min_repeat) == (5, 0.2, 7, 2)
    drafts = generator._strategy(generator.resolve_options("gad")).drafts
    assert (drafts.options.decay, drafts.options.max_rest, drafts.options.min_repeat) == (DECAY, 7, 2)
    assert Generator(gad_bundle("marian")).tuning == tuning_for("cpu")  # nothing leaked into the defaults
    fixed = Generator(gad_bundle("marian"), tuning=tuning_for("cpu").replace(shared_prior=False))
    assert set(fixed.draft_priors.values()) == {None}
    with pytest.raises(InputError, match="tuning must be an aggdec.runtime.tuning.Tuning"):
        Generator(gad_bundle("marian"), tuning={"max_block": 5})


@pytest.mark.parametrize("fields", [
    {"max_block": 2, "min_repeat": 1, "max_rest": 1, "width_quantile": 1.0},
    {"gad_decay": 0.99, "cost_ratio": 0.0, "encoder_call_tokens": 1, "length_classes": (2, 5)},
    {"shared_prior": False, "max_block": 64, "width_quantile": 0.1},
])
def test_any_tuning_decodes_greedys_tokens(gad_bundle, fields):  # noqa: F811
    """Tuning changes how drafts and batches are sized, never what is decoded."""
    texts = random_texts(seed=8, count=10)
    reference = Generator(gad_bundle("marian"))
    tuned = Generator(gad_bundle("marian"), tuning=tuning_for("cpu").replace(**fields))
    greedy = [r.ids for r in reference.generate(texts, max_new_tokens=MAX_NEW)]
    for mode in ("iad", "gad"):
        for batch_size in (1, 4):
            got = [r.ids for r in tuned.generate(texts, mode=mode, max_new_tokens=MAX_NEW, batch_size=batch_size)]
            assert got == greedy, (mode, batch_size, fields)
        streamed = dict(tuned.stream(texts, mode, max_new_tokens=MAX_NEW, batch_size=3))  # cohorts apply here
        assert [streamed[i].ids for i in range(len(texts))] == greedy, (mode, fields)
