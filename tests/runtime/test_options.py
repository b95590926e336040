"""DecodeOptions and Mode: one record for how to decode, checked once against the bundle."""

from __future__ import annotations

import dataclasses

import pytest

from aggdec.runtime.decoding.sizing import BlockOptions
from aggdec.runtime.errors import BundleError, InputError
from aggdec.runtime.generator import Generator
from aggdec.runtime.options import GAD_PLUS_BETA, GAD_PLUS_TAU, MODES, DecodeOptions, Mode, OptionLimits
from tests.runtime.test_gad import K, gad_bundle  # noqa: F401 - a fixture

MAX_NEW = 12
TEXTS = ["w1 w2 w3 w4", "w5 w6", "w7 w7 w7 w7 w7"]


def test_modes_are_one_enum_and_named_by_their_value():
    assert MODES == ("greedy", "iad", "gad", "gad++")
    assert Mode.parse("gad++") is Mode.GAD_PLUS and Mode.parse(Mode.IAD) is Mode.IAD
    assert DecodeOptions("iad").mode is Mode.IAD and str(Mode.GAD_PLUS) == "gad++"
    assert [m for m in Mode if m.needs_drafter] == [Mode.GAD, Mode.GAD_PLUS]
    with pytest.raises(InputError, match="unknown mode 'beam'; choose one of: greedy, iad, gad, gad\\+\\+"):
        DecodeOptions("beam")


@pytest.mark.parametrize("fields, message", [
    ({"mode": "iad", "beta": 2}, "beta applies to mode 'gad\\+\\+' only, not 'iad'"),
    ({"mode": "greedy", "tau": 0.5}, "tau applies to mode 'gad\\+\\+' only"),
    ({"mode": "iad", "draft_k": 3}, "draft_k applies to modes 'gad' and 'gad\\+\\+' only"),
    ({"mode": "gad", "block": BlockOptions()}, "block applies to mode 'gad' with num_beams only"),
    ({"mode": "gad", "block": BlockOptions(), "num_beams": 1}, "block applies to mode 'gad' with num_beams only"),
    ({"mode": "greedy", "block": BlockOptions()}, "block applies to modes 'iad' and 'gad' only"),
    ({"mode": "iad", "block": {"max_block": 3}}, "block must be"),
    ({"mode": "gad++", "beta": 0}, "beta must be an integer of at least 1, got 0"),
    ({"mode": "gad++", "beta": True}, "beta must be an integer"),
    ({"mode": "gad++", "tau": float("nan")}, "tau must be a finite number >= 0"),
    ({"mode": "gad++", "tau": -1}, "tau must be a finite number >= 0, got -1"),
    ({"mode": "gad", "draft_k": 0}, "draft_k must be an integer of at least 1, got 0"),
    ({"mode": "gad", "draft_k": 2.5}, "draft_k must be an integer"),
])
def test_options_that_need_no_bundle_are_refused_when_made(fields, message):
    with pytest.raises(InputError, match=message):
        DecodeOptions(**fields)


def test_options_are_frozen_and_hashable():
    options = DecodeOptions("gad++", beta=2, tau=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beta = 3  # type: ignore[misc]
    assert {options: 1}[DecodeOptions(Mode.GAD_PLUS, beta=2, tau=0.5)] == 1


def test_resolve_checks_against_the_limits_and_fills_the_defaults():
    limits = OptionLimits(top_k=8, drafter_k=25, bundle="b")
    assert DecodeOptions("gad++").resolve(limits) == DecodeOptions("gad++", beta=GAD_PLUS_BETA, tau=GAD_PLUS_TAU,
                                                                   draft_k=25)
    assert DecodeOptions("gad").resolve(limits) == DecodeOptions("gad", draft_k=25) \
        == DecodeOptions("gad", draft_k=25).resolve(limits)  # resolving twice changes nothing
    assert DecodeOptions("iad").resolve(limits) == DecodeOptions("iad")
    with pytest.raises(InputError, match="draft_k must be an integer between 1 and the drafter's k \\(25\\), got 26"):
        DecodeOptions("gad", draft_k=26).resolve(limits)
    with pytest.raises(InputError, match="top-k \\(8\\), got 9"):
        DecodeOptions("gad++", beta=9).resolve(limits)
    with pytest.raises(BundleError, match="mode 'gad' needs a drafter, and the bundle 'b' has none"):
        DecodeOptions("gad").resolve(dataclasses.replace(limits, drafter_k=None))


def test_of_takes_options_or_keywords_never_both():
    options = DecodeOptions("gad", draft_k=3)
    assert DecodeOptions.of(options) is options
    assert DecodeOptions.of("gad", draft_k=3, beta=None) == options
    assert DecodeOptions.of(None) == DecodeOptions() and DecodeOptions().mode is Mode.GREEDY
    with pytest.raises(InputError, match="not both"):
        DecodeOptions.of(options, draft_k=4)


def test_the_generator_resolves_against_its_bundle_and_drafter(gad_bundle, bundle):  # noqa: F811
    generator = Generator(gad_bundle("marian"))
    assert generator.option_limits == OptionLimits(top_k=generator.manifest.top_k, drafter_k=K,
                                                   bundle=str(generator.root),
                                                   max_target_len=generator.manifest.max_target_len)
    assert generator.resolve_options("gad") == DecodeOptions("gad", draft_k=K)
    with pytest.raises(InputError, match=f"drafter's k \\({K}\\), got {K + 1}"):
        generator.check_options(DecodeOptions("gad", draft_k=K + 1))
    with pytest.raises(InputError, match=f"drafter's k \\({K}\\)"):
        list(generator.stream(TEXTS, mode="gad", draft_k=K + 1))  # refused before anything is read
    plain = Generator(bundle("marian"))
    assert plain.option_limits.drafter_k is None
    with pytest.raises(BundleError, match="needs a drafter"):
        plain.generate(TEXTS, DecodeOptions("gad++"))


def test_an_options_object_decodes_as_the_keywords_do(gad_bundle):  # noqa: F811
    generator = Generator(gad_bundle("marian"))
    greedy = [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW)]
    for options in (DecodeOptions("iad", block=BlockOptions(max_block=3, adaptive=False)),
                    DecodeOptions("gad", draft_k=4), DecodeOptions("gad++", beta=1)):
        by_object = [r.ids for r in generator.generate(TEXTS, options, max_new_tokens=MAX_NEW)]
        by_keywords = [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW,
                                                         **_fields(options))]
        streamed = dict(generator.stream(TEXTS, options, max_new_tokens=MAX_NEW))
        assert by_object == by_keywords == greedy == [streamed[i].ids for i in range(len(TEXTS))], options
    with pytest.raises(InputError, match="not both"):
        generator.generate(TEXTS, DecodeOptions("gad"), draft_k=3)


def _fields(options: DecodeOptions) -> dict:
    """The options as keywords (BlockOptions kept as it is, where dataclasses.asdict would not)."""
    return {field.name: getattr(options, field.name) for field in dataclasses.fields(options)}
