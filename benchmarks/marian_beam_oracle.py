"""Compare aggdec's Marian beams with upstream Marian's (pymarian, float32): n-best lists, token for token.

    python benchmarks/marian_beam_oracle.py MODEL_DIR BUNDLE --input SOURCES [--limit 200] [--beams 4 2 5] \
        --pymarian-python PYTHON [--modes greedy iad gad] [--out RESULT.json]

MODEL_DIR is a Marian folder as Bergamot ships it, BUNDLE its aggdec export. Upstream Marian
decodes the folder's weights written as a float32 `.npz` (``marian_upstream_check.float_npz``:
value = int8 / multiplier, as aggdec reads them) with the folder's decoding yml, one sentence a
batch, one CPU thread, ``--beam-size N --n-best --no-spm-decode``: for each sentence its N
finished hypotheses as SentencePiece pieces with the model's raw score (``F0=``, the sum of
log-probs) and the normalized score Marian ranks by. aggdec decodes with
``generate(num_beams=N, num_return_sequences=N)`` (Marian's rules: docs/marian.md) in each mode
asked, and its hypotheses are written as the tokenizer's pieces (the EOS left out, as Marian
prints them).

Compared per sentence: the first-best's pieces and the whole n-best list (hypotheses and their
order), token for token; every sentence where either differs is listed. Scores: Marian prints
6 significant digits, and its log-probs come from its own kernels, not onnxruntime's, so a
score can differ in its last float32 bits: reported as the largest relative difference and the
lists whose scores print alike, not as a pass/fail tolerance. Also checked on Marian's own
output: its normalized score is F0 / length ** normalize with the EOS counted in the length (the
rule aggdec follows; ``at_cap``: hypotheses ended by the length cap, without EOS).
Prints one JSON summary; ``--out`` writes it with every difference. pymarian lives in its own
environment (``marian_upstream_check.py``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from marian_upstream_check import decoding_yml, float_npz, segmented_alike  # noqa: E402

# run in the pymarian environment: argv[1] the decoding yml, argv[2] the sources, argv[3] beams
# (comma separated); prints {beams: [n-best text per sentence]} as JSON
TRANSLATE = """
import json, sys
from pymarian import Translator
lines = open(sys.argv[2], encoding="utf-8").read().splitlines()
out = {}
for beams in sys.argv[3].split(","):
    translator = Translator("-c " + sys.argv[1] + " --beam-size " + beams + " --n-best --no-spm-decode")
    out[beams] = [translator.translate(line) for line in lines]
print(json.dumps(out))
"""


def parse_nbest(text: str) -> list[dict]:
    """Marian's n-best lines ``id ||| pieces ||| F0= raw ||| normalized`` as dicts."""
    entries = []
    for line in text.strip("\n").split("\n"):
        fields = [f.strip() for f in line.split("|||")]
        raw = fields[2].split()
        entries.append({"pieces": fields[1].split(), "raw": raw[1], "score": fields[3]})
    return entries


def printed(value: float) -> str:
    """A score as Marian's n-best prints it (C++ ostream, default precision 6)."""
    return f"{value:.6g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--beams", type=int, nargs="+", default=[4])
    parser.add_argument("--modes", nargs="+", default=["greedy"], help="aggdec modes whose beams are compared")
    parser.add_argument("--batch-size", type=int, default=8, help="aggdec's texts per call (outputs do not depend on it)")
    parser.add_argument("--pymarian-python", required=True)
    parser.add_argument("--work", type=Path, help="where the float .npz and yml go (default: a temporary folder)")
    parser.add_argument("--out", type=Path, help="write the summary and every difference here (JSON)")
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from aggdec.runtime.generator import Generator

    sources = args.input.read_text(encoding="utf-8").splitlines()[: args.limit]
    settings = yaml.safe_load(next(iter(sorted(args.model_dir.glob("config*.yml")))).read_text(encoding="utf-8"))
    normalize = float(settings.get("normalize", 0.0))
    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        config = decoding_yml(args.model_dir, float_npz(args.model_dir, work), work)
        source_file = work / "sources.txt"
        source_file.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
        done = subprocess.run([args.pymarian_python, "-c", TRANSLATE, str(config), str(source_file),
                               ",".join(str(b) for b in args.beams)], capture_output=True, text=True, check=True)
    marian = json.loads(done.stdout.strip().splitlines()[-1])
    marian_seconds = time.time() - started

    tokenizer = Tokenizer.from_file(str(args.bundle / "tokenizer.json"))
    generator = Generator(args.bundle, threads=1)
    eos = generator.manifest.eos_token_id
    alike = segmented_alike(args.model_dir.resolve())
    summary: dict = {"model_dir": str(args.model_dir), "bundle": str(args.bundle), "input": str(args.input),
                     "sentences": len(sources), "marian_seconds": round(marian_seconds, 1), "runs": []}
    failed = False
    for beams in args.beams:
        theirs = [parse_nbest(text) for text in marian[str(beams)]]
        # Marian's own length rule, at its printed precision: normalized = F0 / length ** normalize
        # with the EOS counted (or, at the length cap, the hypothesis's own tokens)
        rule = {"eos_counted": 0, "at_cap": 0, "neither": 0}
        for entries in theirs:
            for e in entries:
                n, raw, score = len(e["pieces"]), float(e["raw"]), float(e["score"])
                # printed to 6 digits each: a relative 1e-5 tells length n + 1 from n (>= 0.3% apart)
                if abs(raw / (n + 1) ** normalize - score) <= 1e-5 * abs(score):
                    rule["eos_counted"] += 1
                elif n and abs(raw / n ** normalize - score) <= 1e-5 * abs(score):
                    rule["at_cap"] += 1
                else:
                    rule["neither"] += 1
        summary.setdefault("marian_length_rule", {})[str(beams)] = rule
        for mode in args.modes:
            t0 = time.time()
            results = generator.generate(sources, mode=mode, num_beams=beams, num_return_sequences=beams,
                                         batch_size=args.batch_size)
            seconds = time.time() - t0
            first = lists = scores = 0
            signed: list[float] = []  # (aggdec - Marian) / |Marian| of each normalized score, over equal lists
            differences = []
            for line, (source, result, entries) in enumerate(zip(sources, results, theirs), start=1):
                ours = [{"pieces": [tokenizer.id_to_token(i) for i in h.ids if i != eos], "score": printed(h.score),
                         "value": h.score} for h in result.sequences]
                same_first = ours[0]["pieces"] == entries[0]["pieces"]
                same_list = [o["pieces"] for o in ours] == [e["pieces"] for e in entries]
                first += same_first
                lists += same_list
                if same_list:
                    scores += [o["score"] for o in ours] == [e["score"] for e in entries]
                    signed += [(o["value"] - float(e["score"])) / abs(float(e["score"])) for o, e in zip(ours, entries)]
                else:
                    differences.append({"line": line, "segmented_alike": alike(source), "source": source,
                                        "first_equal": same_first,
                                        "aggdec": [(" ".join(o["pieces"]), o["value"]) for o in ours],
                                        "marian": [(" ".join(e["pieces"]), e["raw"], e["score"]) for e in entries]})
            failed |= bool(differences)
            run = {"beams": beams, "mode": mode, "first_best_equal": first, "nbest_lists_equal": lists,
                   "lists_whose_scores_print_alike": scores,
                   # a rule misread (a length off by one, another normalization) would shift scores one
                   # way by far more than float32 noise between two engines' kernels
                   "relative_score_difference": {
                       "max": float(f"{max(map(abs, signed), default=0.0):.2e}"),
                       "mean": float(f"{sum(signed) / max(len(signed), 1):.2e}"),
                       "above_zero": sum(d > 0 for d in signed), "below_zero": sum(d < 0 for d in signed)},
                   "aggdec_seconds": round(seconds, 1),
                   "differences": differences}
            summary["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "differences"} | {"differences": len(differences)}),
                  flush=True)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
