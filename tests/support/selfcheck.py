"""Developer sanity check of :mod:`tests.support.tiny` (not a test module; run it by hand).

    python -m tests.support.selfcheck [--skip-editing] [--out DIR]

For every family: build a checkpoint, reload it through the Auto classes, check the tokenizer's
special tokens, and print greedy output lengths.  Then train (or reuse) the editing Marian and
print its held-out exact match.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from tests.support import tiny

_EXPECTED_SPECIALS = {
    # family -> (prefix ids, suffix ids) that tokenizer(text) must add
    "marian": ((), ("</s>",)),
    "bart": (("<s>",), ("</s>",)),
    "mbart": (("<s>",), ("</s>",)),
    "t5": ((), ("</s>",)),
    "mt5": ((), ("</s>",)),
}


def check_family(family: str, root: Path) -> None:
    start = time.monotonic()
    out_dir = tiny.build_random_checkpoint(family, root / family)
    build_s = time.monotonic() - start
    info = json.loads((out_dir / "tiny_info.json").read_text())
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (out_dir / name).is_file(), name

    model = AutoModelForSeq2SeqLM.from_pretrained(out_dir).eval()
    tok = AutoTokenizer.from_pretrained(out_dir)
    assert tok.is_fast, type(tok)
    cfg = model.config
    assert (cfg.pad_token_id, cfg.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert cfg.vocab_size == len(tok)

    prefix, suffix = _EXPECTED_SPECIALS[family]
    ids = tok("w1 w2 w3")["input_ids"]
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens == [*prefix, "w1", "w2", "w3", *suffix], tokens
    assert tok.decode(ids, skip_special_tokens=True) == "w1 w2 w3"

    texts = tiny._random_sources(tiny.default_words(), 40, random.Random(123))
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, num_beams=1, max_new_tokens=40)
    rows = tiny._greedy_outputs(model, tok, texts)
    lengths = [len(r) for r in rows]
    assert not any(cfg.pad_token_id in r for r in rows), "pad generated"
    # The calibration score is recomputed on the *reloaded* model: equality means the shaped weights
    # (final_logits_bias, untied lm_head, ...) survived save/load.
    cal_texts = tiny._random_sources(tiny.default_words(), 48, random.Random(f"calibrate-{family}-0"))
    reloaded_score = tiny._length_score(tiny._greedy_outputs(model, tok, cal_texts), cfg.pad_token_id, 40)
    assert abs(reloaded_score - info["length_score"]) < 1e-9, (reloaded_score, info)

    hist = Counter("1" if n == 1 else "2" if n == 2 else "40(max)" if n == 40 else "3-39" for n in lengths)
    print(f"[{family}] built in {build_s:.1f}s  d_model={cfg.d_model}  vocab={cfg.vocab_size}  "
          f"pad/eos/bos/start={cfg.pad_token_id}/{cfg.eos_token_id}/{cfg.bos_token_id}/{cfg.decoder_start_token_id}  "
          f"specials ok: {tokens}")
    print(f"   eos offset={info['eos_logit_offset']} (attempt {info['attempt']})  sequences shape={tuple(out.shape)}")
    print(f"   lengths={sorted(lengths)}")
    print(f"   buckets={dict(sorted(hist.items()))}  distinct outputs={len(set(map(tuple, rows)))}/{len(rows)}  "
          f"distinct tokens={len({t for r in rows for t in r})}")


def check_editing(out_dir: Path) -> None:
    if not (out_dir / "editing_eval.json").is_file():
        tiny.train_editing_marian(out_dir)
    report = json.loads((out_dir / "editing_eval.json").read_text())
    model = AutoModelForSeq2SeqLM.from_pretrained(out_dir).eval()
    tok = AutoTokenizer.from_pretrained(out_dir)
    pairs = [tiny.make_editing_pair(random.Random(f"selfcheck-{i}")) for i in range(5)]
    enc = tok([s for s, _ in pairs], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, num_beams=1, max_new_tokens=60)
    print(f"[editing] held-out exact match={report['exact_match']:.2f}  steps={report['steps']}  "
          f"train_seconds={report['train_seconds']}  rules={tiny.editing_rules()}")
    for (src, tgt), hyp in zip(pairs, tok.batch_decode(out, skip_special_tokens=True)):
        print(f"   {'OK ' if hyp == tgt else 'BAD'} {src!r} -> {hyp!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-editing", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="where to build (default: a temp dir)")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="tiny-selfcheck-"))
    for family in tiny.FAMILIES:
        check_family(family, root)
    if not args.skip_editing:
        check_editing(root / "editing")


if __name__ == "__main__":
    main()
