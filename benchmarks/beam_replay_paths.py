"""How often speculative beam replay would hold with more drafted paths per hypothesis: an
upper bound computed from plain beam search's own steps.

Decodes the sentences with plain beam N (batch 1) and records every step: the running
hypotheses and the (parent, token) each new hypothesis came from. Then, for each drafting
policy, replays the decode as speculative calls would: a call starting at a step holds each
start hypothesis's drafted paths (at most ``--draft`` tokens each); its replay goes on while
every hypothesis a step selects lies on a drafted path of the start hypothesis it descends
from, and the step that leaves them ends the call (exactly the rule of ``loop._select_beams``).
The hypotheses are plain beam's, so no policy changes the output, only the calls it takes.
The ``source`` policy's counts are checked against real speculative calls (fixed drafts of
``--draft`` tokens, no width cap): the script stops if they differ.

Policies:

* ``source``: each hypothesis drafts its aligned source continuation (what runs today);
* ``branch-top``: also, for the top hypothesis, every path that leaves its source draft at one
  position by ANY token and then follows the source after it (re-aligned): an oracle, since a
  real draft would have to guess those tokens (the verifier scores them only in the call);
  each such path is one more row per position and alternative;
* ``branch-all``: the same branches for every start hypothesis.

    python benchmarks/beam_replay_paths.py BUNDLE [--limit 100] [--beams 4] [--draft 4 8]
"""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np

from aggdec.runtime.decoding import beam as beam_module
from aggdec.runtime.decoding.alignment import SENTINEL, align
from aggdec.runtime.decoding.sizing import BlockOptions
from aggdec.runtime.generator import Generator
from aggdec.runtime.tuning import Tuning
from aggdec.sentences import load_examples


def continuation(hypothesis: list[int], source: np.ndarray, length: int) -> list[int]:
    """The source tokens after the position ``hypothesis`` (decoder start first) aligns with."""
    output = np.asarray([SENTINEL, *hypothesis[1:]], dtype=np.int64)
    at = align(output, source)
    return [] if at is None else source[at + 1 : at + 1 + length].tolist()


def covered(prefix: list[int], start: list[int], source: np.ndarray, draft: int, branch: bool) -> bool:
    """Whether the tokens ``prefix`` after ``start`` lie on one of its drafted paths."""
    main = continuation(start, source, draft)
    if prefix == main[: len(prefix)]:
        return len(prefix) <= len(main)
    if not branch or len(prefix) > draft:
        return False
    i = next(i for i in range(len(prefix)) if i >= len(main) or prefix[i] != main[i])  # where it left
    if i >= len(main):
        return False  # past the end of the source draft: no branch from there
    rest = continuation(start + prefix[: i + 1], source, draft - i - 1)
    return prefix[i + 1 :] == rest[: len(prefix) - i - 1] and len(prefix) - i - 1 <= len(rest)


def calls(steps: list[tuple[list[list[int]], list[tuple[int, int]], bool]], source: np.ndarray, draft: int,
          policy: str) -> list[int]:
    """The beam steps each speculative call replays under ``policy``."""
    replayed, s = [], 0
    while s < len(steps):
        start = steps[s][0]
        where = [(r, []) for r in range(len(start))]  # (start hypothesis, tokens since the call began)
        j = s
        while True:
            running, selected, done = steps[j]
            j += 1
            if done:
                break
            where = [(where[p][0], [*where[p][1], token]) for p, token in selected]
            if not all(covered(prefix, start[r], source, draft,
                               policy == "branch-all" or (policy == "branch-top" and r == 0))
                       for r, prefix in where):
                break
        replayed.append(j - s)
        s = j
    return replayed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--data", default="uagec-test")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--draft", type=int, nargs="+", default=[4, 8])
    args = parser.parse_args()

    generator = Generator(args.bundle, threads=1)
    sources = [example.source for example in load_examples(args.data, args.limit)]
    record: list = []
    original = beam_module.BeamGroup.step

    def recording_step(self, top_logprobs, top_ids):  # plain beam's steps, as they happen
        before = [list(h) for h in self.running]
        selected = original(self, top_logprobs, top_ids)
        record.append((before, [(s.parent, s.token) for s in selected], self.done))
        return selected

    beam_module.BeamGroup.step = recording_step
    decodes = []
    for text in sources:
        record.clear()
        ids = generator.codec.encode([text])[0]
        generator.generate([text], num_beams=args.beams, batch_size=1)
        decodes.append((np.concatenate([[SENTINEL], np.asarray(ids, dtype=np.int64)]), list(record)))
    beam_module.BeamGroup.step = original

    # the model checked: real speculative calls, drafting the source policy's paths (fixed
    # drafts, no width cap), must replay exactly as the simulation says
    real = Generator(args.bundle, threads=1, tuning=Tuning(width_quantile=1.0))
    checked = {}
    for draft in args.draft:
        block = BlockOptions(max_block=draft, adaptive=False)
        checked[draft] = collections.Counter()
        for text in sources:
            result = real.generate([text], mode="iad", num_beams=args.beams, batch_size=1, block=block)[0]
            checked[draft].update(result.stats.accepted)

    summary: dict = {"sentences": len(sources), "beams": args.beams,
                     "plain_calls": sum(len(steps) for _, steps in decodes), "policies": {}}
    for draft in args.draft:
        for policy in ("source", "branch-top", "branch-all"):
            counts = collections.Counter()
            for source, steps in decodes:
                counts.update(calls(steps, source, draft, policy))
            total = sum(counts.values())
            if policy == "source":
                assert counts == checked[draft], ("the simulation is not what the loop does", counts, checked[draft])
            summary["policies"][f"{policy}, draft {draft}"] = {
                "calls": total,
                "mean_steps_per_call": round(sum(k * v for k, v in counts.items()) / total, 3),
                "one_step_calls": round(counts[1] / total, 3),
                "steps_per_call": {str(k): v for k, v in sorted(counts.items())},
            }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
