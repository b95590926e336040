"""How often speculative beam search drafts, and what it costs, for one bundle (this run's
second table): each call's draft length and the measured verdict (drafted iterations slower
per beam step: False), then the time against plain beam 4 on the same texts, outputs compared.

    python draft_decisions.py BUNDLE TEXTS MODE COUNT BATCH   # MODE: iad or gad
"""

import collections
import sys
import time

from aggdec.runtime.decoding import hypothesis_drafts
from aggdec.runtime.generator import Generator

bundle, path, mode, count, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
texts = [line.rstrip("\n") for line in open(path, encoding="utf-8")][:count]
decisions: collections.Counter = collections.Counter()
size = hypothesis_drafts.HypothesisDraft._size


def counted(self, batch_, rows):
    length = size(self, batch_, rows)
    decisions[(length, None if self.gate is None else self.gate.payoff.pays(len(rows)))] += 1
    return length


hypothesis_drafts.HypothesisDraft._size = counted
generator = Generator(bundle, threads=1)
generator.generate(texts[:20], mode=mode, num_beams=4)  # warm
decisions.clear()
started = time.perf_counter()
spec = generator.generate(texts, mode=mode, num_beams=4, batch_size=batch)
spec_s = time.perf_counter() - started
started = time.perf_counter()
plain = generator.generate(texts, mode="greedy", num_beams=4, batch_size=batch)
plain_s = time.perf_counter() - started
assert [r.sequences for r in spec] == [r.sequences for r in plain]
print(f"{mode} beam 4, batch {batch}, {count} texts: {spec_s:.2f} s, plain beam 4 {plain_s:.2f} s "
      f"(speed {plain_s / spec_s:.3f}x plain); outputs identical")
print("calls by (draft length, drafted iterations measured faster):", dict(decisions))
for name, results in (("speculative", spec), ("plain", plain)):
    stats = [r.stats for r in results]
    print(f"{name}: encoder {sum(s.encoder_seconds for s in stats):.3f} s, verifier "
          f"{sum(s.verifier_seconds for s in stats):.3f} s, drafter {sum(s.drafter_seconds for s in stats):.3f} s")
