"""An encoder call's cost against its padded tokens (rows x width), onnxruntime directly, 1 thread:
the median of 30 calls per shape, then seconds = fixed + per_token * tokens by least squares.

    python encoder_fit.py BUNDLE/encoder.onnx
"""
import sys, time, numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])
rng = np.random.default_rng(0)
def t(b, L, n=30):
    a = rng.integers(5, 1000, size=(b, L)).astype(np.int64); m = np.ones((b, L), np.int64)
    s.run(None, {'input_ids': a, 'attention_mask': m})
    best = []
    for _ in range(n):
        t0 = time.perf_counter(); s.run(None, {'input_ids': a, 'attention_mask': m}); best.append(time.perf_counter() - t0)
    return float(np.median(best)) * 1000
rows = []
for b in (1, 2, 4, 8):
    for L in (8, 16, 32, 64):
        ms = t(b, L); rows.append((b * L, ms)); print(f"batch {b} len {L}: {ms:.3f} ms ({ms / (b * L) * 1000:.1f} us/token)")
X = np.array([[1, tok] for tok, _ in rows]); y = np.array([ms for _, ms in rows])
c, per = np.linalg.lstsq(X, y, rcond=None)[0]
print(f"fit: {c:.3f} ms a call + {per * 1000:.1f} us a token -> call = {c / per:.1f} tokens")
