"""Where a decode's CPU time goes, against CTranslate2 on the same sentences: onnxruntime's
encoder calls, its verifier (and drafter) calls, and the host work around them (the decode
loop, IO binding, tokenizing, detokenizing), in CPU seconds, not wall seconds, so that a shared
machine's other work does not count; and CTranslate2's whole greedy translation, split into its
encoder (a translation stopped after one token, less the second token's cost) and its steps.

    python benchmarks/host_share.py BUNDLE --ct2 CT2_DIR [--modes greedy iad] [--batch-sizes 1 8 32]
                                   [--limit 400] [--repeats 3] [--data uagec-test] [--max-new-tokens 255]
                                   [--ct2-compute-type float32]

aggdec runs one thread (its onnxruntime calls run on the calling thread, whose CPU time
``time.thread_time`` counts, split around every ``InferenceSession.run`` and
``run_with_iobinding``); CTranslate2 runs one thread of its own, counted by the process's CPU
time. The sentences are taken shortest first for both (``generate`` sorts; CTranslate2 gets them
sorted), each batch of CTranslate2's ``max_batch_size`` rows decoded to its end as aggdec's
refills its free rows. ``CT2_DIR``: the converted reference model (``aggdec bench``'s work
folder keeps it as ``ct2-fp32``). Medians over ``--repeats`` alternations.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class OrtClock:
    """CPU seconds this thread spent inside onnxruntime's session calls, by whether the call was
    bound (the verifier and drafter on the CPU) or fed (the encoder; an unbound verifier)."""

    def __init__(self) -> None:
        import onnxruntime as ort

        self.seconds = {"run": 0.0, "run_with_iobinding": 0.0}
        for name in self.seconds:
            original = getattr(ort.InferenceSession, name)

            def timed(session, *args, _original=original, _name=name, **kwargs):
                started = time.thread_time()
                try:
                    return _original(session, *args, **kwargs)
                finally:
                    self.seconds[_name] += time.thread_time() - started

            setattr(ort.InferenceSession, name, timed)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)


def aggdec_split(generator, clock: OrtClock, texts: list[str], mode: str, batch_size: int,
                 max_new_tokens: int) -> dict[str, float]:
    clock.reset()
    started = time.thread_time()
    generator.generate(texts, mode=mode, batch_size=batch_size, max_new_tokens=max_new_tokens)
    total = time.thread_time() - started
    fed, bound = clock.seconds["run"], clock.seconds["run_with_iobinding"]
    return {"total": total, "fed calls": fed, "bound calls": bound, "host": total - fed - bound}


def ct2_split(translator, tokens: list[list[str]], batch_size: int, max_new_tokens: int) -> dict[str, float]:
    def cpu(length: int) -> float:
        started = time.process_time()
        translator.translate_batch(tokens, max_batch_size=batch_size, beam_size=1, max_decoding_length=length)
        return time.process_time() - started

    whole, one, two = cpu(max_new_tokens), cpu(1), cpu(2)
    encoder = max(0.0, one - (two - one))
    return {"total": whole, "encoder": encoder, "steps": whole - encoder}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", metavar="BUNDLE")
    parser.add_argument("--ct2", required=True, metavar="CT2_DIR")
    parser.add_argument("--modes", nargs="+", default=["greedy"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--limit", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default="uagec-test")
    parser.add_argument("--ct2-compute-type", default="float32",
                        help="CTranslate2's compute type (int8: against an int8 aggdec bundle)")
    parser.add_argument("--max-new-tokens", type=int, default=255,
                        help="both systems' output limit (the reference bundle's: its 256 positions less the start)")
    args = parser.parse_args(argv)

    import ctranslate2
    from tokenizers import Tokenizer

    from aggdec import Generator
    from aggdec.sentences import load_examples

    texts = [example.source for example in load_examples(args.data, args.limit)]
    clock = OrtClock()
    generator = Generator(args.bundle, device="cpu", threads=1)
    translator = ctranslate2.Translator(args.ct2, device="cpu", inter_threads=1, intra_threads=1,
                                        compute_type=args.ct2_compute_type)
    tokenizer = Tokenizer.from_file(str(Path(args.bundle) / "tokenizer.json"))
    tokens = sorted((encoding.tokens for encoding in tokenizer.encode_batch(texts)), key=len)
    print(f"{len(texts)} sentences of {args.data}, CPU seconds, 1 thread, medians of {args.repeats}; "
          f"CTranslate2 {args.ct2_compute_type}")
    print("| system | batch | total | encoder calls | verifier/drafter calls | host (aggdec) / steps (CT2) "
          "| host share | CT2 / aggdec time |")
    print("|---|---|---|---|---|---|---|---|")
    for batch_size in args.batch_sizes:
        for mode in args.modes:  # warm-up: first calls, measured costs
            generator.generate(texts[: 4 * batch_size], mode=mode, batch_size=batch_size)
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.modes}
        runs["ct2"] = []
        for _ in range(args.repeats):
            for mode in args.modes:
                runs[mode].append(aggdec_split(generator, clock, texts, mode, batch_size, args.max_new_tokens))
            runs["ct2"].append(ct2_split(translator, tokens, batch_size, args.max_new_tokens))
        medians = {system: {key: statistics.median(run[key] for run in rows) for key in rows[0]}
                   for system, rows in runs.items()}
        ct2 = medians["ct2"]
        for mode in args.modes:
            m = medians[mode]
            print(f"| aggdec {mode} | {batch_size} | {m['total']:.3f} | {m['fed calls']:.3f} | {m['bound calls']:.3f} "
                  f"| {m['host']:.3f} | {m['host'] / m['total']:.0%} | {ct2['total'] / m['total']:.2f}x |")
        print(f"| CTranslate2 {args.ct2_compute_type} greedy | {batch_size} | {ct2['total']:.3f} | {ct2['encoder']:.3f} | | "
              f"{ct2['steps']:.3f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
