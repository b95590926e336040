"""IAD on a model that really edits: a tiny Marian trained to copy while applying rewrite rules.

Random models rarely copy, so on them IAD falls back to greedy steps almost always. Here the
output is mostly the input, so IAD's acceptance, bifurcation and re-alignment paths all run
for real, and it must need far fewer verifier calls than greedy for the same output.
"""

from __future__ import annotations

import random

import pytest

from aggdec.runtime.decoding.iad import BlockOptions
from aggdec.runtime.generator import Generator
from tests.runtime.test_lossless import transformers_greedy
from tests.support.tiny import make_editing_pair

MAX_NEW = 60


@pytest.fixture(scope="module")
def editing_texts():
    rng = random.Random(2026)
    return [make_editing_pair(rng)[0] for _ in range(40)]


def test_iad_equals_greedy_and_transformers(editing_marian_dir, editing_bundle, editing_texts):
    expected = transformers_greedy(editing_marian_dir, editing_texts, MAX_NEW)
    generator = Generator(editing_bundle)
    greedy = generator.generate(editing_texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=8)
    assert [r.ids for r in greedy] == expected
    for options in (None, BlockOptions(max_block=4, adaptive=False), BlockOptions(max_block=64, adaptive=False)):
        iad = generator.generate(editing_texts, mode="iad", max_new_tokens=MAX_NEW, block=options)
        assert [r.ids for r in iad] == expected


def test_iad_needs_far_fewer_iterations(editing_bundle, editing_texts):
    generator = Generator(editing_bundle)
    greedy = generator.generate(editing_texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=1)
    iad = generator.generate(editing_texts, mode="iad", max_new_tokens=MAX_NEW,
                             block=BlockOptions(max_block=64, cost_ratio=0.0))
    greedy_iterations = sum(r.stats.iterations for r in greedy)
    iad_iterations = sum(r.stats.iterations for r in iad)
    tokens = sum(len(r.ids) for r in iad)
    assert greedy_iterations == tokens  # one token per greedy step
    # the edits are sparse (about 12% of words), so blocks are long: at least 3x fewer calls
    assert iad_iterations * 3 <= greedy_iterations, (iad_iterations, greedy_iterations)
    # the rewrite rules force bifurcations, and re-alignment after them: some iterations keep
    # a draft only partly (accepted < drafted + 1), and later iterations draft again
    partial = [(d, a) for r in iad for d, a in zip(r.stats.drafted, r.stats.accepted) if 0 < a < d + 1]
    assert partial


def test_caller_block_options_ignore_measured_costs(editing_bundle, editing_texts):
    """A caller's BlockOptions size IAD's blocks with their own cost_ratio: calls measured as
    dear (as a loaded or slow machine measures them) must not shorten them, so the same options
    draft the same blocks on any machine."""
    options = BlockOptions(max_block=64, cost_ratio=0.0)
    texts = editing_texts[:8]

    def drafted(generator):
        results = generator.generate(texts, mode="iad", max_new_tokens=MAX_NEW, block=options, batch_size=1)
        return [r.stats.drafted for r in results]

    calm = Generator(editing_bundle)
    expected = drafted(calm)
    loaded = Generator(editing_bundle)
    for width in range(1, 65):  # every extra position costs as much as a whole step
        for _ in range(4):
            loaded.gad_costs.observe(width, 0.001 * width, rows=1)
    assert loaded.gad_costs.fit(1)[1] > 0.5
    assert drafted(loaded) == expected


def test_sources_with_edits_everywhere(editing_marian_dir, editing_bundle):
    """Deletions, replacements and insertions at the start, the end and back to back."""
    texts = ["uh the cat runs", "the cat runs uh", "uh uh uh dog", "teh gonna teh", "gonna", "uh",
             "red red red red uh red red", "the the teh the the"]
    expected = transformers_greedy(editing_marian_dir, texts, MAX_NEW)
    generator = Generator(editing_bundle)
    assert [r.ids for r in generator.generate(texts, mode="iad", max_new_tokens=MAX_NEW)] == expected
