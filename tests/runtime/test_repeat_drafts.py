"""A looping output drafts its own repetition (``alignment.repeated_tail``), in IAD and GAD.

A model stuck in a loop (``для для для``, a clause over and over) is drafted poorly by its
source (IAD) and by a drafter that reads the source and a window of the output (GAD). Random
tiny models loop within a few dozen tokens, so they exercise this on every family. Drafts only
change speed: every output is still greedy's.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from aggdec.runtime.decoding.alignment import MAX_REPEAT_MATCH, MIN_REPEAT, repeated_tail
from aggdec.runtime.generator import Generator
from aggdec.runtime.tuning import tuning_for
from tests.runtime.test_gad import ROWS_DECIDE, gad_bundle  # noqa: F401 - a fixture
from tests.runtime.test_lossless import random_texts
from tests.support.traces import iterations_by_source
from tests.support.tiny import FAMILIES

MAX_NEW = 48
NEVER = 10**9  # a match no output reaches: repetition drafts off


# ---------------------------------------------------------------------------------- the match


@pytest.mark.parametrize(("tokens", "length", "cycle"), [
    ([5, 5, 5, 5, 5], 4, [5]),  # one token over and over
    ([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], 6, [3, 4, 1, 2]),  # a clause over and over: the stretches overlap
    ([1, 2, 3, 4, 8, 1, 2, 3, 4, 9, 1, 2, 3, 4], 4, [9, 1, 2, 3, 4]),  # equal matches: the latest wins
    ([7, 1, 2, 9, 1, 2], 2, None),  # a match shorter than MIN_REPEAT drafts nothing
    ([1, 2, 3, 4, 5], 0, None),  # nothing repeats
    ([4], 0, None),
    ([], 0, None),
])
def test_the_longest_latest_match_and_what_followed_it(tokens, length, cycle):
    assert MIN_REPEAT == 4  # the cases above are written for it
    got_length, got_cycle = repeated_tail(tokens)
    assert got_length == length
    assert (got_cycle is None and cycle is None) or got_cycle.tolist() == cycle


def test_the_match_is_capped():
    assert repeated_tail([3] * (3 * MAX_REPEAT_MATCH))[0] == MAX_REPEAT_MATCH
    length, cycle = repeated_tail([1, 2, 3, 1, 2], min_match=2)  # the threshold is the caller's to lower
    assert (length, cycle.tolist()) == (2, [3, 1, 2])


@pytest.mark.parametrize("seed", range(20))
def test_the_cycle_continues_any_periodic_output(seed):
    """An output that has repeated a period a few times: the cycle, resized, is the next tokens."""
    rng = random.Random(seed)
    period = [rng.randrange(50) for _ in range(rng.randint(1, 9))]
    head = [100 + rng.randrange(50) for _ in range(rng.randint(0, 5))]  # tokens the loop never has
    loop = period * 40
    cut = len(period) * 2 + MIN_REPEAT + rng.randrange(len(period))  # two periods and then some
    tokens = head + loop[:cut]
    _, cycle = repeated_tail(tokens)
    assert cycle is not None
    k = rng.randint(1, 30)
    assert np.resize(cycle, k).tolist() == loop[cut : cut + k]


# ---------------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("family", FAMILIES)
def test_iad_drafts_a_loop_and_takes_fewer_calls(family, bundle):
    # block lengths from the fixed cost prior, not measured timings: the call counts compared
    # below must differ by the repetition drafts alone, on any machine
    fixed = tuning_for("cpu").replace(load_adaptive=False)
    generator = Generator(bundle(family), tuning=fixed)
    no_repeats = Generator(bundle(family), tuning=fixed.replace(min_repeat=NEVER))
    texts = random_texts(seed=5, count=12)
    expected = [r.ids for r in generator.generate(texts, mode="greedy", max_new_tokens=MAX_NEW)]
    start = list(generator._limits(None).start_ids)
    for batch_size in (1, 5):
        with_repeats = generator.generate(texts, mode="iad", max_new_tokens=MAX_NEW, batch_size=batch_size)
        assert [r.ids for r in with_repeats] == expected
        without = no_repeats.generate(texts, mode="iad", max_new_tokens=MAX_NEW, batch_size=batch_size)
        assert [r.ids for r in without] == expected
        assert sum(iterations_by_source(r, start).repeat for r in with_repeats) > 0  # the outputs loop
        assert sum(r.stats.iterations for r in with_repeats) < sum(r.stats.iterations for r in without)


@pytest.mark.parametrize("family", FAMILIES)
def test_gad_drafts_a_loop_without_calling_the_drafter(family, gad_bundle):  # noqa: F811
    """Counts the rows fed to the drafter graph: none for an iteration that drafted a repetition.
    The rows' sizing alone decides: the gate (Tuning.draft_payoff) may measure a tiny model's
    drafted iterations not paying and take plain steps, repetitions included, and this test
    would then check no repetition draft."""
    texts = random_texts(seed=5, count=12)
    for io_binding in (True, False):
        generator = Generator(gad_bundle(family), io_binding=io_binding, tuning=ROWS_DECIDE)
        rows = []
        session = generator.drafter.session
        session.run = lambda feeds, original=session.run: rows.append(feeds["input_ids"].shape[0]) or original(feeds)
        expected = [r.ids for r in generator.generate(texts, mode="greedy", max_new_tokens=MAX_NEW)]
        start = list(generator._limits(None).start_ids)
        results = generator.generate(texts, mode="gad", max_new_tokens=MAX_NEW, batch_size=1)
        assert [r.ids for r in results] == expected
        counts = [iterations_by_source(r, start) for r in results]
        assert sum(c.repeat for c in counts) > 0  # the outputs loop
        assert sum(rows) == sum(c.drafted for c in counts)  # the drafter ran for drafted iterations only
        # and the repetitions were accepted: more tokens than iterations there
        assert sum(c.repeat_tokens for c in counts) > sum(c.repeat for c in counts)
