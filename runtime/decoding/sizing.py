"""How many draft tokens a row's next verifier call checks, from its own acceptance history.

Shared by every draft source whose drafts can be cut short (IAD's source blocks, GAD's
drafter proposals): a longer block costs more per call and pays only while drafts keep being
accepted. The choice changes speed only, never the output.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from ..bundle_schema import MAX_SEQUENCE_LEN
from ..errors import InputError
from ..values import flag, is_finite_real, positive_integer
from .alignment import MIN_REPEAT


@dataclass(frozen=True)
class BlockOptions:
    """How many draft tokens one verifier call checks.

    ``max_block`` caps the draft. With ``adaptive``, each iteration picks the draft length k
    that maximises expected tokens gained per unit of cost, ``E[k] / (1 + cost_ratio * k)``,
    where ``E[k] = (1 - p^(k+1)) / (1 - p)`` for a per-token acceptance rate p estimated from
    the row's own history, and ``cost_ratio`` is how much one more block position costs
    relative to a single-token call (a device property: a block of 50 costs about 3x a step
    on a CPU, about 1x on a GPU). The choice changes speed only, never the output.
    """

    max_block: int = 32
    adaptive: bool = True
    cost_ratio: float = 0.05
    prior_accepted: float = 9.0  # prior pseudo-counts: an optimistic p of 0.9 to start
    prior_rejected: float = 1.0
    decay: float = 0.8  # weight of older iterations in the estimate of p
    max_rest: int = 64  # the longest run of plain steps between two tries of a failing draft source
    min_repeat: int = MIN_REPEAT  # the shortest repeated stretch of the output whose continuation is drafted

    def __post_init__(self) -> None:
        # a caller's options (Generator.generate's ``block``): refused with a clear error, since a
        # NaN, a zero prior or a fractional block would otherwise fail deep in the loop or decode
        # with nonsense lengths. No block holds more than its bundle's max_target_len tokens
        # (DecodeOptions.resolve cuts it to that), and none is above MAX_SEQUENCE_LEN: a larger
        # max_block only made the sizer's arrays of 1..max_block take gigabytes
        object.__setattr__(self, "max_block", positive_integer("max_block", self.max_block, MAX_SEQUENCE_LEN))
        for name in ("max_rest", "min_repeat"):
            object.__setattr__(self, name, positive_integer(name, getattr(self, name)))
        flag("adaptive", self.adaptive)
        for name in ("cost_ratio", "prior_accepted", "prior_rejected"):
            value = getattr(self, name)
            if not is_finite_real(value) or value < 0:
                raise InputError(f"{name} must be a finite number >= 0, got {value!r}.")
            object.__setattr__(self, name, float(value))
        if self.prior_accepted + self.prior_rejected <= 0:
            raise InputError("prior_accepted + prior_rejected must be above 0 (pseudo-counts of a row's first "
                             f"estimate), got {self.prior_accepted!r} and {self.prior_rejected!r}.")
        if not is_finite_real(self.decay) or not 0 < self.decay <= 1:
            raise InputError(f"decay must be a number in (0, 1], got {self.decay!r}.")
        object.__setattr__(self, "decay", float(self.decay))


MAX_REST = BlockOptions.max_rest  # the default (a Generator's Tuning.max_rest)


class AcceptancePrior:
    """Where a new row's acceptance estimate starts: what the rows before it were accepted at.

    A row's first draft has no history of its own, and a fixed prior fits one workload only:
    IAD on grammar correction keeps nearly every source token (measured on the UA-GEC test
    split: about 9 of every 10 drafted tokens per call, a learned rate of 0.92 to 0.97), while IAD on
    translation or a weak GAD drafter keep few. The options' prior (an optimistic 0.9) made a
    correction's first draft 13 tokens on the CPU, so an unchanged 25-token sentence took two
    verifier calls where one would do. This keeps the accepted tokens and the failed drafts of
    every row it is given (shared by the decodes of one Generator, thread-safe), decayed so it
    follows a change of workload, and starts each new row from that rate, weighted as the
    options' prior (``prior_accepted + prior_rejected`` pseudo-counts): the row's own history
    still takes over within a few calls. Before anything is observed it is the options' prior.
    The draft length changes speed only, never the output.
    """

    def __init__(self, decay: float = 0.995) -> None:
        self.decay = decay  # per observed call: about the last 200 calls count
        self._lock = threading.Lock()
        self._accepted = self._rejected = 0.0

    def start(self, options: BlockOptions) -> tuple[float, float]:
        """(accepted, rejected) pseudo-counts for a new row drafting under ``options``."""
        weight = options.prior_accepted + options.prior_rejected
        with self._lock:  # the options' prior counts too, so that a few calls seen cannot say 1.0
            accepted = self._accepted + options.prior_accepted
            rejected = self._rejected + options.prior_rejected
        rate = accepted / (accepted + rejected)
        return weight * rate, weight * (1.0 - rate)

    def observe(self, drafted: int, accepted: int) -> None:
        with self._lock:
            self._accepted = self.decay * self._accepted + accepted
            self._rejected = self.decay * self._rejected + (1.0 if accepted < drafted else 0.0)

    def reset(self) -> None:
        """Forget what was observed (after a warm-up, whose text is not the workload's)."""
        with self._lock:
            self._accepted = self._rejected = 0.0


class BlockSizer:
    def __init__(self, options: BlockOptions, prior: AcceptancePrior | None = None) -> None:
        self.options = options
        self.prior = prior
        start = (options.prior_accepted, options.prior_rejected) if prior is None else prior.start(options)
        self._start = start  # a probe after a rest drafts as a fresh row would
        self._accepted, self._rejected = start
        self._resting = 0  # plain steps left before drafting is tried again
        self._rest = 1  # the next rest's length: doubles after each failed try
        self._trying = False
        self._probing = False  # the last draft was such a try
        ks = np.arange(1, options.max_block + 1, dtype=np.float64)
        self._ks = ks
        self._cost = 1.0 + options.cost_ratio * ks

    def size(self, fixed_cost: float = 0.0, allow_none: bool = False, block_cost: np.ndarray | None = None) -> int:
        """The draft length to check next. ``fixed_cost``: what drafting costs besides the
        verifier call, relative to a one-token call (GAD's drafter call), which favours longer
        drafts. ``allow_none``: 0 (a plain greedy step, without that cost) is a choice too, for
        a row whose drafts keep failing. ``block_cost``: the cost of checking 1..max_block drafts
        relative to a one-token call, measured (:meth:`CallCost.block_cost`), in place of the
        options' prior."""
        if not self.options.adaptive:
            return self.options.max_block
        cost = self._cost if block_cost is None else block_cost
        value = self._gain(self._accepted, self._rejected) / (cost + fixed_cost)
        best = int(np.argmax(value))
        if not allow_none or value[best] >= 1.0:
            self._rest = 1
            return int(self._ks[best])
        # one token for one plain call beats drafting: rest, then try once more; each failed
        # try doubles the rest, so a row that never accepts pays for a few drafter calls only
        if self._resting > 0:
            return 0
        if self._trying:  # try with the draft length a fresh row would get
            self._trying = False
            self._probing = True
            return int(self._ks[int(np.argmax(self._gain(*self._start) / (cost + fixed_cost)))])
        self._resting, self._rest = self._rest, min(2 * self._rest, self.options.max_rest)
        return 0

    def expected(self) -> np.ndarray:
        """Expected tokens from checking 1..max_block drafts at the current estimate (a caller
        that sizes one block for several sizers sums these)."""
        return self._gain(self._accepted, self._rejected)

    def _gain(self, accepted: float, rejected: float) -> np.ndarray:
        """Expected tokens from checking 1..max_block drafts at a per-token acceptance rate of
        accepted / (accepted + rejected), capped below 1 (a rate of 1 would make every length
        equally infinite)."""
        p = min(accepted / (accepted + rejected), 0.999)
        return (1.0 - p ** (self._ks + 1.0)) / (1.0 - p)

    def skipped(self) -> None:
        """An iteration without a draft."""
        if self._resting > 0:
            self._resting -= 1
            self._trying = self._resting == 0

    def observe(self, drafted: int, accepted: int) -> None:
        if self.prior is not None:
            self.prior.observe(drafted, accepted)
        if self._probing:
            self._probing = False
            if 2 * accepted >= drafted:  # the try mostly passed: drafting pays again, start afresh
                self._accepted, self._rejected = self._start
                self._rest = 1
                return
        decay = self.options.decay
        self._accepted = decay * self._accepted + accepted
        self._rejected = decay * self._rejected + (1.0 if accepted < drafted else 0.0)


class CallCost:
    """What a verifier call costs, measured: seconds = one_token * (1 + ratio * (width - 1)),
    fitted by least squares over the calls seen (``width``: the positions each row's block
    holds; 1 is a plain step), with older calls weighing less so the fit follows the machine.

    Why measured: the sizers weigh a draft's expected gain against its cost, and the cost of a
    longer block relative to a step is a property of the model, precision and machine, not of
    the device alone (on the small reference model, CPU, batch 1, fp32, `aggdec generate --mode
    gad --stats` prints 0.13 to 0.15 per extra position, against the CPU prior of 0.05), and
    GAD's drafter call has to be expressed in one-token calls, which a mean over mixed-width
    calls overstates. Until the calls seen have varied in width, the ``prior_ratio`` stands in
    for the slope. Shared by the decodes of one Generator (thread-safe), so a new request starts
    from what earlier ones measured.

    ``by_rows`` (load-adaptive): calls are also fitted per batch width, the rows a call serves,
    in powers of two (1, 2-3, 4-7, ...): a loaded batch's call is compute-bound, so each extra
    position costs nearly a whole step (the reference model, fp32, batch 32: a 17-wide IAD call
    took 10x a greedy one, benchmarks/results/profile-step-cpu), where an idle batch's call is
    dominated by its fixed cost. A width class without calls of varied widths yet borrows the
    slope of all calls; False: one fit over every call."""

    MIN_SPREAD = 0.25  # variance of the widths seen below which the slope is not trusted
    MAX_RATIO = 4.0  # a noisy fit is clamped to [0, MAX_RATIO]
    _ALL = 0  # the fit of every call (width classes are rows.bit_length() >= 1)

    def __init__(self, prior_ratio: float, decay: float = 0.98, by_rows: bool = True) -> None:
        self.prior_ratio = prior_ratio
        self.decay = decay
        self.by_rows = by_rows
        self._lock = threading.Lock()
        # width class -> decayed [n, w, w^2, t, w t]: Python floats, since a call observes one
        # point and numpy's per-call cost (a few us an operation) is most of a 5-float update
        self._sums: dict[int, list[float]] = {}
        self._drafter: dict[int, float] = {}  # width class -> running mean of a drafter call (GAD)

    def _classes(self, rows: int) -> tuple[int, ...]:
        return (self._ALL, int(rows).bit_length()) if self.by_rows else (self._ALL,)

    @property
    def drafter_seconds(self) -> float:
        """The running mean of a drafter call, over every call."""
        return self._drafter.get(self._ALL, 0.0)

    def reset(self) -> None:
        """Forget what was measured (after a warm-up, whose first calls are not typical)."""
        with self._lock:
            self._sums.clear()
            self._drafter.clear()

    def observe(self, width: int, seconds: float, rows: int = 1) -> None:
        """A verifier call of ``rows`` rows, ``width`` positions each, took ``seconds``."""
        point = (1.0, float(width), float(width * width), seconds, width * seconds)
        decay = self.decay
        with self._lock:
            for key in self._classes(rows):
                sums = self._sums.get(key)
                self._sums[key] = list(point) if sums is None else [decay * a + b for a, b in zip(sums, point)]

    def observe_drafter(self, seconds: float, rows: int = 1, weight: float = 0.05) -> None:
        # a slow-moving mean: one drafter call delayed by the machine should not make every row rest
        with self._lock:
            for key in self._classes(rows):
                mean = self._drafter.get(key, 0.0)
                self._drafter[key] = seconds if mean == 0.0 else (1 - weight) * mean + weight * seconds

    def drafter_cost(self, rows: int = 1) -> float:
        """A drafter call for ``rows`` rows, in one-token verifier calls of as many rows (0 before
        either was measured)."""
        one_token, _ratio = self.fit(rows)
        with self._lock:
            seconds = self._drafter.get(self._classes(rows)[-1], self._drafter.get(self._ALL, 0.0))
        return seconds / one_token if one_token > 0 else 0.0

    def block_cost(self, ratio: float, max_block: int) -> np.ndarray:
        """The cost of a block checking 1..max_block drafts, in one-token calls, for BlockSizer."""
        return 1.0 + ratio * np.arange(1, max_block + 1, dtype=np.float64)

    def fit(self, rows: int = 1) -> tuple[float, float]:
        """(seconds of a one-token call of ``rows`` rows, cost of one more position relative to
        it); (0, prior) before any call was seen."""
        with self._lock:
            own = self._sums.get(self._classes(rows)[-1])
            every = self._sums.get(self._ALL)
        for sums in (own, every):  # the width class's own slope, else that of every call
            if sums is not None and sums[0] > 0.0:
                n, w, ww, t, wt = sums
                mean_w, mean_t = w / n, t / n
                spread = ww / n - mean_w * mean_w
                if spread >= self.MIN_SPREAD:
                    slope = (wt / n - mean_w * mean_t) / spread
                    one = mean_t - slope * (mean_w - 1.0)
                    if one > 0.0:
                        ratio = min(max(slope / one, 0.0), self.MAX_RATIO)
                        break
        else:
            ratio = self.prior_ratio
        base = own if own is not None else every
        if base is None or base[0] == 0.0:
            return 0.0, ratio
        mean_w, mean_t = base[1] / base[0], base[3] / base[0]
        # the class's own calls, scaled to a one-token call by the ratio found
        return mean_t / (1.0 + ratio * (mean_w - 1.0)), ratio


class ReplayPayoff:
    """Whether drafting pays, measured: the seconds per step of the iterations that drafted and
    of those that did not, per batch width class (the rows a call serves, in powers of two),
    decayed so they follow the machine. A step is a beam step a group (speculative beam search)
    or a token a row (GAD, :class:`DraftGate`).

    Why besides the cost model: a drafted beam call pays only when the steps it replays beat its
    extra width, and on the CPU the two are close (reference model, beam 4: a 1-token draft
    replays a second step on 37% of calls; one more position costs 0.2-0.6 of a step). A fitted
    cost and an estimated replay rate, each a little off, then draft where it does not pay; this
    compares what each kind of iteration actually took per step, host work included, and vetoes
    drafting where drafted iterations were the slower. Shared by a Generator's decodes
    (thread-safe)."""

    DECAY = 0.97  # per iteration of each kind
    MIN_WEIGHT = 4.0  # decayed iterations of each kind before the comparison is trusted
    LONGEST_REST = 4096  # the longest rest :meth:`rest` gives (a try now and then, whatever it lost)

    def __init__(self, decay: float = DECAY, min_weight: float = MIN_WEIGHT) -> None:
        """``min_weight``: the decayed iterations of each kind before a verdict (a GAD batch's
        iteration measures every row's tokens, a beam one a few groups' steps)."""
        self.decay = decay
        self.min_weight = min_weight
        self._lock = threading.Lock()
        self._sums: dict[tuple[int, bool], tuple[float, float, float]] = {}  # (class, drafted) -> decayed n, s, steps

    def observe(self, rows: int, drafted: bool, seconds: float, steps: float, weight: float = 1.0) -> None:
        """An iteration of ``rows`` rows took ``seconds`` for ``steps`` steps (a group's beam
        steps, or a row's tokens); it counts as ``weight`` iterations (and ages the older ones
        as many times)."""
        key = (int(rows).bit_length(), drafted)
        decay = self.decay if weight == 1.0 else self.decay ** weight
        with self._lock:  # Python floats: one iteration's update (numpy's per-call cost would dominate it)
            sums = self._sums.get(key)
            point = (weight, weight * seconds, weight * steps)
            self._sums[key] = (point if sums is None else
                               (decay * sums[0] + point[0], decay * sums[1] + point[1], decay * sums[2] + point[2]))

    def pays(self, rows: int) -> bool | None:
        """Whether drafted iterations took less time per step than plain ones at this width
        class; None until both kinds were seen often enough."""
        klass = int(rows).bit_length()
        with self._lock:
            drafted, plain = self._sums.get((klass, True)), self._sums.get((klass, False))
        if drafted is None or plain is None or min(drafted[0], plain[0]) < self.min_weight:
            return None
        return bool(drafted[1] / drafted[2] < plain[1] / plain[2])

    def seen(self, rows: int, drafted: bool) -> bool:
        """Whether iterations of that kind were seen often enough at this width class."""
        with self._lock:
            sums = self._sums.get((int(rows).bit_length(), drafted))
        return sums is not None and sums[0] >= self.min_weight

    def rest(self, rows: int, budget: float) -> int:
        """How many plain iterations to take before the next drafted try at this width class, so
        that the try's measured loss (its steps at the drafted iterations' rate instead of the
        plain ones') is at most ``budget`` of the plain iterations' time; 1 before both kinds
        were seen."""
        klass = int(rows).bit_length()
        with self._lock:
            drafted, plain = self._sums.get((klass, True)), self._sums.get((klass, False))
        if drafted is None or plain is None or min(drafted[2], plain[2]) <= 0.0:
            return 1
        steps = drafted[2] / drafted[0]  # a drafted iteration's steps
        loss = steps * (drafted[1] / drafted[2] - plain[1] / plain[2])  # seconds, against plain steps
        plain_iteration = plain[1] / plain[0]
        if loss <= 0.0 or plain_iteration <= 0.0:
            return 1
        return int(min(math.ceil(loss / (budget * plain_iteration)), self.LONGEST_REST))

    def reset(self) -> None:
        with self._lock:
            self._sums.clear()


# What a drafted try may cost a batch whose drafted iterations were measured slower per token
# than its plain ones (DraftGate), as a share of the plain iterations' time before it. A try
# keeps the drafted iterations' measured rate fresh; at batch 32 on the reference model, CPU, one
# lost about 12 plain steps, so a fixed rest of 64 steps would have cost a fifth of the time
# (0.5%: a rest of about 2,400 steps there; in informal A/Bs of earlier versions of the gate at
# batch 8 and 32, 1,000 sentences, 0.005 came nearer to greedy than 0.02, within the noise).
TRY_BUDGET = 0.005


class DraftGate:
    """Whether a batch's next iteration drafts at all (GAD: calls the drafter), decided for the
    whole batch from whole iterations measured: drafted against plain ones, seconds per token a
    row, per width class, host work and the drafter call included (:class:`ReplayPayoff`).

    Why besides each row's sizing: a row's :class:`BlockSizer` weighs its own expected tokens
    against the cost of a wider call and of the drafter call, as if every row drafted as it does.
    But the drafter call is paid for every drafting row and the widest block by every row, the
    rows that do not draft included, and a loaded batch's cost fit extrapolates a one-token call
    it never sees (reference model, CPU, batch 32: every row drafting 20 tokens, each iteration
    about half as fast per token as a plain step; benchmarks/results/gad-floor-cpu). Where
    drafted iterations took longer per token than plain ones at the batch's width class, the
    batch takes plain steps (no draft) and tries drafting once after a rest sized so that the
    try costs at most ``budget`` of the rest's time (:meth:`ReplayPayoff.rest`): a near tie is
    tried again soon, a clear loss seldom. At a width class not yet measured, the rows' own
    sizing decides (as without the gate) until drafted iterations were seen, then the batch
    takes plain steps until plain ones were, then the verdict holds.

    An iteration weighs as many rows as it served (``decay`` and ``min_weight`` are per row):
    one row's tokens an iteration vary from 1 to a whole draft, 32 rows' average out, so a
    verdict at batch 1 rests on about ten iterations of each kind (a drafted one that loses is
    cheap there) and at 8 rows or more on one (a drafted one at 32 rows costs about 12 plain
    steps on the reference model). Shared by a Generator's decodes (the rests too: per width class, whichever
    batch takes the steps); thread-safe."""

    @classmethod
    def per_beam_step(cls) -> DraftGate:
        """A speculative beam search's gate: a beam iteration measures a few groups' steps, not
        every row's tokens, so it decays and weighs its iterations as :class:`ReplayPayoff` does."""
        return cls(decay=ReplayPayoff.DECAY, min_weight=ReplayPayoff.MIN_WEIGHT)

    def __init__(self, budget: float = TRY_BUDGET, decay: float = 0.99, min_weight: float = 8.0) -> None:
        """``decay``: per row served (about the last 100 rows' iterations count);
        ``min_weight``: rows' iterations of each kind before a verdict."""
        self.payoff = ReplayPayoff(decay, min_weight)
        self.budget = budget
        self._lock = threading.Lock()
        self._rests: dict[int, int] = {}  # width class -> plain iterations left before a try

    def drafts(self, rows: int) -> bool:
        """Whether the next iteration of ``rows`` rows drafts (each row then sizes its own draft)."""
        verdict = self.payoff.pays(rows)
        if verdict is None:  # the rows' own sizing first, then plain steps to judge it against
            return not self.payoff.seen(rows, drafted=True)
        klass = int(rows).bit_length()
        with self._lock:
            if verdict:
                self._rests.pop(klass, None)
                return True
            left = self._rests.get(klass)
            if left is None:  # a rest starts, sized from what the last try measured
                left = self.payoff.rest(rows, self.budget)
            if left > 0:
                self._rests[klass] = left - 1
                return False
            del self._rests[klass]  # the try
            return True

    def rests(self, rows: int) -> bool | None:
        """Whether the next iteration of ``rows`` rows is a plain step inside a rest whose time
        nothing needs to read (True: counted down as :meth:`drafts` does), so that a draft source
        may skip its timing and sizing (``HypothesisDraft._inside_a_rest`` says what that saves);
        None where the gate gives no rest (drafted iterations not measured slower at this width
        class: the source's own sizing decides). A rest's first and last plain steps are left to
        :meth:`drafts` (False), so the plain iterations around each try stay measured."""
        if self.payoff.pays(rows) is not False:
            return None
        klass = int(rows).bit_length()
        with self._lock:
            left = self._rests.get(klass, 0)
            if left <= 1:
                return False
            self._rests[klass] = left - 1
            return True

    def resting(self, rows: int) -> int:
        """The plain iterations left in this width class's rest (0: none under way)."""
        with self._lock:
            return self._rests.get(int(rows).bit_length(), 0)

    def observe(self, rows: int, drafted: bool, seconds: float, tokens: int) -> None:
        """An iteration of ``rows`` rows, drafted or not, took ``seconds`` for ``tokens`` tokens.
        ``drafted``: it drafted, or it followed one that did (see :class:`gad.DrafterDraft`)."""
        self.payoff.observe(rows, drafted, seconds, tokens / rows, weight=float(rows))

    def reset(self) -> None:
        """Forget what was measured (after a warm-up)."""
        self.payoff.reset()
        with self._lock:
            self._rests.clear()
