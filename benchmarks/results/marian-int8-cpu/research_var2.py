"""scratch: build an int8 variant of the float bundle with QuantizeOptions and score its greedy against float greedy."""
import argparse, json, sys, time
from pathlib import Path
from aggdec.export import quantize as Q
p = argparse.ArgumentParser()
p.add_argument("name"); p.add_argument("--float-products"); p.add_argument("--encoder", default="per-call")
p.add_argument("--weights", default="7bit"); p.add_argument("--passes", type=int, default=1)
p.add_argument("--text", default="/tmp/mti8/tune.txt")
a = p.parse_args()
FLOAT = Path("/tmp/mti8/enpt"); out = Path("/tmp/mti8/b") / a.name
if not out.exists():
    Q.quantize_bundle(FLOAT, out, options=Q.QuantizeOptions(encoder=a.encoder, weights=a.weights, activation_passes=a.passes,
                      float_products=a.float_products), progress=None)
q = json.loads((out / "manifest.json").read_text())["quantization"]
from aggdec import Generator
import sacrebleu
texts = Path(a.text).read_text().splitlines()
ref = json.loads(Path(a.text + ".float.json").read_text())
g = Generator(out, threads=1)
t = time.perf_counter(); hyp = [r.text for r in g.generate(texts, batch_size=16)]; dt = time.perf_counter() - t
same = sum(h == r for h, r in zip(hyp, ref))
Path(f"/tmp/mti8/b/{a.name}.{Path(a.text).stem}.json").write_text(json.dumps(hyp))
print(f"RESULT {a.name} {Path(a.text).stem} chrF {sacrebleu.corpus_chrf(hyp, [ref]).score:.2f} BLEU {sacrebleu.corpus_bleu(hyp, [ref]).score:.2f} same {same}/{len(ref)} time {dt:.1f}s top1 {q['top1_agreement']} lp {q['max_logprob_error']} {q['mean_logprob_error']}")
