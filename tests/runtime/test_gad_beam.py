"""Speculative beam search with GAD drafts (``--mode gad --num-beams N``) == plain beam search.

Each hypothesis gets the drafter's draft of its own prefix; beam steps are replayed over one
block call's scores while every selected hypothesis lies on a drafted path. The output must be
plain beam search's exactly: the same hypotheses, the same float32 scores (a block position
computes what it computes alone). The trained editing model and its distilled drafter are
where drafts are followed, so replay happens there; the tests check that it did (fewer
verifier calls than plain beam) and that the output did not move.
"""

from __future__ import annotations

import random

import pytest

from aggdec.runtime.decoding.sizing import BlockOptions
from aggdec.runtime.errors import BundleError, InputError
from aggdec.runtime.generator import Generator
from tests.runtime.test_drafter_source import layered_bundle  # noqa: F401 - a fixture
from tests.runtime.test_lossless import random_texts
from tests.support.tiny import make_editing_pair

MAX_NEW = 16


@pytest.fixture(scope="module")
def editing_gad_bundle(tmp_path_factory, editing_marian_dir, trained_drafter_dir):
    """The trained editing Marian exported with its trained drafter (k = 8)."""
    from aggdec.export import export_bundle

    out = tmp_path_factory.mktemp("bundle-editing-gad") / "bundle"
    export_bundle(editing_marian_dir, out, drafter_dir=trained_drafter_dir, progress=None)
    return out


def _calls(results):
    """Verifier calls of every text's beam group."""
    return sum(r.stats.iterations for r in results)


@pytest.mark.parametrize("num_beams", [2, 4])
def test_gad_beam_equals_plain_beam(num_beams, editing_gad_bundle):
    """Every hypothesis and score of plain beam search, at batch 1 and 8 (10 texts: rows join
    mid-decode as groups finish), IO binding on and off, the length penalties and early
    stopping settings of the IAD beam tests; fixed drafts (every row drafts max_block: the
    most replay) take fewer verifier calls than plain beam, and the default adaptive drafts
    (measured costs: rests and probes) give the same output."""
    rng = random.Random(3)
    texts = [make_editing_pair(rng)[0] for _ in range(10)]
    for io_binding in (True, False):
        generator = Generator(editing_gad_bundle, io_binding=io_binding)
        for length_penalty, early_stopping in ((1.0, False), (0.6, True), (2.0, "never")):
            options = dict(num_beams=num_beams, num_return_sequences=num_beams, length_penalty=length_penalty,
                           early_stopping=early_stopping, max_new_tokens=MAX_NEW)
            plain = generator.generate(texts, batch_size=8, **options)
            adaptive = ((1, None), (8, None)) if io_binding and not early_stopping else ()
            for batch_size, block in ((1, BlockOptions(max_block=8, adaptive=False)),
                                      (8, BlockOptions(max_block=3, adaptive=False)), *adaptive):
                spec = generator.generate(texts, mode="gad", block=block, batch_size=batch_size, **options)
                where = (io_binding, length_penalty, early_stopping, batch_size, block)
                assert [r.sequences for r in spec] == [r.sequences for r in plain], where
                if block is not None:
                    # replay happened: some calls took several beam steps, so fewer calls in all
                    assert max(step for r in spec for step in r.stats.accepted) > 1, where
                    assert _calls(spec) < _calls(plain), (where, _calls(spec), _calls(plain))
                    # a group's draft tokens a call: at most max_block for each of its rows
                    assert max(d for r in spec for d in r.stats.drafted) <= num_beams * block.max_block


def test_gad_beam_with_a_random_drafter_equals_plain_beam(drafter_bundle):
    """A random (untrained) drafter's drafts are mostly wrong: replay rarely holds, and the
    first step off the drafted paths must still be plain beam's (BART: another family, a
    drafter whose k of 25 is capped by draft_k)."""
    from aggdec.export.drafter import new_drafter_from_verifier

    path = drafter_bundle("bart", "gad-beam", lambda model: new_drafter_from_verifier(model, layers=2, k=25,
                                                                                       seed=1))[0]
    texts = random_texts(seed=41, count=8)
    generator = Generator(path)
    options = dict(num_beams=3, num_return_sequences=2, max_new_tokens=MAX_NEW)
    plain = generator.generate(texts, batch_size=4, **options)
    for batch_size, draft_k in ((1, 25), (4, 2)):
        spec = generator.generate(texts, mode="gad", block=BlockOptions(max_block=64, adaptive=False),
                                  draft_k=draft_k, batch_size=batch_size, **options)
        assert [r.sequences for r in spec] == [r.sequences for r in plain], (batch_size, draft_k)
        # max_block is capped by draft_k; every call drafted (fixed drafting) until the limit
        assert max(d for r in spec for d in r.stats.drafted) <= 3 * draft_k
        assert all(d > 0 for r in spec for d in r.stats.drafted[:2])


def test_gad_beam_stream_and_server_options(editing_gad_bundle):
    """stream and generate_ids take GAD beams like plain ones, and a decode loop's rows (the
    server's continuous batching) hold N rows a text."""
    from aggdec.runtime.continuous import RowDecoder
    from aggdec.runtime.options import DecodeOptions

    rng = random.Random(7)
    texts = [make_editing_pair(rng)[0] for _ in range(5)]
    generator = Generator(editing_gad_bundle)
    options = dict(num_beams=3, num_return_sequences=2, max_new_tokens=MAX_NEW)
    plain = generator.generate(texts, **options)
    streamed = dict(generator.stream(texts, mode="gad", batch_size=2, **options))
    assert [streamed[i].sequences for i in range(len(texts))] == [r.sequences for r in plain]
    one = generator.generate_ids(generator.encode(texts[:1])[0], mode="gad", **options)
    assert one.sequences == plain[0].sequences
    decoder = RowDecoder(generator)
    with pytest.raises(InputError, match="num_beams 4 takes more rows than the 3"):
        from aggdec.runtime.decoding.arrivals import Arrivals

        decoder.rows(Arrivals(), DecodeOptions("gad", num_beams=4), batch_size=3)


def test_bad_gad_beam_options(bundle, editing_gad_bundle):
    generator = Generator(editing_gad_bundle)
    with pytest.raises(InputError, match="block applies to mode 'gad' with num_beams only"):
        generator.generate(["a b"], mode="gad", block=BlockOptions(max_block=2))
    with pytest.raises(InputError, match="num_beams applies to modes 'greedy', 'iad' and 'gad' only, not 'gad\\+\\+'"):
        generator.generate(["a b"], mode="gad++", num_beams=2)
    with pytest.raises(InputError, match="draft_k must be an integer between 1 and the drafter's k \\(8\\)"):
        generator.generate(["a b"], mode="gad", num_beams=2, draft_k=9)
    with pytest.raises(InputError, match="num_beams 5 needs the verifier's top-10"):
        generator.generate(["a b"], mode="gad", num_beams=5)
    with pytest.raises(BundleError, match="mode 'gad' needs a drafter"):
        Generator(bundle("marian")).generate(["w1"], mode="gad", num_beams=2)


def test_gad_beam_over_http_and_the_cli(editing_gad_bundle, tmp_path):
    """`/v1/generate` with mode gad and num_beams (the server's continuous batching: a text
    takes N rows of its batch), and `aggdec generate --mode gad --num-beams`, give plain beam
    search's hypotheses and scores."""
    import json

    pytest.importorskip("fastapi")
    from tests.serve.running import Running
    from tests.test_cli import aggdec

    rng = random.Random(11)
    texts = [make_editing_pair(rng)[0] for _ in range(4)]
    generator = Generator(editing_gad_bundle, threads=1)
    options = dict(num_beams=2, num_return_sequences=2, length_penalty=0.6)
    want = generator.generate(texts, max_new_tokens=MAX_NEW, **options)
    running = Running(generator, max_batch=4, max_wait_ms=2, max_queue=16, max_texts=8, max_body_bytes=4096)
    try:
        response = running.generate(texts, mode="gad", max_new_tokens=MAX_NEW, **options)
    finally:
        running.stop()
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    assert [[(s["ids"], s["score"]) for s in item["sequences"]] for item in outputs] == \
        [[(list(h.ids), h.score) for h in w.sequences] for w in want]

    source = tmp_path / "in.txt"
    source.write_text("".join(t + "\n" for t in texts))
    result = aggdec("generate", str(editing_gad_bundle), "--input", str(source), "--mode", "gad", "--num-beams", "2",
                    "--length-penalty", "0.6", "--num-return-sequences", "2", "--format", "jsonl",
                    "--max-new-tokens", str(MAX_NEW))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [[(s["ids"], s["score"]) for s in r["sequences"]] for r in records] == \
        [[(list(h.ids), h.score) for h in w.sequences] for w in want]


def test_gad_beam_rests_where_the_drafter_call_does_not_pay(editing_gad_bundle):
    """The drafter call is a cost of drafting at all: where it measured far above a plain
    iteration (here: 10 s against about a millisecond), no draft length pays, and the batch
    takes plain beam steps, drafting only its tries after rests (one token a row); the
    output is plain beam search's."""
    rng = random.Random(8)
    texts = [make_editing_pair(rng)[0] for _ in range(6)]
    generator = Generator(editing_gad_bundle)
    options = dict(num_beams=4, num_return_sequences=4, max_new_tokens=MAX_NEW, batch_size=1)
    plain = generator.generate(texts, **options)
    cheap = generator.generate(texts, mode="gad", **options)  # measured: a drafter call of about a step
    generator.gad_beam_costs.observe_drafter(10.0, 4)
    costly = generator.generate(texts, mode="gad", **options)
    for spec in (cheap, costly):
        assert [r.sequences for r in spec] == [r.sequences for r in plain]
    for r in costly:
        drafted = r.stats.drafted
        assert all(d <= 4 for d in drafted), drafted  # tries: at most one token for each of 4 rows
        assert sum(1 for d in drafted if d) <= 1 + len(drafted) // 4, drafted
    drafted_cheap = sum(d for r in cheap for d in r.stats.drafted)
    drafted_costly = sum(d for r in costly for d in r.stats.drafted)
    assert drafted_cheap > drafted_costly, (drafted_cheap, drafted_costly)


def test_gad_beam_with_drafter_source_layers(layered_bundle):  # noqa: F811 - the fixture imported above
    """A drafter with source layers of its own: they run once per source (its N rows share the
    result, replicated as the encoder's), and the beams equal plain beam's."""
    bundle, _ = layered_bundle("marian")
    generator = Generator(bundle)
    texts = random_texts(seed=43, count=5)
    options = dict(num_beams=2, num_return_sequences=2, max_new_tokens=MAX_NEW)
    plain = generator.generate(texts, batch_size=2, **options)
    sources = []
    run_source = generator.drafter.source.run
    generator.drafter.source.run = lambda feeds: sources.append(len(feeds["encoder_attention_mask"])) or \
        run_source(feeds)
    spec = generator.generate(texts, mode="gad", block=BlockOptions(max_block=4, adaptive=False), batch_size=2,
                              **options)
    assert [r.sequences for r in spec] == [r.sequences for r in plain]
    assert sum(sources) == len(texts)
