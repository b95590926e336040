"""How export-time checks feed a lexical-shortlist verifier (a Marian bundle's): its
``output_ids`` input, added to every call of the wrapped onnxruntime session, so that the
shared checks (``validate.py``, ``positions.py``), which know nothing of shortlists, drive it
as they drive any verifier. Used by the Marian exporter and by ``aggdec quantize``.
"""

from __future__ import annotations

import numpy as np

from ..runtime.decoding.shortlist import union_feeds
from ..runtime.graph_specs import UNION_INPUTS


class WholeVocabulary:
    """An onnxruntime session of a shortlist verifier fed every output id: how the shared
    validation against the float reference (which scores the whole vocabulary) drives it.

    A verifier that takes ``output_rows`` (graph_specs.takes_output_rows) is fed an empty one
    here, so it gathers each row's matrix itself; :class:`RowShortlists` given the output
    matrix feeds the gathered rows, as the runtime does."""

    def __init__(self, session, vocab: int, matrix: np.ndarray | None = None) -> None:  # noqa: ANN001
        self.session = session
        self.vocab = vocab
        self.matrix = matrix  # the output matrix [V, D], to feed each row's rows of it
        inputs = {value.name: value for value in session.get_inputs()}
        self.union = UNION_INPUTS[0] in inputs  # an int8 head fed the union of its lists (decision 049)
        rows = inputs.get("output_rows")
        self.d_model = rows.shape[-1] if rows is not None else None
        # the bundle's activation type (float16 in an fp16 bundle)
        self.dtype = np.float16 if rows is not None and rows.type == "tensor(float16)" else np.float32

    def output_ids(self, rows: int) -> np.ndarray:
        return np.arange(self.vocab, dtype=np.int64)[None]

    def get_outputs(self):  # noqa: ANN201
        return self.session.get_outputs()

    def run(self, names, feeds: dict):  # noqa: ANN001, ANN201
        ids = self.output_ids(len(feeds["input_ids"]))
        extra = {"output_ids": ids, **(union_feeds(ids, self.vocab) if self.union else {})}
        if self.d_model is not None:
            extra["output_rows"] = (np.zeros((1, 0, self.d_model), self.dtype) if self.matrix is None
                                    else np.ascontiguousarray(self.matrix[np.maximum(ids, 0)], dtype=self.dtype))
        return self.session.run(names, {**feeds, **extra})


class RowShortlists(WholeVocabulary):
    """The same, fed per-row lists of different lengths, -1 padded, as the runtime feeds them: how
    the bitwise block-versus-alone check drives it (and with far less memory than every id,
    which each position of a block multiplies against a copy of)."""

    def output_ids(self, rows: int) -> np.ndarray:
        rng = np.random.default_rng(rows)
        lists = [np.sort(rng.choice(self.vocab, size=min(self.vocab, 200 + 37 * row), replace=False))
                 for row in range(rows)]
        ids = np.full((rows, max(map(len, lists))), -1, dtype=np.int64)
        for row, allowed in enumerate(lists):
            ids[row, : len(allowed)] = allowed
        return ids
