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

from .positions import fresh_names, replace_placeholders

PER_POSITION = "/PerPositionMatMul"  # the name suffix of the product in the Scan's body

DOMAIN = "aggdec.shortlist"
OP = "PerPositionLogits"


class _PerPositionLogits(torch.autograd.Function):
    """logits [B, T, L] = hidden [B, T, D] . weight[ids]^T, row by row: one placeholder node."""

    @staticmethod
    def forward(ctx, weight: Tensor, ids: Tensor, hidden: Tensor) -> Tensor:  # noqa: ANN001
        return torch.matmul(weight[ids].unsqueeze(1), hidden.unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def symbolic(g, weight, ids, hidden):  # noqa: ANN001, ANN205 - the TorchScript exporter's signature
        out = g.op(f"{DOMAIN}::{OP}", weight, ids, hidden)
        out.setType(hidden.type().with_sizes([None, None, None]))  # [B, T, L]
        return out


def shortlist_logits(hidden: Tensor, output_ids: Tensor, weight: Tensor, bias: Tensor,
                     per_position: bool = True) -> tuple[Tensor, Tensor]:
    """Logits [B, T, L] of ``hidden`` [B, T, D] over each row's ``output_ids`` [B or 1, L] (-1
    pads), and the ids they stand for [B, T, L] (a padding slot's id is -1 and its logit -inf).

    ``weight`` [V, D] is the output matrix, ``bias`` [V] the output bias with any suppression
    already added (-inf on a suppressed id). ``per_position``: the verifier's bitwise
    block-equals-alone product (the module docstring; the traced graph then needs
    :func:`per_position_products`); False, a plain batched product, for a graph whose positions
    need not equal themselves alone (a drafter's proposals)."""
    batch, new_len = hidden.shape[0], hidden.shape[1]
    output_ids = output_ids.expand(batch, -1)
    valid = output_ids >= 0
    ids = torch.clamp(output_ids, min=0)  # [B, L]
    row_bias = bias[ids].masked_fill(~valid, float("-inf"))  # [B, L], gathered once
    if per_position:
        logits = _PerPositionLogits.apply(weight, ids, hidden)
    else:
        logits = torch.matmul(hidden, weight[ids].transpose(1, 2))
    allowed = output_ids.unsqueeze(1).expand(batch, new_len, -1)
    return logits + row_bias.unsqueeze(1), allowed


def per_position_products(model) -> int:
    """Replace every placeholder of :func:`shortlist_logits` in ``model`` (an onnx ModelProto)
    by a Scan over the rows whose step gathers the row's matrix and multiplies each of its
    positions as a product of one column, [1, L, D] x [T, D, 1] -> [T, L]; returns how many.

    Row by row so that the gathered matrix (L x D floats, about 1 MB for Bergamot's lists) is
    still in the cache when it is multiplied: gathered for the whole batch at once, it went
    to memory and came back (the gather and the product were 55% of a call at batch 16)."""
    from onnx import TensorProto, helper

    graph = model.graph
    fresh = fresh_names(graph)

    def scan(node, index: int):
        weight, ids, hidden = node.input
        base = f"shortlist_logits_{index}"
        first, last = fresh(f"{base}_axis_0"), fresh(f"{base}_axis_m1")
        graph.initializer.extend([helper.make_tensor(first, TensorProto.INT64, [1], [0]),
                                  helper.make_tensor(last, TensorProto.INT64, [1], [-1])])
        row_ids, row_hidden, row_logits = fresh(f"{base}_row_ids"), fresh(f"{base}_row_hidden"), fresh(f"{base}_row")
        matrix, product = fresh(f"{base}_matrix"), fresh(f"{base}_product")
        batched, column = fresh(f"{base}_batched"), fresh(f"{base}_column")
        body = helper.make_graph(
            [helper.make_node("Gather", [weight, row_ids], [matrix], name=f"/{base}/Rows"),  # [L, D]
             helper.make_node("Unsqueeze", [matrix, first], [batched], name=f"/{base}/Matrix"),  # [1, L, D]
             helper.make_node("Unsqueeze", [row_hidden, last], [column], name=f"/{base}/Column"),  # [T, D, 1]
             helper.make_node("MatMul", [batched, column], [product], name=f"/{base}{PER_POSITION}"),  # [T, L, 1]
             helper.make_node("Squeeze", [product, last], [row_logits], name=f"/{base}/Join")],  # [T, L]
            f"{base}_row_step",
            [helper.make_tensor_value_info(row_ids, TensorProto.INT64, None),
             helper.make_tensor_value_info(row_hidden, TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info(row_logits, TensorProto.FLOAT, None)],
        )
        return helper.make_node(
            "Scan", [ids, hidden], [node.output[0]], name=f"/{base}/Scan", body=body, num_scan_inputs=2,
            scan_input_axes=[0, 0], scan_output_axes=[0])

    return replace_placeholders(model, DOMAIN, OP, scan)
