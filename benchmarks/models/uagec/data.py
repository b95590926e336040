"""UA-GEC sentence pairs for the recipe: the corpus reader (``aggdec.uagec``) and synthetic errors.

The corpus comes from the installed ``ua-gec`` package (no downloads).

``synthetic_pairs`` makes extra (noisy source, clean target) pairs by injecting
learner-like errors into training-split *target* sentences, seeded; optionally some of them
carry rare characters (emoji, superscripts, other scripts) that must pass through unchanged.
"""

from __future__ import annotations

import random
import re

from aggdec.uagec import SPLITS, Pair, corpus_dir, load_pairs  # noqa: F401  (the recipe's reader)


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


# ---------------------------------------------------------------- rare characters

# Where rare characters are drawn from: scripts and symbols a Ukrainian text may quote but the
# training split (almost) never contains. Characters that do occur in the corpus are filtered out
# by the caller (``common_chars``), so every inserted character reaches the model as byte tokens.
# The ranges are spread over 2-, 3- and 4-byte UTF-8 so that many different lead bytes occur.
_RARE_RANGES = (
    (0x00B9, 0x00B9), (0x2070, 0x209C),  # superscripts and subscripts: km³, x₂
    # most lead bytes of 2-byte UTF-8 and every continuation byte (80-BF): Latin-1 and
    # Latin Extended, combining marks (a decomposed й is и + U+0306), Cyrillic outside the corpus (ѕ ѣ),
    # Syriac to NKo
    (0x00A1, 0x00FF), (0x0100, 0x024F), (0x0300, 0x036F), (0x0400, 0x052F), (0x0700, 0x07FF),
    (0x0E00, 0x0E7F), (0xA640, 0xA69F),  # Thai, Cyrillic Extended-B (ꙁ ꙑ): 3-byte lead E0 and EA
    (0x2100, 0x214F), (0x2190, 0x21FF), (0x2200, 0x22FF),  # letterlike, arrows, maths
    (0x0370, 0x03FF),  # Greek
    (0x0530, 0x058F), (0x05D0, 0x05EA), (0x0620, 0x064A),  # Armenian, Hebrew, Arabic
    (0x10D0, 0x10FA),  # Georgian
    (0x3041, 0x3096), (0x4E00, 0x4FFF), (0xAC00, 0xAD00),  # kana, CJK, Hangul
    (0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF),  # emoji
)
# Multi-code-point sequences that must survive whole: skin tones, ZWJ families, flags, keycaps.
_RARE_SEQUENCES = (
    "👍🏽", "👩‍💻", "👨‍👩‍👧", "🇺🇦", "❤️", "1️⃣", "🏳️‍🌈",
)


def _rare_char(rng: random.Random, common: frozenset[str]) -> str:
    while True:
        lo, hi = _RARE_RANGES[rng.randrange(len(_RARE_RANGES))]
        c = chr(rng.randint(lo, hi))
        if c.isprintable() and c not in common:
            return c


def rare_string(rng: random.Random, common: frozenset[str] = frozenset()) -> str:
    """One to three rare characters, or one emoji sequence, none of them in ``common``."""
    if rng.random() < 0.2:
        seq = _RARE_SEQUENCES[rng.randrange(len(_RARE_SEQUENCES))]
        if not set(seq) & common:
            return seq
    return "".join(_rare_char(rng, common) for _ in range(rng.randint(1, 3)))


def insert_rare(sentence: str, rng: random.Random, common: frozenset[str] = frozenset()) -> str:
    """``sentence`` with one or two rare strings at word boundaries, alone or glued to a word."""
    out = sentence
    for _ in range(rng.randint(1, 2)):
        cuts = [0, len(out)] + [m.start() for m in re.finditer(r" ", out)]
        at = cuts[rng.randrange(len(cuts))]
        r = rare_string(rng, common)
        glued = rng.random() < 0.5 and 0 < at < len(out)  # "км³": glued to the word before
        if glued:
            out = out[:at] + r + out[at:]
        else:
            left = " " if at > 0 and out[at - 1] != " " else ""
            right = " " if at < len(out) and out[at] != " " else ""
            out = out[:at] + left + r + right + out[at:]
    return out


def _rare_only(text: str, common: frozenset[str]) -> list[str]:
    return [c for c in text if c not in common]


def synthetic_pairs(
    targets: list[str],
    n: int,
    seed: int = 0,
    rare_rate: float = 0.0,
    common_chars: frozenset[str] = frozenset(),
) -> list[tuple[str, str]]:
    """``n`` (noisy, clean) pairs made from the given correct sentences, seeded.

    With ``rare_rate`` > 0, that fraction of the clean targets first gets rare characters
    (:func:`insert_rare`, drawn outside ``common_chars``), which the noisy source must then carry
    unchanged: a source that lost or altered one (the word noise works on ``\\w`` words, and
    many rare characters are word characters) is redrawn, and after five tries the pair becomes a
    copy, so the model is never taught to invent or drop such a character. The rare draws use
    their own random stream: ``rare_rate=0`` gives exactly the pairs of earlier versions.
    """
    rng = random.Random(seed)
    rare_rng = random.Random(f"rare-{seed}")
    if not targets or n <= 0:
        return []
    out = []
    for _ in range(n):
        t = targets[rng.randrange(len(targets))]
        s = inject_errors(t, rng)
        if rare_rate > 0 and rare_rng.random() < rare_rate:
            t = insert_rare(t, rare_rng, common_chars)
            want = _rare_only(t, common_chars)
            for _try in range(5):
                s = inject_errors(t, rare_rng)
                if _rare_only(s, common_chars) == want:
                    break
            else:
                s = t
        out.append((s, t))
    return out


if __name__ == "__main__":
    tr, te = load_pairs("train"), load_pairs("test")
    print("train", len(tr), "test", len(te), "corpus", corpus_dir())
    for name, ps in (("train", tr), ("test", te)):
        same = sum(p.source == p.target for p in ps)
        print(f"{name}: unchanged (source == a1) {same / len(ps):.3f}")
    for s, t in synthetic_pairs([p.target for p in tr], 5, seed=0):
        print("SYN", s, "=>", t)
