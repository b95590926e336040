"""One verifier_argmax call of two bundles, alternating: B rows x T positions over random
caches (96 positions, 40 cached) and a 30-token encoded source; the new bundle asks for a
FRAC share of each row's block (ragged, as IAD's rows), or every position (1.0).

    python callab.py OLD NEW B T [FRAC] [ROUNDS]
"""
import sys, time, json, numpy as np, onnxruntime as ort
old, new = sys.argv[1], sys.argv[2]
B, T = int(sys.argv[3]), int(sys.argv[4]); frac = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
m = json.load(open(old + "/manifest.json"))
L, H, Dh = m["decoder_layers"], m["num_heads"], m["head_dim"]
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
def sess(p): return ort.InferenceSession(p + "/verifier_argmax.onnx", so, providers=["CPUExecutionProvider"])
so_, sn = sess(old), sess(new)
rng = np.random.default_rng(0); S = 30; C = 96
enc = ort.InferenceSession(old + "/encoder.onnx", so, providers=["CPUExecutionProvider"])
e = enc.run(None, {"input_ids": rng.integers(3, 8000, (B, S)).astype(np.int64), "attention_mask": np.ones((B, S), np.int64)})
names = [o.name for o in enc.get_outputs()]
feeds = {"input_ids": rng.integers(3, 8000, (B, T)).astype(np.int64), "past_lengths": np.full(B, 40, np.int64),
         "encoder_attention_mask": np.ones((B, S), np.int64)}
for i in range(L):
    feeds[f"self_key.{i}"] = rng.standard_normal((B, H, C, Dh)).astype(np.float32)
    feeds[f"self_value.{i}"] = rng.standard_normal((B, H, C, Dh)).astype(np.float32)
for n, v in zip(names, e):
    if n.startswith("cross"): feeds[n] = v
widths = np.maximum(1, np.round(T * frac * rng.uniform(0.6, 1.4, B)).clip(1, T)).astype(np.int64) if frac < 1 else np.full(B, T)
pos = np.flatnonzero(np.arange(T)[None] < widths[:, None]).astype(np.int64)
fn = {**feeds, "head_positions": pos} if "head_positions" in [i.name for i in sn.get_inputs()] else feeds
print("positions", len(pos), "of", B * T)
def t(s, f, n=30):
    st = time.perf_counter()
    for _ in range(n): s.run(["best_logits"], f)
    return (time.perf_counter() - st) / n
for _ in range(5): t(so_, feeds, 5); t(sn, fn, 5)
a, b = [], []
for r in range(int(sys.argv[6]) if len(sys.argv) > 6 else 15):
    if r % 2: b.append(t(sn, fn)); a.append(t(so_, feeds))
    else: a.append(t(so_, feeds)); b.append(t(sn, fn))
a, b = np.median(a), np.median(b)
print(f"B={B} T={T}: old {a*1e3:.3f} ms new {b*1e3:.3f} ms new/old {b/a:.3f}")
