"""Plain against speculative (IAD) beam search: time, calls, replay, iteration costs, profile.

Decodes the same sentences with plain beam N and IAD beam N, interleaved call by call
(``--batch-size`` texts a call, one thread), and prints: each system's total seconds and its
seconds inside onnxruntime, its verifier calls, for IAD the beam steps per call (how often
replay held) and the draft lengths chosen, whether drafted iterations measured faster per step
than plain ones (``Generator.beam_gate``), the cost of an iteration per width for the batch's
rows (``Generator.beam_costs``: a one-token iteration, host work included, and the cost of one
more position relative to it), and with ``--profile`` the functions where each system's time
outside onnxruntime goes (cProfile).

    python benchmarks/beam_profile.py BUNDLE [--limit 100] [--beams 4] [--batch-size 1] [--profile] [--repeats 2]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import pstats
import time

from aggdec.runtime.generator import Generator
from aggdec.sentences import load_examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--data", default="uagec-test")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="passes over the sentences (the first warms up)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=1, help="texts a generate call (interleaved by call)")
    parser.add_argument("--profile", action="store_true", help="cProfile the last pass, per system")
    args = parser.parse_args()

    sources = [example.source for example in load_examples(args.data, args.limit)]
    generator = Generator(args.bundle, threads=1)
    modes = ("greedy", "iad")
    seconds = collections.Counter()
    graph = collections.Counter()
    calls = collections.Counter()
    steps = collections.Counter()
    drafted = collections.Counter()
    outputs: dict[str, list] = {}
    profiles = {mode: cProfile.Profile() for mode in modes}
    for repeat in range(args.repeats):
        last = repeat == args.repeats - 1
        chunks = [sources[i : i + args.batch_size] for i in range(0, len(sources), args.batch_size)]
        for chunk in chunks:
            for mode in modes:
                graph_before = generator.graph_seconds
                profile = profiles[mode] if last and args.profile else None
                started = time.perf_counter()
                if profile is not None:
                    profile.enable()
                results = generator.generate(chunk, mode=mode, num_beams=args.beams, batch_size=args.batch_size,
                                             num_return_sequences=args.beams, max_new_tokens=args.max_new_tokens)
                if profile is not None:
                    profile.disable()
                if not last:
                    continue
                seconds[mode] += time.perf_counter() - started
                graph[mode] += generator.graph_seconds - graph_before
                for result in results:  # at batch 1 its calls; batched, each text's share of them
                    calls[mode] += result.stats.iterations
                    outputs.setdefault(mode, []).append([(h.ids, h.score) for h in result.sequences])
                    if mode == "iad":
                        steps.update(result.stats.accepted)
                        drafted.update(d // args.beams for d in result.stats.drafted)  # about a row's draft
    one_token, ratio = generator.beam_costs.fit(args.beams * args.batch_size)
    summary = {
        "sentences": len(sources), "beams": args.beams,
        "identical": outputs["greedy"] == outputs["iad"],
        "seconds": {mode: round(seconds[mode], 3) for mode in modes},
        "onnxruntime_seconds": {mode: round(graph[mode], 3) for mode in modes},
        "outside_seconds": {mode: round(seconds[mode] - graph[mode], 3) for mode in modes},
        "iad_over_plain_time": round(seconds["iad"] / seconds["greedy"], 3),
        "verifier_calls": {"plain": calls["greedy"], "iad": calls["iad"]},
        "iad_steps_per_call": {str(k): v for k, v in sorted(steps.items())},
        "iad_mean_steps_per_call": round(sum(k * v for k, v in steps.items()) / max(1, sum(steps.values())), 3),
        "iad_draft_tokens_per_row_per_call": {str(k): v for k, v in sorted(drafted.items())},
        "batch_size": args.batch_size,
        "drafting_pays_measured": generator.beam_gate.payoff.pays(args.beams * args.batch_size),
        "measured_iteration_cost": {"rows": args.beams * args.batch_size, "one_token_ms": round(1000 * one_token, 4),
                               "per_extra_position": round(ratio, 4)},
    }
    print(json.dumps(summary, indent=2))
    if args.profile:
        for mode in modes:
            out = io.StringIO()
            pstats.Stats(profiles[mode], stream=out).sort_stats("tottime").print_stats(25)
            print(f"## {mode} beam {args.beams}: cProfile of the last pass, by own time\n{out.getvalue()}")


if __name__ == "__main__":
    main()
