"""The output projection over each row's lexical shortlist, shared by every graph that needs it
(the Marian SSRU verifier, a drafter head for the same model).

A row's shortlist is fed as ``output_ids`` [rows or 1, L], -1 padded (runtime/decoding/
shortlist.py builds them). :func:`shortlist_logits` gathers those rows of the output matrix and
bias, so a position's projection costs L x d, not V x d, and gives padding -inf so that it can
never be chosen.

Why a placeholder op: a verifier's block must give each position bitwise what the position
alone gives (export/positions.py), and MLAS's float GEMM sums in another order for a block of
T rows than for one row. Each position is therefore its own product of one column,
[B, 1, L, D] x [B, T, D, 1]: onnxruntime's MatMul broadcasts the row's matrix over its
positions by offsets (no copy per position) and runs every product of one column the same way
whatever B, T and L. The shared isolation rewrite (positions.isolate_positions) would split that
product again into T x L dot products of one element, so the traced graph holds a placeholder
(:class:`_PerPositionLogits`) that :func:`per_position_products` replaces by the MatMul, named
with :data:`~.positions.PER_POSITION` so the isolation leaves it as it is. (Tried before: a copy
of the matrix per position, ``Expand``, 74% of the verifier's time; the product the other way
round, [B, T, 1, D] x [B, 1, D, L], which onnxruntime folds into one GEMM of T rows when B = 1.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from .positions import PER_POSITION

DOMAIN = "aggdec.shortlist"
OP = "PerPositionLogits"


class _PerPositionLogits(torch.autograd.Function):
    """logits [B, T, L] = hidden [B, T, D] . weight [B, L, D]^T, traced as one placeholder node."""

    @staticmethod
    def forward(ctx, weight: Tensor, hidden: Tensor) -> Tensor:  # noqa: ANN001
        return torch.matmul(weight.unsqueeze(1), hidden.unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def symbolic(g, weight, hidden):  # noqa: ANN001, ANN205 - the TorchScript exporter's signature
        out = g.op(f"{DOMAIN}::{OP}", weight, hidden)
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
    rows = weight[ids]  # [B, L, D]: the row's gathered matrix, once per row
    row_bias = bias[ids].masked_fill(~valid, float("-inf"))  # [B, L], gathered once
    if per_position:
        logits = _PerPositionLogits.apply(rows, hidden)
    else:
        logits = torch.matmul(hidden, rows.transpose(1, 2))
    allowed = output_ids.unsqueeze(1).expand(batch, new_len, -1)
    return logits + row_bias.unsqueeze(1), allowed


def per_position_products(model) -> int:
    """Replace every placeholder of :func:`shortlist_logits` in ``model`` (an onnx ModelProto)
    by its one-column products, [B, 1, L, D] x [B, T, D, 1] -> [B, T, L]; returns how many."""
    from onnx import helper

    graph = model.graph
    names = {n for node in graph.node for n in (*node.input, *node.output)} | {i.name for i in graph.initializer}

    def fresh(base: str) -> str:
        name, index = base, 0
        while name in names:
            index += 1
            name = f"{base}_{index}"
        names.add(name)
        return name

    axes: dict[int, str] = {}

    def axis(value: int) -> str:
        if value not in axes:
            axes[value] = fresh(f"per_position_axis_{'m' if value < 0 else ''}{abs(value)}")
            graph.initializer.append(helper.make_tensor(axes[value], 7, [1], [value]))  # 7: INT64
        return axes[value]

    rewritten, count = [], 0
    for node in graph.node:
        if node.domain != DOMAIN or node.op_type != OP:
            rewritten.append(node)
            continue
        weight, hidden = node.input
        base = f"shortlist_logits_{count}"
        matrix, column, product = fresh(f"{base}_matrix"), fresh(f"{base}_column"), fresh(f"{base}_product")
        rewritten += [
            helper.make_node("Unsqueeze", [weight, axis(1)], [matrix], name=fresh(f"/{base}/Matrix")),
            helper.make_node("Unsqueeze", [hidden, axis(-1)], [column], name=fresh(f"/{base}/Column")),
            helper.make_node("MatMul", [matrix, column], [product], name=fresh(f"/{base}{PER_POSITION}")),
            helper.make_node("Squeeze", [product, axis(-1)], [node.output[0]], name=fresh(f"/{base}/Join")),
        ]
        count += 1
    del graph.node[:]
    graph.node.extend(rewritten)
    kept = [op for op in model.opset_import if op.domain != DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return count
