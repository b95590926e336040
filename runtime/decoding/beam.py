"""Beam search over groups of rows, with transformers' rules (``GenerationMixin._beam_search``, 5.x).

(Bundles made from Marian models search with Marian's rules instead: ``marian_beam.py``; the
rules are data, :attr:`BeamRules.family`, and the loop is the same for both.)

A beam request's ``num_beams`` hypotheses are rows of the batch (one source, encoded once, its
cross-attention rows replicated); one verifier call scores every row, and :meth:`BeamGroup.step`
turns the rows' candidates into the group's next hypotheses. Which hypothesis continues in
which row is a row copy of the self-attention cache (``SlotBuffers.copy_rows``), made only for
the rows whose parent is another row.

The rules, each as transformers has them (the names are theirs):

* scores accumulate in float32: ``log_probs + running_beam_scores``; the first step starts from
  scores ``[0, -1e9, ...]``, so that only the first of the (identical) beams proposes;
* each step takes the ``beams_to_keep = 2 N`` best (hypothesis, token) continuations over the
  flattened ``N x vocab`` scores. Every one of them is among its own hypothesis's 2N best
  tokens, which is why the verifier's top-k must be at least 2N, or the whole vocabulary where
  that is smaller (``DecodeOptions.resolve``);
* a continuation that ends (EOS, or the length limit: ``max_new_tokens`` counts every generated
  token, the forced BOS and the EOS included) leaves the running hypotheses; if it is among the
  first N of the 2N it becomes a finished hypothesis, scored ``score / length ** length_penalty``
  with ``length`` its generated tokens (``cur_len + 1 - decoder_prompt_len``), the division in
  float32; the best N finished are kept;
* the N best continuations that did not end are the next running hypotheses (fewer than N:
  ended ones fill in with ``-1e9`` added, as transformers' do);
* a request is done when every continuation ended, or when N hypotheses have finished and
  either ``early_stopping`` is True or no running hypothesis can beat the worst finished one:
  the best running score divided by ``length ** length_penalty``, ``length`` being the current
  generated length, or ``max_new_tokens`` when ``early_stopping == "never"`` and the penalty is
  positive (``_check_early_stop_heuristic``);
* the result is the finished hypotheses, best first, with their scores (``sequences_scores``).

A forced EOS (ForcedEOSTokenLogitsProcessor) makes EOS the only token with a finite log-prob
(0) at the last step; a forced BOS is the decoder prefix (``DecodeLimits.start_ids``), exactly
as the processor leaves it (the first beam at score 0, the others at -1e9). Ties between equal
float32 scores go to the lower flattened index (hypothesis, then the verifier's rank), which is
ONNX TopK's order; torch's ``topk`` does not document its order for ties.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .common import DecodeLimits, RowTrace

NEG = np.float32(-1.0e9)  # transformers' stand-in for "never": added, in float32
EARLY_STOPPING = (True, False, "never")


@dataclass(frozen=True)
class BeamRules:
    """A beam search's options (``DecodeOptions``' beam fields, resolved) and whose rules it
    follows: ``family`` "transformers" (this module) or "marian" (``marian_beam.py``: there
    ``length_penalty`` is Marian's ``normalize``, ``word_penalty`` its ``word-penalty``, and
    ``early_stopping`` is unused: Marian's beam narrows as hypotheses finish)."""

    num_beams: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1
    family: str = "transformers"
    word_penalty: float = 0.0

    @property
    def candidates(self) -> int:
        """The verifier's candidates a step needs per hypothesis: transformers keeps
        ``beams_to_keep`` = 2N continuations a step (one EOS id), Marian N."""
        return self.num_beams if self.family == "marian" else 2 * self.num_beams


@dataclass(frozen=True)
class Hypothesis:
    """A finished hypothesis: its tokens (the decoder prefix first) and its sequence score."""

    tokens: tuple[int, ...]
    score: float


class Selected(NamedTuple):
    """What a step decided for one row of the group: whose cache it continues (a row of the
    group, by position in the group's slot list) and the token it appends. (A named tuple:
    N are made every beam step, and a frozen dataclass's construction costs several times more.)"""

    parent: int
    token: int


@dataclass
class BeamGroup:
    """One beam request's state: its running hypotheses (one per row, best first), its finished
    ones, its stopping state, and the record its stats are read from."""

    rules: BeamRules
    limits: DecodeLimits
    running: list[list[int]] = field(default_factory=list)  # tokens, rank order
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    finished: list[Hypothesis] = field(default_factory=list)  # best first, at most num_beams
    trace: RowTrace | None = None  # per step: drafted, accepted, rows (tokens: the best at the end)
    done: bool = False
    draft_state: Any = None  # the draft source's, for the whole group (speculative beams: its draft sizer)

    def __post_init__(self) -> None:
        n = self.rules.num_beams
        self.running = [list(self.limits.start_ids) for _ in range(n)]
        self.scores = np.full(n, NEG, dtype=np.float32)
        self.scores[0] = 0.0
        self.trace = RowTrace(tokens=list(self.limits.start_ids))

    @property
    def generated(self) -> int:
        """Generated tokens of the running hypotheses (all alike), the forced BOS included."""
        return len(self.running[0]) - 1

    def _penalized(self, score: np.float32, length: int) -> np.float32:
        # torch divides a float32 tensor by a Python float in float32
        return np.float32(score / np.float32(float(length) ** self.rules.length_penalty))

    def step(self, top_logprobs: np.ndarray, top_ids: np.ndarray) -> list[Selected]:
        """One beam step from each hypothesis's top-k (rank order, [N, K] float32 log-probs and
        ids); returns the rows' next hypotheses (empty once the group is done)."""
        rules, limits = self.rules, self.limits
        n, keep = rules.num_beams, rules.candidates
        length = self.generated + 1  # of every continuation
        at_limit = length >= limits.max_new_tokens
        if at_limit and limits.forced_eos_id is not None:
            # ForcedEOSTokenLogitsProcessor: EOS at log-prob 0, every other token -inf
            top_ids = np.full((n, 1), limits.forced_eos_id, dtype=np.int64)
            top_logprobs = np.zeros((n, 1), dtype=np.float32)
        # float32 + float32: float32, as torch adds them
        accumulated = top_logprobs.astype(np.float32, copy=False) + self.scores[:, None]
        flat = accumulated.reshape(-1)
        # best first; ties to the lower (hypothesis, rank): a stable sort of the flattened scores
        order = np.argsort(-flat, kind="stable")[:keep]
        values = flat[order]
        token_array = top_ids.reshape(-1)[order]
        ended_array = np.ones(len(order), dtype=bool) if at_limit else token_array == limits.eos_id
        # Python lists from here: a step handles 2N candidates, where a numpy call per element
        # costs more than the arithmetic (this runs once per beam step, and a plain beam step's
        # host work is a real share of it on a small model: benchmarks/results/beam-host-cpu)
        parents = (order // accumulated.shape[1]).tolist()
        tokens = token_array.tolist()
        ended = ended_array.tolist()

        # finished: the first N continuations that ended, merged with the earlier finished
        if any(ended[:n]):
            fresh = [Hypothesis((*self.running[parents[i]], tokens[i]), float(self._penalized(values[i], length)))
                     for i in range(n) if ended[i]]
            merged = self.finished + fresh  # earlier ones first: they win ties
            order_finished = sorted(range(len(merged)), key=lambda i: -merged[i].score)
            self.finished = [merged[i] for i in order_finished[:n]]

        # running: the N best continuations, ended ones pushed down by -1e9
        if any(ended):
            running_values = np.where(ended_array, values + NEG, values).astype(np.float32)
            chosen = np.argsort(-running_values, kind="stable")[:n].tolist()
            self.scores = running_values[chosen]
        else:  # ``values`` is already best first: a stable sort leaves it as it is
            chosen = list(range(n))
            self.scores = values[:n].copy()
        self.running = [[*self.running[parents[c]], tokens[c]] for c in chosen]

        self.done = all(ended) or (len(self.finished) == n and (
            rules.early_stopping is True or not self._can_improve()))
        if self.done:
            return []
        return [Selected(parents[c], tokens[c]) for c in chosen]

    def _can_improve(self) -> bool:
        """transformers' early-stop heuristic: can the best running hypothesis still beat the
        worst finished one?"""
        rules = self.rules
        if rules.early_stopping == "never" and rules.length_penalty > 0.0:
            length = self.limits.max_new_tokens
        else:
            length = self.generated
        best = self._penalized(self.scores[0], length)
        return bool(best > np.float32(min(h.score for h in self.finished)))

    def results(self) -> list[Hypothesis]:
        """The ``num_return_sequences`` best finished hypotheses, best first."""
        return self.finished[: self.rules.num_return_sequences]
