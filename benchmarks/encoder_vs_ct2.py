"""aggdec's encoder against CTranslate2's on the same sentences (issue 11, item 3): one output
token each, so that the encoder is what is timed.

    python benchmarks/encoder_vs_ct2.py BUNDLE [--checkpoint DIR] [--work DIR] [--limit 1000] [--threads 1]

CTranslate2 has no encoder-only call for a seq2seq model, so both sides are timed as a user
would call them for one token: ``Generator.generate([s], mode="greedy", max_new_tokens=1)``
against ``Translator.translate_batch([tokens], max_decoding_length=1)``. Each is the encoder,
the cross-attention keys/values of every decoder layer (aggdec's encoder graph computes them;
CTranslate2 computes them at its first step), one decoder step and the call's own overhead.
aggdec's share that is the encoder graph (``stats.encoder_seconds``) is printed beside it.

At fp32 (BUNDLE, CTranslate2 float32) and int8 (BUNDLE quantized by `aggdec quantize` into
--work, CTranslate2 int8); the CTranslate2 models are converted from --checkpoint into --work
as `aggdec bench` converts them. Sentences: the UA-GEC test split, batch 1, CPU; the two sides
alternate sentence by sentence (order reversed every other one) so machine drift hits both.
Prints per precision the summed and median milliseconds of each side and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

REFERENCE_CHECKPOINT = Path(__file__).resolve().parent / "models" / "uagec" / "model"


def _ct2_model(checkpoint: Path, work: Path, compute_type: str) -> Path:
    """The checkpoint converted for CTranslate2 (``aggdec bench``'s conversion), made once."""
    from aggdec.bench.worker import CTranslate2System

    target = work / f"ct2-{compute_type}"
    if not (target / "model.bin").is_file():
        CTranslate2System.prepare({"model": str(checkpoint), "work": str(target),
                                   "options": {"compute_type": compute_type}})
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", metavar="BUNDLE", help="the fp32 bundle exported from --checkpoint")
    parser.add_argument("--checkpoint", type=Path, default=REFERENCE_CHECKPOINT)
    parser.add_argument("--work", type=Path, default=Path("bench-work"))
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import ctranslate2
    from tokenizers import Tokenizer

    from aggdec import Generator
    from aggdec.bench.bundles import quantized_bundle
    from aggdec.uagec import load_pairs

    args.work.mkdir(parents=True, exist_ok=True)
    sources = [pair.source for pair in load_pairs("test")][: args.limit]
    tokenizer = Tokenizer.from_file(str(Path(args.bundle) / "tokenizer.json"))
    tokens = [encoding.tokens for encoding in tokenizer.encode_batch(sources)]
    bundles = {"fp32": Path(args.bundle), "int8": quantized_bundle(Path(args.bundle), args.work)[0]}
    print(f"{len(sources)} UA-GEC test sentences (mean {statistics.mean(map(len, tokens)):.1f} tokens), one output "
          f"token each, batch 1, CPU, {args.threads} thread(s); ctranslate2 {ctranslate2.__version__}")
    for precision, compute_type in (("fp32", "float32"), ("int8", "int8")):
        generator = Generator(bundles[precision], threads=args.threads)
        translator = ctranslate2.Translator(str(_ct2_model(args.checkpoint, args.work, compute_type)), device="cpu",
                                            compute_type=compute_type, intra_threads=args.threads, inter_threads=1)

        def aggdec_side(index: int) -> float:
            return generator.generate([sources[index]], mode="greedy", max_new_tokens=1)[0].stats.encoder_seconds

        def ct2_side(index: int) -> float:
            translator.translate_batch([tokens[index]], beam_size=1, max_decoding_length=1)
            return 0.0

        for index in range(min(8, len(sources))):  # warm-up: arenas and kernel choice out of the timings
            aggdec_side(index), ct2_side(index)
        seconds: dict[str, list[float]] = {"aggdec": [], "ct2": [], "encoder": []}
        sides = [("aggdec", aggdec_side), ("ct2", ct2_side)]
        for index in range(len(sources)):
            for name, side in (sides if index % 2 == 0 else sides[::-1]):
                started = time.perf_counter()
                encoder = side(index)
                seconds[name].append(time.perf_counter() - started)
                if name == "aggdec":
                    seconds["encoder"].append(encoder)
        total = {name: sum(values) for name, values in seconds.items()}
        median = {name: 1e3 * statistics.median(values) for name, values in seconds.items()}
        print(f"  {precision}: aggdec {total['aggdec']:.2f} s (median {median['aggdec']:.3f} ms, of which the "
              f"encoder graph {total['encoder']:.2f} s, median {median['encoder']:.3f} ms)   CTranslate2 "
              f"{total['ct2']:.2f} s (median {median['ct2']:.3f} ms)   CTranslate2/aggdec time "
              f"{total['ct2'] / total['aggdec']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
