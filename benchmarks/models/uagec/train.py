"""Train a small Marian GEC model on UA-GEC (gec-only), CPU-only, time-boxed, one command.

    python benchmarks/models/uagec/train.py --out benchmarks/models/uagec/model \
        [--minutes 50] [--threads 1] [--seed 0]

Steps: (1) a ~8k BPE tokenizer (Metaspace, Marian specials ``</s>`` ``<unk>`` ``<pad>``,
``</s>`` appended) trained on the training split; (2) a from-scratch ``MarianMTModel``
(d_model 256, 4 encoder / 2 decoder layers, 4 heads, FFN 1024, tied embeddings);
(3) AdamW, linear warmup + inverse-sqrt decay, label smoothing 0.1, token-budget batches,
real pairs plus seeded synthetic pairs, stopped and saved when the time budget is spent;
(4) ``save_pretrained`` as fp16 safetensors with the tokenizer, ``<pad>`` masked out of
generation through ``final_logits_bias``, and ``train_log.json`` next to it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from data import load_pairs, synthetic_pairs  # noqa: E402

EOS, UNK, PAD = "</s>", "<unk>", "<pad>"


# ------------------------------------------------------------------ tokenizer

def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    # No normalizer: the text is kept byte-for-byte (NFC as in the corpus).
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, UNK, PAD],  # ids 0, 1, 2
        limit_alphabet=400,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    eos_id = tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A $B {EOS}", special_tokens=[(EOS, eos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(out_dir)
    return fast


def roundtrip_rate(tok, texts: list[str]) -> float:
    ok = 0
    for s in texts:
        ids = tok(s)["input_ids"]
        ok += tok.decode(ids, skip_special_tokens=True) == s
    return ok / max(1, len(texts))


# ------------------------------------------------------------------ batching

def make_batches(examples, max_tokens: int, rng: random.Random):
    """Token-budget batches: sort by length (with a little jitter), cut, shuffle the batches.

    The cost of a batch is rows * (max source len + max target len)."""
    order = sorted(
        range(len(examples)),
        key=lambda i: (len(examples[i][0]) + len(examples[i][1]) + rng.random() * 3),
    )
    batches, cur, cur_max = [], [], 0
    for i in order:
        s, t = examples[i]
        m = max(cur_max, len(s) + len(t))
        if cur and m * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, m = [], len(s) + len(t)
        cur.append(i)
        cur_max = m
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(examples, idx, pad_id: int):
    srcs = [examples[i][0] for i in idx]
    tgts = [examples[i][1] for i in idx]
    S, T = max(map(len, srcs)), max(map(len, tgts))
    inp = torch.full((len(idx), S), pad_id, dtype=torch.long)
    att = torch.zeros((len(idx), S), dtype=torch.long)
    dec = torch.full((len(idx), T), pad_id, dtype=torch.long)
    lab = torch.full((len(idx), T), -100, dtype=torch.long)
    for r, (s, t) in enumerate(zip(srcs, tgts)):
        inp[r, : len(s)] = torch.tensor(s)
        att[r, : len(s)] = 1
        lab[r, : len(t)] = torch.tensor(t)
        # decoder input = [decoder_start (= pad)] + target[:-1]
        dec[r, 1 : len(t)] = torch.tensor(t[:-1])
    return inp, att, dec, lab


def loss_fn(logits, labels, smoothing: float):
    """Label-smoothed cross entropy, mean over target tokens; also the plain NLL."""
    V = logits.size(-1)
    lp = torch.log_softmax(logits.float().view(-1, V), dim=-1)
    lab = labels.view(-1)
    mask = lab != -100
    lp, lab = lp[mask], lab[mask]
    nll = -lp.gather(1, lab[:, None]).squeeze(1)
    smooth = -lp.mean(dim=-1)
    loss = (1 - smoothing) * nll + smoothing * smooth
    return loss.mean(), nll.mean(), int(mask.sum())


@torch.no_grad()
def dev_loss(model, examples, pad_id, max_tokens):
    model.eval()
    rng = random.Random(0)
    tot_nll, tot_tok = 0.0, 0
    for idx in make_batches(examples, max_tokens, rng):
        inp, att, dec, lab = collate(examples, idx, pad_id)
        out = model(input_ids=inp, attention_mask=att, decoder_input_ids=dec)
        _, nll, n = loss_fn(out.logits, lab, 0.0)
        tot_nll += float(nll) * n
        tot_tok += n
    model.train()
    return tot_nll / max(1, tot_tok)


# ------------------------------------------------------------------ main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (save_pretrained)")
    ap.add_argument("--minutes", type=float, default=50.0, help="training time budget")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="stop after this many steps (reproduces a run exactly; the committed model: 2734)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--encoder-layers", type=int, default=4)
    ap.add_argument("--decoder-layers", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=4000, help="token budget per batch")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=400)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--max-len", type=int, default=128, help="drop training pairs longer (tokens)")
    ap.add_argument("--synthetic-ratio", type=float, default=0.5,
                    help="synthetic pairs per real training pair (0 = none)")
    ap.add_argument("--dev-size", type=int, default=400, help="held-out pairs of train for dev loss")
    ap.add_argument("--eval-every", type=float, default=5.0, help="minutes between dev evaluations")
    args = ap.parse_args(argv)

    t_start = time.time()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1) if args.threads == 1 else None
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # ---- data
    train = load_pairs("train")
    rng = random.Random(args.seed)
    perm = list(range(len(train)))
    rng.shuffle(perm)
    dev_idx = set(perm[: args.dev_size])
    dev_pairs = [(train[i].source, train[i].target) for i in sorted(dev_idx)]
    tr_pairs = [(p.source, p.target) for i, p in enumerate(train) if i not in dev_idx]
    syn = synthetic_pairs([t for _, t in tr_pairs], int(len(tr_pairs) * args.synthetic_ratio), seed=args.seed + 1)

    # ---- tokenizer (trained on the training split: sources and targets, dev excluded)
    tok = train_tokenizer([s for s, _ in tr_pairs] + [t for _, t in tr_pairs], args.vocab_size, out)
    pad_id, eos_id, unk_id = tok.pad_token_id, tok.eos_token_id, tok.unk_token_id
    test = load_pairs("test")
    rt_train = roundtrip_rate(tok, [s for s, _ in tr_pairs[:2000]])
    rt_test = roundtrip_rate(tok, [p.source for p in test])
    print(f"tokenizer: vocab {len(tok)} pad {pad_id} eos {eos_id} unk {unk_id}; "
          f"decode(encode(s)) == s on train[:2000] {rt_train:.4f}, test sources {rt_test:.4f}", flush=True)

    def enc(pairs):
        S = tok([s for s, _ in pairs])["input_ids"]
        T = tok([t for _, t in pairs])["input_ids"]
        return [(s, t) for s, t in zip(S, T) if len(s) <= args.max_len and len(t) <= args.max_len]

    real_ex, syn_ex, dev_ex = enc(tr_pairs), enc(syn), enc(dev_pairs)
    examples = real_ex + syn_ex
    n_tok = sum(len(s) + len(t) for s, t in examples)
    print(f"examples: real {len(real_ex)} synthetic {len(syn_ex)} dev {len(dev_ex)}; "
          f"{n_tok} tokens per epoch", flush=True)

    # ---- model
    cfg = MarianConfig(
        vocab_size=len(tok),
        d_model=256,
        encoder_layers=args.encoder_layers,
        decoder_layers=args.decoder_layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        max_position_embeddings=256,
        dropout=args.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_function="swish",
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        decoder_start_token_id=pad_id,
        forced_eos_token_id=None,
        bos_token_id=None,
        decoder_vocab_size=len(tok),
    )
    model = MarianMTModel(cfg)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)

    def lr_at(step):  # linear warmup, then inverse square root
        step = max(1, step)
        return args.lr * min(step / args.warmup, math.sqrt(args.warmup / step))

    budget_s = args.minutes * 60.0
    save_reserve_s = 20.0
    log = {
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "args": vars(args),
        "seed": args.seed,
        "torch": torch.__version__,
        "platform": platform.platform(),
        "tokenizer": {"vocab_size": len(tok), "pad": pad_id, "eos": eos_id, "unk": unk_id,
                      "roundtrip_train2000": rt_train, "roundtrip_test_sources": rt_test},
        "data": {"real": len(real_ex), "synthetic": len(syn_ex), "dev": len(dev_ex),
                 "tokens_per_epoch": n_tok},
        "parameters": n_params,
        "evals": [],
    }
    t_train = time.time()
    d0 = dev_loss(model, dev_ex, pad_id, args.max_tokens)
    log["evals"].append({"step": 0, "epoch": 0.0, "minutes": 0.0, "dev_nll": d0})
    print(f"step 0 dev nll {d0:.3f}", flush=True)

    step, epoch, seen_tok = 0, 0, 0
    next_eval = args.eval_every * 60.0
    run_loss, run_nll, run_n = 0.0, 0.0, 0
    stop = False
    bat_rng = random.Random(args.seed + 2)
    while not stop:
        batches = make_batches(examples, args.max_tokens, bat_rng)
        for bi, idx in enumerate(batches):
            inp, att, dec, lab = collate(examples, idx, pad_id)
            out_ = model(input_ids=inp, attention_mask=att, decoder_input_ids=dec)
            loss, nll, n = loss_fn(out_.logits, lab, args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            step += 1
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            opt.step()
            seen_tok += int(inp.numel() + dec.numel())
            run_loss += float(loss.detach()) * n
            run_nll += float(nll.detach()) * n
            run_n += n
            el = time.time() - t_train
            if step % 50 == 0:
                print(f"step {step} ep {epoch + bi / len(batches):.2f} loss {run_loss / run_n:.3f} "
                      f"nll {run_nll / run_n:.3f} lr {lr_at(step):.2e} {el / 60:.1f} min "
                      f"{seen_tok / el:.0f} tok/s", flush=True)
                run_loss, run_nll, run_n = 0.0, 0.0, 0
            if el >= next_eval or (time.time() - t_start) >= budget_s - save_reserve_s or step == args.max_steps:
                d = dev_loss(model, dev_ex, pad_id, args.max_tokens)
                log["evals"].append({"step": step, "epoch": round(epoch + (bi + 1) / len(batches), 4),
                                     "minutes": round(el / 60, 2), "dev_nll": d})
                print(f"step {step} dev nll {d:.3f}", flush=True)
                next_eval += args.eval_every * 60.0
            if (time.time() - t_start) >= budget_s - save_reserve_s or step == args.max_steps:
                stop = True
                break
        else:
            epoch += 1

    train_s = time.time() - t_train
    # ---- save: <pad> is never generated (it is also the decoder start token)
    model.eval()
    with torch.no_grad():
        model.final_logits_bias[..., pad_id] = -100.0
    model.generation_config = GenerationConfig(
        decoder_start_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        max_length=256,
        num_beams=1,
        do_sample=False,
    )
    model.config.dropout = args.dropout
    model.half().save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log.update({
        "steps": step,
        "epochs": round(epoch + (bi + 1) / len(batches), 4),
        "tokens_seen": seen_tok,
        "train_seconds": round(train_s, 1),
        "wall_seconds": round(time.time() - t_start, 1),
        "checkpoint_bytes": size,
        "dtype": "float16",
    })
    (out / "train_log.json").write_text(json.dumps(log, indent=2, ensure_ascii=False))
    print(f"saved {out} ({size / 1e6:.1f} MB) after {step} steps, {log['wall_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
