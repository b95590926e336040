"""Model families aggdec can export, as small adapters keyed by the Hugging Face config class.

An adapter reads a loaded ``*ForConditionalGeneration`` model and hands the shared graph code
(``graphs.py``) the family's pieces: embeddings, norms, attention projections, position bias
and output head. The modules are the model's own (no weight copies), so what is traced is
exactly the checkpoint's arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..runtime.errors import UnsupportedModelError
from .graphs import AttentionParts, DecoderLayerParts, DecoderParts


@dataclass(frozen=True)
class Family:
    name: str
    # the most source/target positions the checkpoint can embed, or None where unlimited
    position_limit: Callable[[object], int | None]
    decoder_parts: Callable[[nn.Module], DecoderParts]
    encoder: Callable[[nn.Module], nn.Module]
    # validation tolerance against torch: atol + rtol * (a position's log-prob spread)
    atol: float = 1e-4
    rtol: float = 1e-3


# ---------------------------------------------------------------- Marian, BART, mBART


def _bart_like_attention(module: nn.Module) -> AttentionParts:
    return AttentionParts(module.q_proj, module.k_proj, module.v_proj, module.out_proj, module.scaling)


def _bart_like_ffn(layer: nn.Module) -> Callable[[Tensor], Tensor]:
    def ffn(x: Tensor) -> Tensor:
        return layer.fc2(layer.activation_fn(layer.fc1(x)))

    return ffn


def _learned_positions(model: nn.Module, *, position_offset: int,
                       scale_tokens: bool) -> Callable[[Tensor, Tensor], Tensor]:
    """Marian, BART, mBART, Pegasus: a learned (Marian, Pegasus: fixed) position table read at
    position + offset, and the embedding norm where the family has one."""
    decoder = model.model.decoder
    position_table = decoder.embed_positions.weight
    embed_norm = getattr(decoder, "layernorm_embedding", None)
    # Marian and Pegasus multiply plain embeddings by embed_scale in the decoder; BART's
    # embedding class applies its scale itself.
    token_scale = decoder.embed_scale if scale_tokens else 1.0
    last_position = position_table.shape[0] - 1

    def embed(ids: Tensor, positions: Tensor) -> Tensor:
        # Real tokens never pass the table (export caps max_target_len at it); a batch's padding
        # after a row that is near its end may, and must not index past it.
        index = torch.clamp(positions + position_offset, max=last_position)
        hidden = decoder.embed_tokens(ids) * token_scale + position_table[index]
        return embed_norm(hidden) if embed_norm is not None else hidden

    return embed


def _positions_skipping_padding(model: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    """M2M100 and NLLB: fixed sinusoidal positions that skip padding. transformers numbers a
    decoder token ``cache length + 1 + pad id`` and a pad token ``pad id`` (whose row is zero),
    token by token as greedy decoding runs; so a position here is the token's own, whatever
    the block around it holds. The token embedding scales itself."""
    decoder = model.model.decoder
    table = decoder.embed_positions.weights  # transformers' own buffer: its bits
    pad = int(decoder.embed_positions.padding_idx)
    last_position = table.shape[0] - 1

    def embed(ids: Tensor, positions: Tensor) -> Tensor:
        index = torch.where(ids == pad, torch.full_like(positions, pad),
                            torch.clamp(positions + pad + 1, max=last_position))
        return decoder.embed_tokens(ids) + table[index]

    return embed


def _bart_like_parts(model: nn.Module, *, embed: Callable[[Tensor, Tensor], Tensor], pre_norm: bool) -> DecoderParts:
    decoder = model.model.decoder
    config = model.config
    layers = [
        DecoderLayerParts(
            self_attn=_bart_like_attention(layer.self_attn),
            cross_attn=_bart_like_attention(layer.encoder_attn),
            self_norm=layer.self_attn_layer_norm,
            cross_norm=layer.encoder_attn_layer_norm,
            ffn_norm=layer.final_layer_norm,
            ffn=_bart_like_ffn(layer),
        )
        for layer in decoder.layers
    ]
    bias = getattr(model, "final_logits_bias", None)  # BART's and Marian's; M2M100 has none

    def logits(hidden: Tensor) -> Tensor:
        return model.lm_head(hidden) + bias if bias is not None else model.lm_head(hidden)

    def cross_kv(index: int, encoder_hidden: Tensor) -> tuple[Tensor, Tensor]:
        attn = decoder.layers[index].encoder_attn
        return attn.k_proj(encoder_hidden), attn.v_proj(encoder_hidden)

    heads = config.decoder_attention_heads
    return DecoderParts(
        layers=layers,
        num_heads=heads,
        head_dim=config.d_model // heads,
        pre_norm=pre_norm,
        embed=embed,
        position_bias=None,
        final_norm=getattr(decoder, "layer_norm", None),
        logits=logits,
        cross_kv=cross_kv,
    )


def _table_positions(config: object) -> int:
    return int(config.max_position_embeddings)


def _sinusoid_positions_past_padding(config: object) -> int:
    """M2M100's table has max_position_embeddings + 2 rows and its first position is the pad id
    + 1 (transformers grows the table for longer texts; a bundle keeps the checkpoint's)."""
    return int(config.max_position_embeddings) + 1 - int(getattr(config, "pad_token_id", None) or 0)


def _bart_like_family(name: str, *, pre_norm: bool, embed: Callable[[nn.Module], Callable[[Tensor, Tensor], Tensor]],
                      position_limit: Callable[[object], int | None] = _table_positions) -> Family:
    return Family(
        name=name,
        position_limit=position_limit,
        decoder_parts=lambda m: _bart_like_parts(m, embed=embed(m), pre_norm=pre_norm),
        encoder=lambda m: m.model.encoder,
    )


MARIAN = _bart_like_family("marian", pre_norm=False,
                           embed=lambda m: _learned_positions(m, position_offset=0, scale_tokens=True))
BART = _bart_like_family("bart", pre_norm=False,
                         embed=lambda m: _learned_positions(m, position_offset=2, scale_tokens=False))
MBART = _bart_like_family("mbart", pre_norm=True,
                          embed=lambda m: _learned_positions(m, position_offset=2, scale_tokens=False))
# Pegasus: mBART's layers with Marian's fixed sinusoids (offset 0) and embedding scale
PEGASUS = _bart_like_family("pegasus", pre_norm=True,
                            embed=lambda m: _learned_positions(m, position_offset=0, scale_tokens=True))
M2M100 = _bart_like_family("m2m100", pre_norm=True, embed=_positions_skipping_padding,  # NLLB's checkpoints too
                           position_limit=_sinusoid_positions_past_padding)

# ---------------------------------------------------------------- T5, mT5


def _t5_attention(module: nn.Module) -> AttentionParts:
    return AttentionParts(module.q, module.k, module.v, module.o, 1.0)  # T5 folds the scale into init


def _t5_position_bias(model: nn.Module) -> Callable[[Tensor, Tensor], Tensor]:
    """Decoder relative position bias via a bucket table computed by transformers itself.

    The bucket of a distance involves a float log; computing it at export time with the
    checkpoint's own function and storing the table makes the graph agree with transformers
    at every absolute position, on every runtime. Distances at or beyond ``max_distance``
    share the last bucket, so the table needs ``max_distance + 1`` entries.
    """
    attention = model.decoder.block[0].layer[0].SelfAttention
    max_distance = int(attention.relative_attention_max_distance)
    distances = torch.arange(max_distance + 1, dtype=torch.long)
    buckets = attention._relative_position_bucket(
        -distances,  # key before query: relative position memory - context is negative
        bidirectional=False,
        num_buckets=attention.relative_attention_num_buckets,
        max_distance=max_distance,
    )
    table = attention.relative_attention_bias.weight  # [buckets, H]

    def position_bias(query_positions: Tensor, key_positions: Tensor) -> Tensor:
        distance = query_positions.unsqueeze(2) - key_positions.view(1, 1, -1)  # [B,T,K]
        distance = torch.clamp(distance, min=0, max=max_distance)  # keys after the query are masked anyway
        values = table[buckets[distance]]  # [B,T,K,H]
        return values.permute(0, 3, 1, 2)

    return position_bias


def _t5_parts(model: nn.Module) -> DecoderParts:
    config = model.config
    layers = []
    for block in model.decoder.block:
        self_layer, cross_layer, ff_layer = block.layer
        layers.append(
            DecoderLayerParts(
                self_attn=_t5_attention(self_layer.SelfAttention),
                cross_attn=_t5_attention(cross_layer.EncDecAttention),
                self_norm=self_layer.layer_norm,
                cross_norm=cross_layer.layer_norm,
                ffn_norm=ff_layer.layer_norm,
                ffn=ff_layer.DenseReluDense,
            )
        )
    # transformers' T5 scales decoder outputs before a tied head (config.scale_decoder_outputs);
    # its MT5 class never does and its config has no such field.
    scale = config.d_model**-0.5 if getattr(config, "scale_decoder_outputs", False) else 1.0

    def embed(ids: Tensor, positions: Tensor) -> Tensor:
        return model.decoder.embed_tokens(ids)

    def logits(hidden: Tensor) -> Tensor:
        return model.lm_head(hidden * scale) if scale != 1.0 else model.lm_head(hidden)

    def cross_kv(index: int, encoder_hidden: Tensor) -> tuple[Tensor, Tensor]:
        attn = model.decoder.block[index].layer[1].EncDecAttention
        return attn.k(encoder_hidden), attn.v(encoder_hidden)

    return DecoderParts(
        layers=layers,
        num_heads=config.num_heads,
        head_dim=config.d_kv,
        pre_norm=True,
        embed=embed,
        position_bias=_t5_position_bias(model),
        final_norm=model.decoder.final_layer_norm,
        logits=logits,
        cross_kv=cross_kv,
    )


T5 = Family(
    name="t5",
    position_limit=lambda config: None,  # relative positions put no hard limit on length
    decoder_parts=_t5_parts,
    encoder=lambda m: m.encoder,
)

# keyed by the Hugging Face config class name
REGISTRY: dict[str, Family] = {
    "MarianConfig": MARIAN,
    "BartConfig": BART,
    "MBartConfig": MBART,
    "T5Config": T5,
    "MT5Config": T5,
    "M2M100Config": M2M100,  # NLLB's checkpoints too
    "PegasusConfig": PEGASUS,
}
ARCHITECTURES = {
    "MarianConfig": "MarianMTModel",
    "BartConfig": "BartForConditionalGeneration",
    "MBartConfig": "MBartForConditionalGeneration",
    "T5Config": "T5ForConditionalGeneration",
    "MT5Config": "MT5ForConditionalGeneration",
    "M2M100Config": "M2M100ForConditionalGeneration",
    "PegasusConfig": "PegasusForConditionalGeneration",
}


MIN_T5_BUCKETS = 4  # the encoder's bidirectional buckets: num_buckets // 2 a direction, half of them exact
MIN_TARGET_POSITIONS = 2  # the decoder start token and one generated token


def _unsupported_config(config: object) -> str | None:
    """What a checkpoint of a supported class sets that aggdec cannot reproduce, or None.

    T5 relative-position buckets for which transformers' bucket formula is undefined (a division
    by zero, a NaN or negative bucket, an index error in transformers itself), so there is nothing
    to reproduce: fewer than :data:`MIN_T5_BUCKETS` (the encoder, bidirectional, has
    ``num_buckets // 2`` buckets a direction and ``num_buckets // 2 // 2`` exact ones, and divides
    by that), or a max distance not above the decoder's exact buckets (``num_buckets // 2``).

    Separate source and target vocabularies (Marian's ``decoder_vocab_size`` other than
    ``vocab_size``, as some OPUS-MT models have): a bundle holds one tokenizer for both sides,
    and IAD drafts source ids as output ids, so output ids would be decoded, and drafted, in the
    wrong vocabulary."""
    buckets = getattr(config, "relative_attention_num_buckets", None)
    distance = getattr(config, "relative_attention_max_distance", None)
    if buckets is not None and int(buckets) < MIN_T5_BUCKETS:
        # the encoder's exact buckets are num_buckets // 2 // 2 = 0: transformers divides by zero
        return (f"its relative_attention_num_buckets {buckets} is below {MIN_T5_BUCKETS}: the encoder's bidirectional "
                f"buckets ({buckets} // 2 = {int(buckets) // 2} a direction) hold {int(buckets) // 2 // 2} exact ones, "
                "by which transformers' bucket formula divides, so its relative-position buckets are undefined")
    if buckets is not None and distance is not None and int(distance) <= int(buckets) // 2:
        # the decoder's exact buckets are num_buckets // 2; past them transformers' bucket is
        # log(d / exact) / log(max_distance / exact): a division by log(1) or a negative bucket
        return (f"its relative_attention_max_distance {distance} is not above relative_attention_num_buckets "
                f"{buckets} // 2, where transformers' own relative-position buckets are undefined")
    decoder_vocab = getattr(config, "decoder_vocab_size", None)
    vocab = getattr(config, "vocab_size", None)
    if decoder_vocab is not None and vocab is not None and int(decoder_vocab) != int(vocab):
        return (f"its decoder_vocab_size {decoder_vocab} differs from vocab_size {vocab} (separate source and "
                "target vocabularies); an aggdec bundle has one tokenizer for source and output")
    return None


def _too_few_positions(family: Family, config: object) -> str | None:
    """Why the checkpoint's position table holds too few target positions for any decoding (fewer
    than :data:`MIN_TARGET_POSITIONS`), or None. M2M100's positions start after its pad id, so a
    pad id past its table (which transformers cannot even build) leaves none."""
    pad = getattr(config, "pad_token_id", None)
    if family is M2M100 and (isinstance(pad, bool) or not isinstance(pad, int | None)):
        return None  # not an id: the export names it as such
    limit = family.position_limit(config)
    if limit is None or limit >= MIN_TARGET_POSITIONS:
        return None
    fields = f"max_position_embeddings {config.max_position_embeddings}"
    if family is M2M100:
        fields += f" (whose positions start after its pad_token_id {pad})"
    return (f"its {fields} leaves {max(limit, 0)} target position(s), and a bundle needs at least "
            f"{MIN_TARGET_POSITIONS} (the decoder start token and one generated token)")


def family_for(config: object) -> Family:
    """The adapter of ``config``'s class; UnsupportedModelError naming what is not supported."""
    name = type(config).__name__
    try:
        family = REGISTRY[name]
    except KeyError:
        supported = ", ".join(sorted(ARCHITECTURES.values()))
        raise UnsupportedModelError(
            f"aggdec cannot export a checkpoint with {name} (model_type {getattr(config, 'model_type', '?')!r}); "
            f"supported architectures: {supported}."
        ) from None
    reason = _unsupported_config(config) or _too_few_positions(family, config)
    if reason is not None:
        raise UnsupportedModelError(f"aggdec cannot export this {ARCHITECTURES[name]} checkpoint: {reason}.")
    return family
