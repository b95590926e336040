"""Lookups of single values in a vocabulary-long table, as ``GatherElements`` instead of ``Gather``.

Why: a Marian shortlist head looks up a value per allowed id of every row at every call (the
output bias, an int8 head's id scales, the id each shortlist column stands for): [rows,
shortlist] indices, about a thousand a row, into a [vocab] table. onnxruntime's ``Gather``
copies such 4- or 8-byte elements one at a time, several times slower than numpy's ``take``,
and these lookups were a tenth of a wide int8 call; its ``GatherElements`` on the flattened
indices is several times faster (``benchmarks/results/marian-amx-cpu/``, decision 048).

Both operators read ``table[index]`` for every index, negative indices counted from the end
alike, so the values are the same; ``GatherElements`` wants indices of the table's rank (1), so
the indices are flattened and the result takes their shape back. Only ``Gather``s on axis 0 of
a rank-1 initializer or ``Constant`` with indices computed at run time are rewritten (a
constant index, such as a dim picked from a ``Shape``, is left as traced); subgraphs are
rewritten too. The export's checks, which run after this, prove the values unchanged on every
bundle (each block position bitwise equal to the same position alone, and against the float
model).
"""

from __future__ import annotations

import numpy as np

from .positions import fresh_names
from .shape_folding import _constants, graphs_within


def table_lookups_as_gather_elements(model) -> int:
    """Rewrite, in place, each ``Gather`` of ``model`` (an onnx ModelProto) that looks values up
    in a rank-1 constant table by run-time indices (module docstring); returns how many."""
    from onnx import helper, numpy_helper

    fresh = fresh_names(model.graph)
    top_constants = _constants(model.graph)
    flat = fresh("table_lookup_flat_shape")  # the one [-1] target, a top-level Constant if used
    count = 0
    for graph in graphs_within(model.graph):
        constants = {**top_constants, **_constants(graph)}
        rewritten, changed = [], False
        for node in graph.node:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            table = constants.get(node.input[0]) if node.op_type == "Gather" else None
            if table is None or table.ndim != 1 or axis != 0 or node.input[1] in constants:
                rewritten.append(node)
                continue
            base = node.name or node.output[0]
            indices, shape, picked = fresh(f"{base}_flat_ids"), fresh(f"{base}_ids_shape"), fresh(f"{base}_flat")
            rewritten += [
                helper.make_node("Reshape", [node.input[1], flat], [indices], name=fresh(f"{base}/FlatIds")),
                helper.make_node("GatherElements", [node.input[0], indices], [picked], axis=0,
                                 name=fresh(f"{base}/Lookup")),
                helper.make_node("Shape", [node.input[1]], [shape], name=fresh(f"{base}/IdsShape")),
                helper.make_node("Reshape", [picked, shape], list(node.output), allowzero=1,  # a 0 is an empty dim
                                 name=fresh(f"{base}/AsIds")),
            ]
            changed = True
            count += 1
        if changed:
            del graph.node[:]
            graph.node.extend(rewritten)
    if count:  # no inputs: first in the graph is a valid topological place
        model.graph.node.insert(0, helper.make_node("Constant", [], [flat], name=f"{flat}_value",
                                                    value=numpy_helper.from_array(np.array([-1], np.int64), flat)))
    return count
