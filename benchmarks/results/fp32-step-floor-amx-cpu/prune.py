"""Feasibility: exact argmax of h @ W^T + b via a rank-r bound; how many candidates survive."""
import numpy as np, torch, sys
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
from aggdec.sentences import load_examples
torch.set_num_threads(1)
ck = "benchmarks/models/uagec/model"
m = AutoModelForSeq2SeqLM.from_pretrained(ck, dtype=torch.float32).eval()
tok = AutoTokenizer.from_pretrained(ck)
src = [e.source for e in load_examples("uagec-test", int(sys.argv[1]))]
H = []
with torch.no_grad():
    for s in src:
        enc = tok(s, return_tensors="pt")
        out = m.generate(**enc, max_new_tokens=128, num_beams=1, do_sample=False, output_hidden_states=True,
                         return_dict_in_generate=True)
        for step in out.decoder_hidden_states:
            H.append(step[-1][0, -1].numpy())
H = np.stack(H).astype(np.float64)
W = m.lm_head.weight.detach().numpy().astype(np.float64)  # [V, d]
b = m.final_logits_bias.detach().numpy().reshape(-1).astype(np.float64) if hasattr(m, "final_logits_bias") else 0
print("positions", H.shape, "W", W.shape, "bias nonzero", np.count_nonzero(b))
L = H @ W.T + b
# basis from W's own SVD (data-independent: weights only)
U, S, Vt = np.linalg.svd(W, full_matrices=False)
hn = np.linalg.norm(H, axis=1)
for r in (16, 32, 48, 64, 96, 128):
    B = Vt[:r].T                        # [d, r]
    C = W @ B                            # [V, r] coefficients
    E = np.linalg.norm(W - C @ B.T, axis=1)   # residual norms
    approx = (H @ B) @ C.T + b
    slack = hn[:, None] * E[None, :] * 1.0001 + 1e-4
    upper, lower = approx + slack, approx - slack
    Lb = lower.max(axis=1, keepdims=True)
    cand = (upper >= Lb).sum(axis=1)
    assert ((upper >= Lb) | (L < L.max(axis=1, keepdims=True))).all()
    # union over 18 consecutive positions (an IAD block)
    print(f"r={r:3d} candidates per position: median {np.median(cand):.0f} p90 {np.percentile(cand,90):.0f} "
          f"p99 {np.percentile(cand,99):.0f} max {cand.max()}  energy kept {np.sum(S[:r]**2)/np.sum(S**2):.3f}")
print("basis from hidden states (fit on first half, test on second)")
half = len(H) // 2
Hc = H[:half]
_, Sh, Vh = np.linalg.svd(Hc, full_matrices=False)
T = H[half:]; LT = T @ W.T + b
for r in (16, 32, 64, 96, 128):
    B = Vh[:r].T
    g = T @ B; C = W @ B
    qh = np.linalg.norm(T - g @ B.T, axis=1); qw = np.linalg.norm(W - C @ B.T, axis=1)
    approx = g @ C.T + b
    slack = qh[:, None] * qw[None, :] * 1.0001 + 1e-4
    upper, lower = approx + slack, approx - slack
    cand = (upper >= lower.max(axis=1, keepdims=True)).sum(axis=1)
    print(f"r={r:3d} median {np.median(cand):.0f} p90 {np.percentile(cand,90):.0f} max {cand.max()}  |Qh|/|h| median {np.median(qh/np.linalg.norm(T,axis=1)):.3f}")
print("basis from teacher-forced random tokens (no text), tested on real positions")
g_ = torch.Generator().manual_seed(0)
R = []
with torch.no_grad():
    for i in range(40):
        n_src, n_tgt = 24, 24
        ids = torch.randint(3, W.shape[0], (1, n_src), generator=g_)
        dec = torch.randint(3, W.shape[0], (1, n_tgt), generator=g_)
        dec[0, 0] = m.config.decoder_start_token_id
        o = m(input_ids=ids, decoder_input_ids=dec, output_hidden_states=True)
        R.append(o.decoder_hidden_states[-1][0].numpy())
    # self-generated: greedy from random sources
    for i in range(40):
        ids = torch.randint(3, W.shape[0], (1, 20), generator=g_)
        out = m.generate(input_ids=ids, max_new_tokens=30, num_beams=1, do_sample=False, output_hidden_states=True,
                         return_dict_in_generate=True)
        for step in out.decoder_hidden_states:
            R.append(step[-1][0, -1:].numpy())
R = np.concatenate(R).astype(np.float64)
_, _, Vr = np.linalg.svd(R, full_matrices=False)
T = H
for r in (96, 128, 160):
    B = Vr[:r].T
    g = T @ B; C = W @ B
    qh = np.linalg.norm(T - g @ B.T, axis=1); qw = np.linalg.norm(W - C @ B.T, axis=1)
    approx = g @ C.T + b
    slack = qh[:, None] * qw[None, :] * 1.0001 + 1e-4
    upper, lower = approx + slack, approx - slack
    cand = (upper >= lower.max(axis=1, keepdims=True)).sum(axis=1)
    print(f"r={r:3d} median {np.median(cand):.0f} p90 {np.percentile(cand,90):.0f} p99 {np.percentile(cand,99):.0f} max {cand.max()}  |Qh|/|h| median {np.median(qh/np.linalg.norm(T,axis=1)):.3f}")
