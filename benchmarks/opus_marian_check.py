"""OPUS-MT folders in Marian's format, exported by aggdec, against upstream Marian (pymarian).

Writes tiny random OPUS-MT folders as OPUS-MT ships them (tests/support/marian.py
``write_opus_model``: a self-attention model in a float ``.npz`` named as OPUS-MT names it,
``decoder.yml``, the vocabulary ``.yml``, ``source.spm`` / ``target.spm``), with end-of-sentence
biases that make outputs end early or run to Marian's length limit. For each: ``aggdec export``,
aggdec greedy on the texts, and upstream Marian greedy on the same texts given as
``preprocess.sh`` gives them (``spm_encode`` pieces: Python ``sentencepiece``) with the folder's
``decoder.yml`` (``--beam-size 1``, one thread, one sentence a batch). Outputs are compared as
piece strings (what Marian prints, before ``postprocess.sh``). Exits 1 on any difference.

pymarian lives in an environment of its own (a 600 MB wheel): ``python3 -m venv pymarian-env &&
pymarian-env/bin/pip install pymarian==1.12.42``.

    python benchmarks/opus_marian_check.py --pymarian-python pymarian-env/bin/python [--texts 200] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

# run in the pymarian environment: argv[1] the folder (decoder.yml), argv[2] the pieces; prints JSON
TRANSLATE = """
import json, sys
from pymarian import Translator
translator = Translator("-c " + sys.argv[1] + "/decoder.yml --beam-size 1 --cpu-threads 1 --mini-batch 1 --maxi-batch 1 --quiet")
lines = open(sys.argv[2], encoding="utf-8").read().splitlines()
print(json.dumps(translator.translate(lines)))
"""
MODELS = ((0, 6.5), (1, 2.0), (2, 0.0), (3, -1.0))  # (seed, end-of-sentence bias)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pymarian-python", required=True)
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)

    import sentencepiece

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from aggdec.export import export_bundle
    from aggdec.runtime.generator import Generator
    from tests.support.marian import WORDS, write_opus_model

    work = args.work or Path(tempfile.mkdtemp(prefix="opus-marian-"))
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) + rng.choice(["", ".", "!"])
             for _ in range(args.texts)]
    texts += ["zebra quux \ufb01", "the  cat\u00a0sat", "\uff34\uff48\uff45 \uff43\uff41\uff54", "a b c d e f g"]
    failed = False
    for seed, eos_bias in MODELS:
        folder, vocabulary = write_opus_model(work / f"model-{seed}", seed=seed, eos_bias=eos_bias)
        export_bundle(folder, work / f"bundle-{seed}", progress=None)
        processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "source.spm"))
        pieces_file = folder / "input.pieces"
        pieces_file.write_text("\n".join(" ".join(processor.encode(t, out_type=str)) for t in texts) + "\n",
                               encoding="utf-8")
        marian = json.loads(subprocess.run([args.pymarian_python, "-c", TRANSLATE, str(folder), str(pieces_file)],
                                           check=True, capture_output=True, text=True).stdout)
        piece_of = {index: piece for piece, index in vocabulary.items()}
        ours = [" ".join(piece_of[i] for i in result.ids if i != vocabulary["</s>"])
                for result in Generator(work / f"bundle-{seed}").generate(texts)]
        differ = [i for i, (a, b) in enumerate(zip(ours, marian)) if a != b]
        print(json.dumps({"seed": seed, "eos_bias": eos_bias, "sentences": len(texts),
                          "equal": len(texts) - len(differ), "nonempty_outputs": sum(1 for m in marian if m.strip()),
                          "mean_output_pieces": round(sum(len(m.split()) for m in marian) / len(marian), 2),
                          "differences": [{"text": texts[i], "aggdec": ours[i], "marian": marian[i]}
                                          for i in differ[:5]]}, ensure_ascii=False))
        failed |= bool(differ)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
