"""UA-GEC sentence pairs, read from the installed ``ua-gec`` package (no downloads).

The ``ua-gec`` PyPI package ships the corpus inside the package directory:

    ua_gec/data/gec-only/{train,test}/source-sentences/NNNN.src.txt
    ua_gec/data/gec-only/{train,test}/target-sentences/NNNN.a1.txt (.a2.txt, ...)

One file per document, one sentence per line; line i of ``NNNN.src.txt`` is aligned with line
i of ``NNNN.aK.txt`` (annotator K's correction). The gec-only split corrects grammar,
spelling and punctuation but not fluency. Every train document has annotator ``a1`` (43 also
have ``a2``); every test document has both ``a1`` and ``a2``. We use ``a1`` as the target
(31,037 train and 2,696 test pairs) and keep ``a2`` of the test split as a second reference.
"""

from __future__ import annotations

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
