"""Decode-loop overhead: how much of greedy/IAD time is spent outside onnxruntime calls.

Builds a Transformer-base-sized random Marian (d_model 512, 6+6 layers, 8 heads, FFN 2048,
vocabulary 32k), exports it with aggdec, and decodes exactly 64 tokens per sentence (EOS is
suppressed so every run has the same length) at batch 1 on the CPU or, with ``--device cuda``,
on onnxruntime's CUDA provider (TF32 off unless ``--tf32``). Reports medians over
repeats of: wall time, time inside ONNX Runtime calls, time outside them (the Python decode
loop, tokenization, IO binding), and the verifier's cost for a block of T tokens relative to
one token, the curve that IAD's block-size rule (`BlockOptions.cost_ratio`) is tuned on.

    python benchmarks/decode_overhead.py [--device cpu|cuda] [--tf32] [--threads 2] [--repeats 5] [--out results.json]
    python benchmarks/decode_overhead.py --bundle BUNDLE [--sentences 100] ...   # a real bundle on UA-GEC

``--bundle``: the same measurement on an exported bundle (e.g. the small reference model, where
a step is short and the loop's share is larger), decoding the first ``--sentences`` sources of the
UA-GEC test split to their own length; ms / token is then over the tokens each produced.

Needs the [export] extra (torch, transformers) to build the model; decoding is torch-free.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.support (the tokenizer builder the tests use)

NEW_TOKENS = 64


def build_checkpoint(out: Path, vocab_size: int, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    from tests.support.tiny import build_tokenizer

    words = [f"w{i}" for i in range(vocab_size - 3)]
    tokenizer = build_tokenizer("marian", words)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = MarianConfig(
        vocab_size=len(tokenizer), d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512,
        pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad, forced_eos_token_id=None,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=pad, eos_token_id=eos, pad_token_id=pad,
        bad_words_ids=[[eos], [pad]],  # no EOS: every sentence decodes exactly NEW_TOKENS tokens
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def block_cost_curve(generator, source_ids: list[int], sizes: list[int], repeats: int) -> dict[int, float]:
    """Median verifier time for a block of T tokens after a 16-token cache, relative to T = 1."""
    state = generator.verifier.batch(1, generator.io_binding)
    state.admit([source_ids], generator.manifest.pad_token_id)
    prefix = np.full((1, 16), 5, dtype=np.int64)
    state.verify(prefix)
    state.keep(np.array([16]))
    medians = {}
    for size in sizes:
        block = np.full((1, size), 7, dtype=np.int64)
        times = []
        for _ in range(repeats * 3):
            started = time.perf_counter()
            state.verify(block)  # lengths are not advanced: every call sees the same 16-token cache
            times.append(time.perf_counter() - started)
        medians[size] = statistics.median(times)
    return {size: medians[size] / medians[1] for size in sizes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="onnxruntime's CPU or CUDA execution provider (cpu)")
    parser.add_argument("--tf32", action="store_true", help="cuda: allow TF32 matrix products (off)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--bundle", type=Path, help="measure this bundle on UA-GEC test sources instead")
    args = parser.parse_args()

    from aggdec.runtime.errors import AggdecError
    from aggdec.runtime.generator import Generator
    from aggdec.runtime.session import check_device

    try:
        check_device(args.device, args.tf32)  # before minutes of building and exporting
    except AggdecError as exc:
        print(f"decode_overhead: error: {exc}", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory() as tmp:
        bundle, max_new = args.bundle, None
        if bundle is None:
            from aggdec.export import export_bundle  # torch: only to build the random model

            checkpoint, bundle, max_new = Path(tmp) / "ckpt", Path(tmp) / "bundle", NEW_TOKENS
            print("building and exporting a Transformer-base-sized Marian ...", file=sys.stderr)
            build_checkpoint(checkpoint, args.vocab, seed=0)
            export_bundle(checkpoint, bundle, progress=lambda m: print("  " + m, file=sys.stderr))
        generator = Generator(bundle, device=args.device, threads=args.threads, io_binding=True, tf32=args.tf32)
        # the same graphs with every input and output going through numpy each call (the CPU
        # default): what binding costs or saves on this device
        unbound = Generator(bundle, device=args.device, threads=args.threads, io_binding=False, tf32=args.tf32)
        if args.bundle is None:
            rng = np.random.default_rng(0)
            texts = [" ".join(f"w{i}" for i in rng.integers(0, args.vocab - 3, size=20)) for _ in range(args.sentences)]
        else:
            from aggdec.uagec import load_pairs

            texts = [pair.source for pair in load_pairs("test")][: args.sentences]
        for runner in (generator, unbound):  # onnxruntime's first-call work, not measured
            for mode in ("greedy", "iad"):
                runner.warm_up(mode)

        report: dict = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
                        "device": args.device, "threads": args.threads, "bundle": str(args.bundle or "random base"),
                        "new_tokens": max_new or "each sentence's own", "modes": {}}
        if args.device == "cuda":
            from aggdec.bench.report import gpu_environment

            report["gpu"] = gpu_environment()
            report["tf32"] = args.tf32
            report["provider_options"] = generator.provider_options
        runs = (("greedy, IO binding", generator, "greedy"), ("iad, IO binding", generator, "iad"),
                ("greedy, no IO binding", unbound, "greedy"), ("iad, no IO binding", unbound, "iad"))
        samples: dict[str, dict[str, list[float]]] = {
            label: {"wall": [], "outside": [], "iterations": [], "drafted": [], "tokens": []} for label, _, _ in runs}
        for _ in range(args.repeats):
            for text in texts:
                for label, runner, mode in runs:  # interleaved, so machine drift hits every run alike
                    graphs_before, started = runner.graph_seconds, time.perf_counter()
                    result = runner.generate([text], mode=mode, max_new_tokens=max_new)[0]
                    wall = time.perf_counter() - started
                    assert max_new is None or len(result.ids) == max_new
                    sample = samples[label]
                    sample["tokens"].append(len(result.ids))
                    sample["wall"].append(wall)
                    sample["outside"].append(wall - (runner.graph_seconds - graphs_before))
                    sample["iterations"].append(result.stats.iterations)
                    sample["drafted"].append(sum(result.stats.drafted) / result.stats.iterations)
        for label, sample in samples.items():
            wall, outside = statistics.median(sample["wall"]), statistics.median(sample["outside"])
            report["modes"][label] = {"median_seconds": wall, "median_outside_seconds": outside,
                                      # sentences of their own lengths: the share of all the time, not of a median
                                      "outside_share": (sum(sample["outside"]) / sum(sample["wall"]) if args.bundle
                                                        else outside / wall),
                                      "ms_per_token": 1000 * sum(sample["wall"]) / sum(sample["tokens"]),
                                      "median_iterations": statistics.median(sample["iterations"]),
                                      "mean_drafted_per_iteration": statistics.mean(sample["drafted"])}
        source_ids = generator.encode(texts[:1])[0]
        report["block_cost_relative_to_one_token"] = block_cost_curve(
            generator, source_ids, [1, 2, 4, 8, 16, 32, 64], args.repeats)

    print(json.dumps(report, indent=2))
    tokens = report["new_tokens"]
    print(f"\n| mode | median s / sentence ({tokens} tokens) | ms / token | outside ORT | share outside |",
          file=sys.stderr)
    print("|---|---|---|---|---|", file=sys.stderr)
    for mode, row in report["modes"].items():
        print(f"| {mode} | {row['median_seconds']:.3f} | {row['ms_per_token']:.2f} | "
              f"{row['median_outside_seconds'] * 1000:.1f} ms | {100 * row['outside_share']:.1f}% |", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
