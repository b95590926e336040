"""What one decode is asked to do: the :class:`Mode` and its options, as one frozen record.

:class:`DecodeOptions` is the only place a decoding option is named, typed and checked. Its
constructor checks what needs no bundle (a known mode, types and ranges, each option used
with a mode it applies to); :meth:`DecodeOptions.resolve` checks it once against a bundle's
:class:`OptionLimits` (a drafter for GAD, ``draft_k`` within the drafter's k, ``beta``
within the verifier's top-k) and fills the mode's defaults, so that two requests that decode
alike compare equal (the server keys its decode loops by resolved options). The CLI, the
HTTP schema, the bench and train-drafter all build one; ``Generator`` takes one.

A new option (the beam-search issue's ``num_beams``, say) is a field here, an entry in
:data:`APPLIES_TO` naming the modes it applies to, and its checks in ``__post_init__`` /
``resolve``.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
from dataclasses import dataclass
from enum import Enum

from .decoding.beam import EARLY_STOPPING, BeamRules
from .decoding.sizing import BlockOptions
from .errors import BundleError, InputError
from .values import is_finite_real, positive_integer


class Mode(str, Enum):
    """A decoding mode. greedy, iad and gad give greedy's output token for token; gad++ relaxes
    verification (``beta`` > 1) and may differ."""

    GREEDY = "greedy"
    IAD = "iad"  # the source is the draft
    GAD = "gad"  # drafts from the bundle's drafter
    GAD_PLUS = "gad++"  # GAD with SpecDec's relaxed verification

    def __str__(self) -> str:
        return self.value

    @property
    def needs_drafter(self) -> bool:
        return self in (Mode.GAD, Mode.GAD_PLUS)

    @classmethod
    def parse(cls, value: object) -> Mode:
        """``value`` (a Mode or its name) as a Mode, or InputError listing the modes."""
        if isinstance(value, Mode):
            return value
        try:
            return cls(value)
        except ValueError:
            raise InputError(f"unknown mode {value!r}; choose one of: {', '.join(MODES)}.") from None


MODES: tuple[str, ...] = tuple(mode.value for mode in Mode)
DRAFTING_MODES: tuple[Mode, ...] = (Mode.IAD, Mode.GAD, Mode.GAD_PLUS)  # modes whose rows draft
GAD_PLUS_BETA, GAD_PLUS_TAU = 3, 1.0  # GAD++ defaults (SpecDec's relaxed verification)

# the modes each option applies to; an option set for another mode is refused, not ignored
APPLIES_TO: dict[str, tuple[Mode, ...]] = {
    # and GAD's beam search: the batch's draft lengths (``_check_beams``: with num_beams only)
    "block": (Mode.IAD, Mode.GAD),
    "beta": (Mode.GAD_PLUS,),
    "tau": (Mode.GAD_PLUS,),
    "draft_k": (Mode.GAD, Mode.GAD_PLUS),
    # beam search's selection replaces the argmax; with IAD each hypothesis drafts its source,
    # with GAD the drafter's guess after it (gad++'s relaxed acceptance has no beam counterpart)
    "num_beams": (Mode.GREEDY, Mode.IAD, Mode.GAD),
}
# options of beam search only: set with num_beams > 1, or refused
BEAM_OPTIONS = ("length_penalty", "early_stopping", "num_return_sequences")


@dataclass(frozen=True)
class OptionLimits:
    """What a bundle allows: the verifier's top-k and the drafter's k (None: no drafter)."""

    top_k: int
    drafter_k: int | None
    bundle: str = "the bundle"  # for messages
    shortlist: bool = False  # the bundle decodes each sentence over its own shortlist
    max_rows: int | None = None  # the most rows a verifier call may take (a TensorRT profile's)
    # the verifier's log-probs are normalized over every id, banned ones included (transformers'
    # order, Manifest.suppression): what beam scores are sums of
    normalized: bool = True
    # whose beam search the bundle follows (Manifest.beam_rules): "transformers", or "marian" for
    # a bundle made from a Marian model, with the defaults of its decoding yml (``normalize`` as
    # the length penalty, ``word-penalty``)
    beam_family: str = "transformers"
    beam_length_penalty: float = 1.0
    beam_word_penalty: float = 0.0
    # the longest output, counted as beam search counts a hypothesis's length (None: unbounded)
    max_target_len: int | None = None
    # the verifier's logits width (None: not known): a top-k of all of it holds every candidate
    vocab_size: int | None = None


def _shown(mode: object) -> str:
    """A mode as a message shows it: its name (a Mode's repr is its class's)."""
    return reprlib.repr(mode.value if isinstance(mode, Mode) else mode)


# beam search scores a hypothesis ``score / length ** length_penalty`` in float32: ``length **
# length_penalty`` must stay within 2**-100 .. 2**100 for every length a bundle can output, or
# the power overflows (OverflowError from deep in the decode loop, past about 400 for a
# 128-token bundle) or the score becomes -0.0 or -inf for every hypothesis (ties decided by
# accident, and an -inf no JSON can hold); 2**100 leaves 2**28 of float32's range for the score
PENALTY_RANGE_BITS = 100


def _beam_candidates(beams: int, vocab_size: int | None) -> int:
    """The verifier's candidates N beams need per hypothesis: the 2N best continuations of the
    N x vocabulary scores are each among their own hypothesis's 2N best ids, or among all of
    its ids where the vocabulary is smaller (a top-k of the whole vocabulary misses none)."""
    return 2 * beams if vocab_size is None else min(2 * beams, vocab_size)


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode: the mode and the options of that mode (None: the mode's default).

    ``block``: IAD's draft-block options (default: the Generator's tuning for its device); with
    mode gad, those of its beam search only (``max_block`` capped by ``draft_k``).
    ``beta``/``tau``: GAD++ keeps a draft token while it is among the verifier's top ``beta``
    (default 3; 1 is greedy) within ``tau`` log-prob of the best (default 1.0).
    ``draft_k``: the most GAD draft tokens a verifier call checks, 1 to the drafter's k
    (default: its k); each row checks fewer while its drafts are being rejected.
    ``num_beams``: beam search with that many hypotheses per text (None or 1: greedy), with
    transformers' rules (``decoding/beam.py``): ``length_penalty`` (default 1.0),
    ``early_stopping`` (True, False or "never"; default False) and ``num_return_sequences``
    (1 to ``num_beams``; default 1) as ``generate`` takes them. N beams need a verifier top-k
    of at least 2N. On a bundle with Marian's rules (``OptionLimits.beam_family``,
    ``decoding/marian_beam.py``) ``length_penalty`` is Marian's ``normalize`` (default: the
    bundle's), ``early_stopping`` is refused, and a top-k of N suffices.

    >>> DecodeOptions("gad++", beta=2).mode
    <Mode.GAD_PLUS: 'gad++'>
    """

    mode: Mode = Mode.GREEDY
    block: BlockOptions | None = None
    beta: int | None = None
    tau: float | None = None
    draft_k: int | None = None
    num_beams: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    num_return_sequences: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode.parse(self.mode))
        for name, modes in APPLIES_TO.items():
            if getattr(self, name) is not None and self.mode not in modes:
                names = [repr(m.value) for m in modes]
                listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
                raise InputError(f"{name} applies to mode{'s' if len(modes) > 1 else ''} {listed} only, "
                                 f"not {self.mode.value!r}.")
        if self.block is not None and not isinstance(self.block, BlockOptions):
            raise InputError(f"block must be an aggdec.runtime.decoding.iad.BlockOptions, not "
                             f"{type(self.block).__name__}.")
        # each number kept as Python's own: a numpy integer (np.uint64(2**64 - 1)) wraps around in
        # the arithmetic of the checks against a bundle, and its messages then named wrong numbers
        for name in ("beta", "draft_k", "num_beams", "num_return_sequences"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, positive_integer(name, getattr(self, name)))
        if self.tau is not None and (not is_finite_real(self.tau) or self.tau < 0):
            raise InputError(f"tau must be a finite number >= 0, got {self.tau!r}.")
        if self.tau is not None:
            object.__setattr__(self, "tau", float(self.tau))
        self._check_beams()

    def _check_beams(self) -> None:
        if self.num_beams is not None and self.num_beams == 1:  # one beam is greedy search: one key for both
            object.__setattr__(self, "num_beams", None)
        if self.mode is Mode.GAD and self.block is not None and self.num_beams is None:
            # GAD's greedy rows size their drafts per row from the drafter's k and draft_k
            raise InputError("block applies to mode 'gad' with num_beams only (the draft lengths of speculative "
                             "beam search); GAD's greedy rows take draft_k.")
        given = [name for name in BEAM_OPTIONS if getattr(self, name) is not None]
        if given and self.num_beams is None:
            raise InputError(f"{', '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to beam search only; "
                             "set num_beams to 2 or more.")
        if self.length_penalty is not None and not is_finite_real(self.length_penalty):
            raise InputError(f"length_penalty must be a finite number, got {self.length_penalty!r}.")
        if self.length_penalty is not None:
            object.__setattr__(self, "length_penalty", float(self.length_penalty))
        if self.early_stopping is not None and not any(
                self.early_stopping is value or (isinstance(value, str) and self.early_stopping == value)
                for value in EARLY_STOPPING):
            raise InputError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}.")
        count = self.num_return_sequences
        if count is not None and count > self.num_beams:  # type: ignore[operator]
            raise InputError(f"num_return_sequences ({count}) must be at most num_beams ({self.num_beams}).")

    @property
    def beams(self) -> BeamRules | None:
        """The beam search these options ask for (resolved options), or None: one row a text."""
        if self.num_beams is None:
            return None
        return BeamRules(int(self.num_beams),
                         1.0 if self.length_penalty is None else float(self.length_penalty),
                         False if self.early_stopping is None else self.early_stopping,
                         1 if self.num_return_sequences is None else int(self.num_return_sequences))

    @classmethod
    def of(cls, options: DecodeOptions | Mode | str | None = None, **fields: object) -> DecodeOptions:
        """``options``, or a DecodeOptions made from a mode and keyword ``fields`` (None values
        are left out): the keyword conveniences of ``Generator.generate(texts, mode="iad")``.
        Giving both a DecodeOptions and fields is refused, and so is a mode given both as
        ``options`` and as ``mode=``: in either case one would silently win."""
        given = {name: value for name, value in fields.items() if value is not None}
        if isinstance(options, DecodeOptions):
            if given:
                raise InputError(f"give either a DecodeOptions or {', '.join(given)}, not both; "
                                 "dataclasses.replace(options, ...) changes a field.")
            return options
        if options is not None:
            if "mode" in given:
                raise InputError(f"give the mode either as options ({_shown(options)}) or as mode= "
                                 f"({_shown(given['mode'])}), not both.")
            given["mode"] = options
        return cls(**given)

    def resolve(self, limits: OptionLimits) -> DecodeOptions:
        """These options checked against a bundle, with the mode's defaults filled in:
        BundleError when the bundle cannot decode this mode at all (GAD without a drafter),
        InputError naming the value and the limit when an option is outside what it allows."""
        if self.mode.needs_drafter:
            if limits.drafter_k is None:
                raise BundleError(f"mode {self.mode.value!r} needs a drafter, and the bundle {limits.bundle!r} has "
                                  "none; train one with `aggdec train-drafter` and export with --drafter.")
            if self.draft_k is not None and self.draft_k > limits.drafter_k:
                raise InputError(f"draft_k must be an integer between 1 and the drafter's k ({limits.drafter_k}), "
                                 f"got {self.draft_k!r}.")
        self._check_beams_against(limits)
        if self.mode is not Mode.GAD_PLUS:
            resolved = self
        else:
            beta = GAD_PLUS_BETA if self.beta is None else int(self.beta)
            if beta > limits.top_k:
                raise InputError(f"beta must be an integer between 1 and the bundle's top-k ({limits.top_k}), "
                                 f"got {beta!r}; re-export with a larger --top-k for more.")
            resolved = dataclasses.replace(self, beta=beta, tau=float(GAD_PLUS_TAU if self.tau is None else self.tau))
        if self.mode.needs_drafter and self.draft_k is None:
            resolved = dataclasses.replace(resolved, draft_k=limits.drafter_k)
        if self.num_beams is not None and limits.beam_family == "marian":
            # Marian's rules: its yml's normalize is the default length penalty; no early stopping
            resolved = dataclasses.replace(
                resolved, length_penalty=float(limits.beam_length_penalty if self.length_penalty is None
                                               else self.length_penalty),
                num_return_sequences=1 if self.num_return_sequences is None else int(self.num_return_sequences))
        elif self.num_beams is not None:  # the defaults filled in: equal requests compare equal
            rules = self.beams
            assert rules is not None
            resolved = dataclasses.replace(resolved, length_penalty=rules.length_penalty,
                                           early_stopping=rules.early_stopping,
                                           num_return_sequences=rules.num_return_sequences)
        self._check_length_penalty(resolved.length_penalty, limits)
        if self.block is not None and limits.max_target_len is not None \
                and self.block.max_block > limits.max_target_len:
            # no block holds more than the bundle's output: a longer max_block only sized the
            # sizer's arrays (and a static batch's width) for lengths no draft can have
            resolved = dataclasses.replace(resolved, block=dataclasses.replace(
                self.block, max_block=limits.max_target_len))
        return resolved

    @staticmethod
    def _check_length_penalty(penalty: float | None, limits: OptionLimits) -> None:
        if penalty is None or limits.max_target_len is None or limits.max_target_len < 2:
            return
        bound = PENALTY_RANGE_BITS / math.log2(limits.max_target_len)
        if abs(penalty) > bound:
            raise InputError(f"length_penalty must be between {-bound:.3g} and {bound:.3g} for {limits.bundle!r}, got "
                             f"{penalty!r}: beam search divides a score by length ** length_penalty in float32, and "
                             f"for outputs of up to {limits.max_target_len} tokens that leaves float32's range "
                             "past these bounds.")

    @property
    def loop_options(self) -> DecodeOptions:
        """These options less a beam search's scoring (:data:`BEAM_OPTIONS`): what a decode loop
        is made for. Each source carries its own scoring (``Work.beams``), so texts that differ
        only in it share a loop (a server's lane) and its batches."""
        return dataclasses.replace(self, **dict.fromkeys(BEAM_OPTIONS))

    def rules(self, limits: OptionLimits) -> BeamRules | None:
        """The beam search these resolved options ask for on a bundle with ``limits``: its rule
        family and, for Marian's, the word penalty of its decoding yml."""
        rules = self.beams
        if rules is None or limits.beam_family == "transformers":
            return rules
        return dataclasses.replace(rules, family=limits.beam_family, word_penalty=limits.beam_word_penalty)

    def _check_beams_against(self, limits: OptionLimits) -> None:
        beams = self.num_beams
        if beams is None:
            return
        if limits.beam_family == "marian":
            self._check_marian_beams(limits)
        elif limits.vocab_size is not None and limits.vocab_size < 2:
            raise InputError(f"beam search needs a vocabulary of 2 ids or more, and {limits.bundle!r} has "
                             f"{limits.vocab_size} (transformers' beam search fails there too).")
        elif (needed := _beam_candidates(beams, limits.vocab_size)) > limits.top_k:
            fewer = (f"use at most {limits.top_k // 2} beams" if limits.top_k >= 4
                     else "too few for any beam search (2 beams need top-k 4)")
            raise InputError(f"num_beams {beams} needs the verifier's top-{needed} candidates (beam search keeps "
                             f"2 x num_beams continuations a step), and {limits.bundle!r} has top-k {limits.top_k}; "
                             f"{fewer}, or re-export with --top-k {needed}.")
        if limits.shortlist and limits.beam_family == "transformers":
            raise InputError(f"beam search over a lexical shortlist is not supported ({limits.bundle!r} has one): "
                             "its log-probs are normalized over each sentence's shortlist, not transformers' "
                             "vocabulary; decode with the shortlist off (--no-shortlist, shortlist=False).")
        if not limits.normalized:
            raise InputError(f"{limits.bundle!r} masks its banned ids before the log-softmax (an older export, or "
                             "Marian's own graphs), so its log-probs are not transformers' and beam scores would "
                             "differ; re-export it with this aggdec for beam search.")
        if limits.max_rows is not None and beams > limits.max_rows:
            raise InputError(f"num_beams {beams} exceeds the {limits.max_rows} rows a verifier call of "
                             f"{limits.bundle!r} may take.")

    def _check_marian_beams(self, limits: OptionLimits) -> None:
        """Marian's beam search (``decoding/marian_beam.py``) keeps N expansions a step, each among
        its hypothesis's N best tokens, and has no early stopping."""
        beams = int(self.num_beams)  # type: ignore[arg-type]
        if beams > limits.top_k:
            raise InputError(f"num_beams {beams} needs the verifier's top-{beams} candidates (Marian's beam search "
                             f"keeps num_beams expansions a step), and {limits.bundle!r} has top-k {limits.top_k}; "
                             f"use at most {limits.top_k} beams, or re-export with --top-k {beams}.")
        if self.early_stopping is not None:
            raise InputError(f"early_stopping does not apply to {limits.bundle!r}: it decodes beams with Marian's "
                             "rules, where a hypothesis that ends leaves the beam and the search ends when none is "
                             "left; leave early_stopping unset.")
