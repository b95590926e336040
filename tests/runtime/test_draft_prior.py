"""The shared acceptance prior: a new row's first draft length starts from what earlier rows
were accepted at (sizing.AcceptancePrior), and this changes draft lengths, never an output."""

from __future__ import annotations

import pytest

from aggdec.runtime.decoding.sizing import AcceptancePrior, BlockOptions, BlockSizer
from aggdec.runtime.generator import Generator
from tests.runtime.test_batched import ragged_texts
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - the fixture

OPTIONS = BlockOptions(max_block=32, cost_ratio=0.05)


def rows_seen(prior: AcceptancePrior, rows: int, drafted: int, accepted: int) -> None:
    for _ in range(rows):
        sizer = BlockSizer(OPTIONS, prior)
        sizer.observe(drafted, accepted)  # a row reports to the prior as it goes


def test_before_any_row_a_new_row_starts_from_the_options_prior():
    prior = AcceptancePrior()
    assert prior.start(OPTIONS) == pytest.approx((OPTIONS.prior_accepted, OPTIONS.prior_rejected))
    assert BlockSizer(OPTIONS, prior).size() == BlockSizer(OPTIONS).size()


def test_rows_that_kept_their_drafts_lengthen_the_next_rows_first_draft():
    fresh = BlockSizer(OPTIONS).size()
    prior = AcceptancePrior()
    rows_seen(prior, rows=100, drafted=12, accepted=12)
    assert BlockSizer(OPTIONS, prior).size() > fresh
    # weighted as the options' prior: the new row's own history still takes over
    assert sum(prior.start(OPTIONS)) == pytest.approx(OPTIONS.prior_accepted + OPTIONS.prior_rejected)


def test_rows_whose_drafts_failed_shorten_the_next_rows_first_draft():
    fresh = BlockSizer(OPTIONS).size()
    prior = AcceptancePrior()
    rows_seen(prior, rows=100, drafted=12, accepted=1)
    assert BlockSizer(OPTIONS, prior).size() < fresh


def test_a_few_rows_cannot_make_the_rate_certain():
    prior = AcceptancePrior()
    rows_seen(prior, rows=1, drafted=12, accepted=12)
    accepted, rejected = prior.start(OPTIONS)
    assert 0.9 < accepted / (accepted + rejected) < 0.99


def test_the_prior_follows_a_change_of_workload():
    prior = AcceptancePrior()
    rows_seen(prior, rows=2000, drafted=12, accepted=12)
    rows_seen(prior, rows=2000, drafted=12, accepted=0)  # older calls decay away
    accepted, rejected = prior.start(OPTIONS)
    assert accepted / (accepted + rejected) < 0.5


def test_reset_forgets_what_was_seen():
    prior = AcceptancePrior()
    rows_seen(prior, rows=50, drafted=12, accepted=12)
    prior.reset()
    assert prior.start(OPTIONS) == pytest.approx((OPTIONS.prior_accepted, OPTIONS.prior_rejected))


@pytest.mark.parametrize("mode", ["iad", "gad"])
def test_a_generators_rows_feed_its_prior_and_warm_up_forgets_them(mode, gad_bundle):  # noqa: F811
    generator = Generator(gad_bundle("marian"))
    before = generator.draft_priors[mode].start(OPTIONS)
    generator.generate(ragged_texts(seed=3, count=6), mode=mode, max_new_tokens=24)
    assert generator.draft_priors[mode].start(OPTIONS) != pytest.approx(before)
    generator.warm_up(mode)
    assert generator.draft_priors[mode].start(OPTIONS) == pytest.approx(before)


def test_a_learned_prior_changes_the_first_iad_block_and_no_output(bundle):
    generator = Generator(bundle("marian"))
    text = " ".join(["stone"] * 45)  # a source longer than any first block
    greedy = generator.generate([text], mode="greedy", max_new_tokens=40)[0].ids
    fresh = generator.generate([text], mode="iad", max_new_tokens=40)[0]
    generator.draft_priors["iad"].reset()
    rows_seen(generator.draft_priors["iad"], rows=500, drafted=32, accepted=32)
    learned = generator.generate([text], mode="iad", max_new_tokens=40)[0]
    assert learned.stats.drafted[0] > fresh.stats.drafted[0]
    assert learned.ids == fresh.ids == greedy


@pytest.mark.parametrize("block", [{"max_block": 3}, 5])
def test_a_block_that_is_not_block_options_is_refused(block, bundle):
    from aggdec.runtime.errors import InputError

    with pytest.raises(InputError, match="BlockOptions"):
        Generator(bundle("marian")).generate(["w1 w2"], mode="iad", block=block)
