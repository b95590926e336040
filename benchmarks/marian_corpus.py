"""Sentence files for the Marian (Bergamot en-pt / pt-en) checks and benchmarks, from Debian packages.

    python benchmarks/marian_corpus.py OUT_DIR [--packages DIR]

Downloads (``apt-get download``, no root needed) and unpacks (``dpkg-deb -x``) these Debian
packages into ``--packages`` (default OUT_DIR/debs), then writes one text per line into OUT_DIR:

- ``web-bench.en.txt``: the World English Bible (``sword-text-web``, public domain), the verses
  of BENCH_BOOKS: the evaluation text. A copy is committed as benchmarks/data/marian/web-bench.en.txt
  (provenance in that folder's README).
- ``web-train.en.txt``: every other verse of the WEB, for distilling a drafter. Disjoint from the
  evaluation text by book, so nothing a drafter trains on is measured on. Not committed.
- ``fortunes.en.txt``: English fortune cookies (``fortunes``, ``fortunes-min``; BSD-licensed).
- ``fortunes-br.pt.txt``: Brazilian Portuguese fortune cookies (``fortunes-br``, GPL-2+: used here,
  never committed): the real Portuguese text for pt-en. Debian ships no Portuguese SWORD module
  (``apt-cache search sword-text``: English, Spanish), so no verse-aligned references exist here.

The SWORD module is read with ``pysword`` (the [bench] extra), never with Debian's ``diatheke``.
Its OSIS markup carries footnotes inside verses with no space around them ("only born<note>..</note>Son"),
so a note becomes a space before pysword strips the markup, and a space left before punctuation
is dropped. Fortunes are split at their ``%`` lines; an entry's lines are joined with spaces, its
attribution lines ("-- Author") dropped, and entries outside MIN_CHARS..MAX_CHARS or with a tab
anywhere (tables, ASCII art, indented dialogue, and also a tab-indented attribution: the
committed runs were made with this rule) left out.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

PACKAGES = ("sword-text-web", "fortunes", "fortunes-min", "fortunes-br")
WEB_MODULE = "engWEB2015eb"
# the evaluation books: 1,224 verses of narrative, letters and poetry-like prose
BENCH_BOOKS = ("ruth", "jonah", "john", "phil", "jas")
MIN_CHARS, MAX_CHARS = 20, 300
NOTE = re.compile(r"<note\b.*?</note>", re.DOTALL)
SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([,.;:!?’”)])")


def unpack(packages: tuple[str, ...], root: Path) -> Path:
    """``apt-get download`` each package and ``dpkg-deb -x`` it under ``root``; returns root."""
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as debs:
        subprocess.run(["apt-get", "download", *packages], cwd=debs, check=True)
        for deb in sorted(Path(debs).glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root


def tidy(text: str) -> str:
    return SPACE_BEFORE_PUNCTUATION.sub(r"\1", " ".join(text.split()))


def web_verses(sword_root: Path) -> dict[str, list[str]]:
    """The WEB's verses per book (pysword's short name), in order, markup and notes removed."""
    from pysword.cleaner import OSISCleaner
    from pysword.modules import SwordModules

    modules = SwordModules(str(sword_root))
    modules.parse_modules()
    bible = modules.get_bible_from_module(WEB_MODULE)
    cleaner = OSISCleaner()
    verses: dict[str, list[str]] = {}
    for testament in bible.get_structure().get_books().values():
        for book in testament:
            raw = bible.get_iter(books=[book.osis_name], clean=False)
            lines = (tidy(cleaner.clean(NOTE.sub(" ", verse))) for verse in raw)
            verses[book.osis_name.lower()] = [line for line in lines if line]
    return verses


def fortunes(path: Path) -> list[str]:
    """One line per fortune of a fortune file, attributions dropped, kept if short and plain."""
    kept = []
    for entry in re.split(r"^%$", path.read_text(encoding="utf-8", errors="strict"), flags=re.MULTILINE):
        if "\t" in entry:
            continue
        lines = [line for line in entry.splitlines() if not line.strip().startswith("--")]
        text = tidy(" ".join(lines))
        if MIN_CHARS <= len(text) <= MAX_CHARS:
            kept.append(text)
    return kept


def write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    print(f"{path}: {len(lines)} lines")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--packages", type=Path, help="where the packages are unpacked (default OUT/debs); "
                                                      "an existing folder is reused without downloading")
    args = parser.parse_args()
    root = args.packages or args.out / "debs"
    if not (root / "usr/share").is_dir():
        unpack(PACKAGES, root)
    args.out.mkdir(parents=True, exist_ok=True)
    verses = web_verses(root / "usr/share/sword")
    unknown = [book for book in BENCH_BOOKS if book not in verses]
    if unknown:
        raise SystemExit(f"marian_corpus: books {unknown} are not in {WEB_MODULE}")
    write(args.out / "web-bench.en.txt", [v for book in BENCH_BOOKS for v in verses[book]])
    write(args.out / "web-train.en.txt", [v for book, vs in verses.items() if book not in BENCH_BOOKS for v in vs])
    games = root / "usr/share/games/fortunes"
    english = sorted(games.glob("*.u8"))  # fortunes' UTF-8 copies (fortunes-br's one file has none)
    write(args.out / "fortunes.en.txt", list(dict.fromkeys(t for f in english for t in fortunes(f))))
    write(args.out / "fortunes-br.pt.txt", list(dict.fromkeys(fortunes(games / "brasil"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
