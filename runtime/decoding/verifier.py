"""The encoder + verifier pair as the decoding loop drives it.

:class:`Verifier` holds the two sessions and makes a :class:`Batch` per ``generate`` call.
A batch owns its buffers (``cache.py``), its IO binding and each row's cache length:
``admit`` encodes sources into free slots, ``verify`` scores a block of tokens after every
row's cache, ``keep`` says how many of them each row keeps, ``remove`` frees a finished
row's slot. Rejected positions are never copied anywhere: the next call's ``past_lengths``
makes the graph overwrite them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import numpy as np

from ..bundle_probe import check_ids
from ..bundle_schema import ACTIVATION_DTYPES
from ..errors import BundleError
from ..manifest import Manifest
from ..session import Session
from ..graph_specs import (HEAD_POSITIONS, LOGITS_OUTPUT, argmax_head, takes_head_positions, takes_output_rows,
                           takes_union_inputs)
from .cache import SlotBuffers, cross_names, self_cache_names, self_cache_out_names, source_axis
from .fixed_calls import FixedCall, FixedCalls
from .shortlist import Shortlist, union_feeds

# cache positions beyond max_target_len: a row's decoder prefix is at most two tokens, so a
# batch's padded block never writes past the allocation (see Batch.block_limit)
SLACK = 2


# An encoder call's fixed cost in padded source tokens, per device. Measured on the reference
# model, CPU, 1 thread: ~0.4 ms a call against ~0.08 ms a token, at any batch size (the encoder
# is compute bound there, so batching saves little and padding is pure waste). On a GPU a call's
# launch costs far more than padding: one call, unless the padding runs to thousands of tokens.
ENCODER_CALL_TOKENS = {"cpu": 6, "cuda": 2048}  # by the session's device (a TensorRT engine's is "cuda")

# How many batch shapes (slots, graph, binding, whether rows keep an encoder output) keep a
# finished batch's buffers for the next (Verifier.take_buffers): the last ones used.
SPARE_SHAPES = 4

# The most slots a batch may have and still keep each row's gathered shortlist matrix
# (graph_specs.takes_output_rows; Tuning.kept_matrix_slots); a wider batch feeds an empty
# output_rows and the verifier gathers every call, as before. Kept, a row's matrix (about 1 MB
# for Bergamot's lists) is read from memory by every call's product; gathered, its rows come
# from the output matrix's rows that most lists share (cached) and are multiplied while in the
# cache: the gather pays while the kept matrices of the batch stay in the cache. Measured on
# Bergamot en-pt, CPU, 1 thread, greedy, 1,024 verses, time kept over gathered
# (benchmarks/results/marian-kept-rows-cpu): 0.91-0.92 at batch 1, 0.935 at 4, 0.99 at 8,
# 0.94-1.07 at 16, 1.02-1.07 at 32, 1.00-1.08 at 64.
KEPT_MATRIX_SLOTS = 4


def padded_lists(allowed: list[np.ndarray], width: int = 0, fill: int = -1) -> np.ndarray:
    """Rows' shortlists (or their columns in a union) as one [rows, L] array, ``fill`` padded; L
    is the longest list, or ``width`` where that is wider (the rows' kept matrices)."""
    out = np.full((len(allowed), max(width, max(len(ids) for ids in allowed))), fill, dtype=np.int64)
    for row, ids in enumerate(allowed):
        out[row, : len(ids)] = ids
    return out


def padded_sources(sources: list[list[int]], pad_id: int, width: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Encoder inputs for ``sources``: their ids [rows, W] pad_id padded and the attention mask,
    W the longest source, or ``width`` where that is wider."""
    width = max(width, max(len(ids) for ids in sources))
    input_ids = np.full((len(sources), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(sources), width), dtype=np.int64)
    for row, ids in enumerate(sources):
        input_ids[row, : len(ids)] = ids
        mask[row, : len(ids)] = 1
    return input_ids, mask


def stacked_rows(parts: list[np.ndarray], axis: int, width: int) -> np.ndarray:
    """One-row arrays ``parts`` [1, ...], each as long as its own source along ``axis``, as one
    [len(parts), ...] array zero padded there to ``width``: what one encoder call of all their
    sources would give (its padded positions are masked wherever they are read)."""
    shape = list(parts[0].shape)
    shape[0], shape[axis] = len(parts), width
    out = np.zeros(shape, dtype=parts[0].dtype)
    for row, part in enumerate(parts):
        np.moveaxis(out[row], axis - 1, 0)[: part.shape[axis]] = np.moveaxis(part[0], axis - 1, 0)
    return out


def length_groups(lengths: list[int], call_tokens: int) -> list[range]:
    """Split ``lengths`` into consecutive runs, one encoder call each, at the least cost.

    A run's cost is ``call_tokens`` plus its size times its longest length (every source is
    padded to it); the split minimizing the sum is found exactly (O(n^2), n is at most a
    batch). Sorted lengths give the best runs; any order is correct.
    """
    n = len(lengths)
    best = [0.0] + [math.inf] * n  # best[i]: least cost of lengths[:i]
    start = [0] * (n + 1)  # start[i]: where the last run of that split begins
    for end in range(1, n + 1):
        longest = 0
        for begin in range(end - 1, -1, -1):
            longest = max(longest, lengths[begin])
            cost = best[begin] + call_tokens + (end - begin) * longest
            if cost < best[end]:
                best[end], start[end] = cost, begin
    groups, end = [], n
    while end > 0:
        groups.append(range(start[end], end))
        end = start[end]
    return groups[::-1]


class Batch:
    def __init__(self, verifier: Verifier, slots: int, bound: bool,
                 memory: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None, top_k: bool = True,
                 static_width: int | None = None, buffers: SlotBuffers | None = None) -> None:
        """``memory``: what a draft source reads of each row's encoder output, kept per row
        (:attr:`SlotBuffers.hidden`) and computed once, when the row is encoded; None: nothing.
        ``top_k``: its calls return the top-K candidates with their log-probs; False: only each
        position's best id is read, and the bundle's argmax graph runs when it has one.
        ``static_width``: :class:`StaticBatch`'s (its caches hold that many positions more).
        ``buffers``: made before (a pooled :class:`~.fixed_calls.FixedCall`'s); None: new ones."""
        m = verifier.manifest
        self._verifier = verifier
        self._memory = memory
        # the graph its calls run: both take the same inputs and write the same cache
        self._session = verifier.session_for(top_k)
        self._candidates = verifier.candidates_of(self._session)
        # the argmax graph's logits, whose argmax is taken here (graph_specs.ARGMAX_HEADS)
        self._logits = self._candidates == (LOGITS_OUTPUT,)
        # ... of the block positions it is told alone (graph_specs.HEAD_POSITIONS): each row's own
        # block, not the padding after it (decision 050)
        self._gathers = self._logits and verifier.takes_head_positions
        self._positions: np.ndarray | None = None  # the positions last bound, kept alive with the binding
        self._tail = verifier.candidate_tail(self._session)  # the candidates' dims after [rows, width]
        self._spare_key: tuple | None = None  # where close() gives the buffers back (Verifier.take_buffers)
        if buffers is not None:
            self.buffers = buffers
        elif static_width is None:
            self.buffers, self._spare_key = verifier.take_buffers(self._session, slots, bound, memory is not None)
        else:
            self.buffers = verifier.slot_buffers(self._session, slots, bound, memory is not None, static_width)
        self.lengths = np.zeros(slots, dtype=np.int64)  # valid cached positions per slot
        self._binding = self._session.binding() if bound else None
        self._layout = -1  # the buffers' layout the binding was made for
        self._mask = np.zeros((0, 0), dtype=np.int64)
        # a call's token ids (see block()), written in place: on the CPU, while the rows and the
        # block width stay (a greedy step after a greedy step), the binding made for them holds
        self._ids = np.zeros(slots * self.buffers.max_target, dtype=np.int64)
        # every position of a call: a prefix of it (a batch whose graph takes HEAD_POSITIONS)
        self._every = np.arange(self._ids.size if self._gathers else 0, dtype=np.int64)
        self._all = self._every[:0]  # the prefix the last call of every position took
        self._block: np.ndarray | None = None  # the view block() last handed out
        self._bound_width = 0  # the block width the ids, lengths and candidates are bound for
        self._names = (self_cache_names(m.decoder_layers, m.cache_kind), self_cache_out_names(m.decoder_layers, m.cache_kind),
                       cross_names(m.decoder_layers))
        self.encoder_seconds = 0.0
        self.verifier_seconds = 0.0
        self.last_call: tuple[int, float, int] | None = None
        # a bundle with a shortlist: each slot's allowed output ids (None: every id), and the
        # -1 padded [rows, L] array of them fed as output_ids, remade when the rows change
        self._allowed: list[np.ndarray | None] = [None] * slots
        self._output_ids: np.ndarray | None = None
        self._output_layout = -1
        # an int8 shortlist head's union inputs (graph_specs.UNION_INPUTS) for those output_ids:
        # the union is made again only when rows join (a superset of the rows' lists serves as
        # well: integer sums are exact), each slot's columns in it kept and laid out as the rows are
        self._union: dict[str, np.ndarray] = {}
        self._union_ids: np.ndarray | None = None
        self._columns: list[np.ndarray | None] = [None] * slots
        self._rows_fed: np.ndarray | None = None  # the output_rows bound, kept alive with the binding
        self._no_rows = np.zeros((1, 0, self.buffers.d_model), self.buffers.dtype)  # "gather them yourself"

    @property
    def rows(self) -> int:
        return self.buffers.rows

    @property
    def slots(self) -> int:
        return self.buffers.slots

    def admit(self, sources: list[list[int]], pad_id: int, copies: int = 1) -> range:
        """Encode ``sources`` into the next free slots, in order, ``copies`` consecutive rows
        each (a beam search's hypotheses: encoded once, the rows replicated); returns their slots.

        One encoder call per run of similar lengths (:func:`length_groups`): a call pads every
        source to its longest, and encoder time grows with padded tokens, so one long source
        in a call of short ones would multiply its cost (a server admits texts in arrival order).
        An encoder that couples the rows of a call (an int8 bundle's per-call quantization) gets
        one source per call.
        """
        first = self.rows
        per_call = self._verifier.manifest.encodes_one_source_per_call
        shortlist = self._verifier.shortlist
        # per sentence, never the union over the batch
        allowed = [shortlist.for_source(ids) for ids in sources] if shortlist is not None else None
        if allowed is not None and self.buffers.keeps_matrices:  # one resize for the whole admission
            self.buffers.reserve_matrices(max(map(len, allowed)))
        if per_call and allowed is None and len(sources) > 1:
            self._encode_each(sources, pad_id, copies)
        else:
            groups = ([range(i, i + 1) for i in range(len(sources))] if per_call
                      else length_groups([len(ids) for ids in sources], self._verifier.encoder_call_tokens))
            for group in groups:
                self._encode([sources[i] for i in group], pad_id, copies,
                             [allowed[i] for i in group] if allowed is not None else None)
        if allowed is not None:
            for slot in range(first, self.rows):
                self._allowed[slot] = allowed[(slot - first) // copies]
            self._union_ids = None  # the rows that joined may list ids the union lacks
        return range(first, self.rows)

    def output_ids(self) -> np.ndarray:
        """The verifier's ``output_ids`` for the current rows (bundles with a shortlist)."""
        if self._output_layout != self.buffers.layout or self._output_ids is None:
            if self._verifier.shortlist is None:  # the whole vocabulary, one row for every row
                self._output_ids = np.arange(self._verifier.manifest.vocab_size, dtype=np.int64)[None]
            else:  # as wide as the rows' kept matrices, if they are kept
                allowed = self._allowed[: self.rows]
                self._output_ids = padded_lists(allowed, self.buffers.matrix_len if self.buffers.keeps_matrices else 0)
            if self._verifier.takes_union_inputs:
                self._union = self._union_inputs(self._output_ids)
            self._output_layout = self.buffers.layout
        return self._output_ids

    def _union_inputs(self, output_ids: np.ndarray) -> dict[str, np.ndarray]:
        """The union inputs for ``output_ids``, the current rows' lists (decoding/shortlist.py
        ``union_feeds``). One row of ids (one row, or every id for all) is its own union; with
        more, the union is made again only after rows joined, each slot's columns kept, and a
        padding position's column is 0 (any column serves: its logit is -inf whatever its sum)."""
        vocab = self._verifier.manifest.vocab_size
        if output_ids.shape[0] == 1:
            return union_feeds(output_ids, vocab)
        rows = self.rows
        if self._union_ids is None:
            fed = union_feeds(output_ids, vocab)
            self._union_ids = fed["union_ids"]
            self._columns[:rows] = [fed["union_columns"][slot, : len(self._allowed[slot])] for slot in range(rows)]
        return {"union_ids": self._union_ids,
                "union_columns": padded_lists(self._columns[:rows], output_ids.shape[1], fill=0)}

    def output_rows(self) -> np.ndarray:
        """The verifier's ``output_rows`` (a verifier that takes them): each row's gathered
        output matrix as kept since its admission, or an empty one over the whole vocabulary
        (the graph then gathers every id's row itself)."""
        return self.buffers.matrices() if self.buffers.keeps_matrices else self._no_rows

    def _encode(self, sources: list[list[int]], pad_id: int, copies: int = 1,
                allowed: list[np.ndarray] | None = None) -> None:
        """``allowed``: each source's shortlist, when the rows keep their gathered output matrix
        (the encoder gathers it: graph_specs.takes_output_rows)."""
        input_ids, mask = padded_sources(sources, pad_id)
        feeds = {"input_ids": input_ids, "attention_mask": mask}
        matrix_lens = None
        if self.buffers.keeps_matrices and allowed is not None:
            matrix_lens = np.array([len(ids) for ids in allowed], dtype=np.int64)
            feeds["output_ids"] = padded_lists(allowed)
        started = time.perf_counter()
        out = self._verifier.encoder.run(feeds)
        # a draft source's per-source work (drafter_source) counts as encoding: once per row
        hidden = self._memory(out["encoder_hidden_states"], mask) if self._memory is not None else None
        self.encoder_seconds += time.perf_counter() - started
        layers = self._verifier.manifest.decoder_layers
        cross = [out[name] for name in cross_names(layers)]
        matrices = out["output_rows"] if matrix_lens is not None else None
        self._add_encoded(cross, mask, hidden, copies, matrices, matrix_lens)

    def _add_encoded(self, cross: list[np.ndarray], mask: np.ndarray, hidden: np.ndarray | None, copies: int,
                     matrices: np.ndarray | None = None, matrix_lens: np.ndarray | None = None) -> None:
        """Encoded sources into the next free slots, ``copies`` consecutive rows each, with no
        cached position yet."""
        if copies > 1:
            cross = [np.repeat(values, copies, axis=0) for values in cross]
            mask = np.repeat(mask, copies, axis=0)
            hidden = None if hidden is None else np.repeat(hidden, copies, axis=0)
            if matrices is not None and matrix_lens is not None:
                matrices, matrix_lens = np.repeat(matrices, copies, axis=0), np.repeat(matrix_lens, copies)
        slots = self.buffers.add_rows(cross, mask, hidden, matrices, matrix_lens)
        self.lengths[slots.start : slots.stop] = 0

    def _encode_each(self, sources: list[list[int]], pad_id: int, copies: int = 1) -> None:
        """One encoder call per source (an encoder that couples a call's rows), the rows then
        written into the buffers together, zero padded to the longest source as one call of
        them all would give them. Row by row, each admission's host work (every cross buffer
        re-viewed, the binding's layout changed, the source span grown as longer sources come:
        ``generate`` admits them shortest first) cost about a tenth of an int8 IAD batch of 32's
        time outside its graphs; the values written are the same."""
        names = cross_names(self._verifier.manifest.decoder_layers)
        crosses, hiddens = [], []
        for ids in sources:
            feeds = {"input_ids": np.array([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
            started = time.perf_counter()
            out = self._verifier.encoder.run(feeds)
            if self._memory is not None:
                hiddens.append(self._memory(out["encoder_hidden_states"], feeds["attention_mask"]))
            self.encoder_seconds += time.perf_counter() - started
            crosses.append([out[name] for name in names])
        _, mask = padded_sources(sources, 0)
        width, layout = mask.shape[1], self._verifier.manifest.cross_key_layout
        cross = [stacked_rows(list(parts), source_axis(name.startswith("cross_key"), layout), width)
                 for name, parts in zip(names, zip(*crosses))]
        hidden = stacked_rows(hiddens, 1, width) if hiddens else None
        self._add_encoded(cross, mask, hidden, copies)

    def block_limit(self) -> int:
        """The longest block the next call may take: every row's padded block must fit."""
        return self.buffers.max_target - int(self.lengths[: self.rows].max(initial=0))

    def block(self, width: int, pad_id: int) -> np.ndarray:
        """A [rows, width] array of ``pad_id`` to write the next call's tokens into: :meth:`verify`
        reads it where it is (no copy, and on the CPU no new binding while the width stays). The
        next ``block`` overwrites it."""
        if self.rows * width > self._ids.size:  # too wide for any cache: verify says so
            return np.full((self.rows, width), pad_id, dtype=np.int64)
        self._block = self._ids[: self.rows * width].reshape(self.rows, width)
        self._block.fill(pad_id)
        return self._block

    def verify(self, tokens: np.ndarray, widths: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-K (log-probs, ids) for the position after each of ``tokens`` ([rows, T]), best
        first, [rows, T, K] each; from the argmax graph (``top_k=False``) the best id alone,
        [rows, T, 1], and no log-probs ([rows, T, 0]). Reads ``tokens`` where they are when
        written into :meth:`block`'s array; any other array is copied there. ``widths``: each
        row's block, the positions the caller reads (the rest are padding); where the argmax
        graph takes HEAD_POSITIONS only those are computed, and the ids after a row's width are
        0. None: every position."""
        rows, new = tokens.shape
        assert rows == self.rows, f"{rows} blocks for {self.rows} rows"
        lengths = self.lengths[:rows]  # a prefix of a 1-D array: contiguous, and kept current by keep()
        self.buffers.ensure_capacity(int(lengths.max(initial=0)) + new)
        if self._binding is not None and tokens is not self._block:
            ids = self._ids[: rows * new].reshape(rows, new)
            np.copyto(ids, tokens)
            tokens = ids
        started = time.perf_counter()
        top_logprobs, top_ids = self._run(tokens, lengths, widths)
        # (positions per row, seconds, rows): the cost model's data (sizing.CallCost.observe)
        self.last_call = (new, time.perf_counter() - started, rows)
        self.verifier_seconds += self.last_call[1]
        return top_logprobs, top_ids

    def _run(self, tokens: np.ndarray, lengths: np.ndarray,
             widths: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One verifier call over the buffers' rows: ``tokens`` [rows, T] after ``lengths`` [rows]
        cached positions; both contiguous arrays that live until the next call (bound by pointer
        on the CPU). Returns (top log-probs, top ids) as :meth:`verify` does."""
        rows, new = tokens.shape
        names = self._names
        session = self._session
        positions = self._head_positions(rows, new, widths) if self._gathers else None
        if self._binding is None:
            feeds = {"input_ids": tokens, "past_lengths": np.ascontiguousarray(lengths),
                     "encoder_attention_mask": self.buffers.source_mask(), **self.buffers.feeds(names[0], names[2])}
            if self._verifier.takes_output_ids:
                feeds["output_ids"] = self.output_ids()
                feeds.update(self._union)  # made with them: empty unless the verifier takes them
            if self._verifier.takes_output_rows:
                feeds["output_rows"] = self.output_rows()
            if positions is not None:
                feeds[HEAD_POSITIONS] = positions
            out = session.run(feeds)
            self.buffers.store([out[name] for name in names[1]])
            candidates = [out[name] for name in self._candidates]
        else:
            binding = self._binding
            ids = tokens
            relaid = self._layout != self.buffers.layout
            reshaped = relaid or self._bound_width != new or session.device != "cpu"
            # the positions asked for: a ragged call's, or every one of a new shape (decision 050)
            asked = positions is not None and positions is not self._positions
            if reshaped or asked:
                # Outputs come back in the order they were first bound: the candidates, then the
                # buffers (bound below on a batch's first call). A binding left in place would
                # keep last call's shape for the candidates, which follow the rows, the width
                # and the positions asked for.
                for name in self._candidates:
                    binding.bind_output(name, "cpu")
            if asked:
                self._positions = positions  # held here: the binding keeps only a pointer
                binding.bind_cpu_input(HEAD_POSITIONS, positions)
            if reshaped:
                # On the CPU the ids and lengths are read from these arrays at each run (bound by
                # pointer, rewritten in place), so they are bound again only when the rows or the
                # width change. For a device, onnxruntime copies a bound host input at bind time
                # (IOBinding::BindInput), so there they are bound every call.
                binding.bind_cpu_input("input_ids", ids)
                binding.bind_cpu_input("past_lengths", lengths)
                self._bound_width = new
            if relaid:  # the buffers and the mask: only when the batch's layout changed
                self._mask = self.buffers.source_mask()  # held here: the binding keeps only a pointer
                binding.bind_cpu_input("encoder_attention_mask", self._mask)
                if self._verifier.takes_output_ids:  # held by self._output_ids until the rows change
                    binding.bind_cpu_input("output_ids", self.output_ids())
                    for name, value in self._union.items():  # held by self._union alike
                        binding.bind_cpu_input(name, value)
                if self._verifier.takes_output_rows:  # held by the buffers (or here) until the rows change
                    self._rows_fed = self.output_rows()
                    binding.bind_cpu_input("output_rows", self._rows_fed)
                self.buffers.bind(binding, *names)
                self._layout = self.buffers.layout
            outputs = session.run_bound(binding)
            # copies: with the binding kept, the next run writes into the same output memory; but
            # the logits are read once, by the argmax below, before any next run
            candidates = [outputs[index].numpy() if self._logits else outputs[index].numpy().copy()
                          for index in range(len(self._candidates))]
            # the candidates are bound without a shape, so nothing else checks what the graph
            # computed (an unbound call's outputs are checked by its session: OrtSession.run)
            expected = (rows, new, *self._tail) if positions is None else (1, len(positions), *self._tail)
            if any(value.shape != expected for value in candidates):
                raise BundleError(f"the verifier computed candidates of shapes "
                                  f"{' and '.join(str(list(value.shape)) for value in candidates)} for {rows} row(s) of "
                                  f"{new} token(s), where its declared IO implies {list(expected)}; the bundle's graph "
                                  "does not compute what its manifest says.")
        return self._top(candidates, rows, new, positions)

    def _head_positions(self, rows: int, new: int, widths: list[int] | None) -> np.ndarray:
        """The block positions a call of the argmax graph returns the logits of (``verify``'s
        ``widths``): every one, as a view of one array while the call's shape stays (so the
        binding made for it holds), or each row's first ``widths[row]``."""
        if widths is None or min(widths) >= new:
            if len(self._all) != rows * new:
                self._all = self._every[: rows * new]
            return self._all
        ragged = self._every[:new] < np.array(widths, dtype=np.int64)[:, None]  # [rows, new]
        return np.flatnonzero(ragged)

    def _top(self, candidates: list[np.ndarray], rows: int, new: int,
             positions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(top log-probs, top ids) from a call's candidates (:meth:`verify`'s shapes);
        ``positions``: the block positions the logits are of (:meth:`_head_positions`)."""
        if len(candidates) == 2:
            top_logprobs, top_ids = candidates
        else:  # the argmax graph: the best id (or the logits it is the argmax of), its only candidate
            best = candidates[0].argmax(-1) if self._logits else candidates[0]
            if positions is not None:  # [1, N], the positions asked for
                best = best[0]
                if len(positions) < rows * new:  # each row's block: 0 past it
                    placed = np.zeros(rows * new, dtype=np.int64)
                    placed[positions] = best
                    best = placed
                best = best.reshape(rows, new)
            top_ids = best[..., None]
            top_logprobs = np.zeros((rows, new, 0), dtype=np.float32)
        # they become the output; an argmax over the logits' vocabulary-wide last axis (its shape
        # checked after every call) is in range by construction
        if not self._logits:
            check_ids(top_ids, self._verifier.manifest.vocab_size, "the verifier")
        return top_logprobs, top_ids

    def close(self) -> None:
        """The decode that made this batch is done with it: its host buffers go back to the
        verifier for the next batch of its shape (a pooled static batch gives its call back)."""
        if self._spare_key is not None:
            self._verifier.give_buffers(self._spare_key, self.buffers)
            self._spare_key = None

    def keep(self, counts: np.ndarray) -> None:
        """Each row keeps the first ``counts[row]`` tokens of the block just verified."""
        self.lengths[: self.rows] += counts

    def copy_rows(self, sources: list[int], targets: list[int]) -> None:
        """Row ``targets[i]`` continues from row ``sources[i]``'s cache (a beam search's
        reordering; rows of one source, so only the decoder's own cache differs)."""
        self.buffers.copy_rows(sources, targets)
        self.lengths[targets] = self.lengths[sources]

    def remove(self, slot: int) -> int | None:
        """Free ``slot``; the last row moves into it. Returns the slot that moved, if one did."""
        moved = self.buffers.remove_row(slot)
        if moved is not None:
            self.lengths[slot] = self.lengths[moved]
            self._allowed[slot] = self._allowed[moved]
            self._columns[slot] = self._columns[moved]
        return moved

    def shrink(self, width: int | None = None) -> None:
        """Spans down to what the rows need, with room for one more block ``width`` wide (None:
        as wide as the last call). After rows left (once per step, however many left in it), and
        where a batch's drafted blocks stop for a while (a cache sized for them makes every
        plain step attend over the extra span: ``gad.DrafterDraft``)."""
        if width is None:
            width = self.last_call[0] if self.last_call is not None else 1
        self.buffers.shrink(int(self.lengths[: self.rows].max(initial=0)) + width)

    def drafter_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows' kept encoder output and source mask, in row order (a drafter's inputs)."""
        return self.buffers.hidden(), self.buffers.source_mask()


class StaticBatch(Batch):
    """A batch whose every call has one shape, whatever its rows do (``Generator(static_shapes=True)``).

    A GPU library picks its kernels by shape, and two kernels may sum a row in different
    orders: with shapes that follow the rows, a position's log-probs depend on the block it is
    verified in and on the rows beside it (measured on an H100: benchmarks/results/gpu-check-*),
    so a drafting mode may part from greedy where two candidates are close. Here every call is
    [slots, width] tokens over caches of the whole allocation (``capacity`` self-attention
    positions, ``max_source_len`` source positions); every source is encoded alone, at the
    source allocation's width. A row's result is then a function of its own tokens only.

    The loop sees the same interface as :class:`Batch`: rows 0..n-1 in its own order (its
    ``rows`` list; ``lengths`` follow them). Behind it each row has a fixed slot
    (``_slot_of``): a finished row frees its slot without any cache being moved (the loop's
    last row takes its index, not its slot), and a new row takes any free slot. A slot with
    no row is a padding row: pad ids after 0 cached positions; its outputs are ignored and
    its cache writes land where the next row that takes the slot writes before reading.
    Pads after a row's own block are causal and past its length: they change nothing before
    them and are overwritten before they are read.
    """

    def __init__(self, verifier: Verifier, slots: int, bound: bool, width: int,
                 memory: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None, top_k: bool = True) -> None:
        """With ``verifier.fixed_calls`` (and ``bound``), every call runs through one
        :class:`~.fixed_calls.FixedCall` taken from that pool (every input and output bound once,
        at fixed addresses: CUDA graphs), given back by :meth:`close`."""
        self.width = width
        self._pool = verifier.fixed_calls if bound else None
        self._call: FixedCall | None = None
        if self._pool is not None:
            session = verifier.session_for(top_k)
            self._pool_key = self._pool.key(session, slots, width, memory is not None)
            self._call = self._pool.take(self._pool_key, lambda graph_id: FixedCall(
                session, verifier.slot_buffers(session, slots, bound, memory is not None, width), width,
                verifier.candidates_of(session), verifier.candidate_tail(session),
                (self_cache_names(verifier.manifest.decoder_layers, verifier.manifest.cache_kind),
                 self_cache_out_names(verifier.manifest.decoder_layers, verifier.manifest.cache_kind),
                 cross_names(verifier.manifest.decoder_layers)), graph_id, verifier.encoder))
            # a call used before: its slots start as new ones do (padding rows over one source
            # position); the caches keep the last rows' finite data, as a slot a row left does
            self._call.buffers.mask.fill(0)
            self._call.buffers.mask[:, 0] = 1
        super().__init__(verifier, slots, bound, memory, top_k, static_width=width,
                         buffers=self._call.buffers if self._call is not None else None)
        self._live = 0
        self._slot_of = np.zeros(slots, dtype=np.int64)  # row index -> its slot
        self._free = list(range(slots - 1, -1, -1))  # a stack: the lowest free slot is taken first
        self._tokens = np.zeros((slots, width), dtype=np.int64)  # the call's ids, every slot
        self._past = np.zeros(slots, dtype=np.int64)  # the call's past_lengths, every slot

    @property
    def rows(self) -> int:
        return self._live

    def admit(self, sources: list[list[int]], pad_id: int, copies: int = 1) -> range:
        """Encode each source alone at the source allocation's width into ``copies`` free
        slots; the new rows are the last ``len(sources) * copies`` in row order."""
        first = self._live
        names = cross_names(self._verifier.manifest.decoder_layers)
        width = self.buffers.max_source
        all_ids, masks = padded_sources(sources, pad_id, width)
        crosses: list[list[np.ndarray]] = []
        hiddens: list[np.ndarray] = []
        slots = [self._free.pop() for _ in range(len(sources) * copies)]
        # a fixed call's encoder (CUDA graphs): its outputs stay on the device, copied into the
        # slots after each source; otherwise they come to the host, written once for the admission
        encoder = self._call.encoder if self._call is not None else None
        for index in range(len(sources)):
            input_ids, mask = all_ids[index : index + 1], masks[index : index + 1]
            started = time.perf_counter()
            if encoder is not None:
                assert self._pool is not None  # a fixed call comes from the pool
                encoder.run(input_ids, mask, self._pool.refuse)
                self.buffers.write_cross(slots[index * copies : (index + 1) * copies], encoder.cross)
                hidden = encoder.hidden.numpy() if encoder.hidden is not None else None
            else:
                out = self._verifier.encoder.run({"input_ids": input_ids, "attention_mask": mask})
                crosses.append([out[name] for name in names])
                hidden = out["encoder_hidden_states"]
            if self._memory is not None:
                hiddens.append(self._memory(hidden, mask))
            self.encoder_seconds += time.perf_counter() - started
        # one write for the whole admission: on CUDA one batch of uploads (device_edits.py)
        cross = [np.repeat(np.concatenate(parts), copies, axis=0) for parts in zip(*crosses)] if crosses else None
        self.buffers.write_rows(slots, cross, np.repeat(masks, copies, axis=0),
                                np.repeat(np.concatenate(hiddens), copies, axis=0) if hiddens else None)
        self._slot_of[first : first + len(slots)] = slots
        self.lengths[first : first + len(slots)] = 0
        self._live += len(slots)
        self.buffers.layout += 1  # the source mask changed: a device binding copies it again
        if self._call is not None:
            self._call.source_mask_changed()
        return range(first, self._live)

    def block_limit(self) -> int:
        return min(self.width, self.buffers.max_target - int(self.lengths[: self._live].max(initial=0)))

    def verify(self, tokens: np.ndarray, widths: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`Batch.verify`; the call itself is at the batch's one shape, every position
        of it computed (``widths`` is not read)."""
        rows, new = tokens.shape
        assert rows == self._live, f"{rows} blocks for {self._live} rows"
        if new > self.width:
            raise ValueError(f"a block of {new} tokens is wider than the static width {self.width}")
        slots = self._slot_of[:rows]
        self._tokens.fill(self._verifier.manifest.pad_token_id)
        self._tokens[slots, :new] = tokens
        self._past.fill(0)
        self._past[slots] = self.lengths[:rows]
        started = time.perf_counter()
        if self._call is not None and self._pool is not None:
            top_logprobs, top_ids = self._top(self._call.run(self._tokens, self._past, self._pool.refuse),
                                              self.slots, self.width, self._call.head_positions)
        else:
            top_logprobs, top_ids = self._run(self._tokens, self._past)
        # the rows' own width: in this batch a call costs the same at any, which is what the
        # draft sizing should learn (the width is paid anyway)
        self.last_call = (new, time.perf_counter() - started, rows)
        self.verifier_seconds += self.last_call[1]
        return top_logprobs[slots, :new], top_ids[slots, :new]

    def copy_rows(self, sources: list[int], targets: list[int]) -> None:
        self.buffers.copy_rows(self._slot_of[sources].tolist(), self._slot_of[targets].tolist())
        self.lengths[targets] = self.lengths[sources]

    def remove(self, slot: int) -> int | None:
        """Free row ``slot``'s slot (no cache moves); the last row takes its index."""
        last = self._live - 1
        self._free.append(int(self._slot_of[slot]))
        if slot != last:
            self._slot_of[slot] = self._slot_of[last]
            self.lengths[slot] = self.lengths[last]
        self._live = last
        return last if slot != last else None

    def shrink(self, width: int | None = None) -> None:
        pass  # one shape: nothing is given back

    def close(self) -> None:
        if self._call is not None and self._pool is not None:
            self._pool.give(self._pool_key, self._call)
            self._call = None

    def drafter_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        slots = self._slot_of[: self._live]
        return self.buffers.hidden()[slots], self.buffers.mask[slots]


class Verifier:
    def __init__(self, encoder: Session, verifier: Session, manifest: Manifest,
                 encoder_call_tokens: int | None = None, shortlist: Shortlist | None = None,
                 argmax: Session | None = None, kept_matrix_slots: int = KEPT_MATRIX_SLOTS,
                 fixed_calls: FixedCalls | None = None) -> None:
        """``encoder_call_tokens``: padded tokens per encoder call (:func:`length_groups`;
        default: :data:`ENCODER_CALL_TOKENS` for the encoder's device). ``shortlist``: each
        sentence's output ids (a bundle with a shortlist); None decodes over the whole vocabulary.
        ``argmax``: the bundle's argmax graph (graph_specs.VERIFIER_GRAPHS), which batches that
        read only each position's best id run; None: they run ``verifier`` too.
        ``kept_matrix_slots``: :data:`KEPT_MATRIX_SLOTS`. ``fixed_calls``: a bound
        :class:`StaticBatch` runs every call with all its inputs and outputs bound once, at fixed
        addresses, its buffers pooled here (decoding/fixed_calls.py: CUDA graphs); None: as
        before."""
        self.encoder = encoder
        self.verifier = verifier
        self.argmax = argmax
        self.manifest = manifest
        # what a call of the argmax graph is read for: its logits, or (an older bundle's) best ids
        self._argmax_candidates = (LOGITS_OUTPUT,) if argmax_head(manifest) == "logits" else ("top1_ids",)
        self.encoder_call_tokens = (ENCODER_CALL_TOKENS[encoder.device] if encoder_call_tokens is None
                                    else encoder_call_tokens)
        self.shortlist = shortlist
        self.takes_output_ids = manifest.shortlist is not None
        # each row's gathered output matrix, kept per slot from the encoder's call (a bundle
        # exported before it gathers in every verifier call, fed output_ids alone)
        self.takes_output_rows = takes_output_rows(manifest)
        self.takes_union_inputs = takes_union_inputs(manifest)
        # the argmax graph's logits of the positions it is told alone (graph_specs.HEAD_POSITIONS)
        self.takes_head_positions = takes_head_positions(manifest)
        self.kept_matrix_slots = kept_matrix_slots
        self.fixed_calls = fixed_calls
        self._spare: dict[tuple, list[SlotBuffers]] = {}  # take_buffers' finished batches' buffers, by shape
        self._spare_lock = threading.Lock()  # Generators are shared by threads

    def session_for(self, top_k: bool) -> Session:
        """The graph a batch's calls run: the top-K verifier, or (``top_k`` False) the argmax
        graph where the bundle has it; both take the same inputs and write the same cache."""
        return self.verifier if top_k or self.argmax is None else self.argmax

    def candidates_of(self, session: Session) -> tuple[str, ...]:
        """The outputs a call of ``session`` reads besides the cache."""
        if session is self.verifier:
            return ("top_logprobs", "top_ids")
        return self._argmax_candidates

    def candidate_tail(self, session: Session) -> tuple[int, ...]:
        """The dims of a call's candidates after [rows, width]: top-K, none (best ids) or the vocabulary (logits)."""
        names = self.candidates_of(session)
        if names == (LOGITS_OUTPUT,):
            return (self.manifest.vocab_size,)
        return (self.manifest.top_k,) if len(names) == 2 else ()

    def row_bytes(self, keep_hidden: bool, static_width: int | None = None) -> int:
        """The bytes a batch allocates per row when it is made (:meth:`batch`'s arguments): its
        buffers' slot (:meth:`SlotBuffers.slot_bytes`), and a call's token ids and positions
        (:class:`Batch`); what decides how many rows fit in memory (cache.check_rows)."""
        m = self.manifest
        capacity = m.max_target_len + SLACK + (static_width or 0)
        buffers = SlotBuffers.slot_bytes(m.decoder_layers, m.num_heads, m.head_dim, m.d_model, capacity,
                                         m.max_source_len, keep_hidden, ACTIVATION_DTYPES[m.precision], m.cache_kind)
        return buffers + 8 * (2 * capacity + 1 + (static_width or 0))

    def slot_buffers(self, session: Session, slots: int, bound: bool, keep_hidden: bool,
                     static_width: int | None) -> SlotBuffers:
        """A batch's buffers for ``session`` (:class:`Batch`'s arguments)."""
        m = self.manifest
        return SlotBuffers(m.decoder_layers, m.num_heads, m.head_dim, m.d_model, slots,
                           m.max_target_len + SLACK + (static_width or 0), m.max_source_len,
                           session.device, bound, keep_hidden, ACTIVATION_DTYPES[m.precision],
                           m.cache_kind, self.takes_output_rows and self.shortlist is not None
                           and slots <= self.kept_matrix_slots, m.cross_key_layout,
                           static=static_width is not None)

    def take_buffers(self, session: Session, slots: int, bound: bool,
                     keep_hidden: bool) -> tuple[SlotBuffers, tuple | None]:
        """A dynamic batch's buffers: those a finished batch of the same shape gave back, reset,
        or new ones; and the key to give them back under (None: not to be reused).

        ``generate`` makes a batch per call, and a caller that decodes batch after batch (the
        bench: a call per 32 sentences) paid for fresh arrays every time: their allocation,
        and the page faults of the first writes to each page as the caches grew. Kept, the
        pages stay mapped. Host buffers on the CPU only: device buffers are another matter
        (static batches pool theirs in ``fixed_calls``). The memory stays held after the call,
        as a server's cohorts already hold theirs: one set per shape in use at once, for the
        last :data:`SPARE_SHAPES` shapes."""
        key = (id(session), slots, bound, keep_hidden)
        if session.device == "cpu":
            with self._spare_lock:
                spares = self._spare.get(key)
                if spares:
                    buffers = spares.pop()
                    buffers.reset()
                    return buffers, key
        buffers = self.slot_buffers(session, slots, bound, keep_hidden, None)
        return buffers, (key if session.device == "cpu" and buffers.reusable else None)

    def give_buffers(self, key: tuple, buffers: SlotBuffers) -> None:
        """Keep a finished batch's buffers for :meth:`take_buffers`."""
        with self._spare_lock:
            spares = self._spare.pop(key, [])
            spares.append(buffers)
            self._spare[key] = spares  # most recent last
            while len(self._spare) > SPARE_SHAPES:
                del self._spare[next(iter(self._spare))]

    def batch(self, slots: int, bound: bool, memory: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
              top_k: bool = True, static_width: int | None = None) -> Batch:
        """``static_width``: a :class:`StaticBatch` whose every call is that many tokens a row."""
        if static_width is not None:
            return StaticBatch(self, slots, bound, static_width, memory, top_k)
        return Batch(self, slots, bound, memory, top_k)

    @property
    def seconds(self) -> dict[str, float]:
        argmax = self.argmax.seconds if self.argmax is not None else 0.0
        return {"encoder": self.encoder.seconds, "verifier": self.verifier.seconds + argmax}
