"""The decoder's speed knobs as data: one frozen :class:`Tuning` record per ``Generator``.

Every field changes how fast a decode runs, never what it outputs (each one sizes drafts,
splits batches or groups encoder calls; the verifier decides every kept token). The defaults
are per device (:data:`PROFILES`, :func:`tuning_for`): a CPU call's cost grows with its
width, a GPU call costs about the same at any width. ``Generator(..., tuning=...)`` takes a
record, so an A/B run (``benchmarks/ab.py --a gad_decay=0.8``) varies a field without
touching module state.

The decoding modules keep each default next to the code that reads it (as the default of a
parameter) with the measurement that chose it; the profiles below are built from them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .bundle_schema import MAX_SEQUENCE_LEN
from .decoding.alignment import MIN_REPEAT
from .decoding.gad import DECAY
from .decoding.loop import WIDTH_QUANTILE
from .decoding.sizing import MAX_REST
from .decoding.verifier import ENCODER_CALL_TOKENS, KEPT_MATRIX_SLOTS
from .errors import InputError
from .values import flag, is_finite_real, is_integer, positive_integer


@dataclass(frozen=True)
class Tuning:
    """How a Generator sizes drafts and batches; none of it changes an output.

    ``cost_ratio``: the prior cost of one more block position relative to a one-token
    verifier call (BlockOptions.cost_ratio; GAD measures the real one as it goes).
    ``max_block``: IAD's longest draft block (at most ``MAX_SEQUENCE_LEN``; cut to the bundle's
    ``max_target_len``, which no block can pass).
    ``beam_cost_ratio``: the prior cost of one more block position of a speculative beam
    search's iteration relative to a plain beam step, until the iterations measured have
    varied in width (decoding/hypothesis_drafts.py HypothesisDraft: IAD's and GAD's beams).
    A beam call has N rows a text, so one more position costs far more than IAD's one-row
    prior says: 0.2-0.6 measured for beam 4 on the reference model's CPU iterations
    (benchmarks/results/beam-adaptive-cpu).
    ``length_classes``: source lengths (ascending) that split a server's arrival-order batch
    into cohorts (runtime/decoding/loop.py: decode). On the CPU a call's cost grows with the
    span its longest row makes every row attend over (benchmarks/results/serve-cpu); two
    classes, not three: p99/p50 at 8 clients 3.2-3.4 against 4.0 (benchmarks/results/serve-classes-cpu,
    decision 040). A GPU call costs about the same at any span, so there it is one batch.
    ``encoder_call_tokens``: the padded tokens one encoder call may hold before a batch's
    sources are split into calls of similar lengths (decoding/verifier.py: length_groups).
    ``gad_decay``: how fast a GAD row's acceptance estimate forgets (decoding/gad.py: DECAY).
    ``width_quantile``: a batched call's block width is capped at this quantile of its rows'
    wishes (1.0: no cap; decoding/loop.py: WIDTH_QUANTILE).
    ``min_repeat``: the shortest repeated stretch whose continuation is drafted
    (decoding/alignment.py: MIN_REPEAT).
    ``max_rest``: the longest run of plain steps between two tries of a failing draft source
    (decoding/sizing.py: MAX_REST).
    ``shared_prior``: a new row's first draft length starts from the acceptance the earlier
    rows of its mode saw (decoding/sizing.py: AcceptancePrior); False: from BlockOptions'
    fixed prior (benchmarks/results/draft-prior-cpu).
    ``argmax_graph``: calls that read only each position's best id (greedy, IAD, GAD) run the
    bundle's argmax graph, without log-softmax and top-k, when it has one; False: the top-K
    graph for every mode (benchmarks/results/argmax-head-cpu).
    ``load_adaptive``: draft lengths (IAD's and GAD's) weigh the verifier's call cost measured
    at the batch's current width (decoding/sizing.py CallCost ``by_rows``), so a loaded batch
    drafts less (IAD only with the default blocks: a caller's BlockOptions keep their own
    ``cost_ratio``); False: GAD's costs fitted over every call and IAD's ``cost_ratio`` prior.
    ``draft_payoff``: a GAD batch calls the drafter only where its drafted iterations were
    measured faster per token than its plain ones at its width class, and tries again after
    rests (decoding/sizing.py DraftGate); False: each row's draft length alone decides
    (benchmarks/results/gad-floor-cpu).
    ``kept_matrix_slots``: a batch of at most this many slots keeps each row's gathered
    shortlist matrix from its admission on (a bundle whose verifier takes ``output_rows``);
    a wider one gathers it every call; 0: never kept (decoding/verifier.py: KEPT_MATRIX_SLOTS).
    """

    cost_ratio: float = 0.05
    max_block: int = 32
    beam_cost_ratio: float = 0.4
    length_classes: tuple[int, ...] = (48,)
    encoder_call_tokens: int = ENCODER_CALL_TOKENS["cpu"]
    gad_decay: float = DECAY
    width_quantile: float = WIDTH_QUANTILE
    min_repeat: int = MIN_REPEAT
    max_rest: int = MAX_REST
    shared_prior: bool = True
    argmax_graph: bool = True
    load_adaptive: bool = True
    draft_payoff: bool = True
    kept_matrix_slots: int = KEPT_MATRIX_SLOTS

    def __post_init__(self) -> None:
        # numbers are kept as Python's own (a numpy integer wraps around in arithmetic); max_block
        # as BlockOptions bounds it (a block is never longer than a bundle's max_target_len, which
        # the Generator cuts it to)
        for name, most in (("max_block", MAX_SEQUENCE_LEN), ("encoder_call_tokens", None), ("min_repeat", None),
                           ("max_rest", None)):
            object.__setattr__(self, name, positive_integer(f"tuning {name}", getattr(self, name), most))
        if not is_integer(self.kept_matrix_slots) or self.kept_matrix_slots < 0:
            raise InputError(f"tuning kept_matrix_slots must be an integer of at least 0, got {self.kept_matrix_slots!r}.")
        object.__setattr__(self, "kept_matrix_slots", int(self.kept_matrix_slots))
        for name in ("cost_ratio", "beam_cost_ratio"):
            value = getattr(self, name)
            if not is_finite_real(value) or value < 0:
                raise InputError(f"tuning {name} must be a finite number >= 0, got {value!r}.")
            object.__setattr__(self, name, float(value))
        for name in ("gad_decay", "width_quantile"):
            value = getattr(self, name)
            if not is_finite_real(value) or not 0 < value <= 1:
                raise InputError(f"tuning {name} must be a number in (0, 1], got {value!r}.")
            object.__setattr__(self, name, float(value))
        for name in ("shared_prior", "argmax_graph", "load_adaptive", "draft_payoff"):
            flag(f"tuning {name}", getattr(self, name))
        classes = self.length_classes
        if not isinstance(classes, tuple) or any(not is_integer(c) or c < 1
                                                 for c in classes) or list(classes) != sorted(set(classes)):
            raise InputError(f"tuning length_classes must be a tuple of ascending positive integers, got {classes!r}.")
        object.__setattr__(self, "length_classes", tuple(int(c) for c in classes))

    def replace(self, **fields: object) -> Tuning:
        """A copy with ``fields`` changed (checked as a new record is)."""
        unknown = sorted(set(fields) - {field.name for field in dataclasses.fields(self)})
        if unknown:
            raise InputError(f"unknown tuning field {unknown[0]!r}; the fields are: "
                             f"{', '.join(field.name for field in dataclasses.fields(self))}.")
        return dataclasses.replace(self, **fields)


_GPU = Tuning(cost_ratio=0.005, beam_cost_ratio=0.005, max_block=64, length_classes=(),
              encoder_call_tokens=ENCODER_CALL_TOKENS["cuda"])
# the defaults per device; a TensorRT engine's calls cost as a CUDA session's do
PROFILES: dict[str, Tuning] = {"cpu": Tuning(), "cuda": _GPU, "tensorrt": _GPU}


def tuning_for(device: str) -> Tuning:
    """The default tuning of ``device`` (cpu, cuda, tensorrt)."""
    try:
        return PROFILES[device]
    except KeyError:
        raise InputError(f"no tuning profile for device {device!r}; the profiles are: {', '.join(PROFILES)}.") from None
