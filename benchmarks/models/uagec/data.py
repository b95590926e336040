"""UA-GEC sentence pairs, read from the installed ``ua-gec`` package (no downloads).

The ``ua-gec`` PyPI package ships the corpus inside the package directory:

    ua_gec/data/gec-only/{train,test}/source-sentences/NNNN.src.txt
    ua_gec/data/gec-only/{train,test}/target-sentences/NNNN.a1.txt (.a2.txt, ...)

One file per document, one sentence per line; line i of ``NNNN.src.txt`` is aligned with line
i of ``NNNN.aK.txt`` (annotator K's correction). The gec-only split corrects grammar,
spelling and punctuation but not fluency. Every train document has annotator ``a1`` (43 also
have ``a2``); every test document has both ``a1`` and ``a2``. We use ``a1`` as the target
(31,037 train and 2,696 test pairs) and keep ``a2`` of the test split as a second reference.

``synthetic_pairs`` makes extra (noisy source, clean target) pairs by injecting
learner-like errors into training-split *target* sentences, seeded.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "test")


def corpus_dir(variant: str = "gec-only") -> Path:
    """The directory of the corpus inside the installed ``ua_gec`` package."""
    try:
        from importlib.resources import files

        root = Path(str(files("ua_gec") / "data" / variant))
    except ModuleNotFoundError as e:  # pragma: no cover - message only
        raise ModuleNotFoundError(
            "the UA-GEC corpus comes from the `ua-gec` package: pip install ua-gec"
        ) from e
    if not root.is_dir():
        raise FileNotFoundError(f"no {variant!r} corpus under {root}; reinstall `ua-gec`")
    return root


@dataclass(frozen=True)
class Pair:
    doc: str
    line: int
    source: str
    target: str  # annotator a1
    target2: str | None = None  # annotator a2 when present


def _lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    return [ln.rstrip("\r") for ln in lines]


def load_pairs(split: str, variant: str = "gec-only") -> list[Pair]:
    """Aligned sentence pairs of one split, in document order."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {SPLITS}")
    base = corpus_dir(variant) / split
    src_dir, tgt_dir = base / "source-sentences", base / "target-sentences"
    pairs: list[Pair] = []
    for src_path in sorted(src_dir.glob("*.src.txt")):
        doc = src_path.name.split(".")[0]
        src = _lines(src_path)
        t1 = _lines(tgt_dir / f"{doc}.a1.txt")
        a2 = tgt_dir / f"{doc}.a2.txt"
        t2 = _lines(a2) if a2.exists() else None
        if len(t1) != len(src) or (t2 is not None and len(t2) != len(src)):
            raise ValueError(f"{split}/{doc}: source and target line counts differ")
        for i, (s, t) in enumerate(zip(src, t1)):
            pairs.append(Pair(doc, i, s, t, t2[i] if t2 is not None else None))
    return pairs


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
