"""Torch modules that are traced into the bundle's encoder and verifier graphs.

The verifier is written here rather than traced from transformers' own decoder because its
cache contract is ours (format 2, see ``runtime/decoding/cache.py``):

- each decoder layer has a self-attention key buffer and value buffer of fixed capacity,
  ``[batch, heads, capacity, head_dim]``, owned by the runtime and passed in by reference;
- a call takes T new tokens per row and each row's valid cache length (``past_lengths``); it
  writes the new tokens' keys/values at positions ``past_lengths[b] .. + T - 1`` of row b with
  one ScatterND per buffer, and returns the buffer as ``*_out``. The runtime binds that output
  to the input's own memory, and onnxruntime's ScatterND then writes in place (it skips its
  copy when input and output are one buffer): a call's cache traffic is the new tokens only;
- attention reads the whole buffer under a mask (key position <= query position), so slots
  past a row's length (stale or rejected drafts) are never seen and need no clearing;
- the cross K/V of every layer is its own input, written once per request by the encoder;
  the keys already transposed for Q.K^T (``cross_key_layout``, ``runtime/decoding/cache.py``),
  so that no verifier call transposes them again.

Rejected draft positions are dropped by passing a shorter length next time: the next write
lands on them. Nothing of the cache crosses to the host, so on CUDA it stays on the device.

Family differences (embeddings, norms, position bias, output head) come in as
:class:`DecoderParts` from ``families.py``; the layer arithmetic is shared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..runtime.decoding.cache import KEYS_TRANSPOSED


@dataclass
class AttentionParts:
    q: nn.Module
    k: nn.Module
    v: nn.Module
    o: nn.Module
    scaling: float


@dataclass
class DecoderLayerParts:
    self_attn: AttentionParts
    cross_attn: AttentionParts
    self_norm: nn.Module
    cross_norm: nn.Module
    ffn_norm: nn.Module
    ffn: Callable[[Tensor], Tensor]  # the feed-forward block without its norm and residual


@dataclass
class DecoderParts:
    layers: list[DecoderLayerParts]
    num_heads: int
    head_dim: int
    pre_norm: bool  # pre-LN (mBART, T5) or post-LN (Marian, BART)
    embed: Callable[[Tensor, Tensor], Tensor]  # (ids [B,T], positions [B,T]) -> [B,T,D]
    # (query positions [B,T], key positions [K]) -> additive bias [B,H,T,K], or None
    position_bias: Callable[[Tensor, Tensor], Tensor] | None
    final_norm: nn.Module | None
    logits: Callable[[Tensor], Tensor]  # [B,T,D] -> [B,T,V]
    cross_kv: Callable[[int, Tensor], tuple[Tensor, Tensor]]  # (layer, encoder_hidden) -> (k, v) [B,S,H*Dh]


def _split_heads(x: Tensor, num_heads: int, head_dim: int) -> Tensor:
    batch, length = x.shape[0], x.shape[1]
    return x.reshape(batch, length, num_heads, head_dim).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    batch, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_dim)


class _WriteCache(torch.autograd.Function):
    """``cache`` with ``update`` written at ``index`` ([..., 3] = batch, head, position): ScatterND.

    Traced as one ONNX ScatterND so that onnxruntime can run it in place on the bound buffer
    (its tracing of ``index_put`` adds copies and reshapes around it).
    """

    @staticmethod
    def forward(ctx, cache: Tensor, index: Tensor, update: Tensor) -> Tensor:  # noqa: ANN001
        out = cache.clone()
        out[index[..., 0], index[..., 1], index[..., 2]] = update
        return out

    @staticmethod
    def symbolic(g, cache, index, update):  # noqa: ANN001, ANN205 - the TorchScript exporter's signature
        return g.op("ScatterND", cache, index, update)


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scaling: float, keys_transposed: bool = False) -> Tensor:
    """softmax(Q.K^T * scaling + bias).V; ``keys_transposed``: ``k`` is K^T already ([.., Dh, S])."""
    scores = torch.matmul(q, k if keys_transposed else k.transpose(-1, -2)) * scaling + bias
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def cross_key_out(key: Tensor, cross_key_layout: str) -> Tensor:
    """A cross key [B, H, S, Dh] in the bundle's ``cross_key_layout`` (decoding/cache.py cross_dims)."""
    return key.transpose(-1, -2) if cross_key_layout == KEYS_TRANSPOSED else key


def float32_logits(logits: Tensor) -> Tensor:
    """``logits`` as float32, with no Cast traced where they are float32 already: the exporter
    writes ``.to(float32)`` of a float32 tensor as a Cast, and where the argmax graph returns the
    logits that Cast is a copy of every position's vocabulary-wide row that onnxruntime keeps (it
    drops a Cast to the same type only inside a graph, not before an output)."""
    return logits if logits.dtype == torch.float32 else logits.to(torch.float32)


def head_rows(hidden: Tensor, head_positions: Tensor) -> Tensor:
    """The decoder's output [B, T, D] at ``head_positions`` (indexes into its B x T positions,
    graph_specs HEAD_POSITIONS) alone, [1, N, D]: the "logits" head's input, so that padding past
    a row's block costs no vocabulary head. A weight product's summation order does not depend
    on its row count (positions.py), which the export's checks prove for these rows too."""
    width = int(hidden.shape[-1])  # a constant of the trace: no shape arithmetic in the graph
    return hidden.reshape(1, -1, width).index_select(1, head_positions)


def candidates(logits: Tensor, top_k: int, head: str, banned: Tensor | None = None) -> tuple[Tensor, ...]:
    """What a verifier graph returns of each position's logits [..., V], by ``head``
    (runtime/graph_specs.py VERIFIER_GRAPHS, ARGMAX_HEADS): "top_k", the top-K log-probs and
    ids; "argmax", the best id alone; "logits", the (masked) logits the other two choose on,
    whose argmax the runtime takes (decision 039).

    Both choose on the logits, never on the log-probs: log-softmax subtracts one constant from
    every logit with rounding, which can make two different logits equal (and top-k then takes
    the lower id), where transformers' greedy takes the argmax of the logits themselves. On the
    logits, top-k's first id (ties: the lower id) is ArgMax's (ties: the first), bitwise, and
    the log-probs of the chosen ids are then read from the log-softmax.

    ``banned``: an additive -inf mask of the suppressed ids (None: ``logits`` has whatever
    suppression the model applies already, as Marian's graphs add theirs before the
    log-softmax). With it, the ids are chosen on the masked logits and the log-probs are the
    log-softmax over every id, then masked: transformers' order (its NoBadWords/SuppressTokens
    processors act on log-probs in beam search, Manifest.suppression "after_log_softmax"), so
    that beam scores are sums of the values transformers sums."""
    scored = logits if banned is None else logits + banned
    if head == "argmax":
        return (torch.argmax(scored, dim=-1),)
    if head == "logits":
        return (scored,)
    _top_logits, top_ids = torch.topk(scored, top_k, dim=-1)
    log_probs = torch.log_softmax(logits, dim=-1)
    if banned is not None:
        log_probs = log_probs + banned
    return torch.gather(log_probs, -1, top_ids), top_ids


class EncoderGraph(nn.Module):
    """input_ids, attention_mask -> encoder hidden states, then cross key and value of each decoder layer."""

    def __init__(self, model: nn.Module, encoder: nn.Module, parts: DecoderParts,
                 cross_key_layout: str = KEYS_TRANSPOSED) -> None:
        super().__init__()
        self.model = model  # registered so the tracer sees its weights as parameters, not constants
        self.encoder = encoder
        self.parts = parts
        self.cross_key_layout = cross_key_layout

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        heads, head_dim = self.parts.num_heads, self.parts.head_dim
        cross: list[Tensor] = []
        for index in range(len(self.parts.layers)):
            key, value = self.parts.cross_kv(index, hidden)
            # one tensor per layer and kind: the verifier reads each as is, with no slicing copy
            cross += [cross_key_out(_split_heads(key, heads, head_dim), self.cross_key_layout),
                      _split_heads(value, heads, head_dim)]
        return (hidden, *cross)


class VerifierGraph(nn.Module):
    """T new tokens after per-row caches -> the candidates of each position (top-K log-probs/ids,
    or with ``head="argmax"`` the best id) and the new cache. With ``head="logits"`` it takes
    ``head_positions`` last and returns those positions' logits alone (:func:`head_rows`)."""

    def __init__(self, model: nn.Module, parts: DecoderParts, top_k: int, suppressed_ids: tuple[int, ...],
                 vocab_size: int, head: str = "top_k", cross_key_layout: str = KEYS_TRANSPOSED) -> None:
        super().__init__()
        self.model = model  # registered so the tracer sees its weights as parameters, not constants
        self.parts = parts
        self.top_k = top_k
        self.head = head
        self.keys_transposed = cross_key_layout == KEYS_TRANSPOSED
        bias = torch.zeros(vocab_size)
        if suppressed_ids:
            bias[list(suppressed_ids)] = float("-inf")
        self.register_buffer("suppress_bias", bias, persistent=False)
        self.has_suppression = bool(suppressed_ids)

    def forward(self, input_ids: Tensor, past_lengths: Tensor, *buffers: Tensor) -> tuple[Tensor, ...]:
        """``buffers``: per layer self key, self value; then per layer cross key, cross value
        (the key in the bundle's cross_key_layout); then the encoder attention mask [B, S]; then,
        with the "logits" head, ``head_positions``. Returns the candidates (:func:`candidates`),
        then the self key/value buffers with the new tokens written (per layer, key then value)."""
        parts = self.parts
        head_positions = None
        if self.head == "logits":
            *buffers, head_positions = buffers
        layers = len(parts.layers)
        self_kv, cross_kv, encoder_attention_mask = buffers[: 2 * layers], buffers[2 * layers : 4 * layers], buffers[-1]
        batch, new_len = input_ids.shape[0], input_ids.shape[1]
        capacity = self_kv[0].shape[2]
        heads, head_dim = parts.num_heads, parts.head_dim
        steps = torch.arange(new_len, dtype=torch.int64)
        positions = past_lengths.unsqueeze(1) + steps.unsqueeze(0)  # [B, T]
        key_positions = torch.arange(capacity, dtype=torch.int64)  # [C]
        # where the new tokens go: (row, head, position) for every head, [B, H, T, 3]
        index = torch.stack([
            torch.arange(batch, dtype=torch.int64).view(-1, 1, 1).expand(-1, heads, new_len),
            torch.arange(heads, dtype=torch.int64).view(1, -1, 1).expand(batch, -1, new_len),
            positions.unsqueeze(1).expand(-1, heads, -1),
        ], dim=-1)

        neg = torch.finfo(torch.float32).min
        visible = key_positions.view(1, 1, -1) <= positions.unsqueeze(2)  # [B, T, C]
        self_bias = torch.where(visible, 0.0, neg).unsqueeze(1).to(torch.float32)  # [B, 1, T, C]
        if parts.position_bias is not None:
            self_bias = self_bias + parts.position_bias(positions, key_positions)
        cross_bias = ((1 - encoder_attention_mask).to(torch.float32) * neg)[:, None, None, :]

        hidden = parts.embed(input_ids, positions)
        presents: list[Tensor] = []
        for layer_index, layer in enumerate(parts.layers):
            # self-attention over the buffer, after writing the new tokens into it
            residual = hidden
            x = layer.self_norm(hidden) if parts.pre_norm else hidden
            attn = layer.self_attn
            q = _split_heads(attn.q(x), heads, head_dim)
            keys = _WriteCache.apply(self_kv[2 * layer_index], index, _split_heads(attn.k(x), heads, head_dim))
            values = _WriteCache.apply(self_kv[2 * layer_index + 1], index, _split_heads(attn.v(x), heads, head_dim))
            presents += [keys, values]
            x = attn.o(_merge_heads(_attend(q, keys, values, self_bias, attn.scaling)))
            hidden = residual + x
            if not parts.pre_norm:
                hidden = layer.self_norm(hidden)
            # cross-attention over the encoder's precomputed K/V
            residual = hidden
            x = layer.cross_norm(hidden) if parts.pre_norm else hidden
            attn = layer.cross_attn
            q = _split_heads(attn.q(x), heads, head_dim)
            x = attn.o(_merge_heads(_attend(q, cross_kv[2 * layer_index], cross_kv[2 * layer_index + 1],
                                            cross_bias, attn.scaling, self.keys_transposed)))
            hidden = residual + x
            if not parts.pre_norm:
                hidden = layer.cross_norm(hidden)
            # feed-forward
            residual = hidden
            x = layer.ffn_norm(hidden) if parts.pre_norm else hidden
            hidden = residual + layer.ffn(x)
            if not parts.pre_norm:
                hidden = layer.ffn_norm(hidden)
        if parts.final_norm is not None:
            hidden = parts.final_norm(hidden)
        if head_positions is not None:
            hidden = head_rows(hidden, head_positions)
        logits = float32_logits(parts.logits(hidden))
        banned = self.suppress_bias if self.has_suppression else None
        return (*candidates(logits, self.top_k, self.head, banned), *presents)
