"""How many beam steps a speculative call replays on the Bergamot en→pt bundle (marian-beam-cpu).

    python fixed_drafts.py BUNDLE DATA [N]

Plain beam 4 against IAD and GAD beam 4 with fixed drafts of k tokens on every call
(``BlockOptions(max_block=k, adaptive=False)``, drafting as much as allowed) and with the
adaptive default, at batch 1, one thread, the first N (60) sources: wall-time ratio (plain /
speculative: above 1 is faster), verifier calls, beam steps per call, and whether the outputs
equal plain beam's.
"""
import sys
import time

from aggdec.runtime.decoding.iad import BlockOptions
from aggdec.runtime.generator import Generator

bundle, data = sys.argv[1], sys.argv[2]
count = int(sys.argv[3]) if len(sys.argv) > 3 else 60
src = open(data, encoding="utf-8").read().splitlines()[:count]
g = Generator(bundle, threads=1)
g.generate(src[:5], num_beams=4)  # warm up


def run(**kw):
    t = time.perf_counter()
    r = g.generate(src, num_beams=4, batch_size=1, **kw)
    dt = time.perf_counter() - t
    calls = sum(x.stats.iterations for x in r)
    steps = sum(sum(x.stats.accepted) for x in r)
    return dt, calls, steps, [x.sequences for x in r]


base = run()
print("plain", f"{base[0]:.1f}s", "calls", base[1])
for mode in ("iad", "gad"):
    for k in (1, 2, 4, 8):
        r = run(mode=mode, block=BlockOptions(max_block=k, adaptive=False))
        print(mode, "k", k, f"plain/this {base[0] / r[0]:.2f}", "calls", r[1], f"steps/call {r[2] / r[1]:.2f}",
              "equal", r[3] == base[3])
    r = run(mode=mode)
    print(mode, "adaptive", f"plain/this {base[0] / r[0]:.2f}", "calls", r[1], f"steps/call {r[2] / r[1]:.2f}",
          "equal", r[3] == base[3])
