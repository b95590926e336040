"""How much of a batched call's block is padding: the positions after each row's own block
(its trailing pad ids), over every verifier call of a decode.

    python padfrac.py BUNDLE MODE BATCH [LIMIT]     # the first LIMIT UA-GEC test sentences (1000)
"""

import sys

import numpy as np

from aggdec import Generator
from aggdec.runtime.decoding import verifier as V
from aggdec.sentences import load_examples

stats = {"positions": 0, "padding": 0, "calls": 0, "rows": 0}
original = V.Batch.verify


def verify(self, tokens, widths=None):  # counts, then runs the real call
    rows, width = tokens.shape
    real = tokens != PAD
    last = np.where(real.any(1), width - np.argmax(real[:, ::-1], axis=1), 0)  # past each row's last non-pad id
    stats["positions"] += rows * width
    stats["padding"] += int((width - np.maximum(last, 1)).sum())
    stats["calls"] += 1
    stats["rows"] += rows
    return original(self, tokens, widths)


V.Batch.verify = verify
bundle, mode, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
limit = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
texts = [example.source for example in load_examples("uagec-test")][:limit]
generator = Generator(bundle, threads=1)
PAD = generator.manifest.pad_token_id
generator.generate(texts, mode=mode, batch_size=batch)
print(f"{mode} batch {batch}: padding {stats['padding'] / stats['positions']:.3f} of the positions, "
      f"{stats['rows'] / stats['calls']:.1f} rows a call, {stats['positions'] / stats['rows']:.1f} positions a row")
