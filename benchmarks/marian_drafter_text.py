"""The English text the Bergamot en->pt GAD drafter was distilled from (benchmarks/results/marian-gad-cpu/).

    python benchmarks/marian_corpus.py CORPUS            # web-train.en.txt, fortunes.en.txt (not committed)
    python benchmarks/marian_drafter_text.py CORPUS OUT.txt

11,000 verses of the World English Bible outside the evaluation books and 1,000 English
fortunes, drawn and shuffled with a fixed seed; any line that also occurs in the committed
evaluation text (benchmarks/data/marian/web-bench.en.txt: a verse repeated in another book) is
dropped, so nothing measured is trained on. train-drafter keeps the file's last --heldout lines
(100) out of training for its report.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

BENCH = Path(__file__).parent / "data" / "marian" / "web-bench.en.txt"
VERSES, FORTUNES, SEED = 11_000, 1_000, 28


def lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path, help="marian_corpus.py's output folder")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    web, fortunes = lines(args.corpus / "web-train.en.txt"), lines(args.corpus / "fortunes.en.txt")
    bench = set(BENCH.read_text(encoding="utf-8").splitlines())
    rng = random.Random(SEED)
    rng.shuffle(web)
    rng.shuffle(fortunes)
    chosen = [line for line in web[:VERSES] + fortunes[:FORTUNES] if line not in bench]
    rng.shuffle(chosen)
    args.out.write_text("\n".join(chosen) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(chosen)} lines ({VERSES + FORTUNES - len(chosen)} found in the evaluation text left out)")


if __name__ == "__main__":
    main()
