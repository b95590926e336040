"""Marian's lexical shortlist: each sentence's output vocabulary, built on the host.

A shortlist limits the output of one sentence to the ``first`` most frequent target ids plus,
for every distinct id of its source (EOS included), the target ids the lexical table lists for
it (Bergamot's: the 50 best), and, when ``shared``, the source ids themselves; then, as Marian
does, the set is padded to a multiple of 8 with the lowest unused ids from ``first`` on. The
verifier projects onto these rows of the output matrix only (export/marian/graphs.py), so a
step costs the shortlist's rows, not the vocabulary's.

It is built per sentence, never as the union over a batch (as Marian's batch translation
does): a sentence's output must not depend on what it is batched with. In the bundle the
table is ``shortlist.npz``: ``offsets`` (int64, source vocabulary + 1, the start of each source
id's targets) and ``targets`` (int32), checked on load like any bundle file.
"""

from __future__ import annotations

import io

import numpy as np

from ..errors import BundleError
from ..manifest import BundleFiles, Manifest
from ..npz import DAMAGED, npz_size_problem

PAD_MULTIPLE = 8


class Shortlist:
    def __init__(self, offsets: np.ndarray, targets: np.ndarray, first: int, shared: bool, vocab: int) -> None:
        self.offsets, self.targets = offsets, targets
        self.first, self.shared, self.vocab = first, shared, vocab

    @classmethod
    def load(cls, content: bytes, where: str, first: int, shared: bool, vocab: int) -> Shortlist:
        """The table in ``content`` (an .npz's bytes), ``where`` naming it in errors."""
        try:
            # a member's header is checked against what it holds before np.load allocates it (a
            # header claiming 4 TiB was a MemoryError; deflated zeros declaring gigabytes took them)
            problem = npz_size_problem(content)
            if problem is not None:
                raise BundleError(f"{where} is not a shortlist table: {problem}.")
            with np.load(io.BytesIO(content), allow_pickle=False) as archive:
                if sorted(archive.files) != ["offsets", "targets"]:
                    raise BundleError(f"{where} must hold exactly 'offsets' and 'targets', not {archive.files}.")
                offsets, targets = archive["offsets"], archive["targets"]
        except BundleError:
            raise
        except DAMAGED as exc:  # a damaged archive: BadZipFile, zlib.error and EOFError too, not only OSError
            raise BundleError(f"{where} is not a shortlist table ({type(exc).__name__}: {str(exc)[:200]}).") from None
        if offsets.dtype != np.int64 or offsets.ndim != 1 or offsets.size < 2 or targets.dtype != np.int32 \
                or targets.ndim != 1:
            raise BundleError(f"{where}: offsets must be 1-D int64 and targets 1-D int32.")
        if offsets[0] != 0 or offsets[-1] != targets.size or np.any(np.diff(offsets) < 0):
            raise BundleError(f"{where}: offsets do not partition the targets.")
        if targets.size and (targets.min() < 0 or targets.max() >= vocab):
            raise BundleError(f"{where}: a target id is outside the vocabulary of {vocab}.")
        if not 0 <= first <= vocab:
            raise BundleError(f"{where}: first {first} is outside the vocabulary of {vocab}.")
        return cls(offsets, targets, first, shared, vocab)

    def for_source(self, source_ids: list[int]) -> np.ndarray:
        """The sorted output ids (int64) allowed for one sentence of ``source_ids``."""
        allowed = np.zeros(self.vocab, dtype=bool)
        allowed[: self.first] = True
        sources = np.unique(np.asarray(source_ids, dtype=np.int64))
        sources = sources[(sources >= 0) & (sources < self.offsets.size - 1)]
        if self.shared:
            allowed[sources[sources < self.vocab]] = True
        for source in sources:
            allowed[self.targets[self.offsets[source] : self.offsets[source + 1]]] = True
        missing = -int(allowed.sum()) % PAD_MULTIPLE
        if missing:
            unused = np.flatnonzero(~allowed[self.first :])[:missing] + self.first
            allowed[unused] = True
        return np.flatnonzero(allowed).astype(np.int64)


def load_shortlist(files: BundleFiles, manifest: Manifest) -> Shortlist | None:
    """The bundle's shortlist, from the bytes ``files`` read and hash-checked, or None if it has none."""
    settings = manifest.shortlist
    if settings is None:
        return None
    return Shortlist.load(files.read(settings["file"]), f"bundle file {str(files.root / settings['file'])!r}",
                          int(settings["first"]), bool(settings["shared"]), manifest.vocab_size)


def union_feeds(output_ids: np.ndarray, vocab: int) -> dict[str, np.ndarray]:
    """An int8 shortlist head's union inputs (graph_specs.UNION_INPUTS) for ``output_ids``
    [rows, L] (-1 padded, or one row of every id): the ids any row lists, ascending, and each
    list position's column among them; one row of ids is its own union, as it comes (its
    columns 0..L-1: no vocabulary-wide work). A -1 stands for the vocabulary's last id, as the
    graph's lookups read it (its value is masked out after the product).

    Why on the host: the union changes only when the rows do, and found in the graph at every
    call (a vocabulary-wide mask, its nonzero places and their running count) it was about a
    tenth of a wide call (decision 049). It is a way to compute: integer sums are exact, so a
    row gets the same bits whatever else the union holds."""
    ids = np.where(output_ids < 0, output_ids + vocab, output_ids)
    if len(ids) == 1:
        return {"union_ids": ids[0], "union_columns": np.arange(ids.shape[1], dtype=np.int64)[None]}
    listed = np.zeros(vocab, dtype=bool)
    listed[ids.ravel()] = True
    column_of = np.cumsum(listed, dtype=np.int64) - 1
    return {"union_ids": np.flatnonzero(listed).astype(np.int64), "union_columns": column_of[ids]}
