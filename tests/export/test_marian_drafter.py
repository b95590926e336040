"""`aggdec train-drafter` on a Marian folder as it ships, and GAD with the drafter it trains.

A tiny SSRU Marian model with a lexical shortlist (tests/support/marian.py): the drafter is
distilled from the runtime's greedy over each sentence's shortlist, exported into the bundle
with a head over each row's shortlist, and GAD must equal greedy token for token.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from aggdec.export import export_bundle
from aggdec.export.drafter import DrafterConfig
from aggdec.export.train_drafter import DISTILL_FILE, TrainOptions, train_drafter
from aggdec.runtime.errors import ExportError
from aggdec.runtime.generator import Generator
from aggdec.runtime.manifest import load_manifest
from aggdec.runtime.tokenizer import TextCodec
from aggdec.runtime.tuning import Tuning
from tests.export.test_marian import MAX_NEW, TEXTS, reference_greedy
from tests.support.marian import WORDS, add_shortlist, write_model

OPTIONS = TrainOptions(k=4, layers=1, ffn_dim=16, window=4, steps=40, heldout=10, batch_tokens=512, speed=False)


def _sources(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))) for _ in range(count)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model folder, drafter dir, report, training sources, bundle with the drafter)."""
    root = tmp_path_factory.mktemp("marian-drafter")
    folder, _config, _weights = write_model(root / "model", "ssru")
    add_shortlist(folder)
    sources = _sources(150)
    (root / "sources.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    report = train_drafter(folder, root / "sources.txt", root / "drafter", OPTIONS, progress=False)
    export_bundle(folder, root / "bundle", progress=None, max_source_len=64, max_target_len=64,
                  drafter_dir=root / "drafter")
    return folder, root / "drafter", report, sources, root / "bundle"


def test_targets_are_greedy_over_each_sentences_shortlist(trained):
    folder, drafter_dir, report, sources, bundle = trained
    assert report["train_examples"] + report["heldout"] == len(sources) and report["steps"] == OPTIONS.steps
    config = DrafterConfig.load(drafter_dir)
    assert (config.family, config.d_model, config.k, config.ffn_dim, config.window) == ("marian-native", 16, 4, 16, 4)
    lines = (drafter_dir / DISTILL_FILE).read_text(encoding="utf-8").splitlines()
    targets = [tuple(json.loads(line)) for line in lines[1:]]
    # the torch rebuild's greedy, each step's argmax over the sentence's shortlist, as Marian caps it
    expected = reference_greedy(folder, bundle, sources[:8], shortlist=True, max_new=OPTIONS.max_new_tokens)
    assert targets[:8] == expected
    assert len({len(t) for t in expected}) > 2  # not one degenerate output


def test_gad_with_the_trained_drafter_equals_greedy(trained):
    folder, _drafter, _report, sources, bundle = trained
    texts = TEXTS + sources[-10:]  # the held-out sources too
    manifest = load_manifest(bundle)
    assert manifest.shortlist is not None and "output_ids" in manifest.graphs["drafter"].input_names()
    assert reference_greedy(folder, bundle, TEXTS, shortlist=True) == [
        r.ids for r in Generator(bundle).generate(TEXTS, max_new_tokens=MAX_NEW, batch_size=8)]
    # (shortlist, int8 drafter, IO binding): over each sentence's shortlist both drafters with
    # and without IO binding; over the whole vocabulary (the drafter's output_ids one row of
    # every id, broadcast) once
    for shortlist, int8_drafter, io_binding in ((True, None, True), (True, None, False), (True, False, True),
                                                (True, False, False), (False, None, True)):
        # the rows' sizing alone (the gate, Tuning.draft_payoff, may find a tiny drafter not paying)
        generator = Generator(bundle, io_binding=io_binding, int8_drafter=int8_drafter, shortlist=shortlist,
                              tuning=Tuning(draft_payoff=False))
        greedy = [r.ids for r in generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=8)]
        for batch_size in (1, 8):
            got = generator.generate(texts, mode="gad", max_new_tokens=MAX_NEW, batch_size=batch_size)
            assert [r.ids for r in got] == greedy, (shortlist, int8_drafter, io_binding, batch_size)
            assert sum(r.stats.drafter_seconds for r in got) > 0  # the drafter did draft
            assert any(max(r.stats.accepted) > 1 for r in got)


def test_drafts_stay_within_each_rows_shortlist(trained):
    _folder, _drafter, _report, _sources, bundle = trained
    generator = Generator(bundle, int8_drafter=False)
    drafter, manifest = generator.drafter, generator.manifest
    sources = TextCodec(bundle / "tokenizer.json", segmentation=load_manifest(bundle).segmentation).encode(TEXTS[:3])
    width = max(len(s) for s in sources)
    memory_in = np.zeros((3, width), dtype=np.int64)
    ids = np.zeros((3, width), dtype=np.int64)
    for row, source in enumerate(sources):
        ids[row, : len(source)], memory_in[row, : len(source)] = source, 1
    hidden = generator._sessions["encoder"].run({"input_ids": ids, "attention_mask": memory_in})["encoder_hidden_states"]
    lists = np.array([[5, 9, -1], [7, 11, 30], [3, -1, -1]], dtype=np.int64)
    prefixes = [[0], [0, 5, 6], [0, 8]]
    drafts = drafter.draft(prefixes, sources, hidden, memory_in, manifest.pad_token_id, lists)
    assert drafts.shape == (3, manifest.draft_k)
    for row, allowed in enumerate(lists):
        assert set(drafts[row].tolist()) <= set(allowed[allowed >= 0].tolist())
    every = drafter.draft(prefixes, sources, hidden, memory_in, manifest.pad_token_id,
                          np.arange(manifest.vocab_size, dtype=np.int64)[None])
    assert every.shape == (3, manifest.draft_k) and not np.array_equal(every, drafts)


def test_a_marian_drafter_reads_output_positions(tmp_path):
    folder, _config, _weights = write_model(tmp_path / "model", "ssru")
    (tmp_path / "sources.txt").write_text("\n".join(_sources(20)) + "\n", encoding="utf-8")
    options = TrainOptions(k=4, layers=1, steps=1, heldout=2, positions="source", speed=False)
    with pytest.raises(ExportError, match="reads output positions"):
        train_drafter(folder, tmp_path / "sources.txt", tmp_path / "drafter", options, progress=False)


def test_int8_bundle_gad_equals_its_own_greedy(trained, converted):
    """`aggdec quantize` converts the shortlist drafter too (its output_ids fed as the runtime does)."""
    _folder, _drafter, _report, sources, bundle = trained
    int8 = converted(bundle, "int8")
    assert "output_ids" in load_manifest(int8).graphs["drafter"].input_names()
    texts = TEXTS + sources[-10:]
    for io_binding in (True, False):
        generator = Generator(int8, io_binding=io_binding, tuning=Tuning(draft_payoff=False))
        greedy = [r.ids for r in generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=8)]
        for batch_size in (1, 8):
            got = generator.generate(texts, mode="gad", max_new_tokens=MAX_NEW, batch_size=batch_size)
            assert [r.ids for r in got] == greedy, (io_binding, batch_size)
            assert any(max(r.stats.accepted) > 1 for r in got)
