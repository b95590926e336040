"""Marian's transformer as a torch module, built from a :class:`~.weights.MarianWeights`.

Written from Marian's definition (``src/models/transformer.h``, ``src/rnn/cells.h``), in float:

- embeddings are scaled by sqrt(dim-emb) and Marian's sinusoids are added (sines in the first
  half of the dims, cosines in the second; position 0 is the first token);
- post-norm layers (``transformer-postprocess: dan``): sublayer, add the residual, LayerNorm;
- attention scores are q.k^T / sqrt(head_dim), padded source keys masked;
- the FFN is W2(act(W1 x + b1)) + b2, act relu or swish;
- the decoder starts from a zero embedding plus the position-0 sinusoid (Marian's start state);
- an SSRU decoder layer (``transformer-decoder-autoreg: rnn``, ``dec-cell: ssru``) replaces
  self-attention by f = sigmoid(x Wf + bf), c_t = f c_{t-1} + (1 - f) (x W), out = relu(c_t),
  then residual and LayerNorm; then cross-attention, then the FFN;
- logits are h Wemb^T + b (tied) or h W + b, and Marian never emits <unk> (allow-unk: false).

The module has the interface the shared validation drives (``get_encoder()``, a full forward
with ``decoder_input_ids`` returning ``.logits``), so export/validate.py checks the traced
graphs against it in float32 and float64 exactly as it does a Hugging Face model.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch
from torch import Tensor, nn

from ...runtime.errors import ExportError
from .config import MarianConfig
from .weights import MarianWeights

LAYER_NORM_EPS = 1e-6  # Marian's transformer layerNorm


def sinusoids(positions: int, dim: int) -> np.ndarray:
    """Marian's position signal [positions, dim] in float32, as its sinusoidalPositionEmbeddings computes it."""
    half = dim // 2
    increment = np.float32(math.log(10000.0) / (half - 1))
    inverse = np.exp(np.arange(half, dtype=np.float32) * -increment).astype(np.float32)
    angles = np.arange(positions, dtype=np.float32)[:, None] * inverse[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)


class _Linear(nn.Module):
    """x W + b with Marian's [in, out] weight."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.from_numpy(weight.copy()), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(torch.from_numpy(bias.reshape(-1).copy()),
                                                            requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.matmul(x, self.weight)
        return y if self.bias is None else y + self.bias


def _norm(scale: np.ndarray, bias: np.ndarray) -> nn.LayerNorm:
    norm = nn.LayerNorm(scale.size, eps=LAYER_NORM_EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(scale.reshape(-1).copy()))
        norm.bias.copy_(torch.from_numpy(bias.reshape(-1).copy()))
    norm.requires_grad_(False)
    return norm


class _Weights:
    """Takes tensors by name, checking each one's shape; reports any left unused."""

    def __init__(self, weights: MarianWeights) -> None:
        self.tensors = dict(weights.tensors)
        self.used: set[str] = set()

    def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.tensors:
            raise ExportError(f"the Marian model has no tensor {name!r}, which its config implies.")
        value = self.tensors[name]
        if value.size == int(np.prod(shape)) and value.ndim == 2 and value.shape[0] == 1 and len(shape) == 1:
            value = value.reshape(shape)
        if tuple(value.shape) != tuple(shape):
            raise ExportError(f"the Marian tensor {name!r} has shape {list(value.shape)}, but the config implies "
                              f"{list(shape)}.")
        self.used.add(name)
        return value

    def affine(self, weight: str, bias: str | None, d_in: int, d_out: int) -> _Linear:
        return _Linear(self.take(weight, (d_in, d_out)), self.take(bias, (d_out,)) if bias else None)

    def norm(self, prefix: str, dim: int) -> nn.LayerNorm:
        return _norm(self.take(f"{prefix}_ln_scale", (dim,)), self.take(f"{prefix}_ln_bias", (dim,)))

    def unused(self) -> list[str]:
        return sorted(set(self.tensors) - self.used)


class Attention(nn.Module):
    def __init__(self, w: _Weights, prefix: str, config: MarianConfig) -> None:
        super().__init__()
        d = config.d_model
        self.q = w.affine(f"{prefix}_Wq", f"{prefix}_bq", d, d)
        self.k = w.affine(f"{prefix}_Wk", f"{prefix}_bk", d, d)
        self.v = w.affine(f"{prefix}_Wv", f"{prefix}_bv", d, d)
        self.o = w.affine(f"{prefix}_Wo", f"{prefix}_bo", d, d)
        self.norm = w.norm(f"{prefix}_Wo", d)
        self.heads, self.head_dim = config.heads, config.head_dim
        self.scaling = 1.0 / math.sqrt(config.head_dim)

    def split(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> Tensor:
        """Post-norm block: LayerNorm(x + Wo(attention)). ``keys``/``values`` split [B,H,K,Dh]."""
        q = self.split(self.q(x))
        scores = torch.matmul(q, keys.transpose(-1, -2)) * self.scaling + bias
        context = torch.matmul(torch.softmax(scores, dim=-1), values)
        merged = context.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return self.norm(x + self.o(merged))


class FeedForward(nn.Module):
    def __init__(self, w: _Weights, prefix: str, config: MarianConfig) -> None:
        super().__init__()
        d, ffn = config.d_model, config.ffn_dim
        self.w1 = w.affine(f"{prefix}_W1", f"{prefix}_b1", d, ffn)
        self.w2 = w.affine(f"{prefix}_W2", f"{prefix}_b2", ffn, d)
        self.norm = w.norm(f"{prefix}_ffn", d)
        self.swish = config.activation == "swish"

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.w1(x)
        hidden = hidden * torch.sigmoid(hidden) if self.swish else torch.relu(hidden)
        return self.norm(x + self.w2(hidden))


class SSRU(nn.Module):
    """Marian's simpler simple recurrent unit: the gate and candidate of each position; the
    recurrence itself is run by the caller (the graph runs it step by step, export/marian/graphs.py)."""

    def __init__(self, w: _Weights, prefix: str, config: MarianConfig) -> None:
        super().__init__()
        d = config.d_model
        self.candidate = _Linear(w.take(f"{prefix}_W", (d, d)), None)
        self.gate = w.affine(f"{prefix}_Wf", f"{prefix}_bf", d, d)
        self.norm = w.norm(f"{prefix}_ffn", d)

    def inputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(f, (1 - f) * xW) per position: c_t = f_t * c_{t-1} + that."""
        forget = torch.sigmoid(self.gate(x))
        return forget, (1.0 - forget) * self.candidate(x)

    def output(self, x: Tensor, states: Tensor) -> Tensor:
        return self.norm(x + torch.relu(states))


def recur(forget: Tensor, update: Tensor, state: Tensor) -> Tensor:
    """States c_1..c_T [B,T,D] of c_t = f_t * c_{t-1} + u_t from c_0 ``state`` [B,D], one step at a time."""
    states = []
    for t in range(forget.shape[1]):
        state = forget[:, t] * state + update[:, t]
        states.append(state)
    return torch.stack(states, dim=1)


class EncoderLayer(nn.Module):
    def __init__(self, w: _Weights, index: int, config: MarianConfig) -> None:
        super().__init__()
        self.attention = Attention(w, f"encoder_l{index}_self", config)
        self.ffn = FeedForward(w, f"encoder_l{index}_ffn", config)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        a = self.attention
        x = a(x, a.split(a.k(x)), a.split(a.v(x)), bias)
        return self.ffn(x)


class DecoderLayer(nn.Module):
    def __init__(self, w: _Weights, index: int, config: MarianConfig) -> None:
        super().__init__()
        prefix = f"decoder_l{index}"
        self.ssru = SSRU(w, f"{prefix}_rnn", config) if config.decoder_cell == "ssru" else None
        self.self_attention = Attention(w, f"{prefix}_self", config) if self.ssru is None else None
        self.context = Attention(w, f"{prefix}_context", config)
        self.ffn = FeedForward(w, f"{prefix}_ffn", config)


class Encoder(nn.Module):
    def __init__(self, model: MarianModel, w: _Weights, config: MarianConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(w, i + 1, config) for i in range(config.encoder_layers))
        self._model = [model]  # a list: not registered twice as a submodule

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> SimpleNamespace:
        model = self._model[0]
        positions = torch.arange(input_ids.shape[1], dtype=torch.int64).unsqueeze(0).expand_as(input_ids)
        x = model.source_embedding(input_ids) * model.embed_scale + model.positions[model.clamp(positions)]
        neg = torch.finfo(x.dtype).min
        bias = ((1 - attention_mask).to(x.dtype) * neg)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        return SimpleNamespace(last_hidden_state=x)


class MarianModel(nn.Module):
    """The whole model; ``forward`` is the reference the exported graphs are validated against."""

    def __init__(self, config: MarianConfig, weights: MarianWeights, max_positions: int) -> None:
        super().__init__()
        self.config = config
        w = _Weights(weights)
        d, vs, vt = config.d_model, config.source_vocab, config.target_vocab
        if config.embeddings == "all":
            source = target = w.take("Wemb", (vt, d))
        else:
            source, target = w.take("encoder_Wemb", (vs, d)), w.take("decoder_Wemb", (vt, d))
        self.source_weight = nn.Parameter(torch.from_numpy(source.copy()), requires_grad=False)
        self.target_weight = (self.source_weight if target is source
                              else nn.Parameter(torch.from_numpy(target.copy()), requires_grad=False))
        if config.embeddings == "none":
            self.output_weight = nn.Parameter(torch.from_numpy(w.take("decoder_ff_logit_out_W", (d, vt)).T.copy()),
                                              requires_grad=False)
        else:
            self.output_weight = self.target_weight  # [V, d]: logits = h . Wemb^T
        self.output_bias = nn.Parameter(torch.from_numpy(w.take("decoder_ff_logit_out_b", (vt,)).copy()),
                                        requires_grad=False)
        self.embed_scale = math.sqrt(d)
        self.register_buffer("positions", torch.from_numpy(sinusoids(max_positions, d)), persistent=False)
        self.encoder = Encoder(self, w, config)
        self.decoder_layers = nn.ModuleList(DecoderLayer(w, i + 1, config) for i in range(config.decoder_layers))
        unused = w.unused()
        if unused:
            raise ExportError(f"the Marian model holds tensors its config does not explain ({', '.join(unused[:5])}"
                              f"{', ...' if len(unused) > 5 else ''}); it is not the architecture its config says.")
        self.requires_grad_(False)
        self.eval()

    def source_embedding(self, ids: Tensor) -> Tensor:
        return self.source_weight[ids]

    def target_embedding(self, ids: Tensor, positions: Tensor) -> Tensor:
        """Scaled embeddings plus sinusoids; position 0 (the start) is Marian's zero embedding."""
        tokens = self.target_weight[ids] * self.embed_scale
        start = (positions == 0).unsqueeze(-1)
        return torch.where(start, 0.0, tokens) + self.positions[self.clamp(positions)]

    def clamp(self, positions: Tensor) -> Tensor:
        # real tokens never pass the table (export sizes it for the max lengths); a batch's
        # padding after a row near its end may, and must not index past it
        return torch.clamp(positions, max=self.positions.shape[0] - 1)

    def logits(self, hidden: Tensor) -> Tensor:
        return torch.matmul(hidden, self.output_weight.transpose(0, 1)) + self.output_bias

    def get_encoder(self) -> Encoder:
        return self.encoder

    def forward(self, input_ids: Tensor, attention_mask: Tensor, decoder_input_ids: Tensor) -> SimpleNamespace:
        """Full-sequence reference: logits [B, T, V] after each decoder input."""
        memory = self.encoder(input_ids, attention_mask).last_hidden_state
        neg = torch.finfo(memory.dtype).min
        cross_bias = ((1 - attention_mask).to(memory.dtype) * neg)[:, None, None, :]
        batch, length = decoder_input_ids.shape
        positions = torch.arange(length, dtype=torch.int64).unsqueeze(0).expand(batch, -1)
        x = self.target_embedding(decoder_input_ids, positions)
        causal = torch.triu(torch.full((length, length), neg, dtype=memory.dtype), diagonal=1)[None, None]
        for layer in self.decoder_layers:
            if layer.ssru is not None:
                forget, update = layer.ssru.inputs(x)
                x = layer.ssru.output(x, recur(forget, update, torch.zeros_like(x[:, 0])))
            else:
                a = layer.self_attention
                x = a(x, a.split(a.k(x)), a.split(a.v(x)), causal)
            c = layer.context
            x = c(x, c.split(c.k(memory)), c.split(c.v(memory)), cross_bias)
            x = layer.ffn(x)
        return SimpleNamespace(logits=self.logits(x))
