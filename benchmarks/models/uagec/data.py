"""UA-GEC sentence pairs for the recipe: the corpus reader (``aggdec.bench.uagec``) and synthetic errors.

The corpus comes from the installed ``ua-gec`` package (no downloads).

``synthetic_pairs`` makes extra (noisy source, clean target) pairs by injecting
learner-like errors into training-split *target* sentences, seeded.
"""

from __future__ import annotations

import random
import re

from aggdec.bench.uagec import SPLITS, Pair, corpus_dir, load_pairs  # noqa: F401  (the recipe's reader)


# ---------------------------------------------------------------- synthetic errors

_UA_LETTERS = "абвгґдеєжзиіїйклмнопрстуфхцчшщьюя"
# Confusions that Ukrainian learners / fast typists actually make.
_CONFUSE = {
    "и": "і", "і": "и", "е": "є", "є": "е", "ї": "і", "ґ": "г", "г": "ґ",
    "’": "'", "'": "’", "в": "у", "у": "в", "ь": "", "щ": "ш", "ш": "щ",
}
_WORD = re.compile(r"\w+", re.UNICODE)


def _noise_word(w: str, rng: random.Random) -> str:
    if len(w) < 2:
        return w
    op = rng.random()
    i = rng.randrange(len(w))
    if op < 0.25:  # dropped letter
        return w[:i] + w[i + 1 :] if len(w) > 3 else w
    if op < 0.40:  # duplicated letter
        return w[:i] + w[i] + w[i:]
    if op < 0.60:  # swapped adjacent letters
        if len(w) < 3:
            return w
        i = rng.randrange(len(w) - 1)
        return w[:i] + w[i + 1] + w[i] + w[i + 2 :]
    if op < 0.85:  # confused letter
        cands = [k for k, c in enumerate(w) if c.lower() in _CONFUSE]
        if not cands:
            return w
        k = rng.choice(cands)
        rep = _CONFUSE[w[k].lower()]
        if w[k].isupper():
            rep = rep.upper()
        return w[:k] + rep + w[k + 1 :]
    # wrong case of the first letter
    return (w[0].lower() if w[0].isupper() else w[0].upper()) + w[1:]


def inject_errors(sentence: str, rng: random.Random, rate: float = 0.08) -> str:
    """A noisy copy of a (correct) sentence; may return it unchanged."""
    out = sentence
    # dropped commas: the most frequent error class in UA-GEC
    commas = [m.start() for m in re.finditer(r",", out)]
    if commas and rng.random() < 0.6:
        k = rng.choice(commas)
        out = out[:k] + out[k + 1 :]
    # wrong case of the sentence-initial letter
    if out and out[0].isalpha() and rng.random() < 0.05:
        out = (out[0].lower() if out[0].isupper() else out[0].upper()) + out[1:]
    # word-level character noise
    pieces: list[str] = []
    last = 0
    for m in _WORD.finditer(out):
        pieces.append(out[last : m.start()])
        w = m.group(0)
        if rng.random() < rate and not w.isdigit():
            w = _noise_word(w, rng)
        pieces.append(w)
        last = m.end()
    pieces.append(out[last:])
    return "".join(pieces)


def synthetic_pairs(targets: list[str], n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (noisy, clean) pairs made from the given correct sentences, seeded."""
    rng = random.Random(seed)
    if not targets or n <= 0:
        return []
    out = []
    for _ in range(n):
        t = targets[rng.randrange(len(targets))]
        out.append((inject_errors(t, rng), t))
    return out


if __name__ == "__main__":
    tr, te = load_pairs("train"), load_pairs("test")
    print("train", len(tr), "test", len(te), "corpus", corpus_dir())
    for name, ps in (("train", tr), ("test", te)):
        same = sum(p.source == p.target for p in ps)
        print(f"{name}: unchanged (source == a1) {same / len(ps):.3f}")
    for s, t in synthetic_pairs([p.target for p in tr], 5, seed=0):
        print("SYN", s, "=>", t)
