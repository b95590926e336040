"""Evaluate a UA-GEC checkpoint on the gec-only test split (greedy, fp32, CPU).

    python benchmarks/models/uagec/evaluate.py --model DIR [--limit N] [--threads 1] [--batch-size 48] [--out DIR]

Figures, for the model and for the copy system (hypothesis = source):
  - exact match: hypothesis == human target (annotator a1), as strings;
  - unchanged rate: hypothesis == source;
  - token-level edit precision / recall / F0.5 against the human edits. Tokens are whitespace
    tokens (``str.split()``). Edits come from ``difflib.SequenceMatcher`` opcodes over tokens,
    source->hypothesis and source->reference; an edit is ``(start, end, replacement tokens)``
    in source coordinates; TP = hypothesis edits that are also reference edits, summed over
    the corpus. As in the M2 scorer, precision is 1.0 when a system proposes no edits (so copy
    has P = 1, R = 0, F0.5 = 0).
Reference a1 is the primary one; the same figures against annotator a2 are reported too.

Rare characters: a test source's characters that the tokenizer's pieces do not cover (they
become byte tokens, or ``<unk>`` without byte fallback); ``rare_characters`` counts the sources
that hold any and those whose hypothesis keeps every one of them (each as often as the source).

Sources longer than the model's positions (more than ``--max-source-tokens`` subword tokens)
are not decoded; their hypothesis is the source (counted in ``too_long_copied``).
Writes ``evaluation.json`` and ``test_hypotheses.txt`` (one line per test pair, test order)
next to the model, or into ``--out`` (to re-check a model without touching its own files).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from data import load_pairs  # noqa: E402

from aggdec.bench.scoring import score  # noqa: E402


def rare_characters(tok, text: str, cache: dict[str, bool]) -> list[str]:
    """The characters of ``text`` that ``tok`` spells with byte tokens or ``<unk>``."""
    found = []
    for char in text:
        if char not in cache:
            tokens = tok.convert_ids_to_tokens(tok(char, add_special_tokens=False)["input_ids"])
            cache[char] = any(t == tok.unk_token or (t.startswith("<0x") and t.endswith(">")) for t in tokens)
        if cache[char]:
            found.append(char)
    return found


def rare_characters_kept(tok, sources: list[str], hyps: list[str]) -> dict:
    cache: dict[str, bool] = {}
    holding = kept = 0
    for source, hyp in zip(sources, hyps):
        chars = rare_characters(tok, source, cache)
        if chars:
            holding += 1
            kept += all(hyp.count(c) >= source.count(c) for c in set(chars))
    return {"sources_holding": holding, "kept_in_hypothesis": kept}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--limit", type=int, default=None, help="first N test pairs only")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=48)
    ap.add_argument("--max-source-tokens", type=int, default=250)
    ap.add_argument("--out", default=None, help="where the two files go (default: the model directory)")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    t0 = time.time()
    model_dir = Path(args.model)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    test = load_pairs("test")
    if args.limit:
        test = test[: args.limit]
    sources = [p.source for p in test]
    enc = tok(sources)["input_ids"]
    order = sorted(range(len(test)), key=lambda i: len(enc[i]))
    hyps: list[str | None] = [None] * len(test)
    too_long = [i for i in order if len(enc[i]) > args.max_source_tokens]
    for i in too_long:
        hyps[i] = sources[i]
    todo = [i for i in order if len(enc[i]) <= args.max_source_tokens]
    n_done = 0
    with torch.inference_mode():
        for b in range(0, len(todo), args.batch_size):
            idx = todo[b : b + args.batch_size]
            batch = tok([sources[i] for i in idx], return_tensors="pt", padding=True)
            max_new = min(255, int(batch["input_ids"].shape[1] * 1.5) + 10)
            out = model.generate(**batch, do_sample=False, num_beams=1, max_new_tokens=max_new)
            for i, ids in zip(idx, out):
                hyps[i] = tok.decode(ids, skip_special_tokens=True)
            n_done += len(idx)
            print(f"\r{n_done}/{len(todo)} decoded, {time.time() - t0:.0f} s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    decode_s = time.time() - t0

    refs1 = [p.target for p in test]
    refs2 = [p.target2 if p.target2 is not None else p.target for p in test]
    result = {
        "model": str(model_dir),
        "split": "ua_gec gec-only test (sentence level), reference = annotator a1",
        "n": len(test),
        "decoding": {"greedy": True, "num_beams": 1, "do_sample": False, "dtype": "float32",
                     "threads": args.threads, "batch_size": args.batch_size,
                     "too_long_copied": len(too_long), "seconds": round(decode_s, 1)},
        "model_scores": score(sources, hyps, refs1),
        "copy_scores": score(sources, sources, refs1),
        "model_scores_ref_a2": score(sources, hyps, refs2),
        "copy_scores_ref_a2": score(sources, sources, refs2),
        "rare_characters": rare_characters_kept(tok, sources, hyps),
        "tokenizer_roundtrip_test_sources": round(
            sum(tok.decode(e, skip_special_tokens=True) == s for e, s in zip(enc, sources)) / max(1, len(test)), 4),
    }
    out_dir = Path(args.out) if args.out else model_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "test_hypotheses.txt").write_text("\n".join(h.replace("\n", " ") for h in hyps) + "\n", encoding="utf-8")
    (out_dir / "evaluation.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
    m, c = result["model_scores"], result["copy_scores"]
    print(f"model: EM {m['exact_match']:.4f} P {m['precision']:.4f} R {m['recall']:.4f} "
          f"F0.5 {m['f0.5']:.4f} unchanged {m['unchanged_rate']:.4f} (tp {m['tp']}/{m['hyp_edits']} hyp, {m['ref_edits']} ref)")
    print(f"copy:  EM {c['exact_match']:.4f} P {c['precision']:.4f} R {c['recall']:.4f} "
          f"F0.5 {c['f0.5']:.4f} unchanged {c['unchanged_rate']:.4f}")
    rare = result["rare_characters"]
    print(f"rare characters kept in {rare['kept_in_hypothesis']} of the {rare['sources_holding']} sources holding any")
    print(f"decoded in {decode_s:.0f} s; wrote {out_dir / 'evaluation.json'}")


if __name__ == "__main__":
    main()
