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
                                                   max_target_len=generator.manifest.max_target_len,
                                                   vocab_size=generator.manifest.vocab_size)
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


def test_a_mode_given_both_as_options_and_as_mode_is_refused(gad_bundle):  # noqa: F811
    """``generate(texts, "gad++", mode="greedy")`` decoded GAD++: the positional mode won
    silently, and GAD++ may differ from the greedy asked for. Refused wherever options are taken."""
    with pytest.raises(InputError, match="give the mode either as options \\('gad\\+\\+'\\) or as mode= "
                                         "\\('greedy'\\), not both"):
        DecodeOptions.of("gad++", mode="greedy")
    with pytest.raises(InputError, match="not both"):
        DecodeOptions.of(Mode.IAD, mode=Mode.IAD)  # the same mode twice too: one rule, no guessing
    assert DecodeOptions.of("gad", draft_k=3) == DecodeOptions.of(None, mode="gad", draft_k=3)
    generator = Generator(gad_bundle("marian"))
    ids = generator.encode(TEXTS[:1])[0]
    for call in (lambda: generator.generate(TEXTS, "gad++", mode="greedy"),
                 lambda: generator.stream(TEXTS, "gad++", mode="greedy"),
                 lambda: generator.generate_ids(ids, "iad", mode="gad"),
                 lambda: generator.check_options("iad", mode="gad"),
                 lambda: generator.resolve_options(Mode.GAD, mode="gad")):
        with pytest.raises(InputError, match="give the mode either as options"):
            call()


def test_numpy_numbers_in_options_are_kept_as_pythons_own():
    """``num_beams=np.uint64(2**64 - 1)``: the check against the bundle multiplied it in numpy,
    which wrapped around with an overflow RuntimeWarning, and its message named a wrong number."""
    import warnings

    import numpy as np

    options = DecodeOptions("gad++", beta=np.int64(2), tau=np.float32(0.5), draft_k=np.uint8(3))
    assert (type(options.beta), type(options.tau), type(options.draft_k)) == (int, float, int)
    beams = DecodeOptions(num_beams=np.uint64(2**64 - 1), num_return_sequences=np.int32(2),
                          length_penalty=np.float64(1))
    assert (type(beams.num_beams), type(beams.num_return_sequences), type(beams.length_penalty)) == (int, int, float)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warning fails the test
        with pytest.raises(InputError, match=f"num_beams {2**64 - 1} needs the verifier's top-{2 * (2**64 - 1)} "):
            beams.resolve(OptionLimits(top_k=8, drafter_k=None))
    block = BlockOptions(max_block=np.uint16(7), cost_ratio=np.float32(0.25), max_rest=np.int8(3))
    assert (type(block.max_block), type(block.cost_ratio), type(block.max_rest)) == (int, float, int)


def test_max_block_is_bounded_and_cut_to_the_bundles_longest_output(gad_bundle):  # noqa: F811
    """``BlockOptions(max_block=10**9)`` had no bound: the sizer's arrays of 1..max_block took
    gigabytes (the probe's process was killed for memory). No bundle has a longer output than
    MAX_SEQUENCE_LEN, and no block is longer than its bundle's max_target_len."""
    from aggdec.runtime.bundle_schema import MAX_SEQUENCE_LEN
    from aggdec.runtime.tuning import Tuning

    for value in (MAX_SEQUENCE_LEN + 1, 10**9, 2**64):
        with pytest.raises(InputError, match=f"max_block must be an integer between 1 and {MAX_SEQUENCE_LEN:,}"):
            BlockOptions(max_block=value)
        with pytest.raises(InputError, match=f"tuning max_block must be an integer between 1 and {MAX_SEQUENCE_LEN:,}"):
            Tuning(max_block=value)
    limits = OptionLimits(top_k=8, drafter_k=K, max_target_len=20)
    longest = BlockOptions(max_block=MAX_SEQUENCE_LEN, adaptive=False)
    assert DecodeOptions("iad", block=longest).resolve(limits).block == BlockOptions(max_block=20, adaptive=False)
    assert DecodeOptions("iad", block=BlockOptions(max_block=7)).resolve(limits).block.max_block == 7
    generator = Generator(gad_bundle("marian"))
    cap = generator.manifest.max_target_len
    assert generator.resolve_options("iad", block=longest).block.max_block == cap
    greedy = [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW)]
    assert [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW, mode="iad", block=longest)] == greedy
    assert [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW, mode="gad", num_beams=2, block=longest)
            ] == [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW, num_beams=2)]
    widest = Generator(gad_bundle("marian"), tuning=Tuning(max_block=MAX_SEQUENCE_LEN), static_shapes=True)
    assert widest._block_options(None).max_block == cap
    assert widest.static_width == 2 + max(cap, K)  # was 2 + 65,536 positions a row, every call
    assert [r.ids for r in widest.generate(TEXTS, max_new_tokens=MAX_NEW, mode="iad")] == greedy
