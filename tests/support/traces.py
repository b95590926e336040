"""What a decode did, iteration by iteration, read back from its result alone."""

from __future__ import annotations

from typing import NamedTuple

from aggdec.runtime.decoding import cache
from aggdec.runtime.decoding.alignment import repeated_tail


class Iterations(NamedTuple):
    repeat: int  # began with the output repeating itself (GAD drafts the repetition: no drafter call)
    plain: int  # the others without a draft
    drafted: int  # the rest: drafted by the mode's own source
    repeat_tokens: int  # tokens appended by the ``repeat`` iterations


def iterations_by_source(result, start: list[int]) -> Iterations:
    """How a result's iterations drafted, from its ids and per-iteration counts alone
    (``start``: the decoder start tokens)."""
    repeat = plain = drafted = repeat_tokens = done = 0
    for draft, appended in zip(result.stats.drafted, result.stats.accepted):
        if repeated_tail(start + list(result.ids[:done]))[1] is not None:
            repeat += 1
            repeat_tokens += appended
        elif draft == 0:
            plain += 1
        else:
            drafted += 1
        done += appended
    return Iterations(repeat, plain, drafted, repeat_tokens)


def host_edit_log(monkeypatch) -> list[bool]:
    """Every whole-buffer edit through the host from now on (``cache._Flat.edit``: download,
    change, upload), recorded as whether the buffer was a device one: the device edit graphs
    (decoding/device_edits.py) should leave no True in it."""
    log: list[bool] = []
    original = cache._Flat.edit

    def recorded(flat):
        log.append(flat.on_device)
        return original(flat)

    monkeypatch.setattr(cache._Flat, "edit", recorded)
    return log
