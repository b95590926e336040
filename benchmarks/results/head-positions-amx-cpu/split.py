"""Two bundles' decode time split by CPU seconds: the verifier's and encoder's onnxruntime calls
(their sessions' own clocks) and the rest, alternating the bundles, medians of the last three
of four passes.

    python split.py OLD NEW MODE BATCH [LIMIT]     # the first LIMIT UA-GEC test sentences (1200)
"""

import sys
import time

import numpy as np

from aggdec import Generator
from aggdec.sentences import load_examples

old, new, mode, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
limit = int(sys.argv[5]) if len(sys.argv) > 5 else 1200
texts = [example.source for example in load_examples("uagec-test")][:limit]
generators = {name: Generator(name, threads=1) for name in (old, new)}
times = {name: [] for name in generators}
for round_ in range(4):
    for name in (list(generators) if round_ % 2 == 0 else list(generators)[::-1]):
        generator = generators[name]
        before = dict(generator.verifier.seconds)
        started = time.process_time()
        generator.generate(texts, mode=mode, batch_size=batch)
        total = time.process_time() - started
        after = generator.verifier.seconds
        times[name].append((total, after["verifier"] - before["verifier"], after["encoder"] - before["encoder"]))
for name, values in times.items():
    total, verifier, encoder = np.median(np.array(values[1:]), axis=0)
    print(f"{name}: {mode} batch {batch}, total {total:.3f} s, verifier {verifier:.3f}, encoder {encoder:.3f}, "
          f"rest {total - verifier - encoder:.3f}")
