"""A Marian model's config (``special:model.yml`` inside the weights, plus the decoding yml
shipped beside them), validated against what aggdec rebuilds.

Every option is in one of three tables: :data:`REQUIRED` (values aggdec implements, checked),
:data:`ARCHITECTURE` (sizes and the choices :class:`MarianConfig` carries), :data:`IRRELEVANT`
(options of other model types, training or the int8 engine, which do not change a transformer's
float arithmetic). An option in none of them, or a value aggdec does not implement, is refused
naming the option: a model that computes something else must not export silently.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any

import yaml

from ...runtime.bundle_schema import MAX_SEQUENCE_LEN
from ...runtime.errors import ExportError

# option -> the values aggdec implements (Marian's defaults for a transformer included)
REQUIRED: dict[str, tuple[Any, ...]] = {
    "type": ("transformer",),
    "transformer-ffn-depth": (2,),
    "transformer-postprocess": ("dan",),  # dropout, add the residual, then LayerNorm: post-norm
    "transformer-postprocess-emb": ("d", ""),  # dropout only: no norm on the embeddings
    "transformer-postprocess-top": ("",),
    "transformer-preprocess": ("",),
    "transformer-train-position-embeddings": (False,),
    "transformer-tied-layers": ([],),
    "transformer-no-projection": (False,),
    "transformer-pool": (False,),
    "output-omit-bias": (False,),
    "right-left": (False,),
    "input-types": ([],),
    "ulr": (False,),
    "bert-train-type-embeddings": (True, False),  # a BERT option; no type embeddings exist in a transformer
    "skip": (False,),
    "layer-normalization": (False,),  # an RNN option
}
ARCHITECTURE = frozenset({
    "enc-depth", "dec-depth", "dim-emb", "dim-vocabs", "transformer-heads", "transformer-dim-ffn",
    "transformer-ffn-activation", "transformer-decoder-autoreg", "dec-cell", "tied-embeddings",
    "tied-embeddings-all", "tied-embeddings-src",
})
IRRELEVANT = frozenset({
    "bert-type-vocab-size", "dec-cell-base-depth", "dec-cell-high-depth", "dim-rnn", "enc-cell", "enc-cell-depth",
    "enc-type", "lemma-dim-emb", "transformer-aan-activation", "transformer-aan-depth", "transformer-aan-nogate",
    "transformer-dim-aan", "transformer-guided-alignment-layer", "ulr-dim-emb", "ulr-trainable-transformation",
    "version", "transformer-heads-top", "transformer-rnn-projection", "transformer-depth-scaling",
    "precision", "cost-type", "transformer-dropout", "transformer-dropout-attention", "transformer-dropout-ffn",
    "dropout-rnn", "dropout-src", "dropout-trg",
})
ACTIVATIONS = ("relu", "swish")
# the decoding yml (config.*.yml): options that change greedy output and the values aggdec implements
DECODING_REQUIRED: dict[str, tuple[Any, ...]] = {
    "output-sampling": (False,),
    "allow-unk": (False,),
    "n-best": (False,),
}
# the decoding options read into the bundle: the output length cap (max_length_factor), the
# shortlist (read by export.py; vocabularies are checked there too), and the beam search's scoring
# (normalize, word-penalty: the manifest's beam_rules). beam-size is checked and not kept: a
# caller's num_beams decides (greedy unless asked), as the yml's value is only Marian's default
DECODING_READ = frozenset({"max-length-factor", "shortlist", "vocabs", "beam-size", "normalize", "word-penalty"})
# Marian's defaults for a yml that does not set them (its config_parser): no length
# normalization, no word penalty
MARIAN_NORMALIZE, MARIAN_WORD_PENALTY = 0.0, 0.0
BEAM_SCORING_BOUND = 1e3  # the manifest schema's bound on normalize and word-penalty
# Marian's default max-length-factor (its config_parser), for a folder whose yml does not set it
MARIAN_MAX_LENGTH_FACTOR = 3.0
MAX_LENGTH_FACTOR = MAX_SEQUENCE_LEN  # the manifest schema's bound on max_length_factor
# decoding options that do not change a greedy output (beam-only scoring, batching, memory, paths)
DECODING_IRRELEVANT = frozenset({
    "relative-paths", "models", "mini-batch", "maxi-batch",
    "maxi-batch-sort", "workspace", "gemm-precision", "max-length", "max-length-crop",
    "cpu-threads", "quiet", "quiet-translation", "skip-cost", "alignment", "int8shiftAlphaAll", "ssplit-mode",
})


@dataclass(frozen=True)
class MarianConfig:
    encoder_layers: int
    decoder_layers: int
    d_model: int
    heads: int
    ffn_dim: int
    activation: str  # "relu" or "swish"
    decoder_cell: str  # "ssru" (a gated recurrence) or "self-attention"
    source_vocab: int
    target_vocab: int
    embeddings: str  # "all" (one matrix), "decoder" (decoder input = output), "none"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


_SHOWN = reprlib.Repr()  # attributes, not keywords: those came in Python 3.12
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 2, 6, 6, 80, 80, 40


def shown(value: Any) -> str:
    """``value`` for a message, cut short: a YAML value is untrusted, and nested aliases (a
    "billion laughs") make a few hundred bytes of yml a list whose full repr takes gigabytes."""
    return _SHOWN.repr(value)


def _refuse(where: str, option: str, value: Any, allowed: Any) -> ExportError:
    return ExportError(f"{where}: option {option}: {shown(value)} is not supported by aggdec's Marian importer "
                       f"(supported: {allowed}).")


def _load_yaml(text: str, where: str, loader: Any = yaml.SafeLoader) -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise ExportError(f"{where} is not valid YAML ({' '.join(str(exc).split())}).") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ExportError(f"{where} nests its values too deeply to be a Marian config.") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise ExportError(f"{where} holds a value Python will not read ({exc}).") from None
    if not isinstance(data, dict):
        raise ExportError(f"{where} must be a YAML mapping of options.")
    return data


def _int(data: dict[str, Any], key: str, where: str, low: int = 1, high: int = 1 << 20) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ExportError(f"{where}: option {key} must be an integer in {low}..{high}, got {shown(value)}.")
    return value


def parse_model_config(text: str, where: str = "special:model.yml") -> MarianConfig:
    data = _load_yaml(text, where)
    for key, value in data.items():
        if key in REQUIRED:
            if value not in REQUIRED[key]:
                raise _refuse(where, key, value, ", ".join(repr(v) for v in REQUIRED[key]))
        elif key not in ARCHITECTURE and key not in IRRELEVANT:
            raise ExportError(f"{where}: option {key} is unknown to aggdec's Marian importer; it cannot tell "
                              "whether it changes the model's arithmetic, so the model is refused.")
    if data.get("type", "transformer") != "transformer":
        raise _refuse(where, "type", data.get("type"), "'transformer'")
    d_model = _int(data, "dim-emb", where)
    heads = _int(data, "transformer-heads", where)
    if d_model % heads:
        raise ExportError(f"{where}: dim-emb {d_model} is not a multiple of transformer-heads {heads}.")
    activation = data.get("transformer-ffn-activation", "swish")
    if activation not in ACTIVATIONS:
        raise _refuse(where, "transformer-ffn-activation", activation, ", ".join(ACTIVATIONS))
    autoreg = data.get("transformer-decoder-autoreg", "self-attention")
    if autoreg == "rnn":
        cell = data.get("dec-cell", "gru")
        if cell != "ssru":
            raise _refuse(where, "dec-cell", cell, "'ssru' (with transformer-decoder-autoreg: rnn)")
        decoder_cell = "ssru"
    elif autoreg == "self-attention":
        decoder_cell = "self-attention"
    else:
        raise _refuse(where, "transformer-decoder-autoreg", autoreg, "'self-attention', 'rnn'")
    vocabs = data.get("dim-vocabs")
    if (not isinstance(vocabs, list) or len(vocabs) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 1 for v in vocabs)):
        raise ExportError(f"{where}: option dim-vocabs must list two vocabulary sizes, got {shown(vocabs)}.")
    if data.get("tied-embeddings-all", False):
        embeddings = "all"
        if vocabs[0] != vocabs[1]:
            raise ExportError(f"{where}: tied-embeddings-all with two vocabulary sizes {vocabs}.")
    elif data.get("tied-embeddings-src", False):
        raise _refuse(where, "tied-embeddings-src", True, "false")
    else:
        embeddings = "decoder" if data.get("tied-embeddings", False) else "none"
    return MarianConfig(
        encoder_layers=_int(data, "enc-depth", where), decoder_layers=_int(data, "dec-depth", where),
        d_model=d_model, heads=heads, ffn_dim=_int(data, "transformer-dim-ffn", where), activation=activation,
        decoder_cell=decoder_cell, source_vocab=vocabs[0], target_vocab=vocabs[1], embeddings=embeddings,
    )


def check_decoding_config(text: str, where: str) -> dict[str, Any]:
    """The shipped decoding yml: refuse what would make Marian's greedy output differ from aggdec's."""
    data = _load_yaml(text, where)
    for key, value in data.items():
        if key in DECODING_REQUIRED:
            if value not in DECODING_REQUIRED[key]:
                raise _refuse(where, key, value, ", ".join(repr(v) for v in DECODING_REQUIRED[key]))
        elif key not in DECODING_IRRELEVANT and key not in DECODING_READ:
            raise ExportError(f"{where}: option {key} is unknown to aggdec's Marian importer; it cannot tell "
                              "whether it changes the translation, so the model is refused.")
    max_length_factor(data, where)
    beam_rules(data, where)
    size = data.get("beam-size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise _refuse(where, "beam-size", size, "an integer of at least 1")
    return data


def beam_rules(decoding: dict[str, Any], where: str) -> dict[str, Any]:
    """The manifest's ``beam_rules``: beams follow Marian's rules (runtime/decoding/marian_beam.py),
    scored with the yml's ``normalize`` (the default length penalty; Marian's -n) and
    ``word-penalty`` (Marian's defaults, 0 and 0, where it sets none)."""
    values = {}
    for option, default in (("normalize", MARIAN_NORMALIZE), ("word-penalty", MARIAN_WORD_PENALTY)):
        value = decoding.get(option, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= BEAM_SCORING_BOUND:
            raise ExportError(f"{where}: option {option} must be a number from -{BEAM_SCORING_BOUND:g} to "
                              f"{BEAM_SCORING_BOUND:g}, got {shown(value)}.")
        values[option] = float(value)
    return {"family": "marian", "normalize": values["normalize"], "word_penalty": values["word-penalty"]}


def max_length_factor(decoding: dict[str, Any], where: str) -> float:
    """The decoding yml's ``max-length-factor`` (Marian's default where it is not set): Marian
    ends an output at ceil(factor x source tokens) tokens, which changes a greedy output that
    loops; the bundle records it (the manifest's ``max_length_factor``) and the runtime applies
    it per row (runtime/decoding/common.py ``source_length_cap``)."""
    value = decoding.get("max-length-factor", MARIAN_MAX_LENGTH_FACTOR)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_LENGTH_FACTOR:
        raise ExportError(f"{where}: option max-length-factor must be a number above 0 and at most "
                          f"{MAX_LENGTH_FACTOR}, got {shown(value)}.")
    return float(value)


def read_vocabulary(text: str, where: str, size: int) -> dict[str, int]:
    """A Marian vocabulary .yml (piece: id, OPUS-MT's ``*.vocab.yml``) as piece -> id, refused
    unless its ids are exactly 0 .. ``size`` - 1 (the model's ``dim-vocabs``), each piece a
    string (a piece YAML reads as a number or a boolean is not the piece Marian wrote)."""
    # libyaml's safe loader where PyYAML has it: an OPUS-MT vocabulary is 60,000 lines
    data = _load_yaml(text, where, getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for piece, index in data.items():
        if not isinstance(piece, str) or isinstance(index, bool) or not isinstance(index, int):
            raise ExportError(f"{where}: the entry {shown(piece)}: {shown(index)} is not a piece and its id.")
    ids = sorted(data.values())
    if ids != list(range(size)):
        raise ExportError(f"{where} holds {len(data)} pieces with ids {shown(ids[:3])}...{shown(ids[-1:])}; the "
                          f"model's vocabulary has {size}, ids 0 to {size - 1} once each.")
    return data
