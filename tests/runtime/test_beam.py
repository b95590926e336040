"""Beam search == transformers' ``generate(num_beams=N, do_sample=False)``: tokens and scores.

Per family on random tiny models (the fixtures of test_lossless): beam 2 and 4 (5 on a bundle
exported with --top-k 10), batch 1 and 8, IO binding on and off, length penalty 0.6/1.0/2.0,
early stopping True/False/"never", num_return_sequences up to N, and rows that join mid-decode
(fewer rows than texts). transformers decodes one text at a time, as in test_lossless.

Scores: aggdec's per-token log-probs come from onnxruntime's kernels, transformers' from
torch's, and the two float32 computations round differently (SCORE_TOLERANCE). Tokens must
agree exactly.
"""

from __future__ import annotations

import pytest

from aggdec.runtime.errors import InputError
from aggdec.runtime.generator import Generator
from tests.runtime.test_gad import gad_bundle  # noqa: F401 - a fixture
from tests.runtime.test_lossless import random_texts
from tests.support.tiny import FAMILIES

MAX_NEW = 16
# How far aggdec's sequence scores may be from transformers': float32 rounding, by family.
# Marian/BART/mBART: onnxruntime's and torch's log-probs of the same sequence differ by about
# 1e-6 a position (measured: at most 6e-6 over every top-8 candidate), so a score (a sum over
# at most MAX_NEW positions, divided by a length) moves by well under 1e-4. The tiny random
# T5/mT5 are ill-conditioned: transformers' own float32 log-probs differ from its float64 ones
# by up to 1.6e-2 at some positions (no attention scaling, large activations), and onnxruntime's
# by as much; there a score may move by up to 1e-3 (measured: 1.2e-4). A wrong rule (a length,
# the penalty, a missed candidate) moves a score by a token's log-prob or a length factor: far
# more than either. Tokens are compared exactly everywhere.
SCORE_TOLERANCE = {"marian": 1e-4, "bart": 1e-4, "mbart": 1e-4, "t5": 1e-3, "mt5": 1e-3}


def transformers_beam(checkpoint_dir, texts, max_new_tokens, num_beams, length_penalty=1.0, early_stopping=False,
                      num_return_sequences=1, **settings):
    """transformers' beam search, one text at a time: per text, a list of (ids after the start
    token, sequence score), best first; ``settings``: more generate() arguments."""
    import torch
    from transformers import AutoTokenizer

    model = _model(checkpoint_dir)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
    outputs = []
    for text in texts:
        with torch.no_grad():
            out = model.generate(**tokenizer([text], return_tensors="pt"), do_sample=False, num_beams=num_beams,
                                 max_new_tokens=max_new_tokens, length_penalty=length_penalty,
                                 early_stopping=early_stopping, num_return_sequences=num_return_sequences,
                                 return_dict_in_generate=True, output_scores=True, **settings)
        lengths = (out.beam_indices != -1).sum(dim=1).tolist()  # generated tokens of each sequence
        outputs.append([(tuple(seq[1 : 1 + length]), float(score)) for seq, length, score in
                        zip(out.sequences.tolist(), lengths, out.sequences_scores.tolist())])
    return outputs


_MODELS: dict = {}


def _model(checkpoint_dir):
    import torch
    from transformers import AutoModelForSeq2SeqLM

    if checkpoint_dir not in _MODELS:
        _MODELS[checkpoint_dir] = AutoModelForSeq2SeqLM.from_pretrained(checkpoint_dir, dtype=torch.float32).eval()
    return _MODELS[checkpoint_dir]


def beam_outputs(results):
    return [[(h.ids, h.score) for h in result.sequences] for result in results]


def assert_same(got, expected, context, tolerance):
    assert len(got) == len(expected), context
    for index, (mine, theirs) in enumerate(zip(got, expected)):
        assert [ids for ids, _ in mine] == [ids for ids, _ in theirs], (context, index)
        for (_, a), (_, b) in zip(mine, theirs):
            assert a == pytest.approx(b, rel=tolerance, abs=tolerance), (context, index, a, b)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_beams", [2, 4])
def test_beam_equals_transformers(family, num_beams, random_checkpoint, bundle):
    texts = random_texts(seed=11 + FAMILIES.index(family), count=10)
    checkpoint = random_checkpoint(family)
    generator = Generator(bundle(family))
    expected = transformers_beam(checkpoint, texts, MAX_NEW, num_beams, num_return_sequences=num_beams)
    for batch_size in (1, 8):
        got = generator.generate(texts, max_new_tokens=MAX_NEW, batch_size=batch_size, num_beams=num_beams,
                                 num_return_sequences=num_beams)
        assert_same(beam_outputs(got), expected, (family, num_beams, batch_size), SCORE_TOLERANCE[family])
        assert [r.ids for r in got] == [e[0][0] for e in expected]
        assert [r.score for r in got] == [r.sequences[0].score for r in got]


@pytest.mark.parametrize("family", ["bart", "marian"])
def test_beam_rules_grid(family, random_checkpoint, bundle):
    """Every length penalty x early-stopping setting, num_return_sequences below N, IO binding
    off, and a batch of 2 texts for 9 (groups join as others leave, mid-decode)."""
    texts = random_texts(seed=23, count=8)
    checkpoint = random_checkpoint(family)
    bound, unbound = Generator(bundle(family)), Generator(bundle(family), io_binding=False)
    lengths = set()
    for length_penalty in (0.6, 1.0, 2.0):
        for early_stopping in (True, False, "never"):
            expected = transformers_beam(checkpoint, texts, MAX_NEW, 4, length_penalty, early_stopping, 3)
            lengths |= {len(ids) for per_text in expected for ids, _ in per_text}
            options = dict(num_beams=4, length_penalty=length_penalty, early_stopping=early_stopping,
                           num_return_sequences=3, max_new_tokens=MAX_NEW)
            for generator, batch_size in ((bound, 2), (unbound, 8), (bound, 1)):
                got = generator.generate(texts, batch_size=batch_size, **options)
                assert_same(beam_outputs(got), expected, (length_penalty, early_stopping, batch_size),
                            SCORE_TOLERANCE[family])
    assert min(lengths) < MAX_NEW  # hypotheses that end on EOS, and at the limit
    assert MAX_NEW in lengths


def test_five_beams_need_top_k_ten(tmp_path, random_checkpoint, bundle):
    from aggdec.export import export_bundle

    with pytest.raises(InputError, match="re-export with --top-k 10"):
        Generator(bundle("bart")).generate(["a b"], num_beams=5)
    export_bundle(random_checkpoint("bart"), tmp_path / "bundle", top_k=10, progress=None)
    generator = Generator(tmp_path / "bundle")
    texts = random_texts(seed=5, count=6)
    expected = transformers_beam(random_checkpoint("bart"), texts, MAX_NEW, 5, num_return_sequences=5)
    for batch_size in (1, 3):
        got = generator.generate(texts, max_new_tokens=MAX_NEW, num_beams=5, num_return_sequences=5,
                                 batch_size=batch_size)
        assert_same(beam_outputs(got), expected, batch_size, SCORE_TOLERANCE["bart"])


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_beams_on_a_vocabulary_smaller_than_their_candidates(family, tmp_path):
    """N beams keep 2N continuations a step; on a vocabulary of V < 2N ids a top-k of all V
    holds every candidate, as transformers' top-2N over the N x V scores does (V >= 2): these
    were refused for want of a top-k of 2N. IAD beams draft over them alike."""
    from aggdec.export import export_bundle
    from tests.support.tiny import build_random_checkpoint

    checkpoint = build_random_checkpoint(family, tmp_path / "ckpt", seed=3, vocab_words=["a", "b"])
    export_bundle(checkpoint, tmp_path / "bundle", progress=None)
    generator = Generator(tmp_path / "bundle")
    vocab = generator.manifest.vocab_size
    assert generator.manifest.top_k == vocab < 8
    texts = ["a b", "b", "a a b", "b b a b", "a"]
    for num_beams in (4, 5):
        expected = transformers_beam(checkpoint, texts, 8, num_beams, num_return_sequences=3)
        for mode, batch_size in (("greedy", 1), ("greedy", 3), ("iad", 2)):
            got = generator.generate(texts, max_new_tokens=8, num_beams=num_beams, num_return_sequences=3,
                                     batch_size=batch_size, mode=mode)
            assert_same(beam_outputs(got), expected, (num_beams, mode, batch_size), SCORE_TOLERANCE[family])


def test_beams_need_two_ids():
    from aggdec.runtime.options import DecodeOptions, OptionLimits

    with pytest.raises(InputError, match="beam search needs a vocabulary of 2 ids or more, and 'the bundle' has 1"):
        DecodeOptions("greedy", num_beams=2).resolve(OptionLimits(top_k=1, drafter_k=None, vocab_size=1))
    DecodeOptions("greedy", num_beams=2).resolve(OptionLimits(top_k=2, drafter_k=None, vocab_size=2))


def test_stream_and_generate_ids_give_beam_results(bundle):
    generator = Generator(bundle("bart"))
    texts = random_texts(seed=2, count=5)
    expected = generator.generate(texts, max_new_tokens=MAX_NEW, num_beams=3, num_return_sequences=2)
    streamed = dict(generator.stream(texts, max_new_tokens=MAX_NEW, num_beams=3, num_return_sequences=2,
                                     batch_size=2))
    assert [streamed[i].sequences for i in range(len(texts))] == [r.sequences for r in expected]
    one = generator.generate_ids(generator.encode(texts[:1])[0], max_new_tokens=MAX_NEW, num_beams=3,
                                 num_return_sequences=2)
    assert one.sequences == expected[0].sequences
    assert expected[0].stats.iterations >= 1


@pytest.mark.parametrize("options, message", [
    (dict(num_beams=0), "num_beams must be an integer of at least 1"),
    (dict(num_beams=-2), "num_beams must be an integer of at least 1"),
    (dict(num_beams=2.5), "num_beams must be an integer of at least 1"),
    (dict(num_beams=True), "num_beams must be an integer of at least 1"),
    (dict(num_beams=2, num_return_sequences=3), r"num_return_sequences \(3\) must be at most num_beams \(2\)"),
    (dict(num_beams=2, num_return_sequences=0), "num_return_sequences must be an integer of at least 1"),
    (dict(num_beams=2, early_stopping="sometimes"), "early_stopping must be True, False or 'never'"),
    (dict(num_beams=2, length_penalty=float("nan")), "length_penalty must be a finite number"),
    (dict(num_beams=2, length_penalty=400.0), "length_penalty must be between"),  # was an OverflowError
    (dict(length_penalty=2.0), "length_penalty applies to beam search only"),
    (dict(num_beams=1, num_return_sequences=1), "num_return_sequences applies to beam search only"),
    (dict(num_beams=2, mode="gad++"), "num_beams applies to modes 'greedy', 'iad' and 'gad' only"),
])
def test_bad_beam_options(options, message, bundle):
    generator = Generator(bundle("bart"))
    with pytest.raises(InputError, match=message):
        generator.generate(["a b"], **options)


def test_too_few_candidates_for_beams_name_what_would_do():
    """A bundle of top-k 2 or 3 (a vocabulary that small) has room for no beam search: the
    refusal said "use at most 1 beams" (or 0), which would not run either."""
    import re

    from aggdec.runtime.options import DecodeOptions, OptionLimits

    for top_k, advice in ((2, "too few for any beam search (2 beams need top-k 4)"), (3, "too few for any"),
                          (6, "use at most 3 beams")):
        with pytest.raises(InputError, match=rf"has top-k {top_k}; {re.escape(advice)}.*re-export with --top-k 8"):
            DecodeOptions("greedy", num_beams=4).resolve(OptionLimits(top_k=top_k, drafter_k=None))


def test_one_beam_is_greedy(bundle):
    generator = Generator(bundle("bart"))
    texts = random_texts(seed=4, count=4)
    assert [r.ids for r in generator.generate(texts, num_beams=1)] == [r.ids for r in generator.generate(texts)]
    assert generator.resolve_options(num_beams=1) == generator.resolve_options()


def test_beams_refused_beyond_a_loops_rows(bundle):
    from aggdec.runtime.continuous import RowDecoder
    from aggdec.runtime.decoding.arrivals import Arrivals
    from aggdec.runtime.options import DecodeOptions

    decoder = RowDecoder(Generator(bundle("bart")))
    with pytest.raises(InputError, match="num_beams 4 takes more rows than the 3"):
        decoder.rows(Arrivals(), DecodeOptions(num_beams=4), batch_size=3)


@pytest.mark.parametrize("cache_kind", ["attention", "recurrent"])
def test_copy_rows_moves_only_the_decoders_own_cache(cache_kind):
    import numpy as np

    from aggdec.runtime.decoding.cache import SlotBuffers

    buffers = SlotBuffers(layers=2, heads=2, head_dim=3, d_model=6, slots=4, max_target=8, max_source=5,
                          device="cpu", bound=True, keep_hidden=False, cache_kind=cache_kind)
    rng = np.random.default_rng(0)
    cross = [rng.standard_normal((4, 2, 5, 3)).astype(np.float32) for _ in range(4)]
    buffers.add_rows(cross, np.ones((4, 5), dtype=np.int64), None)
    names = [f"x{i}" for i in range(len(buffers._self))]
    for flat in buffers._self:
        flat.view(buffers.self_shape())[:] = rng.standard_normal(buffers.self_shape())
    before = {name: view.copy() for name, view in buffers.feeds(names, [f"c{i}" for i in range(4)]).items()}
    layout = buffers.layout
    buffers.copy_rows([2, 0], [0, 3])  # row 0 takes row 2's cache, row 3 row 0's (as it was)
    after = buffers.feeds(names, [f"c{i}" for i in range(4)])
    for name in names:
        assert np.array_equal(after[name][0], before[name][2])
        assert np.array_equal(after[name][3], before[name][0])
        assert np.array_equal(after[name][1:3], before[name][1:3])
    for i in range(4):  # cross rows untouched
        assert np.array_equal(after[f"c{i}"], before[f"c{i}"])
    assert buffers.layout == layout  # a binding made before stays valid


def test_banned_ids_keep_transformers_log_probs(tmp_path, random_checkpoint):
    """A checkpoint that bans ids (real OPUS-MT ones ban <pad>): transformers' beam search
    normalizes the log-softmax over every id and then sets the banned ones to -inf, so the
    verifier must too (Manifest.suppression), or every score is off by log(1 - p(banned))."""
    import json
    import shutil

    from aggdec.export import export_bundle

    src = tmp_path / "ckpt"
    shutil.copytree(random_checkpoint("marian"), src)
    texts = random_texts(seed=8, count=6)
    plain = transformers_beam(src, texts, MAX_NEW, 3, num_return_sequences=3)
    # ban the tokens the unbanned beams use most: the bans change the search
    counts: dict[int, int] = {}
    for per_text in plain:
        for ids, _ in per_text:
            for token in ids[:-1]:
                counts[token] = counts.get(token, 0) + 1
    banned = sorted(counts, key=counts.get, reverse=True)[:2]
    config = json.loads((src / "generation_config.json").read_text())
    config["bad_words_ids"] = [[token] for token in banned]
    (src / "generation_config.json").write_text(json.dumps(config))
    _MODELS.pop(src, None)
    manifest = export_bundle(src, tmp_path / "bundle", progress=None)
    assert manifest.suppression == "after_log_softmax" and manifest.suppressed_token_ids == tuple(sorted(banned))
    expected = transformers_beam(src, texts, MAX_NEW, 3, num_return_sequences=3)
    assert expected != plain
    got = Generator(tmp_path / "bundle").generate(texts, max_new_tokens=MAX_NEW, num_beams=3, num_return_sequences=3)
    assert_same(beam_outputs(got), expected, "banned", SCORE_TOLERANCE["marian"])

    # a bundle whose verifier masks before the log-softmax (older exports) is refused for beams
    manifest_path = tmp_path / "bundle" / "manifest.json"
    data = json.loads(manifest_path.read_text())
    del data["suppression"]
    manifest_path.write_text(json.dumps(data))
    old = Generator(tmp_path / "bundle")
    with pytest.raises(InputError, match="re-export it with this aggdec for beam search"):
        old.generate(texts, num_beams=2)


@pytest.mark.parametrize("family", ["bart", "marian", "t5"])
def test_speculative_beam_equals_plain_beam(family, bundle, editing_bundle):
    """IAD beam search (each hypothesis drafts its source; beam steps replayed over one block
    call's scores) gives plain beam search's hypotheses and scores exactly: the same float32
    values, since a block position computes what it computes alone. Random models rarely
    follow their source, so the trained editing model (which mostly copies) is where steps
    are replayed; the test checks that some were there (how many: benchmarks/results)."""
    import random

    from aggdec.runtime.decoding.iad import BlockOptions
    from tests.support.tiny import make_editing_pair

    rng = random.Random(3)
    edited = [make_editing_pair(rng)[0] for _ in range(10)]
    for path, texts in ((bundle(family), random_texts(seed=31, count=8)), (editing_bundle, edited)):
        for io_binding in (True, False):
            generator = Generator(path, io_binding=io_binding)
            for length_penalty, early_stopping in ((1.0, False), (0.6, True), (2.0, "never")):
                options = dict(num_beams=4, num_return_sequences=4, length_penalty=length_penalty,
                               early_stopping=early_stopping, max_new_tokens=MAX_NEW)
                plain = generator.generate(texts, batch_size=8, **options)
                # fixed drafts (every aligned row drafts max_block: the most replay), and the
                # default adaptive ones (group sizers on measured call costs: rests and probes)
                adaptive = ((1, None), (8, None)) if io_binding and not early_stopping else ()
                for batch_size, block in ((1, BlockOptions(max_block=7, adaptive=False)),
                                          (8, BlockOptions(max_block=3, adaptive=False)),
                                          (2, BlockOptions(max_block=64, adaptive=False)), *adaptive):
                    spec = generator.generate(texts, mode="iad", block=block, batch_size=batch_size, **options)
                    assert [r.sequences for r in spec] == [r.sequences for r in plain], (path, batch_size, block)
                    if path == editing_bundle and block is not None:  # some calls replayed several beam steps
                        assert max(step for r in spec for step in r.stats.accepted) > 1


def test_speculative_beam_rests_where_drafts_do_not_pay(editing_bundle):
    """A beam group sizes its drafts from the steps its calls replay and the cost of a wider
    call: where one more position costs as much as a whole step (cost_ratio 1: a replayed
    second step can at best pay for it), the group stops drafting after its first calls,
    takes plain beam steps and tries again after rests that double (one probe, not one per
    call); where positions are nearly free it drafts on every call it can. Output is plain
    beam search's either way."""
    import random

    from aggdec.runtime.decoding.iad import FIRST_REST, BlockOptions
    from tests.support.tiny import make_editing_pair

    rng = random.Random(5)
    texts = [make_editing_pair(rng)[0] for _ in range(6)]
    generator = Generator(editing_bundle)
    options = dict(num_beams=4, num_return_sequences=4, max_new_tokens=MAX_NEW, batch_size=1)
    plain = generator.generate(texts, **options)
    costly = generator.generate(texts, mode="iad", block=BlockOptions(cost_ratio=1.0), **options)
    cheap = generator.generate(texts, mode="iad", block=BlockOptions(cost_ratio=0.0), **options)
    for spec in (costly, cheap):
        assert [r.sequences for r in spec] == [r.sequences for r in plain]
    for r in costly:
        drafted = r.stats.drafted  # per call, the group's draft tokens (all rows)
        plain_steps = drafted.count(0)
        assert plain_steps >= min(FIRST_REST, len(drafted) - 2), drafted
        # after a failed try, no two drafted calls in a row
        tries = [i for i, d in enumerate(drafted) if d]
        assert all(b - a > 1 for a, b in zip(tries[1:], tries[2:])), drafted
    drafted_cheap = sum(1 for r in cheap for d in r.stats.drafted if d)
    drafted_costly = sum(1 for r in costly for d in r.stats.drafted if d)
    assert drafted_cheap > 2 * drafted_costly, (drafted_cheap, drafted_costly)


def test_forced_bos_and_eos_follow_transformers(tmp_path, random_checkpoint):
    """A checkpoint that forces its first and last tokens (mBART/BART-style generation configs):
    the forced BOS is the decoder prefix (the first beam at 0, the others at -1e9), the forced
    EOS the only finite token at the length limit, as transformers' processors leave them."""
    import json
    import shutil

    from aggdec.export import export_bundle

    src = tmp_path / "ckpt"
    shutil.copytree(random_checkpoint("bart"), src)
    config = json.loads((src / "generation_config.json").read_text())
    bos = config["bos_token_id"]  # a special token, as a forced BOS must be (the bundle checks)
    config["forced_bos_token_id"] = bos
    config["forced_eos_token_id"] = config["eos_token_id"]
    (src / "generation_config.json").write_text(json.dumps(config))
    manifest = export_bundle(src, tmp_path / "bundle", progress=None)
    assert (manifest.forced_bos_token_id, manifest.forced_eos_token_id) == (bos, config["eos_token_id"])
    texts = random_texts(seed=9, count=8)
    generator = Generator(tmp_path / "bundle")
    for max_new_tokens in (3, MAX_NEW):
        expected = transformers_beam(src, texts, max_new_tokens, 3, length_penalty=0.6, num_return_sequences=3)
        assert all(ids[0] == bos for per_text in expected for ids, _ in per_text)
        got = generator.generate(texts, max_new_tokens=max_new_tokens, num_beams=3, length_penalty=0.6,
                                 num_return_sequences=3, batch_size=4)
        assert_same(beam_outputs(got), expected, max_new_tokens, SCORE_TOLERANCE["bart"])


def test_replay_payoff_compares_time_per_step():
    """ReplayPayoff: drafted against plain iterations' seconds per beam step, per width class;
    no verdict until both kinds were seen a few times."""
    from aggdec.runtime.decoding.sizing import ReplayPayoff

    payoff = ReplayPayoff()
    for _ in range(3):
        payoff.observe(4, True, 0.003, 1.2)  # 2.5 ms a step
        payoff.observe(4, False, 0.002, 1.0)  # 2 ms a step
    assert payoff.pays(4) is None  # seen too few times
    for _ in range(3):
        payoff.observe(4, True, 0.003, 1.2)
        payoff.observe(4, False, 0.002, 1.0)
    assert payoff.pays(4) is False and payoff.pays(5) is False  # 4-7 rows: one class
    assert payoff.pays(8) is None  # another class: nothing seen
    for _ in range(200):  # drafted iterations replaying more steps: drafting now pays
        payoff.observe(4, True, 0.003, 2.0)
    assert payoff.pays(4) is True
    payoff.reset()
    assert payoff.pays(4) is None


def test_speculative_beam_vetoed_where_drafted_iterations_were_slower(editing_bundle):
    """Where the measured drafted iterations took longer per beam step than plain ones, the
    batch drafts only its tries after rests (one token a row), whatever the cost model says;
    the output is plain beam search's."""
    import random

    from tests.support.tiny import make_editing_pair

    rng = random.Random(8)
    texts = [make_editing_pair(rng)[0] for _ in range(6)]
    generator = Generator(editing_bundle)
    options = dict(num_beams=4, num_return_sequences=4, max_new_tokens=MAX_NEW, batch_size=1)
    plain = generator.generate(texts, **options)
    for _ in range(50):  # drafted iterations 10x slower a step, at 4 rows
        generator.beam_gate.payoff.observe(4, True, 0.010, 1.0)
        generator.beam_gate.payoff.observe(4, False, 0.001, 1.0)
    spec = generator.generate(texts, mode="iad", **options)
    assert [r.sequences for r in spec] == [r.sequences for r in plain]
    for r in spec:
        drafted = r.stats.drafted
        assert all(d <= 4 for d in drafted), drafted  # tries: at most one token for each of 4 rows
        assert sum(1 for d in drafted if d) <= 1 + len(drafted) // 4, drafted
    # the rests between tries are the Generator's, sized by what a try lost (here 9 plain steps'
    # time: a rest of hundreds of steps), not a batch's own: one decode a sentence tried after
    # 4 and 8 plain steps of every sentence, and GAD beam 4, whose drafter call costs several
    # steps, ran at 0.75x plain beam 4 one sentence at a time
    heard = []  # the plain steps inside a rest are neither timed nor sized (DraftGate.rests)
    observe = generator.beam_gate.payoff.observe
    generator.beam_gate.payoff.observe = lambda *args, **kwargs: heard.append(args) or observe(*args, **kwargs)
    alone = [generator.generate([text], mode="iad", **options)[0] for text in texts]
    assert [r.sequences for r in alone] == [r.sequences for r in plain]
    assert all(not any(r.stats.drafted) for r in alone), [r.stats.drafted for r in alone]
    assert len(heard) < sum(r.stats.iterations for r in alone) / 4, len(heard)


def test_sources_of_one_loop_each_keep_their_own_beam_scoring(bundle):
    """A server keeps one decode loop for every beam request of the same mode and num_beams:
    each source carries its length_penalty, early_stopping and num_return_sequences
    (``Work.beams``), and gets what ``generate`` gives with those options alone."""
    import dataclasses

    from aggdec.runtime.continuous import RowDecoder
    from aggdec.runtime.decoding.arrivals import Arrivals, Work

    generator = Generator(bundle("bart"))
    rows = RowDecoder(generator)
    texts = random_texts(seed=6, count=6)
    scorings = [dict(length_penalty=0.6, early_stopping="never", num_return_sequences=3),
                dict(length_penalty=2.0, early_stopping=True), dict(length_penalty=-1.0, num_return_sequences=2)]
    loop = generator.resolve_options("iad", num_beams=3)
    assert all(generator.resolve_options("iad", num_beams=3, **scoring).loop_options.resolve(
        generator.option_limits) == loop for scoring in scorings)
    work = Arrivals()
    for index, text in enumerate(texts):
        options = generator.resolve_options("iad", num_beams=3, **scorings[index % 3])
        work.put(Work(index, rows.prepare(text)[1], rows.limits(MAX_NEW), rows.beam_rules(options)))
    work.close()
    got = {done.index: rows.result(done, texts[done.index]) for done in rows.rows(work, loop.loop_options, 6)}
    for index, text in enumerate(texts):
        (want,) = generator.generate([text], mode="greedy", num_beams=3, max_new_tokens=MAX_NEW, **scorings[index % 3])
        assert [(h.ids, h.score) for h in got[index].sequences] == [(h.ids, h.score) for h in want.sequences]
    # the loop's batch holds num_beams rows a source: a source asking for other beams is refused
    work = Arrivals()
    other = dataclasses.replace(rows.beam_rules(loop), num_beams=2)
    work.put(Work(0, rows.prepare(texts[0])[1], None, other))
    work.close()
    with pytest.raises(ValueError, match="asks for 2 beams .* in a loop of 3"):
        list(rows.rows(work, loop, 6))
    work = Arrivals()  # nor are a source's beams dropped in a greedy loop
    work.put(Work(0, rows.prepare(texts[0])[1], None, rows.beam_rules(loop)))
    work.close()
    with pytest.raises(ValueError, match="asks for 3 beams .* in a loop without beams"):
        list(rows.rows(work, "iad", 6))


def test_gad_beam_makes_no_try_that_could_only_lose(gad_bundle):  # noqa: F811 - the fixture imported above
    """A 1-token try replays at most one more step a group; where the drafter call alone is
    measured dearer than a plain step (the reference model's drafter: several, beam-gate-cpu), a
    try could only lose, and the batch's rests no longer end in one. Each decode tried after 4
    and 12 plain steps (one sentence a call: twice a sentence); the output is plain beam's."""
    texts = random_texts(seed=9, count=4)
    generator = Generator(gad_bundle("marian"))
    options = dict(num_beams=4, max_new_tokens=MAX_NEW, batch_size=1)
    plain = generator.generate(texts, **options)
    costs = generator.gad_beam_costs
    for width in (1, 2, 3):  # a plain iteration of 4 rows: 1 ms, a drafter call for them: 10 ms
        for _ in range(8):
            costs.observe(width, 0.001 * (1 + 0.3 * (width - 1)), 4)
    costs.observe_drafter(0.010, 4)
    alone = [generator.generate([text], mode="gad", **options)[0] for text in texts]
    assert [r.sequences for r in alone] == [r.sequences for r in plain]
    assert all(len(r.stats.drafted) > 5 for r in alone)  # long enough for the rests to end
    assert all(not any(r.stats.drafted) for r in alone), [r.stats.drafted for r in alone]
