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
from dataclasses import dataclass
from enum import Enum

from .decoding.sizing import BlockOptions, is_finite_real, is_integer
from .errors import BundleError, InputError


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
    "block": (Mode.IAD,),
    "beta": (Mode.GAD_PLUS,),
    "tau": (Mode.GAD_PLUS,),
    "draft_k": (Mode.GAD, Mode.GAD_PLUS),
}


@dataclass(frozen=True)
class OptionLimits:
    """What a bundle allows: the verifier's top-k and the drafter's k (None: no drafter)."""

    top_k: int
    drafter_k: int | None
    bundle: str = "the bundle"  # for messages



@dataclass(frozen=True)
class DecodeOptions:
    """How to decode: the mode and the options of that mode (None: the mode's default).

    ``block``: IAD's draft-block options (default: the Generator's tuning for its device).
    ``beta``/``tau``: GAD++ keeps a draft token while it is among the verifier's top ``beta``
    (default 3; 1 is greedy) within ``tau`` log-prob of the best (default 1.0).
    ``draft_k``: the most GAD draft tokens a verifier call checks, 1 to the drafter's k
    (default: its k); each row checks fewer while its drafts are being rejected.

    >>> DecodeOptions("gad++", beta=2).mode
    <Mode.GAD_PLUS: 'gad++'>
    """

    mode: Mode = Mode.GREEDY
    block: BlockOptions | None = None
    beta: int | None = None
    tau: float | None = None
    draft_k: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode.parse(self.mode))
        for name, modes in APPLIES_TO.items():
            if getattr(self, name) is not None and self.mode not in modes:
                raise InputError(f"{name} applies to mode{'s' if len(modes) > 1 else ''} "
                                 f"{' and '.join(repr(m.value) for m in modes)} only, not {self.mode.value!r}.")
        if self.block is not None and not isinstance(self.block, BlockOptions):
            raise InputError(f"block must be an aggdec.runtime.decoding.iad.BlockOptions, not "
                             f"{type(self.block).__name__}.")
        if self.beta is not None and (not is_integer(self.beta) or self.beta < 1):
            raise InputError(f"beta must be an integer of at least 1, got {self.beta!r}.")
        if self.tau is not None and (not is_finite_real(self.tau) or self.tau < 0):
            raise InputError(f"tau must be a finite number >= 0, got {self.tau!r}.")
        if self.draft_k is not None and (not is_integer(self.draft_k) or self.draft_k < 1):
            raise InputError(f"draft_k must be an integer of at least 1, got {self.draft_k!r}.")

    @classmethod
    def of(cls, options: DecodeOptions | Mode | str | None = None, **fields: object) -> DecodeOptions:
        """``options``, or a DecodeOptions made from a mode and keyword ``fields`` (None values
        are left out): the keyword conveniences of ``Generator.generate(texts, mode="iad")``.
        Giving both a DecodeOptions and fields is refused, as one would silently win."""
        given = {name: value for name, value in fields.items() if value is not None}
        if isinstance(options, DecodeOptions):
            if given:
                raise InputError(f"give either a DecodeOptions or {', '.join(given)}, not both; "
                                 "dataclasses.replace(options, ...) changes a field.")
            return options
        if options is not None:
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
        return resolved
