"""Torch modules that are traced into the bundle's encoder and verifier graphs.

The verifier is written here rather than traced from transformers' own decoder because its
cache contract is ours: each row of the batch keeps its own cache length (``past_lengths``),
and rejected draft positions are dropped *inside* the graph. The graph appends the new
tokens' keys/values right after each row's valid prefix (a gather over ``concat(past, new)``),
so the returned cache is always left-aligned and exactly ``max(past_lengths) + T`` long. The
next call passes the lengths the host accepted; positions beyond a row's length are garbage
that the gather overwrites and the attention mask hides. On CUDA the cache therefore never
leaves the device: the host sends token ids and lengths and reads back top-K candidates.

Family differences (embeddings, norms, position bias, output head) come in as
:class:`DecoderParts` from ``families.py``; the layer arithmetic is shared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn


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


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scaling: float) -> Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling + bias
    return torch.matmul(torch.softmax(scores, dim=-1), v)


class EncoderGraph(nn.Module):
    """input_ids, attention_mask -> encoder hidden states and every decoder layer's cross K/V."""

    def __init__(self, model: nn.Module, encoder: nn.Module, parts: DecoderParts) -> None:
        super().__init__()
        self.model = model  # registered so the tracer sees its weights as parameters, not constants
        self.encoder = encoder
        self.parts = parts

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        heads, head_dim = self.parts.num_heads, self.parts.head_dim
        per_layer = []
        for index in range(len(self.parts.layers)):
            key, value = self.parts.cross_kv(index, hidden)
            per_layer.append(torch.stack([_split_heads(key, heads, head_dim), _split_heads(value, heads, head_dim)]))
        # [layers, 2, B, H, S, Dh]: one tensor so that one device buffer holds all of it.
        return hidden, torch.stack(per_layer)


class VerifierGraph(nn.Module):
    """T new tokens after per-row caches -> top-K log-probs/ids per position and the new cache."""

    def __init__(self, model: nn.Module, parts: DecoderParts, top_k: int, suppressed_ids: tuple[int, ...],
                 vocab_size: int) -> None:
        super().__init__()
        self.model = model  # registered so the tracer sees its weights as parameters, not constants
        self.parts = parts
        self.top_k = top_k
        bias = torch.zeros(vocab_size)
        if suppressed_ids:
            bias[list(suppressed_ids)] = float("-inf")
        self.register_buffer("suppress_bias", bias, persistent=False)
        self.has_suppression = bool(suppressed_ids)

    def forward(
        self,
        input_ids: Tensor,  # [B, T] int64
        past_lengths: Tensor,  # [B] int64: valid cached positions per row
        past_key_values: Tensor,  # [L, 2, B, H, P, Dh]
        cross_key_values: Tensor,  # [L, 2, B, H, S, Dh]
        encoder_attention_mask: Tensor,  # [B, S] int64
    ) -> tuple[Tensor, Tensor, Tensor]:
        parts = self.parts
        new_len = input_ids.shape[1]
        past_len = past_key_values.shape[4]
        steps = torch.arange(new_len, dtype=torch.int64)
        positions = past_lengths.unsqueeze(1) + steps.unsqueeze(0)  # [B, T]
        out_len = past_lengths.max() + new_len
        key_positions = torch.arange(out_len, dtype=torch.int64)  # [K], K = max(len) + T

        # Where each output cache slot comes from in concat(past, new): a row's own prefix, then
        # its new tokens; slots past a row's end repeat the last index and are masked out below.
        lengths = past_lengths.unsqueeze(1)
        source_index = torch.where(key_positions.unsqueeze(0) < lengths, key_positions.unsqueeze(0),
                                   key_positions.unsqueeze(0) - lengths + past_len)
        source_index = torch.clamp(source_index, max=past_len + new_len - 1)  # [B, K]

        neg = torch.finfo(torch.float32).min
        visible = key_positions.view(1, 1, -1) <= positions.unsqueeze(2)  # [B, T, K]
        self_bias = torch.where(visible, 0.0, neg).unsqueeze(1).to(torch.float32)  # [B, 1, T, K]
        if parts.position_bias is not None:
            self_bias = self_bias + parts.position_bias(positions, key_positions)
        cross_bias = ((1 - encoder_attention_mask).to(torch.float32) * neg)[:, None, None, :]

        hidden = parts.embed(input_ids, positions)
        heads, head_dim = parts.num_heads, parts.head_dim
        gather_index = source_index[:, None, :, None].expand(-1, heads, -1, head_dim)
        presents = []
        for index, layer in enumerate(parts.layers):
            # self-attention over the compacted cache
            residual = hidden
            x = layer.self_norm(hidden) if parts.pre_norm else hidden
            attn = layer.self_attn
            q = _split_heads(attn.q(x), heads, head_dim)
            k_new = _split_heads(attn.k(x), heads, head_dim)
            v_new = _split_heads(attn.v(x), heads, head_dim)
            keys = torch.gather(torch.cat([past_key_values[index, 0], k_new], dim=2), 2, gather_index)
            values = torch.gather(torch.cat([past_key_values[index, 1], v_new], dim=2), 2, gather_index)
            presents.append(torch.stack([keys, values]))
            x = attn.o(_merge_heads(_attend(q, keys, values, self_bias, attn.scaling)))
            hidden = residual + x
            if not parts.pre_norm:
                hidden = layer.self_norm(hidden)
            # cross-attention over the encoder's precomputed K/V
            residual = hidden
            x = layer.cross_norm(hidden) if parts.pre_norm else hidden
            attn = layer.cross_attn
            q = _split_heads(attn.q(x), heads, head_dim)
            x = attn.o(_merge_heads(_attend(q, cross_key_values[index, 0], cross_key_values[index, 1],
                                            cross_bias, attn.scaling)))
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
        logits = parts.logits(hidden).to(torch.float32)
        if self.has_suppression:
            logits = logits + self.suppress_bias
        log_probs = torch.log_softmax(logits, dim=-1)
        top_logprobs, top_ids = torch.topk(log_probs, self.top_k, dim=-1)
        return top_logprobs, top_ids, torch.stack(presents)
