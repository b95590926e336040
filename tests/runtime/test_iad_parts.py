"""The pieces of the IAD loop that need no model: alignment, block sizing, stopping rules."""

import numpy as np
import pytest

from aggdec.runtime.decoding.common import DecodeLimits, RowTrace
from aggdec.runtime.decoding.iad import BlockOptions, BlockSizer, align
from aggdec.runtime.errors import InputError

S = -1  # the sentinel both sequences start with


def arr(*values):
    return np.array([S, *values], dtype=np.int64)


def test_start_aligns_before_the_source():
    assert align(arr(), arr(5, 6, 7)) == 0


def test_unique_last_token_aligns():
    assert align(arr(5, 6), arr(5, 6, 7)) == 2


def test_repeated_token_needs_a_longer_suffix():
    # "6" occurs twice in the source; "5 6" and "8 6" tell the occurrences apart
    source = arr(5, 6, 7, 8, 6, 9)
    assert align(arr(5, 6), source) == 2
    assert align(arr(1, 8, 6), source) == 5


def test_suffix_that_stops_occurring_gives_no_alignment():
    # "6" is ambiguous, and "4 6" occurs nowhere: no unique match, greedy steps follow
    assert align(arr(4, 6), arr(5, 6, 7, 8, 6, 9)) is None


def test_token_absent_from_source_gives_no_alignment():
    assert align(arr(5, 42), arr(5, 6, 7)) is None


def test_ambiguous_back_to_the_start_is_resolved_by_the_sentinel():
    # output "6 6" vs source "6 6 6": the sentinel pins the suffix to the start
    assert align(arr(6, 6), arr(6, 6, 6)) == 2


def test_fully_ambiguous_suffix_is_no_alignment():
    # the whole output "7 7" occurs twice inside the source, never at its start
    assert align(np.array([S, 7, 7]), arr(1, 7, 7, 7)) is None


def test_fixed_block_size():
    sizer = BlockSizer(BlockOptions(max_block=7, adaptive=False))
    assert sizer.size() == 7


def test_adaptive_block_grows_with_acceptance_and_shrinks_with_rejection():
    options = BlockOptions(max_block=64, cost_ratio=0.04)
    sizer = BlockSizer(options)
    start = sizer.size()
    for _ in range(10):
        sizer.observe(drafted=10, accepted=10)
    grown = sizer.size()
    for _ in range(10):
        sizer.observe(drafted=10, accepted=0)
    shrunk = sizer.size()
    assert 1 <= shrunk < start <= grown <= 64


def test_free_blocks_use_the_cap():
    # with no cost per block position, verifying more is never worse
    sizer = BlockSizer(BlockOptions(max_block=50, cost_ratio=0.0))
    assert sizer.size() == 50


def test_bad_block_options_are_refused():
    with pytest.raises(ValueError):
        BlockOptions(max_block=0)
    with pytest.raises(ValueError):
        BlockOptions(cost_ratio=-1)


def test_extend_stops_at_eos():
    limits = DecodeLimits(start_ids=(0,), eos_id=2, max_new_tokens=10)
    trace = RowTrace(tokens=[0])
    assert trace.extend([5, 2, 7], limits) == 2
    assert trace.tokens == [0, 5, 2] and trace.done


def test_extend_stops_at_the_length_limit():
    limits = DecodeLimits(start_ids=(0,), eos_id=2, max_new_tokens=3)
    trace = RowTrace(tokens=[0])
    assert trace.extend([5, 6, 7, 8], limits) == 3
    assert trace.tokens == [0, 5, 6, 7] and trace.done


def test_forced_eos_replaces_the_last_token():
    limits = DecodeLimits(start_ids=(0,), eos_id=2, max_new_tokens=3, forced_eos_id=2)
    trace = RowTrace(tokens=[0])
    trace.extend([5, 6, 7, 8], limits)
    assert trace.tokens == [0, 5, 6, 2] and trace.done


def test_expected_position_breaks_ties():
    source = arr(5, 6, 7, 8, 6, 9)
    # "4 6": ambiguous "6", and "4 6" occurs nowhere; the draft continues near where the output is
    assert align(arr(4, 6), source, expected=4) == 5
    assert align(arr(4, 6), source, expected=1) == 2


def test_replaced_word_aligns_with_the_expected_position():
    # 42 occurs nowhere in the source: it replaced source[expected]
    assert align(arr(5, 42), arr(5, 6, 7), expected=2) == 2
    # ... unless that was the end of the source
    assert align(arr(5, 42), arr(5, 6, 7), expected=3) is None


def test_a_unique_match_wins_over_the_expected_position():
    assert align(arr(5, 6), arr(5, 6, 7, 8), expected=3) == 2


@pytest.mark.parametrize("options", [
    {"max_block": 2.5}, {"max_block": True}, {"adaptive": 1}, {"cost_ratio": float("nan")},
    {"prior_accepted": -3.0}, {"prior_rejected": float("inf")}, {"prior_accepted": 0, "prior_rejected": 0},
    {"decay": 0}, {"decay": 1.5}, {"decay": "0.5"},
])
def test_nonsense_block_options_are_refused_with_the_field_named(options):
    with pytest.raises(InputError, match=next(iter(options)).split("_")[0]):
        BlockOptions(**options)


def test_a_prior_with_no_rejections_sizes_probes_like_fresh_rows(recwarn):
    # a rate of 1 (prior_rejected=0) is capped like a measured one: a probe after a rest drafts
    # the length a fresh row would, not a length from a 0/0
    options = BlockOptions(max_block=8, prior_rejected=0.0)
    fresh = BlockSizer(options).size(fixed_cost=50.0)
    sizer = BlockSizer(options)
    probes = []
    for _ in range(40):
        size = sizer.size(fixed_cost=50.0, allow_none=True)
        if size:
            probes.append(size)
            sizer.observe(size, 0)
        else:
            sizer.skipped()
    assert len(probes) > 1 and all(size == fresh for size in probes[1:])
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
