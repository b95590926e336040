"""Beam search on Marian bundles follows Marian's rules (runtime/decoding/marian_beam.py).

The specification is :func:`marian_beams` below: Marian's beam search (``beam_search.cpp``,
``history.h``) written out plainly over the bundle's own verifier, run with onnxruntime one
position at a time from an empty state (no blocks, no row copies, no rollback). Plain beams
must equal it hypothesis for hypothesis and score for score (the same float32 sums in the same
order: exact equality); IAD and GAD beams must equal plain beams. Upstream Marian itself is
the reference on the Bergamot models (benchmarks/marian_beam_oracle.py, not in CI).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from aggdec.export import export_bundle
from aggdec.export.marian.config import parse_model_config
from aggdec.export.marian.model import MarianModel
from aggdec.export.marian.weights import read_weights
from aggdec.runtime.decoding.cache import bucket, self_cache_names, self_cache_out_names
from aggdec.runtime.decoding.iad import BlockOptions
from aggdec.runtime.decoding.shortlist import load_shortlist
from aggdec.runtime.errors import InputError
from aggdec.runtime.generator import Generator
from aggdec.runtime.manifest import BundleFiles, load_manifest
from aggdec.runtime.tokenizer import TextCodec
from tests.export.test_marian import TEXTS, tiny  # noqa: F401 - a fixture
from tests.support.marian import add_shortlist, write_model

MAX_NEW = 20
# sources whose tiny-model outputs repeat one of their words: IAD's drafts (the source after the
# aligned position) are then accepted, so beam steps are replayed over a block
REPEATS = ["red red red red red red red red", "big big big big big big"]


class OnePositionScorer:
    """A source's top-k (log-probs, ids) after any prefix, from the bundle's verifier fed one
    token at a time from an empty cache; each prefix's written cache is kept by the prefix."""

    def __init__(self, bundle: Path, source: list[int], shortlist: bool) -> None:
        m = load_manifest(bundle)
        self.m = m
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        encoder = ort.InferenceSession(str(bundle / m.graphs["encoder"].file), options)
        self.verifier = ort.InferenceSession(str(bundle / m.graphs["verifier"].file), options)
        # the source padded to the width the runtime's buffers give a text decoded alone (a power
        # of two from 16, cache.bucket): cross-attention then sums over the same positions, masked
        # ones included, so its float32 rounding is the same (another width changes the last bits)
        width = bucket(len(source), m.max_source_len)
        ids = np.full((1, width), m.pad_token_id, dtype=np.int64)
        ids[0, : len(source)] = source
        self.mask = (np.arange(width) < len(source)).astype(np.int64)[None]
        self.extra: dict[str, np.ndarray] = {}
        inputs = {i.name for i in self.verifier.get_inputs()}
        encoder_inputs = {"input_ids": ids, "attention_mask": self.mask}
        if "output_ids" in inputs:  # a shortlist bundle: the sentence's list, or every id
            if shortlist:
                listed = load_shortlist(BundleFiles(bundle, m), m).for_source(source)
            else:
                listed = np.arange(m.vocab_size, dtype=np.int64)
            self.extra["output_ids"] = listed[None, :]
            encoder_inputs["output_ids"] = self.extra["output_ids"]
        names = [o.name for o in encoder.get_outputs()]
        out = dict(zip(names, encoder.run(None, encoder_inputs)))
        self.cross = {k: v for k, v in out.items() if k.startswith("cross_")}
        if "output_rows" in inputs:
            self.extra["output_rows"] = out["output_rows"]
        self.capacity = m.max_target_len + 2
        self.names = self_cache_names(m.decoder_layers, m.cache_kind)
        self.out_names = self_cache_out_names(m.decoder_layers, m.cache_kind)
        empty = {n: np.zeros((1, m.num_heads, self.capacity, m.head_dim), np.float32) for n in self.names}
        self.caches: dict[tuple[int, ...], dict] = {(): empty}
        self.scores: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, prefix: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        if prefix not in self.scores:
            before = prefix[:-1]
            if before and before not in self.caches:
                self(before)
            names = [o.name for o in self.verifier.get_outputs()]
            out = dict(zip(names, self.verifier.run(None, {
                "input_ids": np.array([[prefix[-1]]], np.int64), "past_lengths": np.array([len(before)], np.int64),
                **self.caches[before], **self.cross, "encoder_attention_mask": self.mask, **self.extra})))
            self.caches[prefix] = {n: out[o] for n, o in zip(self.names, self.out_names)}
            self.scores[prefix] = (out["top_logprobs"][0, 0], out["top_ids"][0, 0])
        return self.scores[prefix]


def marian_beams(score, start: int, eos: int, beams: int, cap: int, normalize: float, word_penalty: float
                 ) -> list[tuple[tuple[int, ...], float]]:
    """Marian's beam search for one sentence, plainly: (tokens after the start, score), best first.

    One hypothesis at first, expanded into its ``beams`` best; then each step the running
    hypotheses' expansions (path score + log-prob, float32) are ranked and as many kept as
    hypotheses ran; kept ones ending in EOS finish and leave (the beam narrows); at the length
    cap every kept one finishes; a finished hypothesis scores (path - wp * length) / length **
    normalize, length counting the EOS. Ties go to the lower (hypothesis, rank)."""
    running: list[tuple[tuple[int, ...], np.float32]] = [((start,), np.float32(0.0))]
    width = beams
    finished: list[tuple[tuple[int, ...], float]] = []
    while running:
        expansions = []
        for h, (tokens, path) in enumerate(running):
            log_probs, ids = score(tokens)
            for rank, (log_prob, token) in enumerate(zip(log_probs, ids)):
                expansions.append((np.float32(path + np.float32(log_prob)), h, rank, tokens + (int(token),)))
        expansions.sort(key=lambda e: (-e[0], e[1], e[2]))
        kept = expansions[:width]
        length = len(kept[0][3]) - 1
        running = []
        for path, _h, _rank, tokens in kept:
            if tokens[-1] == eos or length >= cap:
                value = (path - np.float32(word_penalty) * np.float32(length)) / np.power(
                    np.float32(length), np.float32(normalize))
                finished.append((tokens[1:], float(np.float32(value))))
            else:
                running.append((tokens, path))
        width = len(running)
    return sorted(finished, key=lambda f: -f[1])


def specification(bundle: Path, texts: list[str], beams: int, shortlist: bool = True, normalize: float | None = None,
                  max_new: int = MAX_NEW) -> list[list[tuple[tuple[int, ...], float]]]:
    m = load_manifest(bundle)
    rules = m.beam_rules
    assert rules is not None and rules["family"] == "marian"
    alpha = rules["normalize"] if normalize is None else normalize
    out = []
    for source in TextCodec(bundle / "tokenizer.json", segmentation=load_manifest(bundle).segmentation).encode(texts):
        cap = min(max_new, math.ceil(np.float32(m.max_length_factor) * np.float32(len(source))))
        scorer = OnePositionScorer(bundle, source, shortlist)
        out.append(marian_beams(scorer, m.decoder_start_token_id, m.eos_token_id, beams, cap, alpha,
                                rules["word_penalty"]))
    return out


def hypotheses(results) -> list[list[tuple[tuple[int, ...], float]]]:
    return [[(h.ids, h.score) for h in r.sequences] for r in results]


@pytest.fixture(scope="module")
def spec_cache():
    return {}


CASES = [("ssru", "bin", True, True), ("ssru", "bin", True, False), ("self-attention", "npz", False, False)]


@pytest.mark.parametrize("decoder,fmt,with_list,use_list", CASES)
def test_plain_beams_equal_marians_rules_over_the_bundles_verifier(tiny, spec_cache, decoder, fmt, with_list,
                                                                  use_list):
    """Plain beams (2 and 4) on SSRU and self-attention bundles, over each sentence's shortlist
    and over every id, at batch 1 and several texts a call, IO binding on and off: every
    hypothesis and score equal the specification's."""
    _folder, bundle = tiny(decoder, fmt, 0.0, with_list)
    assert load_manifest(bundle).suppression == "after_log_softmax"
    for beams in (2, 4):
        key = (bundle, beams, use_list)
        if key not in spec_cache:
            spec_cache[key] = specification(bundle, TEXTS, beams, shortlist=use_list)
        expected = spec_cache[key]
        # not degenerate: some end at the cap and some on EOS, lists hold several hypotheses, and
        # the beam's best is not greedy's for every text
        ends = [tokens[-1] == 0 for listed in expected for tokens, _score in listed]
        assert any(ends) and not all(ends)
        assert all(len(listed) == beams for listed in expected)
        for io_binding in (True, False):
            generator = Generator(bundle, io_binding=io_binding, shortlist=use_list)
            greedy = [r.ids for r in generator.generate(TEXTS, max_new_tokens=MAX_NEW)]
            assert [h[0][0] for h in expected] != greedy
            for batch_size in (1, 5):
                got = generator.generate(TEXTS, num_beams=beams, num_return_sequences=beams, batch_size=batch_size,
                                         max_new_tokens=MAX_NEW)
                assert hypotheses(got) == expected, (beams, io_binding, batch_size)
                assert [r.ids for r in got] == [h[0][0] for h in expected]


def test_iad_beams_equal_plain_beams(tiny):
    _folder, bundle = tiny("ssru", "bin", 0.0, True)
    texts = TEXTS + REPEATS
    for io_binding in (True, False):
        generator = Generator(bundle, io_binding=io_binding)
        for beams in (2, 4):
            plain = hypotheses(generator.generate(texts, num_beams=beams, num_return_sequences=beams,
                                                  max_new_tokens=MAX_NEW))
            for batch_size in (1, 5):
                for block in (BlockOptions(max_block=4, adaptive=False), None):
                    got = generator.generate(texts, mode="iad", num_beams=beams, num_return_sequences=beams,
                                             batch_size=batch_size, max_new_tokens=MAX_NEW, block=block)
                    assert hypotheses(got) == plain, (io_binding, beams, batch_size, block)
                    if block is not None:  # drafts were replayed: several beam steps in one call
                        assert any(max(r.stats.accepted) > 1 for r in got)


@pytest.fixture(scope="module")
def gad_repeating(tmp_path_factory):
    """A tiny SSRU Marian folder exported with an untrained drafter of k = 6 whose head always
    proposes "▁red" (id 14), a token the tiny model's beams repeat on some sources: its
    drafts are then sometimes on every hypothesis's path, and beam steps are replayed."""
    from aggdec.export.drafter import Drafter, DrafterConfig

    root = tmp_path_factory.mktemp("marian-gad-beam")
    folder, config, _weights = write_model(root / "model", "ssru")
    vocab = config["dim-vocabs"][1]
    torch.manual_seed(0)
    drafter = Drafter(DrafterConfig(vocab_size=vocab, d_model=16, num_heads=2, head_dim=8, ffn_dim=32, layers=1,
                                    k=6, max_positions=64 + 6 + 1, pad_token_id=0, eos_token_id=0,
                                    family="marian-native")).eval()
    with torch.no_grad():
        drafter.head.bias[14] = 100.0
    drafter.save(root / "drafter")
    export_bundle(folder, root / "bundle", progress=None, max_source_len=64, max_target_len=64,
                  drafter_dir=root / "drafter")
    return folder, root / "bundle"


def test_gad_beams_equal_plain_beams_and_the_specification(gad_repeating):
    _folder, bundle = gad_repeating
    texts = TEXTS + REPEATS
    expected = specification(bundle, texts, 3)
    for io_binding in (True, False):
        generator = Generator(bundle, io_binding=io_binding)
        plain = hypotheses(generator.generate(texts, num_beams=3, num_return_sequences=3, max_new_tokens=MAX_NEW))
        assert plain == expected
        for batch_size in (1, 5):
            for block in (BlockOptions(max_block=6, adaptive=False), None):
                got = generator.generate(texts, mode="gad", num_beams=3, num_return_sequences=3,
                                         batch_size=batch_size, max_new_tokens=MAX_NEW, block=block)
                assert hypotheses(got) == plain, (io_binding, batch_size, block)
                if block is not None:  # drafts were replayed: several beam steps in one call
                    assert any(max(r.stats.accepted) > 1 for r in got)


def test_log_probs_are_normalized_over_the_list_with_unk_masked_after(tiny):
    """Marian's path scores sum log-softmax over the sentence's list, <unk> included in the
    normalization and masked afterwards (suppressWords on the path scores)."""
    folder, bundle = tiny("ssru", "bin", 0.0, True)
    m = load_manifest(bundle)
    weights = read_weights(next(folder.glob("model.*")))
    model = MarianModel(parse_model_config(weights.config_text), weights, 128)
    source = TextCodec(bundle / "tokenizer.json", segmentation=load_manifest(bundle).segmentation).encode([TEXTS[5]])[0]
    scorer = OnePositionScorer(bundle, source, shortlist=True)
    listed = torch.from_numpy(load_shortlist(BundleFiles(bundle, m), m).for_source(source))
    prefix = (0,)
    log_probs, ids = scorer(prefix)
    with torch.no_grad():
        src = torch.tensor([source])
        logits = model(src, torch.ones_like(src), torch.tensor([list(prefix)])).logits[0, -1].double()
    over_list = torch.log_softmax(logits[listed], -1)
    without_unk = torch.log_softmax(logits[listed[listed != 1]], -1)
    want = dict(zip(listed.tolist(), over_list.tolist()))
    other = dict(zip(listed[listed != 1].tolist(), without_unk.tolist()))
    assert 1 in want and 1 not in ids.tolist()  # <unk> is in the list and never a candidate
    got = dict(zip(ids.tolist(), log_probs.tolist()))
    assert max(abs(got[i] - want[i]) for i in got) < 1e-4
    assert max(abs(got[i] - other[i]) for i in got) > 1e-3  # the other order is told apart


def test_marian_beam_options(tiny, tmp_path):
    """length_penalty is Marian's normalize (default: the yml's); word-penalty comes from the yml;
    early_stopping does not apply; N beams need a top-k of N."""
    _folder, bundle = tiny("ssru", "bin", 0.0, True)
    generator = Generator(bundle)
    assert load_manifest(bundle).beam_rules == {"family": "marian", "normalize": 1.0, "word_penalty": 0.0}
    texts = TEXTS[:6]
    got = generator.generate(texts, num_beams=3, num_return_sequences=3, length_penalty=0.0, max_new_tokens=MAX_NEW)
    raw = specification(bundle, texts, 3, normalize=0.0)
    assert hypotheses(got) == raw
    assert raw != specification(bundle, texts, 3)  # the penalty changes these, so the test can tell
    with pytest.raises(InputError, match="early_stopping does not apply"):
        generator.generate(["a"], num_beams=2, early_stopping=True)
    with pytest.raises(InputError, match="top-9 candidates.*Marian's beam search"):
        generator.generate(["a"], num_beams=9)
    assert generator.generate(["a"], num_beams=8)[0].sequences  # N = top-k is enough for Marian's rules

    folder, _config, _weights = write_model(tmp_path / "model", "ssru", decoding={"word-penalty": 0.5,
                                                                                   "normalize": 0.6, "beam-size": 4})
    add_shortlist(folder)
    export_bundle(folder, tmp_path / "bundle", progress=None, max_source_len=64, max_target_len=64)
    assert load_manifest(tmp_path / "bundle").beam_rules == {"family": "marian", "normalize": 0.6,
                                                            "word_penalty": 0.5}
    got = Generator(tmp_path / "bundle").generate(texts, num_beams=3, num_return_sequences=3, max_new_tokens=MAX_NEW)
    assert hypotheses(got) == specification(tmp_path / "bundle", texts, 3)


def test_a_bundle_masking_unk_before_the_log_softmax_is_refused_with_the_way_out(tiny, tmp_path):
    _folder, bundle = tiny("ssru", "bin", 0.0, True)
    old = tmp_path / "old"
    shutil.copytree(bundle, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["suppression"] = "before_log_softmax"  # as every Marian bundle exported before beams
    (old / "manifest.json").write_text(json.dumps(manifest))
    generator = Generator(old)
    with pytest.raises(InputError, match="masks its banned ids before the log-softmax.*re-export"):
        generator.generate(["a"], num_beams=2)
    assert generator.generate(["a"], max_new_tokens=4)[0].ids  # greedy still decodes


@pytest.mark.parametrize("decoding,needle", [({"normalize": "yes"}, "option normalize"),
                                             ({"word-penalty": float("inf")}, "option word-penalty"),
                                             ({"beam-size": 0}, "option beam-size")])
def test_bad_beam_scoring_options_in_the_yml_are_refused(tmp_path, decoding, needle):
    from aggdec.runtime.errors import ExportError

    folder, _config, _weights = write_model(tmp_path / "model", "ssru", decoding=decoding)
    with pytest.raises(ExportError, match=needle):
        export_bundle(folder, tmp_path / "out", progress=None, max_source_len=64, max_target_len=64)
    assert not (tmp_path / "out").exists()  # nothing written
