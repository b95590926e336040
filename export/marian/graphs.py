"""The encoder and verifier graphs of a Marian model (``model.py``), for the shared exporter.

A self-attention decoder (OPUS-MT's) is the shared attention verifier (``export/graphs.py``)
given Marian's parts. An SSRU decoder gets :class:`RecurrentVerifierGraph`, whose own cache is a
recurrent state per position (cache kind "recurrent", ``runtime/decoding/cache.py``): a call
starts each row from the state at its last kept position, computes the block's states one
position after the other, writes every one of them at its position, and goes on with
cross-attention and the FFN as a self-attention decoder does.

Why the recurrence is an ONNX Scan: the tracer would unroll a Python loop at the example's
block length, and the closed form (cumulative sums of log f) has a cancellation error that
grows with the block, so a block's states would not be bitwise those of its positions one at
a time. :class:`_Recurrence` is traced as a placeholder node and :func:`recurrence_as_scan`
replaces it by a Scan whose body is c = f * c + u: the same two float operations at every step,
whatever the block length, which is what makes a block equal its positions alone. The gate is
sigmoid(x Wf + bf) itself, never exp(logsigmoid): a saturated gate is exactly 0 or 1, not NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..graphs import (AttentionParts, DecoderLayerParts, DecoderParts, _merge_heads, _split_heads, _WriteCache,
                      candidates, float32_logits, head_rows)
from ...runtime.decoding.cache import KEYS_TRANSPOSED
from ..positions import replace_placeholders
from ..shortlist_head import ids_at, shortlist_logits
from .model import MarianModel, recur

RECURRENCE_DOMAIN = "aggdec.marian"
RECURRENCE_OP = "Recurrence"


class _Recurrence(torch.autograd.Function):
    """c_t = f_t * c_{t-1} + u_t over axis 1, from c_0: traced as one placeholder node."""

    @staticmethod
    def forward(ctx, forget: Tensor, update: Tensor, state: Tensor) -> Tensor:  # noqa: ANN001
        return recur(forget, update, state)

    @staticmethod
    def symbolic(g, forget, update, state):  # noqa: ANN001, ANN205 - the TorchScript exporter's signature
        out = g.op(f"{RECURRENCE_DOMAIN}::{RECURRENCE_OP}", forget, update, state)
        out.setType(forget.type())
        return out


def recurrence_as_scan(model) -> int:
    """Replace every placeholder recurrence node of ``model`` (an onnx ModelProto) by a Scan
    computing c = f * c + u step by step along axis 1; returns how many were replaced."""
    from onnx import TensorProto, helper

    def scan(node, index: int):
        forget, update, state = node.input
        base = f"recurrence_{index}"
        body = helper.make_graph(
            [helper.make_node("Mul", ["f_t", "c_prev"], ["kept"]),
             helper.make_node("Add", ["kept", "u_t"], ["c_next"]),
             helper.make_node("Identity", ["c_next"], ["c_out"])],
            f"{base}_step",
            [helper.make_tensor_value_info("c_prev", TensorProto.FLOAT, None),
             helper.make_tensor_value_info("f_t", TensorProto.FLOAT, None),
             helper.make_tensor_value_info("u_t", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("c_next", TensorProto.FLOAT, None),
             helper.make_tensor_value_info("c_out", TensorProto.FLOAT, None)],
        )
        return helper.make_node(
            "Scan", [state, forget, update], [f"{base}_last", node.output[0]], name=f"/{base}/Scan",
            body=body, num_scan_inputs=2, scan_input_axes=[1, 1], scan_output_axes=[1])

    return replace_placeholders(model, RECURRENCE_DOMAIN, RECURRENCE_OP, scan)


def attention_parts(model: MarianModel) -> DecoderParts:
    """A self-attention Marian decoder as the shared verifier's parts (post-norm, no final norm)."""

    def parts(attention) -> AttentionParts:
        return AttentionParts(attention.q, attention.k, attention.v, attention.o, attention.scaling)

    def ffn(block):
        def run(x: Tensor) -> Tensor:
            hidden = block.w1(x)
            hidden = hidden * torch.sigmoid(hidden) if block.swish else torch.relu(hidden)
            return block.w2(hidden)
        return run

    layers = []
    for layer in model.decoder_layers:
        self_attention = layer.self_attention if layer.self_attention is not None else layer.context
        layers.append(DecoderLayerParts(
            self_attn=parts(self_attention), cross_attn=parts(layer.context), self_norm=self_attention.norm,
            cross_norm=layer.context.norm, ffn_norm=layer.ffn.norm, ffn=ffn(layer.ffn)))

    def cross_kv(index: int, hidden: Tensor) -> tuple[Tensor, Tensor]:
        context = model.decoder_layers[index].context
        return context.k(hidden), context.v(hidden)

    config = model.config
    return DecoderParts(layers=layers, num_heads=config.heads, head_dim=config.head_dim, pre_norm=False,
                        embed=model.target_embedding, position_bias=None, final_norm=None, logits=model.logits,
                        cross_kv=cross_kv)


class ShortlistEncoderGraph(nn.Module):
    """The encoder graph of a shortlist bundle: the shared encoder's outputs, then
    ``output_rows`` [rows, L, D], the rows of the output matrix that ``output_ids`` [rows, L]
    names (-1 pads: row 0, whose logit the verifier's -inf bias hides).

    Why in the encoder: a row's shortlist, and so its gathered matrix, is fixed for its whole
    output, and the encoder runs once per row when it is admitted; the runtime keeps the matrix
    per slot beside the cross keys and values, and the verifier multiplies it every call without
    gathering it (the gather was about a quarter of a batch-16 verifier call). ``output_ids`` is
    optional in the graph (:func:`optional_output_ids`), so callers that encode alone still can."""

    def __init__(self, encoder: nn.Module, model: MarianModel) -> None:
        super().__init__()
        self.encoder = encoder
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, output_ids: Tensor) -> tuple[Tensor, ...]:
        return (*self.encoder(input_ids, attention_mask), self.model.output_weight[torch.clamp(output_ids, min=0)])


def optional_output_ids(model) -> None:
    """Give the traced :class:`ShortlistEncoderGraph` (an onnx ModelProto) a default for its
    ``output_ids`` input, an empty [1, 0] (no rows to gather), so that it may be left out."""
    from onnx import TensorProto, helper

    model.graph.initializer.append(helper.make_tensor("output_ids", TensorProto.INT64, [1, 0], []))


class RecurrentVerifierGraph(nn.Module):
    """T new tokens after per-row recurrent states -> top-K log-probs/ids per position and the states written."""

    def __init__(self, model: MarianModel, top_k: int, suppressed_ids: tuple[int, ...], shortlist: bool,
                 head: str = "top_k", output_rows: bool = False, cross_key_layout: str = KEYS_TRANSPOSED) -> None:
        """``shortlist``: the graph takes ``output_ids`` [rows or 1, L], each row's allowed output ids
        (-1 pads a row's list; [1, V] of every id decodes over the whole vocabulary), and projects
        onto those rows of the output matrix only. ``output_rows``: it also takes those rows of the
        matrix already gathered, [rows, L, D] (:class:`ShortlistEncoderGraph`), or an empty
        [1, 0, D] to gather them itself. ``cross_key_layout``: the cross keys' (Manifest.cross_key_layout)."""
        super().__init__()
        self.model = model  # registered so the tracer sees its weights as parameters, not constants
        self.top_k = top_k
        self.head = head  # what it returns of each position (export/graphs.py candidates)
        self.shortlist = shortlist
        self.output_rows = output_rows
        self.keys_transposed = cross_key_layout == KEYS_TRANSPOSED
        bias = torch.zeros(model.config.target_vocab)
        bias[list(suppressed_ids)] = float("-inf")
        self.register_buffer("suppress_bias", bias, persistent=False)

    def forward(self, input_ids: Tensor, past_lengths: Tensor, *buffers: Tensor) -> tuple[Tensor, ...]:
        """``buffers``: per layer its state buffer [B, H, C, Dh]; then per layer cross key (in the
        bundle's cross_key_layout), cross value; then the encoder attention mask [B, S]; then, with a shortlist, ``output_ids`` (and
        with ``output_rows``, that input); without one, the "logits" head's ``head_positions``
        (export/graphs.py :func:`head_rows`)."""
        model = self.model
        config = model.config
        layers, heads, head_dim = config.decoder_layers, config.heads, config.head_dim
        states_in, cross_kv, encoder_attention_mask = buffers[:layers], buffers[layers : 3 * layers], buffers[3 * layers]
        batch, new_len = input_ids.shape[0], input_ids.shape[1]
        positions = past_lengths.unsqueeze(1) + torch.arange(new_len, dtype=torch.int64).unsqueeze(0)  # [B, T]
        rows = torch.arange(batch, dtype=torch.int64)
        # [B, H, T, 3] = (row, head, position) by broadcasting sums: the same ids as stacking
        # expanded copies, without the tracer's shape arithmetic for each expand (a batch-1 call
        # is mostly per-node cost; export/shape_folding.py)
        unit = torch.eye(3, dtype=torch.int64)
        index = (rows.view(-1, 1, 1, 1) * unit[0] + torch.arange(heads, dtype=torch.int64).view(1, -1, 1, 1) * unit[1]
                 + positions.unsqueeze(1).unsqueeze(-1) * unit[2])
        last = torch.clamp(past_lengths - 1, min=0)  # the state each row goes on from (none at length 0)
        started = (past_lengths > 0).view(-1, 1)
        neg = torch.finfo(torch.float32).min
        cross_bias = ((1 - encoder_attention_mask).to(torch.float32) * neg)[:, None, None, :]

        hidden = model.target_embedding(input_ids, positions)
        written: list[Tensor] = []
        # each row's state at its last kept position, read as [B, H, 1, Dh] by GatherElements:
        # indexing buffer[rows, :, last, :] traces into a Transpose of the whole buffer (a copy
        # of every row's every position per layer and call, about 5% of a batch-16 call)
        last_position = last.view(-1, 1, 1, 1) + torch.zeros(1, heads, 1, head_dim, dtype=torch.int64)
        for layer_index, layer in enumerate(model.decoder_layers):
            buffer = states_in[layer_index]
            previous = torch.gather(buffer, 2, last_position).reshape(batch, heads * head_dim)
            previous = torch.where(started, previous, 0.0)  # where, not a product: 0 * NaN is NaN
            forget, update = layer.ssru.inputs(hidden)
            states = _Recurrence.apply(forget, update, previous)  # [B, T, D]
            written.append(_WriteCache.apply(buffer, index, _split_heads(states, heads, head_dim)))
            hidden = layer.ssru.output(hidden, states)
            context = layer.context
            q = _split_heads(context.q(hidden), heads, head_dim)
            keys = cross_kv[2 * layer_index]  # K^T already, or K (Manifest.cross_key_layout)
            keys = keys if self.keys_transposed else keys.transpose(-1, -2)
            scores = torch.matmul(q, keys) * context.scaling + cross_bias
            attended = torch.matmul(torch.softmax(scores, dim=-1), cross_kv[2 * layer_index + 1])
            hidden = context.norm(hidden + context.o(_merge_heads(attended)))
            hidden = layer.ffn(hidden)
        if self.shortlist:
            rows = buffers[3 * layers + 2] if self.output_rows else None
            return (*self._shortlisted(hidden, buffers[3 * layers + 1], rows), *written)
        # <unk> masked after the log-softmax, as Marian's beam search does (suppressWords on the
        # path scores): log-probs normalized over every id, what Marian's beam scores sum
        if self.head == "logits":  # its positions alone: [1, N, D]
            hidden = head_rows(hidden, buffers[3 * layers + 1])
        logits = float32_logits(model.logits(hidden))
        return (*candidates(logits, self.top_k, self.head, self.suppress_bias), *written)

    def _shortlisted(self, hidden: Tensor, output_ids: Tensor, rows: Tensor | None) -> tuple[Tensor, ...]:
        """The candidates over each row's shortlist: logits of the gathered output rows only.

        The candidates are chosen on the logits, which do not depend on how long the padded
        lists of a call are; their log-probs are then read from the row's log-softmax over its
        list (Marian normalizes over the shortlist), ``<unk>`` masked after it as Marian does."""
        model = self.model
        logits, row_ids = shortlist_logits(hidden, output_ids, model.output_weight,
                                           model.output_bias, rows=rows)  # [B, T, L], [B, L]
        banned = self.suppress_bias[torch.clamp(row_ids, min=0)].unsqueeze(1)  # [B, 1, L]; padding is -inf already
        chosen = candidates(logits, self.top_k, self.head, banned)  # over the row's list: local indices
        if self.head == "argmax":
            return (ids_at(row_ids, chosen[0]),)
        top_logprobs, local = chosen
        return top_logprobs, ids_at(row_ids, local)
