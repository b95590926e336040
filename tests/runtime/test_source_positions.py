"""A drafter that reads its tokens at source positions (``DrafterConfig.positions == "source"``).

After an edit that changes the length, output position p no longer holds source position p;
such a drafter is fed, per row, the position of the source token its output is aligned with
(runtime/decoding/alignment.py). Drafts only change speed: GAD must still equal greedy, and
the runtime must feed exactly the positions drafter training computes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from aggdec.runtime.decoding.alignment import source_position_offsets, source_shift
from aggdec.runtime.errors import BundleError
from aggdec.runtime.generator import Generator
from tests.runtime.test_lossless import check_drafting_equals_greedy, random_texts
from tests.support.tiny import FAMILIES

MAX_NEW = 24
K = 6
WINDOW = 5
START = 0
SOURCE = np.array([10, 11, 12, 13, 14, 15, 16, 1])


# ---------------------------------------------------------------------------------- the shift


@pytest.mark.parametrize(("output", "shift"), [
    ([10, 11, 12], 0),  # a copy so far
    ([10, 99, 13], 1),  # 11 12 became 99: 13 stands where source[3] stood, one ahead
    ([10, 11, 50, 12, 13], -1),  # 50 inserted: one behind
    ([10, 11, 12, 88], 0),  # 13 replaced by 88, which occurs nowhere: the last token that does counts
    ([10, 99, 13, 88, 77], 1),  # ... however many such tokens follow, within the lookback
    ([97, 98, 99], 0),  # nothing in the source (a translation): output positions
    ([], 0),  # only the decoder start
])
def test_source_shift_follows_length_changing_edits(output, shift):
    assert source_shift([START, *output], SOURCE, lookback=16) == shift


def test_source_shift_looks_back_only_over_the_tokens_the_drafter_reads():
    prefix = [START, 10, 99, 13, 88, 77, 66]
    assert source_shift(prefix, SOURCE, lookback=4) == 1  # 13 is among the last 4
    assert source_shift(prefix, SOURCE, lookback=3) == 0  # it is not among the last 3


def test_a_repeated_token_aligns_nearest_the_unshifted_position():
    source = np.array([10, 7, 11, 12, 7, 13, 14, 7, 1])
    assert source_shift([START, 10, 11, 12, 7], source, lookback=16) == 1  # the 7 after 12: unique by suffix
    assert source_shift([START, 50, 51, 52, 53, 7], source, lookback=16) == 0  # tie: nearest position 5


def test_offsets_shift_and_never_go_below_zero():
    prefixes = [[START, 10, 99, 13], [START, 50, 10], [START, 10, 11, 50, 12, 13]]
    offsets = source_position_offsets([0, 0, 2], prefixes, [SOURCE] * 3, window=4)
    # +1; 10 at output position 2 stands at source position 1: -1, kept at 0; -1 from offset 2
    assert offsets.tolist() == [1, 0, 1]


# ---------------------------------------------------------------------------------- bundles


@pytest.fixture(scope="session")
def source_positions_bundle(drafter_bundle):
    """family -> (bundle whose drafter reads source positions, the drafter's directory)."""
    from aggdec.export.drafter import new_drafter_from_verifier

    def drafter(model):
        return new_drafter_from_verifier(model, layers=1, k=K, seed=4, window=WINDOW, positions="source")

    return lambda family: drafter_bundle(family, "source-positions", drafter)


@pytest.mark.parametrize("family", FAMILIES)
def test_gad_equals_greedy_with_a_source_positions_drafter(family, source_positions_bundle, random_checkpoint):
    bundle, _ = source_positions_bundle(family)
    assert json.loads((bundle / "manifest.json").read_text())["draft_positions"] == "source"
    generators = check_drafting_equals_greedy(bundle, random_checkpoint(family), random_texts(seed=21, count=16),
                                              MAX_NEW, draft_ks=(1, K), modes=("gad", "gad++"))
    assert all(generator.drafter.source_positions for generator in generators)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_runtime_feeds_the_positions_training_computes(family, source_positions_bundle, random_checkpoint):
    """The float drafter's ids equal torch's argmax on drafter training's own inputs (its
    _Layout), and differ from the drafts at output positions: the shift is applied."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from aggdec.export.drafter import Drafter
    from aggdec.export.train_drafter import _layout

    bundle, drafter_dir = source_positions_bundle(family)
    generator = Generator(bundle, int8_drafter=False)
    model = AutoModelForSeq2SeqLM.from_pretrained(random_checkpoint(family)).eval()
    drafter = Drafter.load(drafter_dir)
    layout = _layout(model, AutoTokenizer.from_pretrained(random_checkpoint(family)), drafter)
    assert layout.source_positions
    pad = generator.manifest.pad_token_id
    start = generator.manifest.decoder_start_token_id
    shifted = differs = 0
    for text in random_texts(seed=36, count=8):
        source = generator.encode([text])
        ids_of_source = list(source[0])
        if len(ids_of_source) < 8:
            continue
        batch = generator.verifier.batch(1, generator.io_binding, generator.drafter.memory)
        batch.admit(source, pad)
        # two source tokens dropped (a merge): the rest of the output stands two positions behind
        prefix = [start, *ids_of_source[:2], *ids_of_source[4:8]]
        with torch.no_grad():
            hidden = model.get_encoder()(input_ids=torch.tensor(source)).last_hidden_state
            ones = torch.ones_like(torch.tensor(source))
            ids, mask, slot, offset = layout.inputs([prefix], [ids_of_source], torch.device("cpu"))
            logits = drafter.slot_logits(ids, mask, slot, hidden, ones, offset)
        shifted += int(offset[0]) != len(prefix) - WINDOW
        drafted = generator.drafter.draft([prefix], [ids_of_source], batch.buffers.hidden(),
                                          batch.buffers.source_mask(), pad)
        best, second = torch.topk(logits[0], 2, dim=-1).values.T
        decisive = (best - second > 1e-4).numpy()  # a near tie may go either way in another kernel
        assert np.array_equal(drafted[0][decisive], logits.argmax(-1)[0].numpy()[decisive])
        generator.drafter.source_positions = False
        at_output_positions = generator.drafter.draft([prefix], [ids_of_source], batch.buffers.hidden(),
                                                      batch.buffers.source_mask(), pad)
        generator.drafter.source_positions = True
        differs += int(not np.array_equal(at_output_positions, drafted))
    assert shifted and differs, "no prefix was shifted, or the shift changed no draft: the test shows nothing"


def test_an_int8_bundle_keeps_source_positions_and_stays_lossless(source_positions_bundle, tmp_path):
    from aggdec.export.quantize import quantize_bundle

    bundle, _ = source_positions_bundle("t5")
    quantize_bundle(bundle, tmp_path / "int8", progress=None)
    assert json.loads((tmp_path / "int8" / "manifest.json").read_text())["draft_positions"] == "source"
    generator = Generator(tmp_path / "int8")
    assert generator.drafter.source_positions
    texts = random_texts(seed=22, count=8)
    greedy = [r.ids for r in generator.generate(texts, mode="greedy", max_new_tokens=MAX_NEW)]
    assert [r.ids for r in generator.generate(texts, mode="gad", max_new_tokens=MAX_NEW, batch_size=3)] == greedy


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda m: m.__setitem__("draft_positions", "left"), "draft_positions"),
    (lambda m: m.__setitem__("draft_positions", 1), "draft_positions"),
])
def test_a_bad_draft_positions_is_refused(source_positions_bundle, tmp_path, edit, needle):
    import shutil

    bundle, _ = source_positions_bundle("marian")
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=needle):
        Generator(copy)


def test_draft_positions_without_a_drafter_is_refused(random_checkpoint, tmp_path):
    from aggdec.export import export_bundle

    export_bundle(random_checkpoint("marian"), tmp_path / "bundle", progress=None)
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest.get("draft_positions") is None
    manifest["draft_positions"] = "source"
    (tmp_path / "bundle" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="draft_positions is set"):
        Generator(tmp_path / "bundle")


def test_a_bundle_from_before_the_field_reads_output_positions(source_positions_bundle, tmp_path):
    import shutil

    bundle, _ = source_positions_bundle("marian")
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["draft_positions"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert not Generator(copy).drafter.source_positions
