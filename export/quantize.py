"""`aggdec quantize`: an fp32 bundle -> an int8 bundle for the CPU that stays lossless (and,
with ``precision="fp16"``, an fp16 bundle for CUDA: ``half.py``; the checks below are shared).

Lossless (IAD, GAD and GAD++ at beta 1 give the bundle's own greedy output, token for token)
needs more than accuracy: the verifier must compute each position exactly as it would alone.
Greedy verifies one position per call, IAD/GAD a block of T; if a position's result depended
on what else is in the call, a block could accept a token that greedy would not have chosen.

onnxruntime's own int8 paths couple positions:

- ``quantize_dynamic`` inserts ``DynamicQuantizeLinear``, which computes ONE scale (and zero
  point) over the whole activation tensor: every position's quantization depends on the
  largest value among all positions in the call.
- ``MatMulNBits`` (accuracy_level 4) quantizes activations in blocks and runs kernels chosen
  by the number of rows; measured: int8 IAD/GAD equalled int8 greedy on 798 of 800 sentences.

So activations are quantized here **per row** (one symmetric scale per position vector:
absmax over the last axis / 127, then one ``QuantizeLinear`` of step 1 that rounds and shifts
to uint8), weights per output column (symmetric, with onnxruntime's ``quantize_data``), and
the product is ``MatMulInteger``: its int32 accumulation is exact, so neither the kernel path
nor the block size can change it. The rest is per-element float math (Cast, two Muls) or
per-row (the absmax). Nothing mixes positions, and the block-vs-single check in
:func:`check_verifier_graphs` proves it on every bundle written.

Weights use 7 bits (``reduce_range``, values in [-64, 64]): MLAS's fast u8 x s8 kernel on
AVX2 CPUs without VNNI multiplies with ``vpmaddubsw``, which adds pairs of u8*s8 products into
a *saturating* int16; with activations in [1, 255] (int8 shifted by the zero point 128) and
|w| <= 64, a pair is at most 2 * 255 * 64 = 32640 < 32767, so nothing saturates on any x86
CPU and the int32 result is exact everywhere.

The drafter is the exception: its tokens are proposals the verifier checks, so coupling does
not matter there, and it gets onnxruntime's own ``quantize_dynamic`` (:func:`write_dynamic_int8`),
the faster of the two; so does the CPU copy of an fp32 bundle's drafter (``drafter_int8``).

So, by default, does the encoder (``QuantizeOptions.encoder = "per-call"``): it runs once per
source, and one scale per call couples only the rows of that call, so the bundle records
``quantization.encoder = "per-call"`` and the runtime encodes one unpadded source per call
(``Manifest.encodes_one_source_per_call``): a source's encoding is then a function of the source
alone, at any batch size, and every mode reads the same encoding. ``"per-row"`` quantizes the
encoder as the verifier, for one batched call (README, int8 bundles, has the measurement).

``activations="two-pass"`` trades speed for closeness to fp32: each row is divided by its
absmax / 63 and sent as two 7-bit passes, the rounded value and its rounding residual x 126
(about 13 bits together), against 8-bit weights; a matrix that already lies on one int8 grid
(a Marian int8 model's) keeps exactly those values, where 7 bits per column would round them a
second time. |activation| <= 127 after the shift by 64 and |w| <= 127 keep AVX2's pair sums
exact as above (2 * 127 * 127 = 32258). Each pass is one ``MatMulIntegerToFloat``; nothing
mixes positions either (decision 028 has what it gains and costs).

This module needs onnx and onnxruntime, not torch: an existing bundle can be quantized on a
machine that cannot export.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runtime.bundle_schema import MAX_TEXT_LEN
from ..runtime.errors import ExportError
from ..runtime.manifest import TOKENIZER_FILE, Manifest, load_manifest, manifest_digest, hash_files
from ..runtime.segmentation import SENTENCEPIECE, SENTENCEPIECE_FILE
from ..runtime.graph_specs import UNION_INPUTS, UNION_SPECS, VERIFIER_GRAPHS, drafter_takes_output_ids
from .positions import (BATCHES, NEW_LENS, PAST_LENS, PER_POSITION, Case, Driver, check_verifier_graphs, cpu_session,
                        isolate_positions, validation_cases)
from .table_lookups import table_lookups_as_gather_elements

ROW_QMAX = 127.0  # activations: symmetric int8, [-127, 127], shifted to uint8 [1, 255]
A_ZERO_POINT = 128
# the smallest normal float32: the scale of an all-zero row (its quantized values are 0 anyway)
TINY_SCALE = float(np.finfo(np.float32).tiny)


@dataclass(frozen=True)
class QuantizeOptions:
    # the [d_model, vocab] output projection (lm_head, the drafter's head): most of a verifier
    # step's multiply-adds; quantized by default (README, int8 bundles, has the measurement)
    output_projection: bool = True
    # int8 encoder activations: "per-call" (onnxruntime's dynamic quantization; the runtime then
    # encodes one source per call) or "per-row" (as the verifier); bundle_schema.ENCODER_QUANTIZATION
    encoder: str = "per-call"
    # how activations and weights meet (ACTIVATION_SCHEMES): "per-row" (above) or "two-pass" (module
    # docstring): much closer to fp32 (a Marian int8 model's outputs nearly all equal its float
    # ones), slower; the encoder is then quantized per row too
    activations: str = "per-row"
    # a regular expression: products whose weight initializer's name matches it (re.search) stay
    # float32, in every graph (e.g. "ssru" for a Marian decoder's recurrence)
    float_products: str | None = None


ACTIVATION_SCHEMES = ("per-row", "two-pass")
# two-pass: activations in 7 bits a pass (|q| <= 63, shifted by 64 to [1, 127]) against 8-bit
# weights (|w| <= 127): a pair of products is at most 2 * 127 * 127 = 32258 < 32767
PASS_QMAX = 63.0
PASS_ZERO_POINT = 64
ID_ROWS_ZERO_POINT = 128  # a shortlist head's int8 output matrix, stored as uint8 (_Rewriter._shortlist_head)
# a shortlist head's calls of at least this many rows multiply the union of their rows' ids once
# (_Rewriter._id_sums); fewer, each row its own ids (decision 045)
UNION_HEAD_ROWS = 8
RESIDUAL_STEPS = 2 * PASS_QMAX  # a residual is at most half a first-pass step: 126 steps of its own


def on_int8_grid(weight: np.ndarray) -> tuple[np.ndarray, np.float32] | None:
    """``weight``'s int8 values and multiplier when it is exactly q / multiplier with integers
    |q| <= 127 and max |q| = 127 (how Marian stores its int8 matrices: docs/marian.md), else
    None. The multiplier, 127 / max |w|, gives back every value to float32 rounding."""
    peak = float(np.abs(weight).max()) if weight.size else 0.0
    if peak == 0.0 or not np.isfinite(peak):
        return None
    multiplier = np.float32(127.0 / peak)
    scaled = weight.astype(np.float64) * float(multiplier)
    q = np.round(scaled)
    if np.abs(scaled - q).max() > 1e-3 or not np.allclose((q / multiplier).astype(np.float32), weight, rtol=1e-6,
                                                           atol=0.0):
        return None
    return q.astype(np.int8), multiplier


# ------------------------------------------------------------------ one graph


def shortlist_head_parts(node) -> tuple[str, str, str] | None:
    """(output matrix, ids, hidden) of ``node`` when it is a float shortlist head as
    export/shortlist_head.py writes it (an If whose gathering branch is a Scan over the rows,
    with one Gather of the output matrix and the one-column product in its step), else None."""
    branches = {attr.name: attr.g for attr in node.attribute if attr.name in ("then_branch", "else_branch")}
    for branch in branches.values():
        scans = [n for n in branch.node if n.op_type == "Scan"]
        if len(branch.node) != 1 or len(scans) != 1:
            continue
        body = next((attr.g for attr in scans[0].attribute if attr.name == "body"), None)
        if body is None or not any(n.op_type == "MatMul" and n.name.endswith(PER_POSITION) for n in body.node):
            continue
        gathers = [n for n in body.node if n.op_type == "Gather"]
        if len(gathers) == 1 and len(scans[0].input) == 2 and gathers[0].input[1] == body.input[0].name:
            return gathers[0].input[0], scans[0].input[0], scans[0].input[1]
    return None


def _opset(model) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


class _Rewriter:
    """Replaces every float MatMul by a constant 2-D weight with the per-row int8 subgraph."""

    def __init__(self, model, vocab_size: int, options: QuantizeOptions) -> None:
        from onnx import TensorProto, numpy_helper

        self.model, self.graph = model, model.graph
        self.vocab_size, self.options = vocab_size, options
        self.opset = _opset(model)
        self.inits = {init.name: init for init in self.graph.initializer}
        self.TensorProto, self.numpy_helper = TensorProto, numpy_helper
        self.names: set[str] = {n for node in self.graph.node for n in (*node.input, *node.output)} | set(self.inits)
        self.weights: dict[str, tuple[str, str]] = {}  # fp32 weight -> (int8 weight, column scales)
        self.id_matrices: dict[str, tuple[str, str]] = {}  # a shortlist head's matrix: _id_matrices
        self.rows: dict[str, tuple[str, str]] = {}  # activation -> (uint8 rows, row scales)
        self.two_pass = options.activations == "two-pass"
        self.float_products = re.compile(options.float_products) if options.float_products else None
        self.scalars: dict[str, str] = {}
        self.quantized = self.on_grid = 0

    def _name(self, base: str) -> str:
        name, index = base, 0
        while name in self.names:
            index += 1
            name = f"{base}_{index}"
        self.names.add(name)
        return name

    def _constant(self, base: str, array: np.ndarray) -> str:
        name = self._name(base)
        self.graph.initializer.append(self.numpy_helper.from_array(array, name))
        return name

    def _weight(self, name: str) -> tuple[str, str]:
        """Per-column symmetric int8 (7-bit range) with onnxruntime's quantize_data; two-pass:
        8-bit (``_weight_8bit``)."""
        if name not in self.weights:
            weight = self.numpy_helper.to_array(self.inits[name]).astype(np.float32)
            quantized, scales = self._weight_8bit(weight) if self.two_pass else self._weight_7bit(weight)
            self.weights[name] = (self._constant(f"{name}_int8", quantized),
                                  self._constant(f"{name}_column_scale", scales))
        return self.weights[name]

    def _weight_7bit(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One-pass weights: per output column, symmetric, 7 bits (module docstring)."""
        from onnxruntime.quantization.quant_utils import quantize_data

        quantized = np.empty(weight.shape, dtype=np.int8)
        scales = np.empty(weight.shape[1], dtype=np.float32)
        for column in range(weight.shape[1]):
            values = weight[:, column]
            if not np.any(values):  # quantize_data would divide by a zero range
                quantized[:, column], scales[column] = 0, 1.0
                continue
            _, scale, q = quantize_data(values, self.TensorProto.INT8, symmetric=True, reduce_range=True)
            quantized[:, column], scales[column] = q, np.float32(scale)
        return quantized, scales

    def _id_matrices(self, name: str) -> tuple[str, str]:
        """A shortlist head's output matrix ``name`` [V, D], each id's row quantized as
        ``_weight`` quantizes a product's column, stored by id as uint8 (int8 shifted by
        :data:`ID_ROWS_ZERO_POINT`), and one scale per id [V]: the initializers' names."""
        if name not in self.id_matrices:
            by_column = self.numpy_helper.to_array(self.inits[name]).astype(np.float32).T  # [D, V]
            quantized, scales = self._weight_8bit(by_column) if self.two_pass else self._weight_7bit(by_column)
            by_id = (quantized.T.astype(np.int16) + ID_ROWS_ZERO_POINT).astype(np.uint8)
            self.id_matrices[name] = (self._constant(f"{name}_uint8_by_id", by_id),
                                      self._constant(f"{name}_id_scale", scales))
        return self.id_matrices[name]

    def _weight_8bit(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Two-pass weights: the matrix's own int8 grid when it lies on one (Marian's int8
        matrices: rounding them again to 7 bits per column was most of the error), else per
        output column over the whole int8 range."""
        grid = on_int8_grid(weight)
        if grid is not None:
            self.on_grid += 1
            q, multiplier = grid
            return q, np.full(weight.shape[1], 1.0 / multiplier, dtype=np.float32)
        peak = np.abs(weight).max(axis=0)
        scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        return np.clip(np.round(weight / scales), -127, 127).astype(np.int8), scales

    def _row_scale(self, activation: str, base: str, qmax: float, nodes: list) -> str:
        """absmax over the last axis / qmax, floored at the smallest normal float32."""
        from onnx import helper

        absolute = self._name(f"{base}_abs")
        absmax = self._name(f"{base}_absmax")
        nodes.append(helper.make_node("Abs", [activation], [absolute], name=self._name(f"{base}/Abs")))
        if self.opset >= 18:  # ReduceMax takes its axes as an input from opset 18
            axes = self._constant(f"{base}_last_axis", np.array([-1], dtype=np.int64))
            nodes.append(helper.make_node("ReduceMax", [absolute, axes], [absmax], keepdims=1,
                                          name=self._name(f"{base}/RowMax")))
        else:
            nodes.append(helper.make_node("ReduceMax", [absolute], [absmax], axes=[-1], keepdims=1,
                                          name=self._name(f"{base}/RowMax")))
        raw_scale, scale = self._name(f"{base}_row_scale_raw"), self._name(f"{base}_row_scale")
        nodes.append(helper.make_node("Div", [absmax, self._constant(f"{base}_qmax", np.array(qmax, np.float32))],
                                      [raw_scale], name=self._name(f"{base}/RowScale")))
        nodes.append(helper.make_node("Max", [raw_scale, self._constant(f"{base}_tiny", np.array(TINY_SCALE,
                                      np.float32))], [scale], name=self._name(f"{base}/RowScaleFloor")))
        return scale

    def _two_pass_rows(self, activation: str, nodes: list) -> tuple[str, str, str]:
        """Two-pass rows of ``activation``: :meth:`_scaled_passes`' two, each rounded, shifted
        by 64 and cast to uint8 by one QuantizeLinear (a scalar scale and zero point). Per
        element after the row's absmax, like the one-pass rows. Returns (first pass, second
        pass, row scale)."""
        if activation in self.rows:
            return self.rows[activation]
        from onnx import helper

        base = activation.strip("/").replace("/", "_") or "x"
        passes, scale = self._scaled_passes(activation, nodes, two_pass=True)
        zero_point = self._shared("pass_zero_point", np.uint8(PASS_ZERO_POINT))
        quantized = []
        for suffix, node_name, (value, step) in zip(("uint8", "residual_uint8"), ("FirstPass", "SecondPass"), passes):
            quantized.append(self._name(f"{base}_{suffix}"))
            nodes.append(helper.make_node("QuantizeLinear", [value, step, zero_point], [quantized[-1]],
                                          name=self._name(f"{base}/{node_name}")))
        self.rows[activation] = (quantized[0], quantized[1], scale)
        return self.rows[activation]

    def _shared(self, base: str, value: np.generic) -> str:
        """A scalar constant made once per graph (zero points, pass steps)."""
        if base not in self.scalars:
            self.scalars[base] = self._constant(base, np.array(value))
        return self.scalars[base]

    def _rows(self, activation: str, nodes: list) -> tuple[str, str]:
        """Per-row (per-position) symmetric quantization of ``activation``, shared by every
        MatMul that reads it (q/k/v projections). Hand-written because onnxruntime's dynamic
        quantization (DynamicQuantizeLinear) has one scale per tensor, coupling positions."""
        if activation in self.rows:
            return self.rows[activation]
        from onnx import helper

        base = activation.strip("/").replace("/", "_") or "x"
        scale = self._row_scale(activation, base, ROW_QMAX, nodes)
        scaled, quantized = self._name(f"{base}_scaled"), self._name(f"{base}_uint8")
        nodes.append(helper.make_node("Div", [activation, scale], [scaled], name=self._name(f"{base}/Scale")))
        # |scaled| <= 127 (plus rounding error of the scale, which rounding absorbs): one
        # QuantizeLinear (step 1) rounds half to even and shifts by the zero point, the values
        # Round, Add and Cast gave in three nodes
        nodes.append(helper.make_node("QuantizeLinear", [scaled, self._shared("one", np.float32(1)),
                                                         self._shared("row_zero_point", np.uint8(A_ZERO_POINT))],
                                      [quantized], name=self._name(f"{base}/ToUint8")))
        self.rows[activation] = (quantized, scale)
        return self.rows[activation]

    def _quantizable(self, node) -> bool:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.input[1] not in self.inits:
            return False
        weight = self.inits[node.input[1]]
        if weight.data_type != self.TensorProto.FLOAT or len(weight.dims) != 2:
            return False
        if self.float_products is not None and self.float_products.search(node.input[1]):
            return False
        return weight.dims[1] != self.vocab_size or self.options.output_projection

    def _two_pass_product(self, node, base: str) -> list:
        """x·W as row scale * (first·W + second·W / 126) * column scales: each pass one
        MatMulIntegerToFloat (onnxruntime's u8 x s8 product with its int32 sum scaled to float,
        per column; exact integer sums whatever the kernel), then an Add and the row's Mul."""
        from onnx import helper

        rows: list = []
        first, second, row_scale = self._two_pass_rows(node.input[0], rows)
        weight, column_scale = self._weight(node.input[1])
        zero_point = self._shared("pass_zero_point", np.uint8(PASS_ZERO_POINT))
        one, step = self._shared("one", np.float32(1)), self._shared("residual_step", np.float32(1 / RESIDUAL_STEPS))
        coarse, fine, summed = (self._name(f"{base}_{s}") for s in ("first_pass", "second_pass", "passes"))
        return rows + [
            helper.make_node("MatMulIntegerToFloat", [first, weight, one, column_scale, zero_point], [coarse],
                             domain="com.microsoft", name=self._name(f"{base}/FirstPassMatMul")),
            helper.make_node("MatMulIntegerToFloat", [second, weight, step, column_scale, zero_point], [fine],
                             domain="com.microsoft", name=self._name(f"{base}/SecondPassMatMul")),
            helper.make_node("Add", [coarse, fine], [summed], name=self._name(f"{base}/AddPasses")),
            helper.make_node("Mul", [summed, row_scale], [node.output[0]], name=self._name(f"{base}/RowScaleMul")),
        ]

    def _scaled_passes(self, activation: str, nodes: list, two_pass: bool) -> tuple[list[tuple[str, str]], str]:
        """``activation`` [B, T, D] divided by its rows' absmax / 63 (7-bit passes), as one pass,
        or (``two_pass``) two: the value and its rounding residual x 126 (about 13 bits
        together). Returns each pass as (float value, its step), for a QuantizeLinear to round,
        and the row scales [B, T, 1]."""
        from onnx import helper

        base = activation.strip("/").replace("/", "_") or "x"
        scale = self._row_scale(activation, base, PASS_QMAX, nodes)
        scaled = self._name(f"{base}_scaled")
        nodes.append(helper.make_node("Div", [activation, scale], [scaled], name=self._name(f"{base}/Scale")))
        passes = [(scaled, self._shared("one", np.float32(1)))]
        if two_pass:
            rounded, residual = self._name(f"{base}_rounded"), self._name(f"{base}_residual")
            nodes += [helper.make_node("Round", [scaled], [rounded], name=self._name(f"{base}/Round")),
                      helper.make_node("Sub", [scaled, rounded], [residual], name=self._name(f"{base}/Residual"))]
            passes.append((residual, self._shared("residual_step", np.float32(1 / RESIDUAL_STEPS))))
        return passes, scale

    def _shortlist_head(self, node) -> list | None:
        """An int8 shortlist head in place of ``node`` when it is one (:func:`shortlist_head_parts`),
        else None (decision 041).

        Row by row (a Scan, as the float head), a row's ids gather its rows of the uint8 output
        matrix ([L, D], int8 shifted by 128: a quarter of the float rows' bytes) and one
        ``MatMulInteger`` multiplies them by the row's positions, [L, D] x [D, T] (two-pass: both
        passes side by side, [D, 2T], one product). Its int32 sums are exact whatever the shapes,
        so a position gives the same bits in any block, which the float head needs a one-column
        product per position for. The matrix is the left operand, read in place; onnxruntime
        packs the right one, the small side, and its kernel costs about the same for any T up to
        16. Then, per element: each pass to float (two-pass: joined), times each id's scale and
        each position's row scale.

        The operands are the other way round from the other products (weights the unsigned
        left operand, activations signed), so the bounds that keep AVX2's saturating pair sums
        exact (module docstring) are: weights of 7 bits (two-pass: 8) shifted by 128, at most 192
        (255), against activations of 7 bits (|q| <= 63): 2 * 192 * 63 and 2 * 255 * 63 are
        below 32767."""
        parts = shortlist_head_parts(node)
        if parts is None or not self.options.output_projection:
            return None
        weight, ids, hidden = parts
        if weight not in self.inits or (self.float_products is not None and self.float_products.search(weight)):
            return None
        from onnx import helper

        types = self.TensorProto
        base = (node.name or node.output[0]).strip("/").replace("/", "_") + "_int8"

        def name(suffix: str) -> str:
            return self._name(f"{base}_{suffix}")

        def node_name(suffix: str) -> str:
            return self._name(f"/{base}/{suffix}")

        by_id, id_scale = self._id_matrices(weight)
        nodes: list = []
        passes, row_scale = self._scaled_passes(hidden, nodes, self.two_pass)
        columns = []  # each pass's positions as columns [B, D, T]
        for index, (value, step) in enumerate(passes):
            quantized, column = name(f"int8_{index}"), name(f"columns_{index}")
            nodes += [helper.make_node("QuantizeLinear", [value, step, self._shared("int8_zero", np.int8(0))],
                                       [quantized], name=node_name(f"Pass{index}")),
                      helper.make_node("Transpose", [quantized], [column], perm=[0, 2, 1],
                                       name=node_name(f"Pass{index}Columns"))]
            columns.append(column)
        if len(columns) > 1:
            joined = name("columns")
            nodes.append(helper.make_node("Concat", columns, [joined], axis=2, name=node_name("Passes")))
            columns = [joined]  # [B, D, 2T]
        row_ids, matrix, row_columns, row_sums = name("row_ids"), name("row_matrix"), name("row_columns"), name("row_sums")
        body = helper.make_graph(
            [helper.make_node("Gather", [by_id, row_ids], [matrix], name=node_name("RowMatrix")),  # [L, D]
             helper.make_node("MatMulInteger", [matrix, row_columns,
                                                self._shared("id_rows_zero_point", np.uint8(ID_ROWS_ZERO_POINT))],
                              [row_sums], name=node_name("RowMatMul"))],  # [L, passes x T]
            f"{base}_row_step",
            [helper.make_tensor_value_info(row_ids, types.INT64, None),
             helper.make_tensor_value_info(row_columns, types.INT8, None)],
            [helper.make_tensor_value_info(row_sums, types.INT32, None)])
        by_position = name("int32_by_position")  # [B, passes x T, L]
        nodes += self._id_sums(by_id, ids, columns[0], body, by_position, name, node_name)
        sums = [by_position]
        if len(passes) > 1:
            sums = [name("first_pass"), name("second_pass")]
            nodes.append(helper.make_node("Split", [by_position], sums, axis=1, name=node_name("SplitPasses")))
        summed = None
        for index, accumulated in enumerate(sums):
            as_float = name(f"float_{index}")
            nodes.append(helper.make_node("Cast", [accumulated], [as_float], to=types.FLOAT, name=node_name(f"ToFloat{index}")))
            if index == 0:
                summed = as_float
                continue
            stepped, added = name(f"stepped_{index}"), name(f"passes_{index}")
            nodes += [helper.make_node("Mul", [as_float, self._shared("residual_step", np.float32(1 / RESIDUAL_STEPS))],
                                       [stepped], name=node_name(f"Step{index}")),
                      helper.make_node("Add", [summed, stepped], [added], name=node_name(f"AddPass{index}"))]
            summed = added
        scales, scale_row, by_id_scale = name("id_scales"), name("id_scale_row"), name("id_scaled")
        nodes += [helper.make_node("Gather", [id_scale, ids], [scales], name=node_name("IdScales")),  # [B, L]
                  helper.make_node("Unsqueeze", [scales, self._shared("axis_1", np.array([1], np.int64))], [scale_row],
                                   name=node_name("IdScaleRow")),  # [B, 1, L]
                  helper.make_node("Mul", [summed, scale_row], [by_id_scale], name=node_name("IdScaleMul")),
                  helper.make_node("Mul", [by_id_scale, row_scale], [node.output[0]], name=node_name("RowScaleMul"))]
        return nodes

    def _union_inputs(self) -> tuple[str, str]:
        """The graph's UNION_INPUTS, added as inputs on first use."""
        from onnx import helper

        present = {value.name for value in self.graph.input}
        for spec in UNION_SPECS:
            if spec.name not in present:
                self.graph.input.append(helper.make_tensor_value_info(spec.name, self.TensorProto.INT64, list(spec.dims)))
        return UNION_INPUTS

    def _id_sums(self, by_id: str, ids: str, columns: str, row_step, by_position: str, name,
                 node_name) -> list:
        """The int32 sums [B, P, L] of each row's ids (``ids`` [B, L]) against its positions
        (``columns`` [B, D, P]), computed one of two ways by the call's rows (an If): under
        :data:`UNION_HEAD_ROWS` rows, row by row (a Scan of ``row_step``: a row's matrix is
        gathered and multiplied while it is in the cache); from it on, once for the batch over
        the union of its rows' ids (decision 045): the union's rows of the matrix are gathered
        once and multiplied by every position of every row in one product [U, D] x [D, B x P],
        and each row then picks its own ids' sums. Integer sums are exact whatever the shapes,
        so both ways give every row the same bits as it gets alone (the export's check runs a
        batch this wide; tests/export/test_marian.py compares batch 8 with batch 1): the union
        is a way to compute, never what a row's output depends on, as issue 28 requires of a
        shortlist.

        The union and each list position's column in it are graph inputs (graph_specs
        UNION_INPUTS), made on the host when the rows change (decoding/shortlist.py
        ``union_feeds``, decision 049): found in the graph at every call (a vocabulary-wide
        mask, its NonZero and CumSum) they were about a tenth of a wide call. A -1 (a row's
        padding) stands for the last id, as for the row-by-row Gather; its value is masked."""
        from onnx import helper

        types = self.TensorProto
        axis_0 = self._shared("axis_0", np.array([0], np.int64))
        axis_1 = self._shared("axis_1", np.array([1], np.int64))
        axis_2 = self._shared("axis_2", np.array([2], np.int64))
        flat_shape = self._shared("flat_shape", np.array([-1], np.int64))
        keep = self._shared("broadcast_keep", np.array([1], np.int64))  # Expand: a dimension kept as it is
        stacked, by_row_out = name("int32"), name("int32_row_by_row")
        row_by_row = helper.make_graph(
            [helper.make_node("Scan", [ids, columns], [stacked], name=node_name("Rows"), body=row_step,
                              num_scan_inputs=2),  # [B, L, P]
             helper.make_node("Transpose", [stacked], [by_row_out], perm=[0, 2, 1],
                              name=node_name("ByPosition"))],  # [B, P, L]
            name("row_by_row"), [], [helper.make_tensor_value_info(by_row_out, types.INT32, None)])
        u = {k: name(k) for k in ("columns_of_ids", "union_matrix", "by_batch", "column_shape", "rows", "passes",
                                  "as_columns", "union_sums", "sums_shape", "by_union", "by_row", "index_shape",
                                  "index", "picked", "row_index")}
        ids_shape, row_count, wide = name("ids_shape"), name("ids_rows"), name("wide_call")
        union_ids, union_columns = self._union_inputs()
        n = helper.make_node
        once = helper.make_graph([
            # fed [output rows, L] as output_ids is: one row of every id serves every row
            n("Expand", [union_columns, ids_shape], [u["columns_of_ids"]], name=node_name("UnionColumns")),  # [B, L]
            n("Gather", [by_id, union_ids], [u["union_matrix"]], name=node_name("UnionMatrix")),  # [U, D]
            n("Transpose", [columns], [u["by_batch"]], perm=[1, 0, 2], name=node_name("UnionPositions")),  # [D, B, P]
            n("Shape", [columns], [u["column_shape"]], name=node_name("UnionColumnShape")),
            n("Slice", [u["column_shape"], axis_0, axis_1], [u["rows"]], name=node_name("UnionRows")),
            n("Slice", [u["column_shape"], axis_2, self._shared("axis_3", np.array([3], np.int64))], [u["passes"]],
              name=node_name("UnionPasses")),
            n("Reshape", [u["by_batch"], self._shared("columns_flat_shape", np.array([0, -1], np.int64))],
              [u["as_columns"]], name=node_name("UnionPositionsFlat")),  # [D, B x P]
            n("MatMulInteger", [u["union_matrix"], u["as_columns"],
                                self._shared("id_rows_zero_point", np.uint8(ID_ROWS_ZERO_POINT))],
              [u["union_sums"]], name=node_name("UnionMatMul")),  # [U, B x P]
            n("Concat", [flat_shape, u["rows"], u["passes"]], [u["sums_shape"]], axis=0,
              name=node_name("UnionSumsShape")),
            n("Reshape", [u["union_sums"], u["sums_shape"]], [u["by_union"]], name=node_name("UnionSums")),  # [U, B, P]
            n("Transpose", [u["by_union"]], [u["by_row"]], perm=[1, 2, 0], name=node_name("UnionByRow")),  # [B, P, U]
            n("Concat", [keep, u["passes"], keep], [u["index_shape"]], axis=0,
              name=node_name("UnionIndexShape")),  # [1, P, 1]: broadcast over the positions
            n("Unsqueeze", [u["columns_of_ids"], axis_1], [u["row_index"]],
              name=node_name("UnionRowIndex")),  # [B, 1, L]
            n("Expand", [u["row_index"], u["index_shape"]], [u["index"]], name=node_name("UnionIndex")),  # [B, P, L]
            n("GatherElements", [u["by_row"], u["index"]], [u["picked"]], axis=2, name=node_name("UnionPick")),
        ], name("union_of_rows"), [], [helper.make_tensor_value_info(u["picked"], types.INT32, None)])
        return [
            helper.make_node("Shape", [ids], [ids_shape], name=node_name("CallShape")),
            helper.make_node("Gather", [ids_shape, self._shared("scalar_0", np.array(0, np.int64))], [row_count],
                             name=node_name("CallRows")),
            helper.make_node("GreaterOrEqual", [row_count, self._shared("union_head_rows",
                                                                        np.array(UNION_HEAD_ROWS, np.int64))],
                             [wide], name=node_name("WideCall")),
            helper.make_node("If", [wide], [by_position], then_branch=once, else_branch=row_by_row,
                             name=node_name("IdSums")),
        ]

    def run(self):
        from onnx import helper

        rewritten = []
        replaced_weights: set[str] = set()
        for node in self.graph.node:
            head = self._shortlist_head(node) if node.op_type == "If" else None
            if head is not None:
                rewritten += head
                self.quantized += 1
                continue
            if not self._quantizable(node):
                rewritten.append(node)
                continue
            activation, weight = node.input
            base = (node.name or node.output[0]).strip("/").replace("/", "_")
            if self.two_pass:
                rewritten += self._two_pass_product(node, base)
                replaced_weights.add(weight)
                self.quantized += 1
                continue
            rows, row_scale = self._rows(activation, rewritten)
            quantized_weight, column_scale = self._weight(weight)
            replaced_weights.add(weight)
            accumulated, as_float, by_row = (self._name(f"{base}_{s}") for s in ("int32", "float", "row_scaled"))
            rewritten += [
                helper.make_node("MatMulInteger", [rows, quantized_weight,
                                                   self._shared("row_zero_point", np.uint8(A_ZERO_POINT))], [accumulated],
                                 name=self._name(f"{base}/MatMulInteger")),
                helper.make_node("Cast", [accumulated], [as_float], to=self.TensorProto.FLOAT,
                                 name=self._name(f"{base}/ToFloat")),
                helper.make_node("Mul", [as_float, row_scale], [by_row], name=self._name(f"{base}/RowScaleMul")),
                helper.make_node("Mul", [by_row, column_scale], [node.output[0]],
                                 name=self._name(f"{base}/ColumnScaleMul")),
            ]
            self.quantized += 1
        del self.graph.node[:]
        self.graph.node.extend(rewritten)
        if self.two_pass and self.quantized and not any(o.domain == "com.microsoft" for o in self.model.opset_import):
            self.model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        still_used = {name for node in self.graph.node for name in node.input}
        unused = [init for init in self.graph.initializer if init.name in replaced_weights and init.name not in
                  still_used]
        for init in unused:
            self.graph.initializer.remove(init)
        return self.model


def quantize_model(model, vocab_size: int, options: QuantizeOptions = QuantizeOptions(),
                   counts: dict[str, int] | None = None):
    """Rewrite ``model`` (an onnx ModelProto, changed in place and returned) to per-row (or
    two-pass) int8. Returns the model and the number of MatMuls made int8; ``counts``, if given,
    gets ``int8_grid_matrices`` added: two-pass weights that kept their own int8 grid."""
    rewriter = _Rewriter(model, vocab_size, options)
    rewriter.run()
    table_lookups_as_gather_elements(model)  # the int8 head's id scales, and bundles exported before the pass
    if counts is not None:
        counts["int8_grid_matrices"] = counts.get("int8_grid_matrices", 0) + rewriter.on_grid
    return model, rewriter.quantized


def write_dynamic_int8(src: Path, dst: Path, *, matmuls_only: bool = False, float_products: str | None = None) -> int:
    """The fp32 graph ``src`` with int8 products, written to ``dst``, by onnxruntime's own dynamic
    quantization (fused ``DynamicQuantizeMatMul``, int8 weights per column, 7-bit so that AVX2's
    int16 pair sums cannot saturate), not the per-row rewrite above.

    For a drafter (an fp32 bundle's ``drafter_int8``, an int8 bundle's drafter), which need not
    be lossless (its tokens are proposals the verifier checks): on the reference drafter it was
    the faster of the two with the same acceptance (README, drafter_int8); a row's drafts may
    change with its batch mates, never the output. For an int8 bundle's encoder (per-call): the
    runtime encodes one source per call, so nothing else is in its call (module docstring).

    ``matmuls_only`` (the encoder): the weight MatMuls alone, on the graph as exported. By
    default onnxruntime also quantizes the embedding (Gather) and, after its pre-processing,
    fuses differently; on the reference encoder that was 5% slower and further from fp32 (encoder
    output error 0.0097 of its largest value against 0.0079, median of 1,000 test sentences, a
    scratch timing). ``float_products`` (with ``matmuls_only``): products whose weight's name
    matches it stay float32 (QuantizeOptions.float_products). Returns the number of int8
    products (MatMulInteger) written."""
    import tempfile

    import onnx

    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    settings = {"weight_type": QuantType.QInt8, "per_channel": True, "reduce_range": True}
    with _without_preprocessing_advice():
        if matmuls_only:
            quantize_dynamic(src, dst, op_types_to_quantize=["MatMul"], extra_options={"MatMulConstBOnly": True},
                             nodes_to_exclude=_float_product_nodes(src, float_products), **settings)
        else:
            with tempfile.TemporaryDirectory(prefix=".dynamic-int8.", dir=dst.parent) as scratch:
                prepared = Path(scratch) / "prepared.onnx"
                quant_pre_process(str(src), str(prepared))  # shape inference, as onnxruntime's quantizer asks
                quantize_dynamic(prepared, dst, **settings)
    return sum(node.op_type == "MatMulInteger" for node in onnx.load(str(dst)).graph.node)


def _float_product_nodes(path: Path, float_products: str | None) -> list[str]:
    """The MatMul nodes of the graph at ``path`` whose weight's name matches ``float_products``."""
    if not float_products:
        return []
    import onnx

    pattern = re.compile(float_products)
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    return [node.name for node in graph.node
            if node.op_type == "MatMul" and node.input[1] in weights and pattern.search(node.input[1])]


class _PreprocessingAdvice(logging.Filter):
    """onnxruntime's quantize_dynamic logs "Please consider (to run) pre-processing before
    quantization" on the root logger for every graph it is given that its quant_pre_process did
    not tag. Here the advice never applies: the encoder's products are quantized on the graph as
    exported on purpose (see write_dynamic_int8), and the rest is pre-processed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(("Please consider to run pre-processing",
                                                   "Please consider pre-processing"))


@contextlib.contextmanager
def _without_preprocessing_advice():
    root, advice = logging.getLogger(), _PreprocessingAdvice()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)


def draft_agreement(reference, quantized, cases) -> float:
    """Share of the drafted ids two drafter sessions have in common on the export's drafter
    validation cases (:func:`~.validate.drafter_cases`): what int8 costs the drafter."""
    same = total = 0
    for case in cases:
        (ours,), (theirs,) = quantized.run(None, case.feeds), reference.run(None, case.feeds)
        same += int((ours == theirs).sum())
        total += ours.size
    return same / max(total, 1)


def _figures(reference: Driver, quantized: Driver, cases: list[Case], precision: str) -> dict:
    """Top-1 agreement and log-prob error of the converted verifier against the fp32 one.
    Small differences are the precision's and never fail; an inf or NaN where fp32 is finite
    does (ExportError: the activations overflowed)."""
    agree = positions = 0
    errors: list[np.ndarray] = []
    for case in cases:
        results = []
        for driver in (reference, quantized):
            encoded = driver.encode(case)
            cache = driver.prefill(case, encoded)
            results.append(driver.call(case, encoded, cache, case.new_ids, case.kept)[:2])
        (ref_lp, ref_ids), (q_lp, q_ids) = results
        overflowed = int((~np.isfinite(q_lp) & np.isfinite(ref_lp)).sum())
        if overflowed:
            raise ExportError(f"the {precision} verifier gives {overflowed} non-finite log-probs where the fp32 one "
                              f"gives finite ones: {OVERFLOW_ADVICE[precision]}")
        agree += int((ref_ids[..., 0] == q_ids[..., 0]).sum())
        positions += ref_ids[..., 0].size
        # log-prob of each candidate both graphs return, compared id by id
        match = q_ids[..., :, None] == ref_ids[..., None, :]  # [B, T, k(q), k(ref)]
        ref_at = np.where(match, ref_lp[..., None, :], 0.0).sum(-1)
        both = match.any(-1) & np.isfinite(q_lp) & np.isfinite(ref_at)
        errors.append(np.abs(q_lp - ref_at)[both])
    error = np.concatenate(errors) if errors else np.zeros(0)
    return {"positions": positions, "top1_agreement": round(agree / max(positions, 1), 6),
            "max_logprob_error": round(float(error.max()) if error.size else 0.0, 6),
            "mean_logprob_error": round(float(error.mean()) if error.size else 0.0, 6)}


def _draft_agreement(reference: tuple[Driver, object, object], quantized: tuple[Driver, object, object],
                     cases: list[Case], manifest: Manifest) -> float:
    """Share of drafted ids the quantized drafter (on the quantized encoder) has in common with
    the fp32 one (on the fp32 encoder): drafts only change speed, never the output."""
    from ..runtime.decoding.gad import Drafter

    rng = np.random.default_rng(2)
    same = total = 0
    for case in cases[:: len(PAST_LENS) * len(NEW_LENS)]:  # one per batch size
        prefixes = [[manifest.decoder_start_token_id] + rng.integers(3, manifest.vocab_size, size=n).tolist()
                    for n in rng.integers(0, 9, size=len(case.ids))]
        drafts = []
        for driver, session, source in (reference, quantized):  # (driver, drafter, drafter_source or None)
            drafter = Drafter(session, int(manifest.draft_k or 0), int(manifest.mask_token_id or 0),
                              int(manifest.draft_window or 0), source,
                              source_positions=manifest.draft_positions == "source",
                              takes_output_ids=drafter_takes_output_ids(manifest))
            memory = drafter.memory(driver.encode(case)["hidden"], case.mask)
            sources = [ids[mask == 1] for ids, mask in zip(case.ids, case.mask)]
            every_id = np.arange(manifest.vocab_size, dtype=np.int64)[None]  # a shortlist drafter's output_ids
            drafts.append(drafter.draft(prefixes, sources, memory, case.mask, manifest.pad_token_id, every_id))
        same += int((drafts[0] == drafts[1]).sum())
        total += drafts[0].size
    return round(same / max(total, 1), 6)


# ------------------------------------------------------------------ a bundle


def _load_graph(path: Path):
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    # a bundle is untrusted input: a graph that names external data could read outside it
    if any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer):
        raise ExportError(f"{path.name} keeps its weights in external data files; aggdec quantize reads graphs "
                          "that hold their weights, as `aggdec export` writes them.")
    return model


OVERFLOW_ADVICE = {
    "int8": "a quantization scale is broken; please report it with the checkpoint's name.",
    "fp16": "the checkpoint's activations overflow float16 (largest finite value 65504; T5 checkpoints are known "
            "to). Use the fp32 bundle on CUDA, or --precision int8 for the CPU.",
}
# what each precision writes: the manifest's quantization scheme and how step 1 says it
SCHEMES = {"int8": ("per-row-int8", "per-row int8 activations, per-column int8 weights"),
           "fp16": ("fp16", "float16 weights and activations; norms, softmax, log-softmax and top-k in float32")}


TWO_PASS_SCHEME = ("two-pass-int8", "two 7-bit int8 passes per activation row (the value and its rounding "
                   "residual), 8-bit weights (their own int8 grid where they have one)")


def _check_options(precision: str, options: QuantizeOptions) -> None:
    """Refuse option combinations this module does not write, naming the option."""
    if options.activations not in ACTIVATION_SCHEMES:
        raise ExportError(f"int8 activations are quantized {', or '.join(ACTIVATION_SCHEMES)}, not "
                          f"{options.activations!r}.")
    if precision != "int8" and (options.activations != "per-row" or options.float_products):
        raise ExportError(f"activations={options.activations!r} and float_products are int8 options; an "
                          f"{precision} bundle converts every product.")
    if options.activations == "two-pass" and options.encoder == "per-call":
        raise ExportError("two-pass activations quantize the encoder per row too (onnxruntime's per-call "
                          "quantization has neither the second pass nor 8-bit weights): pass encoder='per-row' "
                          "(--encoder-quantization per-row).")
    if options.float_products:
        if len(options.float_products) > MAX_TEXT_LEN:  # the manifest records it: refused there after converting
            raise ExportError(f"float_products is {len(options.float_products)} characters long; the manifest keeps "
                              f"a pattern of at most {MAX_TEXT_LEN}.")
        try:
            re.compile(options.float_products)
        except re.error as exc:
            raise ExportError(f"float_products {options.float_products!r} is not a regular expression: "
                              f"{exc}.") from None


def quantize_bundle(src_dir: str | Path, out_dir: str | Path, *, precision: str = "int8", force: bool = False,
                    options: QuantizeOptions = QuantizeOptions(),
                    progress: Callable[[str], None] | None = print) -> Manifest:
    """Write a ``precision`` copy of the fp32 bundle ``src_dir`` to ``out_dir``: int8 for the
    CPU (the module docstring) or fp16 for CUDA (``half.py``).

    The source bundle is checked like any bundle (schema, hashes, no links). The new bundle is
    checked before it is written: the verifier must give each position bitwise the same result
    in a block as alone (else ValidationError, nothing written), and the manifest records the
    top-1 agreement and log-prob error against the fp32 graphs on the export validation shapes.
    """
    from .safety import guarded

    return guarded(_quantize_bundle)(src_dir, out_dir, precision=precision, force=force, options=options,
                                     progress=progress)


def _convert(precision: str, name: str, src: Path, dst: Path, manifest: Manifest, options: QuantizeOptions,
             counts: dict[str, int]) -> int:
    """Write graph ``name`` of the bundle at ``precision``; returns its converted matrix products."""
    import onnx

    model = _load_graph(src)  # refuses external data, for every graph
    if precision == "fp16":
        from .half import every_position_head, half_model

        if name in VERIFIER_GRAPHS:
            isolate_positions(model)  # for bundles exported before the rewrite (idempotent)
            every_position_head(model, manifest.vocab_size)  # (the spec: _with_every_position_head)
        model, count = half_model(model, manifest.vocab_size, options.output_projection)
    elif name in ("drafter", "drafter_source"):  # proposals only: onnxruntime's dynamic quantization will do
        return write_dynamic_int8(src, dst)
    elif name == "encoder" and options.encoder == "per-call":  # the runtime gives it one source per call
        return write_dynamic_int8(src, dst, matmuls_only=True, float_products=options.float_products)
    else:
        model, count = quantize_model(model, manifest.vocab_size, options, counts)
        if name in VERIFIER_GRAPHS:
            isolate_positions(model)
            _prune(model, (KEPT_ROWS,))
    onnx.save(model, str(dst))
    return count


# a shortlist verifier's kept per-row output matrices (graph_specs.takes_output_rows): its int8
# head gathers int8 rows itself, so an int8 bundle's verifier reads none and its encoder makes none
KEPT_ROWS = "output_rows"
KEPT_ROWS_IDS = "output_ids"  # what the encoder gathers them by


def _names_read(node) -> set[str]:
    """Every name ``node`` reads, its subgraphs' outer-scope names included."""
    read = {name for name in node.input if name}
    for attr in node.attribute:
        for sub in (attr.g, *attr.graphs) if attr.HasField("g") else attr.graphs:
            for inner in sub.node:
                read |= _names_read(inner)
    return read


def _prune(model, inputs: tuple[str, ...] = ()) -> None:
    """Drop the nodes of ``model``'s graph that no output needs (in place), then the graph
    inputs ``inputs`` and the initializers that nothing reads any more."""
    graph = model.graph
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed |= _names_read(node)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    for item in [i for i in graph.input if i.name in inputs and i.name not in needed]:
        graph.input.remove(item)
    for item in [i for i in graph.initializer if i.name not in needed]:
        graph.initializer.remove(item)


def _drop_kept_rows_output(path: Path) -> None:
    """The encoder at ``path`` without its ``output_rows`` output, the nodes only that output
    needed and the ``output_ids`` input they read (once the verifier's head no longer reads kept
    rows): the runtime then neither feeds nor keeps them (graph_specs.takes_output_rows)."""
    import onnx

    model = onnx.load(str(path))
    outputs = [o for o in model.graph.output if o.name != KEPT_ROWS]
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    _prune(model, (KEPT_ROWS_IDS,))
    onnx.save(model, str(path))


def _without_kept_rows(graphs: dict) -> dict:
    """The graphs' specs without the kept rows: the verifiers' ``output_rows`` input, the
    encoder's ``output_ids`` input and ``output_rows`` output."""
    import dataclasses

    def without(tensors, *names):
        return tuple(t for t in tensors if t.name not in names)

    return {name: dataclasses.replace(spec, inputs=without(spec.inputs, KEPT_ROWS, *(
                                          (KEPT_ROWS_IDS,) if name == "encoder" else ())),
                                      outputs=without(spec.outputs, KEPT_ROWS))
            for name, spec in graphs.items()}


def _with_every_position_head(graphs: dict, vocab_size: int) -> dict:
    """The specs with the argmax graph's head over every block position, as
    half.every_position_head leaves an fp16 one: no HEAD_POSITIONS, logits [batch, new_len, vocab]."""
    import dataclasses

    from ..runtime.graph_specs import HEAD_POSITIONS, LOGITS_OUTPUT

    spec = graphs.get("verifier_argmax")
    if spec is None or HEAD_POSITIONS not in spec.input_names():
        return graphs
    outputs = tuple(dataclasses.replace(t, dims=("batch", "new_len", vocab_size)) if t.name == LOGITS_OUTPUT else t
                    for t in spec.outputs)
    return {**graphs, "verifier_argmax": dataclasses.replace(
        spec, inputs=tuple(t for t in spec.inputs if t.name != HEAD_POSITIONS), outputs=outputs)}


def _with_union_inputs(graphs: dict) -> dict:
    """The verifiers' specs with the int8 union head's inputs (graph_specs.UNION_INPUTS)."""
    import dataclasses

    return {name: dataclasses.replace(spec, inputs=(*spec.inputs, *UNION_SPECS)) if name in VERIFIER_GRAPHS else spec
            for name, spec in graphs.items()}


def _quantize_bundle(src_dir, out_dir, *, precision, force, options, progress) -> Manifest:
    import dataclasses

    import onnx

    from ..runtime.bundle_schema import ACTIVATION_DTYPES, ENCODER_QUANTIZATION
    from ..runtime.session import require_onnxruntime
    from .safety import check_destination, make_temp, publish, remove_temp

    if precision not in SCHEMES:
        raise ExportError(f"precision {precision!r} is not one aggdec quantize writes; choose one of: "
                          f"{', '.join(SCHEMES)}.")
    if options.encoder not in ENCODER_QUANTIZATION:
        raise ExportError(f"the encoder's int8 activations are quantized {', or '.join(ENCODER_QUANTIZATION)}, not "
                          f"{options.encoder!r}.")
    _check_options(precision, options)
    ort = require_onnxruntime()
    src, out = Path(src_dir), Path(out_dir)
    started = time.perf_counter()
    manifest = load_manifest(src)
    if manifest.precision != "fp32":
        raise ExportError(f"{str(src)!r} is already converted ({manifest.precision}); convert the fp32 bundle it was "
                          "made from.")
    check_destination(src, out, force)
    # The bundle is untrusted: the converter reads its graphs with onnx and onnxruntime by path,
    # whose own errors on a graph that is not what the manifest says (random bytes, another
    # graph's IO, an operator of an unknown domain) were tracebacks, and whose reads follow
    # external-data paths out of the bundle. The runtime's load refuses all of that as a
    # BundleError (and reads external data only from the files the manifest lists): nothing
    # is converted that aggdec itself would not decode with.
    from ..runtime.loader import open_bundle

    open_bundle(src, device="cpu", threads=1)
    say = progress or (lambda message: None)
    scheme, described = SCHEMES[precision]
    if precision == "int8" and options.activations == "two-pass":
        scheme, described = TWO_PASS_SCHEME
    if options.float_products:
        described += f"; products whose weight matches {options.float_products!r} stay float32"
    # the runtime will encode one source per call (Manifest.encodes_one_source_per_call): so do the checks
    per_call_encoder = precision == "int8" and options.encoder == "per-call"
    if per_call_encoder:
        described += "; the encoder's activations per call, one source per call"
    tmp = None
    try:
        tmp = make_temp(out)
        # an fp32 bundle's int8 copy of its drafter is not carried over: the new bundle's drafter is converted
        graphs = {name: spec for name, spec in manifest.graphs.items() if name != "drafter_int8"}
        say(f"[1/3] converting {', '.join(graphs)} to {precision} ({described})")
        grid: dict[str, int] = {}
        counts = {name: _convert(precision, name, src / spec.file, tmp / spec.file, manifest, options, grid)
                  for name, spec in graphs.items()}
        new_graphs = _with_activation_type(graphs, precision)
        if precision == "fp16":
            new_graphs = _with_every_position_head(new_graphs, manifest.vocab_size)
        converted_inputs = {i.name for i in _load_graph(tmp / graphs["verifier"].file).graph.input}
        if KEPT_ROWS in manifest.graphs["verifier"].input_names() and KEPT_ROWS not in converted_inputs:
            _drop_kept_rows_output(tmp / graphs["encoder"].file)
            new_graphs = _without_kept_rows(new_graphs)
        if UNION_INPUTS[0] in converted_inputs:
            new_graphs = _with_union_inputs(new_graphs)
        shutil.copyfile(src / TOKENIZER_FILE, tmp / TOKENIZER_FILE)
        if manifest.segmentation == SENTENCEPIECE:  # the tokenizer's other half (runtime/sentencepiece.py)
            shutil.copyfile(src / SENTENCEPIECE_FILE, tmp / SENTENCEPIECE_FILE)
        if manifest.shortlist is not None:  # the table the runtime builds each row's output ids from
            shutil.copyfile(src / manifest.shortlist["file"], tmp / manifest.shortlist["file"])

        say(f"[2/3] checking the {precision} verifier: each position alone == the same position in a block")
        # an int8 shortlist head multiplies the union of its rows' ids from UNION_HEAD_ROWS rows
        # on (_Rewriter._id_sums): a batch that wide is checked too
        union_head = precision == "int8" and manifest.shortlist is not None and options.output_projection
        cases = validation_cases(manifest, batches=BATCHES + (UNION_HEAD_ROWS,) if union_head else BATCHES)
        reference = {name: cpu_session(ort, src / spec.file) for name, spec in graphs.items()}
        converted = {name: cpu_session(ort, tmp / spec.file) for name, spec in graphs.items()}
        if manifest.shortlist is not None:
            # a shortlist verifier takes each row's output ids: both are fed the same -1 padded
            # per-row lists of different lengths, as the runtime feeds them (its output projection
            # gathers those rows of the matrix, so it is not a constant product and stays float)
            from .shortlist_feeds import RowShortlists

            for sessions in (reference, converted):
                for name in VERIFIER_GRAPHS:  # both heads get the same lists (seeded by the row count)
                    if name in sessions:
                        sessions[name].session = RowShortlists(sessions[name].session, manifest.vocab_size)
        ref_driver = Driver(reference["encoder"], reference["verifier"], manifest)
        new_driver = Driver(converted["encoder"], converted["verifier"], manifest, ACTIVATION_DTYPES[precision],
                            per_source=per_call_encoder)
        figures = _figures(ref_driver, new_driver, cases, precision)  # refuses non-finite log-probs first
        checked = check_verifier_graphs(converted["encoder"], {name: converted[name] for name in VERIFIER_GRAPHS
                                                               if name in converted},
                                        dataclasses.replace(manifest, graphs=new_graphs), cases,
                                        ACTIVATION_DTYPES[precision], per_call_encoder)
        say(f"      {checked} positions bitwise equal")
        figures["draft_agreement"] = None
        if "drafter" in graphs:
            figures["draft_agreement"] = _draft_agreement(
                (ref_driver, reference["drafter"], reference.get("drafter_source")),
                (new_driver, converted["drafter"], converted.get("drafter_source")), cases, manifest)
        say(f"      against the fp32 graphs: top-1 agreement {figures['top1_agreement']:.4f}, log-prob error "
            f"max {figures['max_logprob_error']:.4f} mean {figures['mean_logprob_error']:.4f}"
            + (f", drafts in common {figures['draft_agreement']:.4f}" if figures["draft_agreement"] is not None
               else ""))

        say("[3/3] writing tokenizer and manifest")
        files = hash_files(tmp)  # every file written, external data included
        quantization = {"scheme": scheme, "reference": "fp32 graphs",
                        **({"encoder": options.encoder} if precision == "int8" else {}),
                        "output_projection": options.output_projection,
                        "quantized_matmuls": int(sum(counts.values())), **figures,
                        **({"float_products": options.float_products} if options.float_products else {}),
                        **({"int8_grid_matrices": grid.get("int8_grid_matrices", 0)}
                           if options.activations == "two-pass" else {})}
        exporter = {**manifest.exporter, "onnx": onnx.__version__, "quantized_with_onnxruntime": ort.__version__}
        new = dataclasses.replace(manifest, precision=precision, quantization=quantization, files=files,
                                  exporter=exporter, graphs=new_graphs)
        publish(tmp, out, new.to_json())
    except BaseException:
        remove_temp(tmp)
        raise
    say(f"done in {time.perf_counter() - started:.1f}s: {out} (manifest sha256 {manifest_digest(out)})")
    return new


def _with_activation_type(graphs: dict, precision: str) -> dict:
    """The graphs' specs with their float32 tensors in the precision's activation type, as the
    converted graphs have them (top_logprobs stays float32: half.FP32_OUTPUTS)."""
    import dataclasses

    from ..runtime.bundle_schema import ACTIVATION_DTYPES
    from .half import FP32_OUTPUTS

    act = ACTIVATION_DTYPES[precision]

    def retype(tensors):
        return tuple(dataclasses.replace(t, dtype=act) if t.dtype == "float32" and t.name not in FP32_OUTPUTS else t
                     for t in tensors)

    return {name: dataclasses.replace(spec, inputs=retype(spec.inputs), outputs=retype(spec.outputs))
            for name, spec in graphs.items()}
