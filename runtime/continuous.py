"""A Generator's decode loop fed by a queue that stays open: the building blocks of a server.

``Generator.generate``/``stream`` own their queue and close it; a server keeps one decode loop
per decoding configuration alive over a queue it never closes (``aggdec/serve/engine.py``),
tokenizes each request's texts itself, gives each row its own limits, and turns finished rows
into results as they come. :class:`RowDecoder` is that surface over one Generator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .decoding.arrivals import Arrivals
from .decoding.beam import BeamRules
from .decoding.cache import check_rows
from .decoding.common import DecodeLimits
from .decoding.loop import DraftSource, Finished
from .errors import InputError
from .generator import GenerationResult, Generator
from .options import DecodeOptions, Mode
from .values import positive_integer


class RowDecoder:
    """Decode loops over open queues for ``generator``, and the per-row steps around them."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator

    def prepare(self, item: object, index: int = 0) -> tuple[str, list[int]]:
        """``item`` (a string, or UTF-8 bytes) as a text and its token ids, or the InputError that
        ``Generator.stream`` would report for it (naming ``index``): what a server checks per item."""
        return self.generator._prepare(item, index)

    def limits(self, max_new_tokens: int | None = None) -> DecodeLimits:
        """The stopping rule for ``max_new_tokens`` (None: the bundle's limit), for a
        :class:`~.decoding.arrivals.Work` of its own; InputError if the bundle cannot honour it."""
        return self.generator._limits(max_new_tokens)

    def beam_rules(self, options: DecodeOptions) -> BeamRules | None:
        """The beam rules a source decoded with resolved ``options`` carries (``Work.beams``), for
        a loop made for ``options.loop_options``; None without beam search."""
        return options.rules(self.generator.option_limits)

    def rows(self, work: Arrivals, options: DecodeOptions | Mode | str | None = None, batch_size: int = 16,
             linger: float = 0.0, on_call: Callable[[int], None] | None = None) -> Iterator[Finished]:
        """The batched decode loop over ``work`` (which may keep growing until it is closed):
        yields each row as it finishes; :meth:`result` turns it into a GenerationResult. A server
        runs one per decoding configuration in a thread of its own, with a queue it never
        closes; ``batch_size`` counts rows, and a beam search's source takes ``num_beams`` of
        them. ``linger``: seconds an idle loop waits to gather a batch after the first
        source. ``on_call(rows)``: called before each verifier call with its number of rows."""
        generator = self.generator
        strategy = generator._strategy(generator.resolve_options(options))
        batch_size = positive_integer("batch_size", batch_size)
        if strategy.rows_per_text > batch_size:
            raise InputError(f"num_beams {strategy.rows_per_text} takes more rows than the {batch_size} of this "
                             "decode loop; lower num_beams or raise the batch size.")
        # an open queue: the batch is made for all batch_size rows when the first source comes
        check_rows(batch_size, generator._row_bytes(strategy), "batch_size", batch_size)
        if on_call is not None:
            strategy = strategy._replace(drafts=_Counted(strategy.drafts, on_call))
        return generator._decode(work, generator._limits(None), strategy, batch_size, linger)

    def check_batch_size(self, batch_size: int, name: str = "batch_size") -> int:
        """``batch_size`` (rows, as :meth:`rows` takes it) as an int, or InputError naming ``name``:
        not a positive integer, or more rows than this machine's memory holds the buffers of for
        the costliest mode the bundle decodes (``decoding/cache.check_rows``). What :meth:`rows`
        would refuse at a loop's first request, for a server to refuse before it listens."""
        batch_size = positive_integer(name, batch_size)
        check_rows(batch_size, self.generator._row_bytes(), name, batch_size)
        return batch_size

    def result(self, done: Finished, source: str | None = None) -> GenerationResult:
        """A finished row as a GenerationResult (``source``: its text, to restore <unk>); its
        ``stats.batch_size`` is the most rows a call that decoded it served, read from the row."""
        return self.generator._result(done, source)


class _Counted:
    """A draft source that reports each verifier call's number of rows (a server's batch-size metric)."""

    def __init__(self, inner: DraftSource, on_call: Callable[[int], None]) -> None:
        self.inner = inner
        self.on_call = on_call

    @property
    def seconds(self) -> float:
        return self.inner.seconds

    @property
    def memory(self):
        return self.inner.memory

    def start(self, row) -> None:
        self.inner.start(row)

    def propose(self, batch, rows, rooms):
        self.on_call(len(rows))
        return self.inner.propose(batch, rows, rooms)

    def observe(self, row, drafted: int, accepted: int, appended: int) -> None:
        self.inner.observe(row, drafted, accepted, appended)
