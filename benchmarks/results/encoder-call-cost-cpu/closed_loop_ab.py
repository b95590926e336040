"""The server's decode loop without HTTP (benchmarks/serve_closed_loop.py's closed loop: 32 texts
in flight, each replaced as it finishes, in arrival order) with the encoder's call cost fixed at
the old prior (6 padded tokens) against measured (EncoderCallCost), alternating in one process.

    python benchmarks/results/encoder-call-cost-cpu/closed_loop_ab.py BUNDLE [--rounds 3] [--limit 512]

Prints, per round and side: texts/s, encoder and verifier ms per text, encoder calls per text,
and the call cost in tokens the side used at the end (the fit, for the measured side).
"""

from __future__ import annotations

import argparse

import aggdec.runtime.decoding.verifier as verifier_module
from aggdec import Generator
from aggdec.runtime.continuous import RowDecoder
from aggdec.runtime.tuning import tuning_for
from aggdec.sentences import load_examples
from benchmarks.serve_closed_loop import closed_loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=512)
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    sides = {"fixed 6": tuning_for("cpu").replace(encoder_call_tokens=6), "measured": tuning_for("cpu")}
    generators = {name: Generator(args.bundle, threads=1, tuning=tuning) for name, tuning in sides.items()}
    texts = [e.source for e in load_examples("uagec-test", limit=args.limit)]
    ids = [RowDecoder(generators["measured"]).prepare(text)[1] for text in texts]
    calls = {"n": 0}
    original = verifier_module.Batch._encode

    def counted(batch, *a, **k):
        calls["n"] += 1
        return original(batch, *a, **k)

    verifier_module.Batch._encode = counted
    for generator in generators.values():  # warm-up and a first fit from offline calls
        generator.generate(texts[:64], mode="iad", batch_size=32)
    done = args.passes * len(ids)
    for round_ in range(args.rounds):
        for name, generator in generators.items():
            before, calls["n"] = dict(generator.verifier.seconds), 0
            rate = closed_loop(generator, ids, 32, 32, args.passes, 0.0)
            spent = {k: (v - before[k]) / done * 1000 for k, v in generator.verifier.seconds.items()}
            print(f"round {round_} {name:>8}: {rate:6.1f} texts/s; per text: encoder {spent['encoder']:.2f} ms, "
                  f"verifier {spent['verifier']:.2f} ms, encoder calls {calls['n'] / done:.2f}; call cost "
                  f"{generator.verifier.encoder_call_tokens:.1f} tokens", flush=True)


if __name__ == "__main__":
    main()
