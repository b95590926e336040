"""scratch: build an int8 variant of the float bundle and score its greedy against float greedy."""
import argparse, json, re, sys, time
from pathlib import Path
import numpy as np
from aggdec.export import quantize as Q

p = argparse.ArgumentParser()
p.add_argument("name"); p.add_argument("--quant", default=".*", help="regex: weights to quantize")
p.add_argument("--encoder", default="per-row"); p.add_argument("--weights", default="col7")
p.add_argument("--abits", type=int, default=8)
p.add_argument("--text", default="/tmp/mti8/tune.txt")
a = p.parse_args()
FLOAT = Path("/tmp/mti8/enpt"); out = Path("/tmp/mti8/b") / a.name
pat = re.compile(a.quant)
orig_q = Q._Rewriter._quantizable
def quantizable(self, node):
    return orig_q(self, node) and bool(pat.search(node.input[1]))
Q._Rewriter._quantizable = quantizable
if a.abits == 7:
    Q.ROW_QMAX = 63.0; Q.A_ZERO_POINT = 64
def weight(self, name):
    if name in self.weights: return self.weights[name]
    w = self.numpy_helper.to_array(self.inits[name]).astype(np.float32)
    if a.weights == "grid":
        s = np.float32(127) / np.abs(w).max(); q = np.round(w * s)
        assert np.allclose(q / s, w, rtol=1e-6, atol=0), name
        scales = np.full(w.shape[1], 1 / s, np.float32)
    else:  # col8
        s = np.float32(127) / np.maximum(np.abs(w).max(0), 1e-30); q = np.round(w * s)
        scales = (1 / s).astype(np.float32)
    self.weights[name] = (self._constant(f"{name}_int8", q.astype(np.int8)), self._constant(f"{name}_column_scale", scales))
    return self.weights[name]
if a.weights != "col7":
    Q._Rewriter._weight = weight
if not out.exists():
    Q.quantize_bundle(FLOAT, out, options=Q.QuantizeOptions(encoder=a.encoder), progress=None)
    print(json.dumps(json.loads((out / "manifest.json").read_text())["quantization"]))
from aggdec import Generator
import sacrebleu
texts = Path(a.text).read_text().splitlines()
ref_file = Path(a.text + ".float.json")
if not ref_file.exists():
    g = Generator(FLOAT, threads=1); ref_file.write_text(json.dumps([r.text for r in g.generate(texts, batch_size=16)]))
ref = json.loads(ref_file.read_text())
g = Generator(out, threads=1)
t = time.perf_counter(); hyp = [r.text for r in g.generate(texts, batch_size=16)]; dt = time.perf_counter() - t
same = sum(h == r for h, r in zip(hyp, ref))
print(f"RESULT {a.name} {Path(a.text).stem} chrF {sacrebleu.corpus_chrf(hyp, [ref]).score:.2f} BLEU {sacrebleu.corpus_bleu(hyp, [ref]).score:.2f} same {same}/{len(ref)} time {dt:.1f}s")
