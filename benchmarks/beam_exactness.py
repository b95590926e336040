"""Beam search against transformers' on real sentences, and how often speculative beam replays.

For each sentence: transformers' ``generate(num_beams=N, num_return_sequences=N)`` and aggdec's
plain and speculative beam search (IAD; GAD too with ``--modes greedy iad gad`` on a bundle with
a drafter; batch 1, one thread); counts the sentences whose N hypotheses are identical (ids, in
order), the largest sequence-score difference, and for each speculative mode the beam steps per
verifier call (``stats.accepted``: steps a call replayed) against plain beam's calls.

    python benchmarks/beam_exactness.py BUNDLE CHECKPOINT --limit 100 --beams 4 [--modes greedy iad gad]
"""

from __future__ import annotations

import argparse
import collections
import json
import time

from aggdec.runtime.generator import Generator
from aggdec.sentences import load_examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("checkpoint")
    parser.add_argument("--data", default="uagec-test")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=["greedy", "iad"], choices=["greedy", "iad", "gad"],
                        help="aggdec's beam searches: greedy (plain beam), iad, gad (default: greedy iad)")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    torch.set_num_threads(1)
    sources = [example.source for example in load_examples(args.data, args.limit)]
    model = AutoModelForSeq2SeqLM.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    generator = Generator(args.bundle, threads=1)
    n = args.beams
    report = collections.Counter()
    worst_score = 0.0
    steps = {mode: collections.Counter() for mode in args.modes}
    seconds = collections.Counter()
    for text in sources:
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**tokenizer([text], return_tensors="pt"), do_sample=False, num_beams=n,
                                 num_return_sequences=n, max_new_tokens=args.max_new_tokens,
                                 return_dict_in_generate=True, output_scores=True)
        seconds["transformers"] += time.perf_counter() - started
        lengths = (out.beam_indices != -1).sum(dim=1).tolist()
        theirs = [(tuple(seq[1 : 1 + length]), score) for seq, length, score in
                  zip(out.sequences.tolist(), lengths, out.sequences_scores.tolist())]
        for mode in args.modes:
            started = time.perf_counter()
            result = generator.generate([text], mode=mode, num_beams=n, num_return_sequences=n, batch_size=1,
                                        max_new_tokens=args.max_new_tokens)[0]
            seconds[mode] += time.perf_counter() - started
            mine = [(h.ids, h.score) for h in result.sequences]
            report[f"{mode}_identical"] += [ids for ids, _ in mine] == [ids for ids, _ in theirs]
            report[f"{mode}_best_identical"] += mine[0][0] == theirs[0][0]
            worst_score = max(worst_score, max(abs(a - b) for (_, a), (_, b) in zip(mine, theirs)))
            report[f"{mode}_calls"] += result.stats.iterations
            steps[mode].update(result.stats.accepted)
    names = {mode: "plain" if mode == "greedy" else mode for mode in args.modes}
    speculative = [mode for mode in args.modes if mode != "greedy"]
    summary = {
        "sentences": len(sources), "beams": n,
        "identical_to_transformers": {mode: report[f"{mode}_identical"] for mode in args.modes},
        "best_identical_to_transformers": {mode: report[f"{mode}_best_identical"] for mode in args.modes},
        "max_sequence_score_difference": worst_score,
        "verifier_calls": {names[mode]: report[f"{mode}_calls"] for mode in args.modes},
        **{f"{mode}_beam_steps_per_call": {str(k): v for k, v in sorted(steps[mode].items())} for mode in speculative},
        **{f"{mode}_mean_steps_per_call": sum(k * v for k, v in steps[mode].items()) / max(1, sum(steps[mode].values()))
           for mode in speculative},
        "seconds_total": {"transformers": seconds["transformers"],
                          **{f"aggdec_{names[mode]}": seconds[mode] for mode in args.modes}},
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
