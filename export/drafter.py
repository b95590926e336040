"""The GAD drafter: a shallow non-autoregressive decoder that proposes k tokens in one pass.

It reads the tokens decoded so far followed by k [MASK] slots, attends bidirectionally over
all of them, cross-attends to the *verifier's* encoder output (one encoder pass per request
serves both models), and predicts every slot at once (SpecDec's Spec-Drafter, with the
verifier's encoder standing in for the drafter's own deep encoder). [MASK] is an extra
embedding row, id ``vocab_size``, so it never collides with the tokenizer's vocabulary.

Optionally (``encoder_layers``) a few drafter-only layers re-encode the verifier's encoder
output first: they depend on the source alone, so the runtime runs them once per request
(``drafter_source.onnx``), not once per drafter call.

The architecture is the same for every family: pre-LayerNorm blocks whose attention inner
size is the verifier's (heads x head_dim), so its attention projections, embeddings and
output head can be initialised from the verifier. Saved as safetensors + ``drafter.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn

CONFIG_FILE = "drafter.json"
POSITIONS = ("output", "source")  # DrafterConfig.positions
WEIGHTS_FILE = "drafter.safetensors"


@dataclass(frozen=True)
class DrafterConfig:
    vocab_size: int  # the verifier's; [MASK] is id vocab_size
    d_model: int
    num_heads: int
    head_dim: int
    ffn_dim: int
    layers: int = 2
    k: int = 25  # [MASK] slots drafted per call
    max_positions: int = 1024  # prefix + slots
    # The drafter reads only the last ``window`` output tokens (0: all of them), so that a call
    # costs O(window + k) however long the output grows; positions stay absolute.
    window: int = 0
    # Drafter-only layers over the verifier's encoder output (self-attention + feed-forward),
    # run once per request; 0: the drafter cross-attends the encoder output as it is.
    encoder_layers: int = 0
    # Which positions the drafter reads its tokens at: "output" (each token's place in the output),
    # or "source" (the place of the source token it is aligned with; runtime/decoding/alignment.py).
    # "source" is for editing tasks: there, output positions drift from the source's after every
    # edit that changes the length, and a drafter that found its place by position drafts off by one.
    positions: str = "output"
    pad_token_id: int = 0
    eos_token_id: int = 1
    family: str = ""

    @property
    def mask_token_id(self) -> int:
        return self.vocab_size

    def save(self, directory: Path) -> None:
        (directory / CONFIG_FILE).write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, directory: Path) -> DrafterConfig:
        from ..runtime.errors import ExportError

        path = directory / CONFIG_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ExportError(f"{str(path)!r} is not a readable drafter config ({exc}).") from None
        advice = "retrain it with `aggdec train-drafter`"
        if not isinstance(data, dict):
            raise ExportError(f"{str(path)!r} must hold a JSON object, not {type(data).__name__}; {advice}.")
        kinds = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(kinds))
        missing = sorted(name for name, f in kinds.items() if f.default is dataclasses.MISSING and name not in data)
        if unknown or missing:
            raise ExportError(f"{str(path)!r} is not a drafter config this aggdec reads (unknown keys: "
                              f"{unknown or 'none'}; missing keys: {missing or 'none'}); {advice}.")
        if data.get("positions", "output") not in POSITIONS:
            raise ExportError(f"{str(path)!r}: positions = {data['positions']!r} is not one of {list(POSITIONS)}; "
                              f"{advice}.")
        from .checkpoint_limits import DRAFTER_SIZE_LIMITS

        for name, value in data.items():
            wanted = {"int": int, "str": str}[kinds[name].type]  # whole counts: ids and sizes
            if isinstance(value, bool) or not isinstance(value, wanted) or (
                    isinstance(value, int) and not 0 <= value < 2**31):
                raise ExportError(f"{str(path)!r}: {name} = {reprlib.repr(value)} is not a valid value; {advice}.")
            # the modules are built from these sizes before a weight is read (layers 10**9 would
            # build modules for hours; a width of 2**30 allocate gigabytes): real drafters stay far below
            if name in DRAFTER_SIZE_LIMITS and value > DRAFTER_SIZE_LIMITS[name]:
                raise ExportError(f"{str(path)!r}: {name} = {value} is above the largest a drafter may have "
                                  f"({DRAFTER_SIZE_LIMITS[name]}); {advice}.")
        return cls(**data)


class _Attention(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        inner = config.num_heads * config.head_dim
        self.heads, self.head_dim = config.num_heads, config.head_dim
        self.q = nn.Linear(config.d_model, inner)
        self.k = nn.Linear(config.d_model, inner)
        self.v = nn.Linear(config.d_model, inner)
        self.o = nn.Linear(inner, config.d_model)

    def _split(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, memory: Tensor, bias: Tensor) -> Tensor:
        q, k, v = self._split(self.q(x)), self._split(self.k(memory)), self._split(self.v(memory))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + bias
        out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2)
        return self.o(out.reshape(out.shape[0], out.shape[1], -1))


class _Layer(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.self_norm = nn.LayerNorm(config.d_model)
        self.self_attn = _Attention(config)
        self.cross_norm = nn.LayerNorm(config.d_model)
        self.cross_attn = _Attention(config)
        self.ffn_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.ffn_dim)
        self.fc2 = nn.Linear(config.ffn_dim, config.d_model)

    def forward(self, x: Tensor, memory: Tensor, self_bias: Tensor, cross_bias: Tensor) -> Tensor:
        h = self.self_norm(x)
        x = x + self.self_attn(h, h, self_bias)
        x = x + self.cross_attn(self.cross_norm(x), memory, cross_bias)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ffn_norm(x))))


class _SourceLayer(nn.Module):
    """A drafter-only encoder layer over the verifier's encoder output (pre-LayerNorm).

    Its two residual branches start at zero (``o`` and ``fc2``), so a new layer is the identity
    and a drafter with extra layers starts out exactly as one without them."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.self_norm = nn.LayerNorm(config.d_model)
        self.self_attn = _Attention(config)
        self.ffn_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.ffn_dim)
        self.fc2 = nn.Linear(config.ffn_dim, config.d_model)
        for zeroed in (self.self_attn.o, self.fc2):
            nn.init.zeros_(zeroed.weight)
            nn.init.zeros_(zeroed.bias)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        h = self.self_norm(x)
        x = x + self.self_attn(h, h, bias)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ffn_norm(x))))


def _mask_bias(mask: Tensor) -> Tensor:
    """[B, L] 0/1 key mask -> additive [B, 1, 1, L]."""
    return ((1 - mask.to(torch.float32)) * torch.finfo(torch.float32).min)[:, None, None, :]


class Drafter(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size + 1, config.d_model)  # + [MASK]
        self.positions = nn.Embedding(config.max_positions, config.d_model)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.layers))
        self.source_layers = nn.ModuleList(_SourceLayer(config) for _ in range(config.encoder_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, encoder_hidden: Tensor,
                encoder_attention_mask: Tensor, position_offset: Tensor | None = None) -> Tensor:
        """Logits [B, L, V] for every position of ``input_ids`` (prefix, slots, padding)."""
        return self.head(self._hidden(input_ids, attention_mask, encoder_hidden, encoder_attention_mask,
                                      position_offset))

    def slot_logits(self, input_ids: Tensor, attention_mask: Tensor, slot_start: Tensor, encoder_hidden: Tensor,
                    encoder_attention_mask: Tensor, position_offset: Tensor | None = None,
                    memory: Tensor | None = None) -> Tensor:
        """Logits [B, k, V] of the k [MASK] slots that start at ``slot_start[b]`` in each row;
        ``position_offset[b]``: the output position of the row's first input token (its window's);
        ``memory``: :meth:`memory` of ``encoder_hidden``, when computed already."""
        return self.head(self.slot_hidden(input_ids, attention_mask, slot_start, encoder_hidden,
                                          encoder_attention_mask, position_offset, memory))

    def slot_hidden(self, input_ids: Tensor, attention_mask: Tensor, slot_start: Tensor, encoder_hidden: Tensor,
                    encoder_attention_mask: Tensor, position_offset: Tensor | None = None,
                    memory: Tensor | None = None) -> Tensor:
        """The k slots' final hidden states [B, k, d]: what :meth:`slot_logits` projects."""
        hidden = self._hidden(input_ids, attention_mask, encoder_hidden, encoder_attention_mask, position_offset,
                              memory)
        index = slot_start.unsqueeze(1) + torch.arange(self.config.k, dtype=torch.int64, device=slot_start.device)[None]
        return torch.gather(hidden, 1, index.unsqueeze(2).expand(-1, -1, hidden.shape[2]))

    def memory(self, encoder_hidden: Tensor, encoder_attention_mask: Tensor) -> Tensor:
        """What the drafter cross-attends: the encoder output through the drafter-only layers
        (itself when there are none). It depends on the source alone."""
        bias = _mask_bias(encoder_attention_mask)
        for layer in self.source_layers:
            encoder_hidden = layer(encoder_hidden, bias)
        return encoder_hidden

    def _hidden(self, input_ids: Tensor, attention_mask: Tensor, encoder_hidden: Tensor,
                encoder_attention_mask: Tensor, position_offset: Tensor | None = None,
                memory: Tensor | None = None) -> Tensor:
        """``memory``: :meth:`memory` of ``encoder_hidden`` when the caller has it already."""
        if memory is None:
            memory = self.memory(encoder_hidden, encoder_attention_mask)
        positions = torch.arange(input_ids.shape[1], dtype=torch.int64, device=input_ids.device).unsqueeze(0)
        if position_offset is not None:
            # clamped: a padded position past the table must not index out of it
            positions = torch.clamp(positions + position_offset.unsqueeze(1), max=self.config.max_positions - 1)
        x = self.embed(input_ids) + self.positions(positions)
        self_bias, cross_bias = _mask_bias(attention_mask), _mask_bias(encoder_attention_mask)
        for layer in self.layers:
            x = layer(x, memory, self_bias, cross_bias)
        return self.final_norm(x)


    # ------------------------------------------------------------------ persistence

    def save(self, directory: str | Path) -> None:
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.save(directory)
        save_file({name: tensor.contiguous() for name, tensor in self.state_dict().items()},
                  str(directory / WEIGHTS_FILE))

    @classmethod
    def load(cls, directory: str | Path) -> Drafter:
        from safetensors.torch import load_file

        directory = Path(directory)
        if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
            from ..runtime.errors import ExportError

            raise ExportError(f"{str(directory)!r} is not a drafter directory (needs {CONFIG_FILE} and "
                              f"{WEIGHTS_FILE}); create one with `aggdec train-drafter`.")
        config = DrafterConfig.load(directory)
        _check_weights_file(directory / WEIGHTS_FILE, config)  # before a real module is built
        drafter = cls(config)
        try:
            drafter.load_state_dict(load_file(str(directory / WEIGHTS_FILE)))
        except Exception as exc:  # noqa: BLE001 - safetensors' and torch's own errors for a damaged file
            from ..runtime.errors import ExportError
            from .safety import one_line

            raise ExportError(f"could not read the drafter weights {str(directory / WEIGHTS_FILE)!r} "
                              f"({one_line(exc)}); retrain it with `aggdec train-drafter`.") from None
        return drafter.eval()


def _check_weights_file(path: Path, config: DrafterConfig) -> None:
    """ExportError unless the safetensors file at ``path`` holds exactly the tensors, by name
    and shape, of the drafter ``config`` describes (built on the meta device: nothing is
    allocated), read from its header alone. A config that does not match its weights (another
    drafter's, or sizes edited up) is refused before a module is built, and a damaged file
    before its tensors are read."""
    from safetensors import safe_open

    from ..runtime.errors import ExportError
    from .safety import one_line

    advice = "retrain it with `aggdec train-drafter`"
    try:
        with safe_open(str(path), framework="pt") as weights:
            stored = {name: list(weights.get_slice(name).get_shape()) for name in weights.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError
        raise ExportError(f"{str(path)!r} is not a readable safetensors file ({one_line(exc)}); {advice}.") from None
    with torch.device("meta"):
        expected = {name: list(tensor.shape) for name, tensor in Drafter(config).state_dict().items()}
    for name in sorted(set(expected) | set(stored)):
        if expected.get(name) != stored.get(name):
            raise ExportError(f"{str(path)!r} does not hold the drafter its {CONFIG_FILE} describes: tensor "
                              f"{name!r} is {stored.get(name, 'missing')} in the file, "
                              f"{expected.get(name, 'not part of that drafter')} by the config; {advice}.")


def drafter_inputs(prefixes: list[list[int]], k: int, mask_id: int, pad_id: int, window: int = 0
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Batch ``prefix[-window:] + [MASK] * k`` rows, right-padded (window 0: the whole prefix):
    (input_ids, attention_mask, slot_start, position_offset). The runtime's Drafter.draft
    builds the same arrays with numpy."""
    seen = [prefix[-window:] if window else prefix for prefix in prefixes]
    width = max(len(p) for p in seen) + k
    ids = torch.full((len(seen), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(seen), width), dtype=torch.int64)
    for row, prefix in enumerate(seen):
        ids[row, : len(prefix)] = torch.tensor(prefix, dtype=torch.int64)
        ids[row, len(prefix) : len(prefix) + k] = mask_id
        mask[row, : len(prefix) + k] = 1
    return (ids, mask, torch.tensor([len(p) for p in seen], dtype=torch.int64),
            torch.tensor([len(full) - len(p) for full, p in zip(prefixes, seen)], dtype=torch.int64))


class DrafterShape(NamedTuple):
    """What a drafter takes of a Hugging Face verifier's shape (its feed-forward width the default)."""
    family: str
    d_model: int
    num_heads: int
    head_dim: int
    ffn_dim: int


def drafter_shape(model: nn.Module) -> DrafterShape:
    from .families import family_for

    family = family_for(model.config)
    parts = family.decoder_parts(model)
    ffn_dim = int(getattr(model.config, "decoder_ffn_dim", None) or getattr(model.config, "d_ff", None)
                  or 4 * model.config.d_model)
    return DrafterShape(family.name, int(model.config.d_model), parts.num_heads, parts.head_dim, ffn_dim)


def new_drafter_from_verifier(model: nn.Module, layers: int = 2, k: int = 25, seed: int = 0, window: int = 0,
                              encoder_layers: int = 0, positions: str = "output", ffn_dim: int | None = None
                              ) -> Drafter:
    """A drafter shaped after ``model`` and initialised from it where shapes allow.

    Copied: the token embeddings, the output head (and BART/Marian's final_logits_bias), and
    the self- and cross-attention projections of the verifier's first ``layers`` decoder
    layers (the attention inner size is the verifier's, so these always fit). The rest
    (norms, feed-forward, positions, [MASK], drafter-only encoder layers) starts fresh:
    families differ there. ``ffn_dim``: the feed-forward width (default: the verifier's).
    """
    from .families import family_for

    shape = drafter_shape(model)
    parts = family_for(model.config).decoder_parts(model)  # the layers it copies from
    vocab = int(model.get_output_embeddings().weight.shape[0])
    max_positions = int(getattr(model.config, "max_position_embeddings", 512) or 512) + k + 1
    config = DrafterConfig(
        vocab_size=vocab, d_model=shape.d_model, num_heads=shape.num_heads, head_dim=shape.head_dim,
        ffn_dim=ffn_dim or shape.ffn_dim, layers=layers, k=k, max_positions=max_positions,
        pad_token_id=int(model.config.pad_token_id), eos_token_id=int(model.config.eos_token_id),
        family=shape.family, window=window, encoder_layers=encoder_layers, positions=positions,
    )
    torch.manual_seed(seed)
    drafter = Drafter(config)
    with torch.no_grad():
        source_embed = model.get_input_embeddings().weight
        drafter.embed.weight[:vocab].copy_(source_embed[:vocab])
        drafter.embed.weight[vocab].copy_(source_embed[:vocab].mean(dim=0))
        drafter.head.weight.copy_(model.get_output_embeddings().weight)
        bias = getattr(model, "final_logits_bias", None)
        drafter.head.bias.copy_(bias[0] if bias is not None else torch.zeros(vocab))
        for mine, theirs in zip(drafter.layers, parts.layers):
            for attn, source in ((mine.self_attn, theirs.self_attn), (mine.cross_attn, theirs.cross_attn)):
                for name in ("q", "k", "v", "o"):
                    target, origin = getattr(attn, name), getattr(source, name)
                    target.weight.copy_(origin.weight)
                    target.bias.copy_(origin.bias if origin.bias is not None else torch.zeros_like(target.bias))
    return drafter


class DrafterGraph(nn.Module):
    """What drafter.onnx computes: the argmax id of each of the k slots (never logits).

    Its ``encoder_hidden_states`` is what the drafter cross-attends: the encoder output, or, when
    the drafter has ``encoder_layers``, drafter_source.onnx's output (those layers run there,
    once per request, not here).

    ``shortlist`` (a bundle with a lexical shortlist): the graph also takes ``output_ids``, each
    row's allowed ids as the verifier gets them (-1 padded, one row per row), and argmaxes
    over those rows of its head only. The head over the whole vocabulary is most of a small
    drafter's cost (Bergamot's: 32,000 x 256 per slot, against a decoder layer of about a
    million products per token); a draft outside the row's list could never be accepted anyway."""

    def __init__(self, drafter: Drafter, shortlist: bool = False) -> None:
        super().__init__()
        self.drafter = drafter
        self.shortlist = shortlist

    def forward(self, input_ids: Tensor, attention_mask: Tensor, slot_start: Tensor, position_offset: Tensor,
                encoder_hidden_states: Tensor, encoder_attention_mask: Tensor, *output_ids: Tensor) -> Tensor:
        args = (input_ids, attention_mask, slot_start, encoder_hidden_states, encoder_attention_mask, position_offset)
        if not self.shortlist:
            return torch.argmax(self.drafter.slot_logits(*args, memory=encoder_hidden_states), dim=-1)
        hidden = self.drafter.slot_hidden(*args, memory=encoder_hidden_states)
        return shortlist_argmax(hidden, output_ids[0], self.drafter.head.weight, self.drafter.head.bias)


def shortlist_argmax(hidden: Tensor, output_ids: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """The best id [B, k] of each slot of ``hidden`` [B, k, d] among its row's ``output_ids``
    [B, L] (-1 pads, never chosen), by the verifier's shortlist projection
    (export/shortlist_head.py) as a plain batched product: a drafter's slots need not equal
    themselves computed alone. ``output_ids`` has a row per row (the graph's IO says so): with
    one row for all, onnxruntime's symbolic shape inference, which its int8 quantization of the
    drafter runs, cannot relate the broadcast rows to the batch."""
    from .shortlist_head import ids_at, shortlist_logits

    logits, row_ids = shortlist_logits(hidden, output_ids, weight, bias, per_position=False)  # [B, k, L], [B, L]
    return ids_at(row_ids, torch.argmax(logits, dim=-1))


class DrafterSourceGraph(nn.Module):
    """What drafter_source.onnx computes: the drafter-only encoder layers over the encoder output,
    once per request (bundles whose drafter has ``encoder_layers``)."""

    def __init__(self, drafter: Drafter) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(self, encoder_hidden_states: Tensor, encoder_attention_mask: Tensor) -> Tensor:
        return self.drafter.memory(encoder_hidden_states, encoder_attention_mask)
