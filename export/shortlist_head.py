"""The output projection over each row's lexical shortlist, shared by every graph that needs it
(the Marian SSRU verifier, a drafter head for the same model).

A row's shortlist is fed as ``output_ids`` [rows or 1, L], -1 padded (runtime/decoding/
shortlist.py builds them). :func:`shortlist_logits` gathers those rows of the output matrix and
bias, so a position's projection costs L x d, not V x d, and gives padding -inf so that it can
never be chosen.

Why a placeholder op: a verifier's block must give each position bitwise what the position
alone gives (export/positions.py), and MLAS's float GEMM sums in another order for a block of
T rows than for one row. Each position is therefore its own product of one column,
[1, L, D] x [T, D, 1]: onnxruntime's MatMul broadcasts the row's matrix over its positions by
offsets (no copy per position) and runs every product of one column the same way whatever T
and L. The rows go one at a time (a Scan), so a row's gathered matrix is multiplied while it
is still in the cache. The shared isolation rewrite (positions.isolate_positions) would split
such a product into T x L dot products of one element, so the traced graph holds a placeholder
(:class:`_PerPositionLogits`) that :func:`per_position_products` replaces by that Scan; the
rewrite rewrites top-level products only and leaves a Scan's body alone. Tried before (docs/decisions/026): a copy
of the matrix per position (``Expand``, 74% of the verifier's time); the product the other way
round, [B, T, 1, D] x [B, 1, D, L], which onnxruntime folds into one GEMM of T rows when B = 1;
one product for the whole batch at once, whose gathered matrices went to memory and back.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .positions import PER_POSITION, fresh_names, replace_placeholders

DOMAIN = "aggdec.shortlist"
OP = "PerPositionLogits"


class _PerPositionLogits(torch.autograd.Function):
    """logits [B, T, L] = hidden [B, T, D] . matrix^T, row by row: one placeholder node. A row's
    matrix is ``rows[b]`` [L, D] when ``rows`` is not empty, else ``weight[ids[b]]``."""

    @staticmethod
    def forward(ctx, weight: Tensor, ids: Tensor, hidden: Tensor, rows: Tensor) -> Tensor:  # noqa: ANN001
        matrix = rows if rows.shape[1] > 0 else weight[ids]
        return torch.matmul(matrix.unsqueeze(1), hidden.unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def symbolic(g, weight, ids, hidden, rows):  # noqa: ANN001, ANN205 - the TorchScript exporter's signature
        out = g.op(f"{DOMAIN}::{OP}", weight, ids, hidden, rows)
        out.setType(hidden.type().with_sizes([None, None, None]))  # [B, T, L]
        return out


def shortlist_logits(hidden: Tensor, output_ids: Tensor, weight: Tensor, bias: Tensor,
                     per_position: bool = True, rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Logits [B, T, L] of ``hidden`` [B, T, D] over each row's ``output_ids`` [B or 1, L] (-1
    pads), and each row's ids [B, L] (a padding slot's id is -1 and its logit -inf):
    :func:`ids_at` reads the ids of chosen slots from them.

    ``weight`` [V, D] is the output matrix, ``bias`` [V] the output bias with any suppression
    already added (-inf on a suppressed id). ``per_position``: the verifier's bitwise
    block-equals-alone product (the module docstring; the traced graph then needs
    :func:`per_position_products`); False, a plain batched product, for a graph whose positions
    need not equal themselves alone (a drafter's proposals).

    ``rows`` (per-position products only): each row's matrix already gathered, [B, L, D],
    ``weight[max(output_ids, 0)]`` (what the encoder of a bundle with ``output_rows`` returns
    when a row is admitted, kept per slot by the runtime), so that the call does not gather it;
    an empty [B or 1, 0, D] (or None) gathers it from ``weight`` as before (the whole
    vocabulary, and callers that feed ``output_ids`` alone)."""
    batch = hidden.shape[0]
    output_ids = output_ids.expand(batch, -1)
    valid = output_ids >= 0
    ids = torch.clamp(output_ids, min=0)  # [B, L]
    row_bias = bias[ids].masked_fill(~valid, float("-inf"))  # [B, L], gathered once
    if per_position:
        if rows is None:
            rows = hidden.new_zeros((1, 0, hidden.shape[-1]))
        logits = _PerPositionLogits.apply(weight, ids, hidden, rows)
    else:
        logits = torch.matmul(hidden, weight[ids].transpose(1, 2))
    return logits + row_bias.unsqueeze(1), output_ids


def ids_at(row_ids: Tensor, local: Tensor) -> Tensor:
    """The ids [B, ...] at slots ``local`` [B, ...] (indices into each row's list) of ``row_ids``
    [B, L]: one gather over the flattened slots, not a copy of the list per position (an expand
    over the block traced into a dozen small nodes)."""
    return torch.gather(row_ids, 1, local.flatten(1)).view_as(local)


def per_position_products(model) -> int:
    """Replace every placeholder of :func:`shortlist_logits` in ``model`` (an onnx ModelProto)
    by a Scan over the rows whose step multiplies each of the row's positions as a product of
    one column, [1, L, D] x [T, D, 1] -> [T, L]; returns how many.

    Row by row so that a row's matrix (L x D floats, about 1 MB for Bergamot's lists) is still
    in the cache when it is multiplied: gathered for the whole batch at once, it went to memory
    and came back (the gather and the product were 55% of a call at batch 16). The matrices
    come from one of two Scans under an If on the placeholder's ``rows`` input: fed (not
    empty), each row's gathered matrix as the runtime keeps it per slot, so the call gathers
    nothing (the gather was about a quarter of a batch-16 call, a tenth of a batch-1 call);
    empty, the row's ids, gathered from the output matrix inside the step. Both steps end in
    the same one-column product, so a position's logits do not depend on which one ran."""
    from onnx import TensorProto, helper

    graph = model.graph
    fresh = fresh_names(graph)

    def row_scan(base: str, index_first: str, index_last: str, weight: str | None, rows_or_ids: str, hidden: str,
                 output: str):
        """A Scan over the rows of ``rows_or_ids`` and ``hidden``: the row's matrix, gathered
        from ``weight`` when it is given (its ids are scanned), times each position."""
        row_in, row_hidden, row_logits = fresh(f"{base}_row_in"), fresh(f"{base}_row_hidden"), fresh(f"{base}_row")
        matrix, product = fresh(f"{base}_matrix"), fresh(f"{base}_product")
        batched, column = fresh(f"{base}_batched"), fresh(f"{base}_column")
        nodes = [helper.make_node("Gather", [weight, row_in], [matrix], name=f"/{base}/Rows")] if weight else []
        nodes += [helper.make_node("Unsqueeze", [matrix if weight else row_in, index_first], [batched],
                                   name=f"/{base}/Matrix"),  # [1, L, D]
                  helper.make_node("Unsqueeze", [row_hidden, index_last], [column], name=f"/{base}/Column"),  # [T, D, 1]
                  helper.make_node("MatMul", [batched, column], [product], name=f"/{base}{PER_POSITION}"),  # [T, L, 1]
                  helper.make_node("Squeeze", [product, index_last], [row_logits], name=f"/{base}/Join")]  # [T, L]
        body = helper.make_graph(
            nodes, f"{base}_row_step",
            [helper.make_tensor_value_info(row_in, TensorProto.INT64 if weight else TensorProto.FLOAT, None),
             helper.make_tensor_value_info(row_hidden, TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info(row_logits, TensorProto.FLOAT, None)],
        )
        return helper.make_node("Scan", [rows_or_ids, hidden], [output], name=f"/{base}/Scan", body=body,
                                num_scan_inputs=2, scan_input_axes=[0, 0], scan_output_axes=[0])

    def replace(node, index: int) -> list:
        weight, ids, hidden, rows = node.input
        base = f"shortlist_logits_{index}"
        first, last = fresh(f"{base}_axis_0"), fresh(f"{base}_axis_m1")
        one, zero = fresh(f"{base}_one"), fresh(f"{base}_zero")
        graph.initializer.extend([helper.make_tensor(first, TensorProto.INT64, [1], [0]),
                                  helper.make_tensor(last, TensorProto.INT64, [1], [-1]),
                                  helper.make_tensor(one, TensorProto.INT64, [], [1]),
                                  helper.make_tensor(zero, TensorProto.INT64, [], [0])])
        shape, length, empty = fresh(f"{base}_rows_shape"), fresh(f"{base}_rows_len"), fresh(f"{base}_rows_empty")
        gathered, kept = fresh(f"{base}_gathered"), fresh(f"{base}_kept")
        then_branch = helper.make_graph(
            [row_scan(f"{base}_gather", first, last, weight, ids, hidden, gathered)], f"{base}_gather",
            [], [helper.make_tensor_value_info(gathered, TensorProto.FLOAT, None)])
        else_branch = helper.make_graph(
            [row_scan(f"{base}_kept", first, last, None, rows, hidden, kept)], f"{base}_kept",
            [], [helper.make_tensor_value_info(kept, TensorProto.FLOAT, None)])
        return [helper.make_node("Shape", [rows], [shape], name=f"/{base}/RowsShape"),
                helper.make_node("Gather", [shape, one], [length], name=f"/{base}/RowsLen", axis=0),
                helper.make_node("Equal", [length, zero], [empty], name=f"/{base}/RowsEmpty"),
                helper.make_node("If", [empty], [node.output[0]], name=f"/{base}/If",
                                 then_branch=then_branch, else_branch=else_branch)]

    return replace_placeholders(model, DOMAIN, OP, replace)
