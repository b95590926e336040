"""The main job: correct real Ukrainian learner sentences with aggdec's reference model.

Exports the committed UA-GEC grammatical-error-correction model (a small Marian trained by
``benchmarks/models/uagec/train.py``, with its GAD drafter) to an aggdec bundle, then corrects
sentences from the UA-GEC test split (``examples/uagec_test_sample.tsv``) one at a time, the
online setting, with greedy decoding, IAD and GAD, interleaved sentence by sentence so machine
drift hits all modes alike. Prints corrections, checks that IAD and GAD gave greedy's exact
output, and prints the speedups measured in this run.

    python examples/uagec_demo.py [--sentences 100] [--threads 2] [--work uagec-work]

Any other UA-GEC checkpoint runs the same way, e.g. the larger reference model (its drafter, when
one lies beside it, is ``DIR/../drafter``; ``--drafter`` names another; without one, GAD is left out):

    python examples/uagec_demo.py --checkpoint ../shared/models/uagec-base/model

Needs the [export] extra to export (once per checkpoint); decoding is torch-free.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "benchmarks" / "models" / "uagec" / "model"
SAMPLE = ROOT / "examples" / "uagec_test_sample.tsv"


def _sentence_count(text: str) -> int:
    available = len(SAMPLE.read_text(encoding="utf-8").splitlines())
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= available:
        raise argparse.ArgumentTypeError(f"must be from 1 to {available} (the sentences in {SAMPLE.name}), got {value}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=_sentence_count, default=100, help="sentences to correct (1 to 100)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=ROOT / "uagec-work", help="where the bundle is written")
    parser.add_argument("--show", type=int, default=8, help="corrections to print")
    parser.add_argument("--checkpoint", type=Path, default=MODEL,
                        help="a Hugging Face checkpoint directory (default: the committed reference model)")
    parser.add_argument("--drafter", type=Path, default=None,
                        help="its GAD drafter (default: CHECKPOINT/../drafter when that exists)")
    args = parser.parse_args()
    if not (args.checkpoint / "config.json").is_file():
        parser.error(f"--checkpoint {args.checkpoint}: no config.json there (a save_pretrained directory?)")
    drafter = args.drafter or args.checkpoint.resolve().parent / "drafter"
    if not (drafter / "drafter.json").is_file():
        if args.drafter is not None:
            parser.error(f"--drafter {args.drafter}: no drafter.json there (written by aggdec train-drafter)")
        print(f"no GAD drafter for this checkpoint (none at {drafter}): GAD is left out, greedy and IAD run. "
              "Train one with `aggdec train-drafter`, or name one with --drafter.", file=sys.stderr)
        drafter = None

    from tqdm import tqdm  # with the [export] extra the demo needs

    from aggdec import Generator

    bundle = bundle_for(args.checkpoint, drafter, args.work)
    generator = Generator(bundle, threads=args.threads)
    rows = [line.split("\t") for line in SAMPLE.read_text(encoding="utf-8").splitlines()][: args.sentences]
    sources = [source for source, _ in rows]
    modes = ["greedy", "iad"] + (["gad"] if generator.drafter is not None else [])

    generator.generate(sources[:5], mode="greedy")  # warm-up
    results = {mode: [] for mode in modes}
    # interleaved: each sentence in every mode before the next sentence
    for source in tqdm(sources, desc=f"correcting ({', '.join(modes)})", unit="sentence", file=sys.stderr):
        for mode in modes:
            results[mode].extend(generator.generate([source], mode=mode))

    print("Corrections (IAD):")
    shown = 0
    for (source, target), result in zip(rows, results["iad"]):
        if result.text != source and shown < args.show:
            shown += 1
            print(f"  in:  {source}\n  out: {result.text}\n  ref: {target}")
    greedy = results["greedy"]
    total = {mode: sum(r.stats.total_seconds for r in results[mode]) for mode in modes}
    print(f"\n{len(sources)} UA-GEC test sentences, batch 1, CPU, {args.threads} threads:")
    for mode in modes:
        same = sum(a.ids == b.ids for a, b in zip(results[mode], greedy))
        tokens = sum(len(r.ids) for r in results[mode])
        calls = sum(r.stats.iterations for r in results[mode])
        per_sentence = statistics.median(g.stats.total_seconds / r.stats.total_seconds
                                         for g, r in zip(greedy, results[mode]))
        print(f"  {mode:6s} {total[mode]:7.3f}s  {tokens / calls:5.2f} tokens/call  identical to greedy "
              f"{same}/{len(sources)}  speedup {total['greedy'] / total[mode]:.2f}x "
              f"(median per sentence {per_sentence:.2f}x)")
    identical = all(a.ids == b.ids for mode in modes for a, b in zip(results[mode], greedy))
    return 0 if identical else 1


def bundle_for(checkpoint: Path, drafter: Path | None, work: Path) -> Path:
    """The bundle of this checkpoint (and drafter) under ``work``, exported once and re-exported
    when the weights change: a stamp beside it records what it was made from."""
    def identity(directory: Path | None) -> dict:
        if directory is None:
            return {}
        return {f.name: [f.stat().st_size, f.stat().st_mtime_ns]
                for f in sorted(directory.iterdir()) if f.is_file()}

    made_from = {"checkpoint": str(checkpoint.resolve()), "files": identity(checkpoint),
                 "drafter": str(drafter.resolve()) if drafter else None, "drafter_files": identity(drafter)}
    name = "bundle" if checkpoint.resolve() == MODEL.resolve() else (
        "bundle-" + hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:12])
    bundle, stamp = work / name, work / f"{name}.made-from.json"
    if (bundle / "manifest.json").is_file() and stamp.is_file() and json.loads(stamp.read_text()) == made_from:
        return bundle
    from aggdec.export import export_bundle

    export_bundle(checkpoint, bundle, force=True, drafter_dir=drafter, progress=lambda m: print(m, file=sys.stderr))
    stamp.write_text(json.dumps(made_from, indent=1))
    return bundle


if __name__ == "__main__":
    raise SystemExit(main())
