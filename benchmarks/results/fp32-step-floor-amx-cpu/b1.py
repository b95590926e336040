"""Per-step cost, aggdec greedy b1 fp32 vs CTranslate2 fp32 b1 (scratch)."""
import sys, time
from pathlib import Path
import numpy as np
import ctranslate2
from tokenizers import Tokenizer
from aggdec.runtime.generator import Generator
from aggdec.runtime.loader import open_bundle
from aggdec.sentences import load_examples

bundle, n = sys.argv[1], int(sys.argv[2])
ct2dir = sys.argv[3] if len(sys.argv) > 3 else "/work/runs/bench-work/ct2-fp32"
ctype = sys.argv[4] if len(sys.argv) > 4 else "float32"
src = [e.source for e in load_examples("uagec-test", n)]
opened = open_bundle(bundle, threads=1)
gen = Generator.from_bundle(opened)
tr = ctranslate2.Translator(ct2dir, device="cpu", compute_type=ctype, intra_threads=1, inter_threads=1)
tok = Tokenizer.from_file("benchmarks/models/uagec/model/tokenizer.json")
toks = [e.tokens for e in tok.encode_batch(src, add_special_tokens=True)]
# count steps
outs = gen.generate(src, mode="greedy", batch_size=1)
steps = sum(len(o.ids) for o in outs)
def agg():
    for s in src: gen.generate([s], mode="greedy", batch_size=1)
def agg_enc_only():
    for s in src: gen.generate([s], mode="greedy", batch_size=1, max_new_tokens=1)
def ct(maxlen=256):
    for t in toks: tr.translate_batch([t], beam_size=1, max_decoding_length=maxlen, return_end_token=True)
def ct1():
    ct(1)
res = {k: [] for k in ["agg", "agg1", "ct", "ct1"]}
for r in range(3):
    for name, f in [("agg", agg), ("ct", ct), ("agg1", agg_enc_only), ("ct1", ct1)]:
        t = time.perf_counter(); f(); res[name].append(time.perf_counter() - t)
m = {k: min(v) for k, v in res.items()}
print(f"{n} sentences, {steps} steps; min of 3 (s): " + " ".join(f"{k}={v:.3f}" for k, v in m.items()))
print(f"aggdec per step {(m['agg']-m['agg1'])/(steps-n)*1e3:.3f} ms, ct2 per step {(m['ct']-m['ct1'])/(steps-n)*1e3:.3f} ms")
print(f"aggdec encoder+1 per sentence {m['agg1']/n*1e3:.3f} ms, ct2 {m['ct1']/n*1e3:.3f} ms")
import collections
acc = collections.Counter()
for r in range(2):
    acc.clear()
    for s in src:
        st = gen.generate([s], mode="greedy", batch_size=1)[0].stats
        acc["enc"] += st.encoder_seconds; acc["ver"] += st.verifier_seconds; acc["tot"] += st.total_seconds
print({k: round(v, 3) for k, v in acc.items()}, "verifier per step ms", round(acc["ver"] / steps * 1e3, 3),
      "host per step ms", round((acc["tot"] - acc["ver"] - acc["enc"]) / steps * 1e3, 3))
