"""Train a Marian GEC model on UA-GEC (gec-only), time-boxed, one command.

    python benchmarks/models/uagec/train.py --out benchmarks/models/uagec/model \
        [--minutes 50] [--threads 1] [--seed 0]

The defaults train the committed small model on the CPU. The larger reference model (d384,
6+4 layers, byte fallback, rare characters; ``../shared/models/uagec-base``) is

    python benchmarks/models/uagec/train.py --out DIR --device cuda --threads 4 --seed 0 \
        --minutes 6.5 --byte-fallback --vocab-size 8000 --d-model 384 --heads 6 --ffn-dim 1536 \
        --encoder-layers 6 --decoder-layers 4 --max-tokens 20000 --lr 1e-3 --warmup 800 \
        --dropout 0.2 --eval-every 0.5 --keep-best --rare-char-rate 0.1

Steps: (1) a ~8k BPE tokenizer (Metaspace, Marian specials ``</s>`` ``<unk>`` ``<pad>``,
``</s>`` appended) trained on the training split; (2) a from-scratch ``MarianMTModel``
(by default d_model 256, 4 encoder / 2 decoder layers, 4 heads, FFN 1024, tied embeddings);
(3) AdamW, linear warmup + inverse-sqrt decay, label smoothing 0.1, token-budget batches,
real pairs plus seeded synthetic pairs, stopped and saved when the time budget is spent;
(4) ``save_pretrained`` as fp16 safetensors with the tokenizer, ``<pad>`` masked out of
generation through ``final_logits_bias``, and ``train_log.json`` next to it.

A CPU run of the small model takes hours on a shared machine, so at every dev evaluation the
whole training state (weights, optimizer, step, the epoch's batch order, the random streams) is
written to ``OUT/resume.pt``; ``--resume`` continues from it, with the same options, to the
same weights an uninterrupted run reaches (on the CPU, where the run is deterministic).
``--minutes`` is then the budget of the resumed part; ``--max-steps`` counts from step 0.
"""

from __future__ import annotations

import argparse
import contextlib
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

BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path, byte_fallback: bool = False):
    """The recipe's BPE, saved as a fast tokenizer in ``out_dir``.

    ``byte_fallback``: 256 byte tokens ``<0x00>``..``<0xFF>`` (ids 3-258, ordinary vocabulary
    entries, not special tokens, so decoding with ``skip_special_tokens`` keeps them) stand in
    for any character the pieces do not cover, so no text becomes ``<unk>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    # No normalizer: the text is kept byte-for-byte (NFC as in the corpus).
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        # The byte tokens take 256 of the ids: the same total vocabulary, fewer learned pieces.
        vocab_size=vocab_size - (len(BYTE_TOKENS) if byte_fallback else 0),
        min_frequency=2,
        special_tokens=[EOS, UNK, PAD],  # ids 0, 1, 2
        limit_alphabet=400,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok = _with_byte_fallback(tok) if byte_fallback else _metaspace_always(tok)
    return _save_fast(tok, out_dir)


def _metaspace_always(tok):
    from tokenizers import decoders

    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def _with_byte_fallback(trained):
    """Rebuild a trained BPE with the byte tokens after the specials and ``byte_fallback`` on.

    The pieces and merges are the trained ones, so every text the pieces cover tokenizes as
    before. Whitespace is made exact as well: the ``▁`` word marker is prepended by a normalizer
    and the pre-tokenizer adds none, so a leading space is kept as its own ``▁`` instead of
    being merged away, and the decoder drops exactly the one marker the normalizer added. Only
    U+2581 ``▁`` itself cannot round-trip (it decodes as a space)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    state = json.loads(trained.to_str())["model"]
    learned = sorted(state["vocab"].items(), key=lambda kv: kv[1])
    specials = [EOS, UNK, PAD]
    vocab = {t: i for i, t in enumerate(specials + BYTE_TOKENS)}
    for piece, _ in learned:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=UNK, byte_fallback=True))
    tok.normalizer = normalizers.Prepend("▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    tok.decoder = decoders.Sequence([
        decoders.ByteFallback(),
        decoders.Metaspace(replacement="▁", prepend_scheme="never"),
        decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
    ])
    tok.add_special_tokens(specials)
    return tok


def extend_with_byte_fallback(model_dir: Path, out_dir: Path):
    """A trained model's tokenizer with the 256 byte tokens appended after its vocabulary
    (ids ``V``..``V+255``) and ``byte_fallback`` on, saved in ``out_dir``.

    Its pieces, merges, pre-tokenizer and ids are kept, so every text its pieces cover
    tokenizes exactly as before, and the model it was trained with keeps every embedding row:
    only characters that were ``<unk>`` become byte tokens (``--init-from``)."""
    from tokenizers import Tokenizer, decoders, models

    trained = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    state = json.loads(trained.to_str())
    if state["model"].get("byte_fallback"):
        raise SystemExit(f"{model_dir}: its tokenizer has byte fallback already")
    vocab = dict(state["model"]["vocab"])
    if any(token in vocab for token in BYTE_TOKENS):
        raise SystemExit(f"{model_dir}: its vocabulary holds byte tokens already")
    first = trained.get_vocab_size(with_added_tokens=True)
    vocab.update({token: first + i for i, token in enumerate(BYTE_TOKENS)})
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in state["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=UNK, byte_fallback=True))
    tok.normalizer, tok.pre_tokenizer = trained.normalizer, trained.pre_tokenizer
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), trained.decoder])
    tok.add_special_tokens([EOS, UNK, PAD])
    return _save_fast(tok, out_dir)


def _save_fast(tok, out_dir: Path):
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

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
    return loss.mean(), nll.mean(), mask.sum()  # the count stays a tensor: no host sync


def to_device(tensors, device):
    """Batches are built on the CPU; on CUDA they go over pinned and without a host sync."""
    if device.type == "cpu":
        return tensors
    return tuple(t.pin_memory().to(device, non_blocking=True) for t in tensors)


def autocast(device, bf16: bool):
    """bf16 autocast around the forward pass on CUDA; the loss is computed in fp32 from the logits."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def _rare_char_check(examples, first_byte: int, n_bytes: int = 256) -> dict:
    """How the rare-character pairs reach the model: byte tokens (ids ``first_byte``.. on), and
    whether source and target carry the same ones (a difference would teach the model to invent
    or drop a character)."""
    is_byte = lambda i: first_byte <= i < first_byte + n_bytes  # noqa: E731
    with_bytes, n_tok, ids, differ = 0, 0, set(), 0
    for s, t in examples:
        sb, tb = [i for i in s if is_byte(i)], [i for i in t if is_byte(i)]
        with_bytes += bool(sb)
        n_tok += len(sb)
        ids.update(sb)
        differ += sb != tb
    return {"sources_with_byte_tokens": with_bytes, "byte_tokens": n_tok,
            "distinct_byte_ids": len(ids), "pairs_differing": differ}


@torch.no_grad()
def dev_loss(model, examples, pad_id, max_tokens, device=torch.device("cpu"), bf16=False):
    model.eval()
    rng = random.Random(0)
    tot_nll, tot_tok = 0.0, 0
    for idx in make_batches(examples, max_tokens, rng):
        inp, att, dec, lab = to_device(collate(examples, idx, pad_id), device)
        with autocast(device, bf16):
            out = model(input_ids=inp, attention_mask=att, decoder_input_ids=dec)
        _, nll, n = loss_fn(out.logits, lab, 0.0)
        tot_nll += float(nll) * int(n)
        tot_tok += int(n)
    model.train()
    return tot_nll / max(1, tot_tok)


# ------------------------------------------------------------------ resuming

RESUME_FILE = "resume.pt"
# options that may change between a run and its resumption: they do not change the weights
RESUME_FREE_ARGS = frozenset({"out", "resume", "minutes", "max_steps", "eval_every"})


def _write_resume(out: Path, state: dict) -> None:
    """The training state, written whole or not at all (a run stopped mid-write keeps the last)."""
    tmp = out / (RESUME_FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, out / RESUME_FILE)


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
    ap.add_argument("--byte-fallback", action="store_true",
                    help="256 byte tokens in the vocabulary: no character becomes <unk>")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4, help="attention heads, encoder and decoder")
    ap.add_argument("--ffn-dim", type=int, default=1024, help="feed-forward width, encoder and decoder")
    ap.add_argument("--encoder-layers", type=int, default=4)
    ap.add_argument("--decoder-layers", type=int, default=2)
    ap.add_argument("--device", default="cpu",
                    help="cpu, cuda or cuda:N; on CUDA: bf16 autocast, fused AdamW, TF32 (seeded, not bitwise reproducible)")
    ap.add_argument("--no-bf16", action="store_true", help="on CUDA: train in fp32")
    ap.add_argument("--keep-best", action="store_true",
                    help="save the weights of the dev evaluation with the lowest dev NLL, not the last ones")
    ap.add_argument("--max-tokens", type=int, default=4000, help="token budget per batch")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=400)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument("--max-len", type=int, default=128, help="drop training pairs longer (tokens)")
    ap.add_argument("--synthetic-ratio", type=float, default=0.5,
                    help="synthetic pairs per real training pair (0 = none)")
    ap.add_argument("--rare-char-rate", type=float, default=0.0,
                    help="fraction of synthetic pairs given rare characters (emoji, other scripts) to copy; "
                         "needs --byte-fallback")
    ap.add_argument("--dev-size", type=int, default=400, help="held-out pairs of train for dev loss")
    ap.add_argument("--eval-every", type=float, default=5.0,
                    help="minutes between dev evaluations (each one also writes OUT/resume.pt)")
    ap.add_argument("--resume", action="store_true",
                    help="continue from OUT/resume.pt, written by an earlier run with the same options")
    ap.add_argument("--init-from", default=None,
                    help="start from this trained model (its architecture and weights) instead of from scratch; "
                         "with --byte-fallback its tokenizer gets the 256 byte tokens appended and the model "
                         "as many new embedding rows, every other id and row kept")
    args = ap.parse_args(argv)
    if args.init_from and not args.byte_fallback:
        ap.error("--init-from extends a model's vocabulary with byte fallback: give --byte-fallback")
    if args.rare_char_rate and not args.byte_fallback:
        ap.error("--rare-char-rate needs --byte-fallback: without byte tokens rare characters are <unk>")
    if not 0.0 <= args.rare_char_rate <= 1.0:
        ap.error("--rare-char-rate must be in [0, 1]")
    if args.d_model % args.heads:
        ap.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this torch has no CUDA device")
    bf16 = cuda and not args.no_bf16

    t_start = time.time()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1) if args.threads == 1 else None
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    if cuda:
        # Seeded, but GPU kernels (atomics, TF32) are not bitwise reproducible; speed first.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.use_deterministic_algorithms(True)

    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    resumed = None
    if args.resume:
        if not (out / RESUME_FILE).is_file():
            ap.error(f"--resume: no {out / RESUME_FILE} (an earlier run writes it at each dev evaluation)")
        resumed = torch.load(out / RESUME_FILE, weights_only=False)
        differ = sorted(k for k, v in vars(args).items()
                        if k not in RESUME_FREE_ARGS and resumed["args"].get(k) != v)
        if differ:
            ap.error(f"--resume: options differ from the run that wrote {RESUME_FILE}: "
                     + ", ".join(f"{k} {resumed['args'].get(k)!r} -> {getattr(args, k)!r}" for k in differ))

    # ---- data
    train = load_pairs("train")
    rng = random.Random(args.seed)
    perm = list(range(len(train)))
    rng.shuffle(perm)
    dev_idx = set(perm[: args.dev_size])
    dev_pairs = [(train[i].source, train[i].target) for i in sorted(dev_idx)]
    tr_pairs = [(p.source, p.target) for i, p in enumerate(train) if i not in dev_idx]
    # Rare characters are drawn outside every character of the real pairs, so each one is
    # byte-encoded (the tokenizer is trained on the real pairs only).
    common = frozenset("".join(s + t for s, t in tr_pairs + dev_pairs))
    syn = synthetic_pairs([t for _, t in tr_pairs], int(len(tr_pairs) * args.synthetic_ratio), seed=args.seed + 1,
                          rare_rate=args.rare_char_rate, common_chars=common)

    # ---- tokenizer (trained on the training split: sources and targets, dev excluded)
    if args.init_from:
        tok = extend_with_byte_fallback(Path(args.init_from), out)
    else:
        tok = train_tokenizer([s for s, _ in tr_pairs] + [t for _, t in tr_pairs], args.vocab_size, out,
                              byte_fallback=args.byte_fallback)
    pad_id, eos_id, unk_id = tok.pad_token_id, tok.eos_token_id, tok.unk_token_id
    test = load_pairs("test")
    rt_train = roundtrip_rate(tok, [s for s, _ in tr_pairs[:2000]])
    rt_test = roundtrip_rate(tok, [p.source for p in test])
    unk_test = sum(ids.count(unk_id) for ids in tok([p.source for p in test])["input_ids"])
    print(f"tokenizer: vocab {len(tok)} pad {pad_id} eos {eos_id} unk {unk_id}; "
          f"decode(encode(s)) == s on train[:2000] {rt_train:.4f}, test sources {rt_test:.4f}; "
          f"<unk> in test sources: {unk_test}", flush=True)

    def enc(pairs):
        S = tok([s for s, _ in pairs])["input_ids"]
        T = tok([t for _, t in pairs])["input_ids"]
        return [(s, t) for s, t in zip(S, T) if len(s) <= args.max_len and len(t) <= args.max_len]

    real_ex, syn_ex, dev_ex = enc(tr_pairs), enc(syn), enc(dev_pairs)
    rare_check = None
    if args.rare_char_rate:
        rare_check = _rare_char_check(syn_ex, tok.convert_tokens_to_ids(BYTE_TOKENS[0]))
        print(f"rare chars: {rare_check['sources_with_byte_tokens']} synthetic sources with byte tokens "
              f"({rare_check['byte_tokens']} byte tokens, {rare_check['distinct_byte_ids']} distinct byte ids); "
              f"{rare_check['pairs_differing']} pairs whose byte tokens differ between source and target", flush=True)
    examples = real_ex + syn_ex
    n_tok = sum(len(s) + len(t) for s, t in examples)
    print(f"examples: real {len(real_ex)} synthetic {len(syn_ex)} dev {len(dev_ex)}; "
          f"{n_tok} tokens per epoch", flush=True)

    # ---- model
    cfg = MarianConfig(
        vocab_size=len(tok),
        d_model=args.d_model,
        encoder_layers=args.encoder_layers,
        decoder_layers=args.decoder_layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn_dim,
        decoder_ffn_dim=args.ffn_dim,
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
    if args.init_from:  # its own architecture; the byte tokens' rows added (mean of the others)
        model = MarianMTModel.from_pretrained(args.init_from, torch_dtype=torch.float32)
        model.resize_token_embeddings(len(tok))
        model.config.decoder_vocab_size = len(tok)
        model.config.dropout = args.dropout
        model = model.to(device)
    else:
        model = MarianMTModel(cfg).to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01,
                            **({"fused": True} if cuda else {}))

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
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "bf16_autocast": bf16,
        "setup_seconds": round(time.time() - t_start, 1),
        "evals": [],
    }
    log["tokenizer"].update({"byte_fallback": args.byte_fallback, "unk_in_test_sources": unk_test})
    if rare_check is not None:
        log["data"]["rare_chars"] = rare_check
    try:
        import tokenizers
        import transformers

        log.update({"transformers": transformers.__version__, "tokenizers": tokenizers.__version__})
    except ImportError:  # pragma: no cover - both are imported above
        pass
    t_train = time.time()
    bat_rng = random.Random(args.seed + 2)
    if resumed is None:
        d0 = dev_loss(model, dev_ex, pad_id, args.max_tokens, device, bf16)
        log["evals"].append({"step": 0, "epoch": 0.0, "minutes": 0.0, "dev_nll": d0})
        print(f"step 0 dev nll {d0:.3f}", flush=True)
        best = {"dev_nll": d0, "step": 0, "state": None}
        step, epoch, seen_tok, done_in_epoch = 0, 0, 0, 0
        next_eval = args.eval_every * 60.0
    else:
        model.load_state_dict(resumed["model"])
        opt.load_state_dict(resumed["optimizer"])
        torch.set_rng_state(resumed["torch_rng"])
        bat_rng.setstate(resumed["epoch_rng"])  # as it was before this epoch's batches were drawn
        step, epoch, seen_tok, done_in_epoch = (resumed[k] for k in ("step", "epoch", "seen_tok", "done_in_epoch"))
        best, log["evals"] = resumed["best"], resumed["evals"]
        log["resumed"] = log.get("resumed", []) + [{"step": step, "from_train_seconds": resumed["train_seconds"]}]
        t_train -= resumed["train_seconds"]  # minutes and tokens/s continue the run's
        next_eval = resumed["next_eval"]
        print(f"resumed at step {step} (epoch {epoch}, batch {done_in_epoch}) from {out / RESUME_FILE}", flush=True)
    run_loss, run_nll, run_n = 0.0, 0.0, 0
    stop = False
    while not stop:
        epoch_rng = bat_rng.getstate()
        batches = make_batches(examples, args.max_tokens, bat_rng)
        for bi, idx in enumerate(batches):
            if bi < done_in_epoch:  # a resumed epoch: these batches were trained on before
                continue
            inp, att, dec, lab = to_device(collate(examples, idx, pad_id), device)
            with autocast(device, bf16):
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
            # Running sums stay where the loss is: no host sync per step on CUDA.
            run_loss += loss.detach() * n
            run_nll += nll.detach() * n
            run_n += n
            el = time.time() - t_train
            if step % 50 == 0:
                print(f"step {step} ep {epoch + bi / len(batches):.2f} loss {float(run_loss) / float(run_n):.3f} "
                      f"nll {float(run_nll) / float(run_n):.3f} lr {lr_at(step):.2e} {el / 60:.1f} min "
                      f"{seen_tok / el:.0f} tok/s", flush=True)
                run_loss, run_nll, run_n = 0.0, 0.0, 0
            if el >= next_eval or (time.time() - t_start) >= budget_s - save_reserve_s or step == args.max_steps:
                d = dev_loss(model, dev_ex, pad_id, args.max_tokens, device, bf16)
                log["evals"].append({"step": step, "epoch": round(epoch + (bi + 1) / len(batches), 4),
                                     "minutes": round(el / 60, 2), "dev_nll": d})
                print(f"step {step} dev nll {d:.3f}", flush=True)
                if args.keep_best and d < best["dev_nll"]:
                    best = {"dev_nll": d, "step": step,
                            "state": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}}
                next_eval += args.eval_every * 60.0
                _write_resume(out, {
                    "args": vars(args), "model": model.state_dict(), "optimizer": opt.state_dict(),
                    "torch_rng": torch.get_rng_state(), "epoch_rng": epoch_rng, "step": step, "epoch": epoch,
                    "done_in_epoch": bi + 1, "seen_tok": seen_tok, "best": best, "evals": log["evals"],
                    "train_seconds": time.time() - t_train, "next_eval": next_eval})
            if (time.time() - t_start) >= budget_s - save_reserve_s or step == args.max_steps:
                stop = True
                break
        else:
            epoch += 1
            done_in_epoch = 0

    train_s = time.time() - t_train
    final_dev = log["evals"][-1]["dev_nll"]
    saved = {"step": step, "dev_nll": final_dev}
    if args.keep_best and best["state"] is not None and best["dev_nll"] < final_dev:
        model.load_state_dict(best["state"])
        saved = {"step": best["step"], "dev_nll": best["dev_nll"]}
        print(f"keeping the weights of step {saved['step']} (dev nll {saved['dev_nll']:.3f})", flush=True)
    # ---- save: <pad> is never generated (it is also the decoder start token)
    model = model.cpu()
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
        "final_dev_nll": final_dev,
        "saved_step": saved["step"],
        "saved_dev_nll": saved["dev_nll"],
    })
    (out / "train_log.json").write_text(json.dumps(log, indent=2, ensure_ascii=False))
    print(f"saved {out} ({size / 1e6:.1f} MB) after {step} steps, {log['wall_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
