"""Lossless: IAD == greedy == transformers' greedy `generate`, token for token.

Checked per family on random tiny models and random inputs: batch 1 and batched greedy,
with and without IO binding, at several IAD block sizes (so that EOS and the length limit
fall at every offset of a block), on sources with repeated n-grams (ambiguous suffix
matches), length-1 sources and maximum-length sources.
"""

from __future__ import annotations

import random

import pytest

from aggdec.runtime.decoding.iad import BlockOptions
from aggdec.runtime.generator import Generator
from tests.support.tiny import FAMILIES, default_words

MAX_NEW = 24


def random_texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    words = default_words()
    texts = []
    for index in range(count):
        if index % 4 == 0:  # repeated n-grams: the suffix match must look further back
            gram = [rng.choice(words) for _ in range(rng.randint(1, 3))]
            filler = [rng.choice(words) for _ in range(rng.randint(0, 4))]
            texts.append(" ".join(gram * rng.randint(2, 4) + filler + gram))
        else:
            texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))))
    texts.append(rng.choice(words))  # one word: source = word + specials
    return texts


def transformers_greedy(checkpoint_dir, texts, max_new_tokens, **settings):
    """transformers' own greedy decoding, one text at a time, as token ids after the start token;
    ``settings``: more generate() arguments (a generation config's, overridden)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir)
    outputs = []
    for text in texts:
        with torch.no_grad():
            ids = model.generate(**tokenizer([text], return_tensors="pt"), do_sample=False, num_beams=1,
                                 max_new_tokens=max_new_tokens, **settings)[0].tolist()
        outputs.append(tuple(ids[1:]))
    return outputs


def check_drafting_equals_greedy(bundle, checkpoint_dir, texts, max_new_tokens, draft_ks, modes=("gad",)):
    """GAD (and GAD++ at beta 1) equal greedy, which equals transformers' greedy: with the int8 and
    the float drafter, IO binding on and off, batch 1 and 5, each draft length. Returns the
    Generators it made, for checks of their own."""
    from aggdec.runtime.generator import Generator
    from aggdec.runtime.tuning import Tuning

    expected, generators = None, []
    for int8_drafter in (None, False):
        for io_binding in (True, False):
            # the rows' sizing alone: the gate (Tuning.draft_payoff) may measure a tiny model's
            # drafter calls not paying and take plain steps, which would check no draft
            generator = Generator(bundle, int8_drafter=int8_drafter, io_binding=io_binding,
                                  tuning=Tuning(draft_payoff=False))
            generators.append(generator)
            greedy = [r.ids for r in generator.generate(texts, mode="greedy", max_new_tokens=max_new_tokens)]
            if expected is None:
                assert greedy == transformers_greedy(checkpoint_dir, texts, max_new_tokens)
                expected = greedy
            assert greedy == expected
            for batch_size in (1, 5):
                for k in draft_ks:
                    for mode in modes:
                        beta = {"beta": 1} if mode == "gad++" else {}  # gad++ at beta 1 is greedy too
                        got = generator.generate(texts, mode=mode, max_new_tokens=max_new_tokens, draft_k=k,
                                                 batch_size=batch_size, **beta)
                        assert [r.ids for r in got] == expected, (mode, int8_drafter, io_binding, batch_size, k)
    return generators


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_and_iad_equal_transformers(family, random_checkpoint, bundle):
    texts = random_texts(seed=FAMILIES.index(family), count=24)  # hash() of a str differs per process
    expected = transformers_greedy(random_checkpoint(family), texts, MAX_NEW)
    generator = Generator(bundle(family))
    greedy_single = [r.ids for r in generator.generate(texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=1)]
    greedy_batched = [r.ids for r in generator.generate(texts, mode="greedy", max_new_tokens=MAX_NEW, batch_size=5)]
    assert greedy_single == expected
    assert greedy_batched == expected
    for max_block in (1, 2, 3, 7, 64):
        options = BlockOptions(max_block=max_block, adaptive=False)
        iad = [r.ids for r in generator.generate(texts, mode="iad", max_new_tokens=MAX_NEW, block=options)]
        assert iad == expected, f"IAD with blocks of {max_block} differs from greedy"
    adaptive = [r.ids for r in generator.generate(texts, mode="iad", max_new_tokens=MAX_NEW)]
    assert adaptive == expected
    # the outputs are not degenerate: some stop on EOS, some at the limit, lengths vary
    assert len({len(ids) for ids in expected}) > 3


@pytest.mark.parametrize("family", FAMILIES)
def test_io_binding_on_and_off_agree(family, bundle):
    texts = random_texts(seed=7, count=8)
    bound = Generator(bundle(family), io_binding=True)
    unbound = Generator(bundle(family), io_binding=False)
    for mode in ("greedy", "iad"):
        assert [r.ids for r in bound.generate(texts, mode=mode, max_new_tokens=MAX_NEW)] == \
            [r.ids for r in unbound.generate(texts, mode=mode, max_new_tokens=MAX_NEW)]


@pytest.mark.parametrize("max_new_tokens", range(1, 12))
def test_every_length_limit(max_new_tokens, random_checkpoint, bundle):
    """The limit falls at every position: inside a block, at its end, on EOS."""
    texts = random_texts(seed=3, count=6)
    expected = transformers_greedy(random_checkpoint("bart"), texts, max_new_tokens)
    generator = Generator(bundle("bart"))
    for mode in ("greedy", "iad"):
        assert [r.ids for r in generator.generate(texts, mode=mode, max_new_tokens=max_new_tokens)] == expected


def test_maximum_length_source(bundle):
    generator = Generator(bundle("marian"))
    limit = generator.manifest.max_source_len
    words = default_words()
    longest = " ".join(words[i % len(words)] for i in range(limit - 1))  # + EOS = the limit
    assert len(generator.encode([longest])[0]) == limit
    greedy = generator.generate([longest], mode="greedy", max_new_tokens=8)[0]
    iad = generator.generate([longest], mode="iad", max_new_tokens=8)[0]
    assert greedy.ids == iad.ids
