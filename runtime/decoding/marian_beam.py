"""Beam search with Marian's rules (marian-nmt/marian-dev ``src/translator/beam_search.cpp``,
``history.h``), for bundles made from Marian models (the manifest's ``beam_rules``).

For a model that ships in Marian's format the reference is Marian itself, and its beam search
is not transformers' (``beam.py``). Read from Marian's source (1.12, the version pymarian
1.12.42 is built from), for one sentence:

* the search starts from one hypothesis (``t == 0``: one row of log-probs, path score 0) and
  takes its N best tokens;
* each later step expands the K hypotheses still running and keeps the K best (hypothesis,
  token) path scores over the K x vocab (or K x shortlist) expansions (``getNBestList`` with
  ``maxBeamSize``, a ``std::partial_sort`` on the scores: best first). Path scores are float32
  sums of log-probs; suppressed ids (``allow-unk: false``: ``<unk>``) are set to the lowest
  float *after* the log-softmax (``suppressWords`` on the path scores), so log-probs are
  normalized over every id of the sentence's list, ``<unk>`` included (the manifest's
  ``suppression: "after_log_softmax"``). Every kept expansion is among its own hypothesis's K
  best tokens, so a verifier top-k of N suffices;
* a kept expansion that ends in EOS is a finished hypothesis and leaves the beam, which
  narrows by one (``purgeBeams``): there is no refill and no early stop; the search ends when
  the beam is empty;
* at the step whose output length reaches the length cap (``max-length-factor``, and here also
  the caller's ``max_new_tokens``), every kept expansion is finished, EOS or not
  (``History::add(..., last=true)``);
* a finished hypothesis's score is ``(path score - word_penalty * length) / length ** normalize``,
  in float32, ``length`` being its tokens, the EOS counted (the history's size, which holds
  the start beam too);
* the result is the finished hypotheses by that score, best first (``History::nBest``; Marian
  prints ``top()``, and the N of them with ``n-best``).

The group keeps ``num_beams`` rows for its whole search, as the loop's groups do: once K < N
hypotheses run, the rows beyond K hold copies of the first (their scores are read by no
step), so that every row still decodes something valid. They cost verifier rows until the
group is done; freeing them is not built.

Ties between equal float32 path scores go to the lower (hypothesis, rank), as in ``beam.py``;
``std::partial_sort`` leaves the order of ties unspecified, so an exact tie is the one place
the two could disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .beam import BeamRules, Hypothesis, Selected
from .common import DecodeLimits, RowTrace


@dataclass
class MarianBeamGroup:
    """One beam request's state under Marian's rules (the interface of ``beam.BeamGroup``)."""

    rules: BeamRules
    limits: DecodeLimits
    running: list[list[int]] = field(default_factory=list)  # tokens, rank order; rows past ``live`` are fillers
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # path scores of the live ones
    finished: list[Hypothesis] = field(default_factory=list)  # in the order they finished
    trace: RowTrace | None = None
    done: bool = False
    draft_state: Any = None
    live: int = 0  # hypotheses still running (Marian's beam size now)
    first: bool = True  # the first step expands the start hypothesis alone

    def __post_init__(self) -> None:
        n = self.rules.num_beams
        self.running = [list(self.limits.start_ids) for _ in range(n)]
        self.scores = np.zeros(1, dtype=np.float32)
        self.live = n
        self.trace = RowTrace(tokens=list(self.limits.start_ids))

    @property
    def generated(self) -> int:
        """Generated tokens of the running hypotheses (all alike)."""
        return len(self.running[0]) - len(self.limits.start_ids)

    def _normalized(self, score: np.float32, length: int) -> float:
        # History::add: (pathScore - wp * length) / pow(length, alpha), all float
        rules = self.rules
        penalized = np.float32(score) - np.float32(rules.word_penalty) * np.float32(length)
        return float(np.float32(penalized / np.power(np.float32(length), np.float32(rules.length_penalty))))

    def step(self, top_logprobs: np.ndarray, top_ids: np.ndarray) -> list[Selected]:
        """One beam step from each row's top-k (rank order, [N, K]); returns what every row of
        the group holds next (empty once the group is done)."""
        n = self.rules.num_beams
        expanding = 1 if self.first else self.live  # hypotheses whose expansions compete
        keep = self.live  # Marian keeps as many as run (N at the start)
        self.first = False
        length = self.generated + 1
        last = length >= self.limits.max_new_tokens
        accumulated = top_logprobs[:expanding].astype(np.float32, copy=False) + self.scores[:expanding, None]
        flat = accumulated.reshape(-1)
        order = np.argsort(-flat, kind="stable")[:keep]  # best first; ties to the lower (hypothesis, rank)
        values = flat[order]
        width = accumulated.shape[1]
        parents = [int(o) // width for o in order.tolist()]
        tokens = top_ids[:expanding].reshape(-1)[order].tolist()
        eos = self.limits.eos_id
        running: list[int] = []  # indices into the kept expansions that go on, best first
        for i, token in enumerate(tokens):
            if token == eos or last:
                self.finished.append(Hypothesis((*self.running[parents[i]], token),
                                                self._normalized(values[i], length)))
            else:
                running.append(i)
        self.live = len(running)
        if not running:
            self.done = True
            return []
        self.scores = values[running].astype(np.float32)
        fillers = [running[0]] * (n - len(running))
        chosen = running + fillers
        self.running = [[*self.running[parents[c]], tokens[c]] for c in chosen]
        return [Selected(parents[c], tokens[c]) for c in chosen]

    def results(self) -> list[Hypothesis]:
        """The ``num_return_sequences`` best finished hypotheses, best first (earlier ones win ties)."""
        ranked = sorted(self.finished, key=lambda h: -h.score)
        return ranked[: self.rules.num_return_sequences]
