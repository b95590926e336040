"""The schema of ``manifest.json``: a bundle is untrusted input, so it is checked before use.

One rule per :class:`~aggdec.runtime.manifest.Manifest` field (the ``FIELDS`` table): its JSON
type, its range, and for ids and sizes the other fields it depends on. Graph IO is checked
generically (names, dtypes from a known set, dims that are ints >= 1 or identifiers), never
by graph IO name, so the exporter can change the graphs' IO without touching this module.

Every file name the manifest gives (``files`` keys, ``graphs.*.file``) must be a plain name
inside the bundle directory, and is checked here, before anything touches the filesystem, so
that a hostile manifest can neither make aggdec read outside the bundle nor learn anything
about such a path (whether it exists, its hash) from an error message.

Unknown keys are refused rather than ignored: the manifest is versioned (``format_version``),
so an unknown key means a hand-edited manifest or one written by a newer aggdec whose meaning
this version cannot honour; silently dropping it could decode differently from what the
exporter intended.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import BundleError
from .segmentation import SEGMENTATIONS, SENTENCEPIECE, SENTENCEPIECE_FILE

MAX_SEQUENCE_LEN = 65536  # refused above: no position table is that long, and buffers are sized from it
# ONNX element types a bundle graph may use; the onnxruntime spelling of each, for the load-time check
DTYPES = {
    "float32": "tensor(float)", "float16": "tensor(float16)", "bfloat16": "tensor(bfloat16)",
    "float64": "tensor(double)", "int64": "tensor(int64)", "int32": "tensor(int32)",
    "int8": "tensor(int8)", "uint8": "tensor(uint8)", "bool": "tensor(bool)",
}
MODEL_DTYPES = ("float32", "float16", "bfloat16")  # the manifest's own `dtype`: the weights' precision
PRECISIONS = ("fp32", "int8", "fp16")  # how the graphs compute (`aggdec quantize`: int8 for the CPU, fp16 for CUDA)
# the element type of the float tensors a bundle's graphs exchange (encoder output, cross K/V,
# self-attention buffers): int8 bundles quantize inside each product and keep float32 between
# them; fp16 bundles hand fp16 from graph to graph. top_logprobs is float32 at every precision.
ACTIVATION_DTYPES = {"fp32": "float32", "int8": "float32", "fp16": "float16"}
CACHE_KIND_NAMES = ("attention", "recurrent")  # the verifier's own cache (decoding/cache.py CACHE_KINDS)
DRAFT_POSITIONS = ("output", "source")  # where the drafter reads its tokens (export.drafter.POSITIONS)
# One drafter, two graphs: "drafter" (float, every device) and, in fp32 bundles, "drafter_int8",
# the same drafter with int8 matrix products for the CPU (export/quantize.py). A drafter only
# proposes tokens, so its precision changes speed, never the output; the runtime opens one of them.
DRAFTER_GRAPHS = ("drafter", "drafter_int8")
# The argmax graph's one input beyond the verifier's, last, where its head returns logits
# (graph_specs.verifier_spec; decision 050): the block positions whose logits the call returns,
# as indexes into the call's rows x width, so that a row's padding past its block costs no
# vocabulary head. The logits are then [1, head_len, vocab], those positions in that order.
HEAD_POSITIONS = "head_positions"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# tensor names may carry a layer index or a path ("key_cache.0", "/decoder/out"), never control characters
_TENSOR_NAME = re.compile(r"[A-Za-z0-9_./:\-]{1,256}\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_RESERVED_NAMES = {"manifest.json"}  # the manifest cannot list (and hash) itself


class Invalid(Exception):
    """One schema violation; :func:`validate_manifest` turns it into a BundleError with the path."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.message, self.path = message, path

    def inside(self, segment: str) -> Invalid:
        return Invalid(self.message, segment + self.path)

    def __str__(self) -> str:
        return f"{self.path} {self.message}".lstrip()


def show(value: Any, limit: int = 60) -> str:
    """A value for an error message: repr, one line, bounded (a manifest can hold anything)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_file_name(name: Any) -> str:
    """A plain file name inside the bundle directory, or :class:`Invalid`. Pure: no filesystem access."""
    if not isinstance(name, str):
        raise Invalid(f"must be a file name string, got {type(name).__name__}")
    if (not name or name in (".", "..") or any(c in name for c in "/\\:\0") or ".." in name
            or any(ord(c) < 32 or ord(c) == 127 for c in name) or len(name) > 255):
        raise Invalid(
            f"{show(name)} is not a plain file name; bundle files must sit directly in the bundle directory "
            "(no '/', '\\', ':', '..', control characters or absolute paths)"
        )
    if name in _RESERVED_NAMES:
        raise Invalid(f"{show(name)} is reserved for the manifest itself")
    return name


# -- field rules: each takes (value, the whole manifest object) and raises Invalid --------------

Rule = Callable[[Any, dict], None]


def _type(value: Any, kind: type, what: str) -> None:
    # bool is an int in Python but never a valid size or id in a manifest
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise Invalid(f"must be {what}, got {type(value).__name__} {show(value)}")


MAX_TEXT_LEN = 256  # a free-text manifest field (a pattern, a name): writers check against it first


def text(value: Any, data: dict) -> None:
    _type(value, str, "a string")
    if not value or len(value) > MAX_TEXT_LEN:
        raise Invalid(f"must be a non-empty string of at most {MAX_TEXT_LEN} characters, got {show(value)}")


def integer(low: int, high: int | str | None = None, below: bool = False) -> Rule:
    """An int in [low, high] (or [low, high) with ``below``); ``high`` may name an earlier field."""

    def rule(value: Any, data: dict) -> None:
        _type(value, int, "an integer")
        hi = data[high] if isinstance(high, str) else high
        if hi is not None and below:
            hi -= 1
        if value < low or (hi is not None and value > hi):
            span = f"of at least {low}" if hi is None else f"from {low} to {hi}"
            why = f" ({high} is {data[high]})" if isinstance(high, str) else ""
            raise Invalid(f"must be an integer {span}{why}, got {value}")

    return rule


token_id = integer(0, "vocab_size", below=True)


def optional(rule: Rule) -> Rule:
    def check(value: Any, data: dict) -> None:
        if value is not None:
            rule(value, data)

    return check


def one_of(choices: tuple[str, ...]) -> Rule:
    def rule(value: Any, data: dict) -> None:
        if value not in choices or not isinstance(value, str):
            raise Invalid(f"must be one of {', '.join(choices)}, got {show(value)}")

    return rule


def list_of(rule: Rule, limit: int = 1 << 20) -> Rule:
    def check(value: Any, data: dict) -> None:
        _type(value, list, "a list")
        if len(value) > limit:
            raise Invalid(f"has {len(value)} entries, more than {limit}")
        for index, item in enumerate(value):
            try:
                rule(item, data)
            except Invalid as exc:
                raise exc.inside(f"[{index}]") from None

    return check


def dict_of(key: Rule, value_rule: Rule) -> Rule:
    def check(value: Any, data: dict) -> None:
        _type(value, dict, "an object")
        for name, item in value.items():
            try:
                key(name, data)
            except Invalid as exc:
                raise exc.inside(" key") from None
            try:
                value_rule(item, data)
            except Invalid as exc:
                raise exc.inside(f"[{show(name)}]") from None

    return check


def obj(fields: dict[str, Rule], optional_keys: frozenset[str] = frozenset()) -> Rule:
    """A JSON object with exactly these keys, those in ``optional_keys`` possibly absent (added
    after bundles were written without them; see the module docstring on unknown keys)."""

    def check(value: Any, data: dict) -> None:
        _type(value, dict, "an object")
        _exact_keys(value, fields, optional_keys)
        for name, rule in fields.items():
            if name not in value:  # an absent optional key
                continue
            try:
                rule(value[name], data)
            except Invalid as exc:
                raise exc.inside(f".{name}") from None

    return check


def _exact_keys(value: dict, fields: dict[str, Any], optional_keys: frozenset[str] = frozenset()) -> None:
    missing = [k for k in fields if k not in value and k not in optional_keys]
    unknown = [k for k in value if k not in fields]
    if missing:
        raise Invalid(f"is missing {', '.join(map(show, missing))}")
    if unknown:
        raise Invalid(f"has unknown keys {', '.join(map(show, sorted(unknown, key=str)))} (written by a newer "
                      "aggdec, or edited by hand)")


def boolean(value: Any, data: dict) -> None:
    if not isinstance(value, bool):
        raise Invalid(f"must be true or false, got {type(value).__name__} {show(value)}")


def number(low: float, high: float | None = None, above: bool = False) -> Rule:
    """A finite JSON number (int or float, never a bool) in [low, high] (``above``: in (low, high])."""

    def rule(value: Any, data: dict) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
                or value in (float("inf"), float("-inf")):
            raise Invalid(f"must be a finite number, got {type(value).__name__} {show(value)}")
        if value < low or (above and value == low) or (high is not None and value > high):
            if above:
                span = f"above {low}" + ("" if high is None else f" and at most {high}")
            else:
                span = f"at least {low}" if high is None else f"from {low} to {high}"
            raise Invalid(f"must be a number {span}, got {show(value)}")

    return rule


def file_name(value: Any, data: dict) -> None:
    check_file_name(value)


def sha256(value: Any, data: dict) -> None:
    if not isinstance(value, str) or not _SHA256.match(value):
        raise Invalid(f"must be a sha256 digest (64 lowercase hex characters), got {show(value)}")


def tensor_name(value: Any, data: dict) -> None:
    if not isinstance(value, str) or not _TENSOR_NAME.match(value):
        raise Invalid(f"must be a tensor name (letters, digits, '_', '.', '/', ':', '-'), got {show(value)}")


def identifier(value: Any, data: dict) -> None:
    if not isinstance(value, str) or not _IDENTIFIER.match(value) or len(value) > 64:
        raise Invalid(f"must be an identifier, got {show(value)}")


def dim(value: Any, data: dict) -> None:
    if isinstance(value, str):
        identifier(value, data)
    else:
        integer(1)(value, data)


def _unique_names(value: list, data: dict) -> None:
    names = [t["name"] for t in value]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise Invalid(f"names {', '.join(map(show, duplicated))} more than once")


def _all(*rules: Rule) -> Rule:
    def check(value: Any, data: dict) -> None:
        for rule in rules:
            rule(value, data)

    return check


TENSOR = obj({"name": tensor_name, "dtype": one_of(tuple(DTYPES)), "dims": list_of(dim, 16)})
TENSORS = _all(list_of(TENSOR, 4096), _unique_names)
GRAPH = obj({"file": file_name, "inputs": TENSORS, "outputs": TENSORS})

# How an int8 bundle's encoder quantizes its activations: "per-row" as the verifier (one scale
# per position: a batch is encoded in one call), or "per-call" (onnxruntime's dynamic
# quantization, one scale per call: faster, but a source's encoding would depend on its batch
# mates and padding, so the runtime encodes one source per call). Absent: per-row.
ENCODER_QUANTIZATION = ("per-row", "per-call")

# what `aggdec quantize` records about an int8 bundle: its scheme and how far it is from fp32
QUANTIZATION = obj({
    "scheme": one_of(("per-row-int8", "two-pass-int8", "fp16")),
    "encoder": one_of(ENCODER_QUANTIZATION),  # may be absent (optional_keys), never null
    "reference": text,
    "output_projection": boolean,
    "quantized_matmuls": integer(0, 1 << 20),
    "positions": integer(1, 1 << 30),
    "top1_agreement": number(0.0, 1.0),
    "max_logprob_error": number(0.0),
    "mean_logprob_error": number(0.0),
    "draft_agreement": optional(number(0.0, 1.0)),
    "float_products": text,  # QuantizeOptions.float_products, when set
    "int8_grid_matrices": integer(0, 1 << 20),  # two-pass: weights that kept their own int8 grid
}, optional_keys=frozenset({"encoder", "float_products", "int8_grid_matrices"}))

# whose beam search a bundle follows besides transformers' (Manifest.beam_rules)
BEAM_FAMILIES = ("marian",)
# where the verifier masks suppressed ids (Manifest.suppression)
SUPPRESSION_ORDERS = ("before_log_softmax", "after_log_softmax")
# the axes of the cross-attention keys after [rows] (Manifest.cross_key_layout, decoding/cache.py
# cross_dims): as the values, or transposed once by the encoder for the verifier's Q.K^T
CROSS_KEY_LAYOUTS = ("heads_source_dim", "heads_dim_source")

# field -> rule, in an order where every field a rule refers to (vocab_size) comes first
FIELDS: dict[str, Rule] = {
    "format_version": integer(1),  # its value is checked by Manifest.from_json, with its own message
    "family": text,
    "architecture": text,
    "vocab_size": integer(1),
    "d_model": integer(1),
    "encoder_layers": integer(1),
    "decoder_layers": integer(1),
    "num_heads": integer(1),
    "head_dim": integer(1),
    "decoder_start_token_id": token_id,
    "eos_token_id": token_id,
    "pad_token_id": token_id,
    "forced_bos_token_id": optional(token_id),
    "forced_eos_token_id": optional(token_id),
    "suppressed_token_ids": list_of(token_id),
    "max_source_len": integer(2, MAX_SEQUENCE_LEN),
    "max_target_len": integer(2, MAX_SEQUENCE_LEN),
    "top_k": integer(1, "vocab_size"),
    "dtype": one_of(MODEL_DTYPES),
    "opset": integer(1, 1000),
    "graphs": dict_of(identifier, GRAPH),
    "files": dict_of(file_name, sha256),
    "draft_k": optional(integer(1, MAX_SEQUENCE_LEN)),
    # the drafter's [MASK] is an extra embedding row: id vocab_size itself is allowed
    "mask_token_id": optional(integer(0, "vocab_size")),
    "draft_window": optional(integer(0, MAX_SEQUENCE_LEN)),
    "draft_positions": optional(one_of(DRAFT_POSITIONS)),
    "exporter": dict_of(text, text),
    "precision": one_of(PRECISIONS),
    "quantization": optional(QUANTIZATION),
    "cache_kind": one_of(CACHE_KIND_NAMES),
    "shortlist": optional(obj({"file": file_name, "first": integer(0, "vocab_size"), "shared": boolean})),
    # Marian's max-length-factor: a row's output cap is ceil(factor x its source length)
    "max_length_factor": optional(number(0, MAX_SEQUENCE_LEN, above=True)),
    "suppression": optional(one_of(SUPPRESSION_ORDERS)),
    # whose beam search the bundle follows (decoding/loop.py BEAM_GROUPS) with Marian's scoring options
    "beam_rules": optional(obj({"family": one_of(BEAM_FAMILIES), "normalize": number(-1e3, 1e3),
                                "word_penalty": number(-1e3, 1e3)})),
    "cross_key_layout": optional(one_of(CROSS_KEY_LAYOUTS)),
    "segmentation": optional(one_of(SEGMENTATIONS)),
    "clean_up_tokenization_spaces": optional(boolean),
    "split_special_tokens": optional(boolean),
}
# fields with a dataclass default: an older manifest may leave them out
OPTIONAL_FIELDS = frozenset({"draft_k", "mask_token_id", "draft_window", "draft_positions", "exporter", "precision",
                             "quantization", "cache_kind", "shortlist", "max_length_factor", "suppression",
                             "beam_rules", "cross_key_layout", "segmentation", "clean_up_tokenization_spaces",
                             "split_special_tokens"})
REQUIRED_GRAPHS = ("encoder", "verifier")


def _cross_field(data: dict) -> None:
    """Rules that tie fields together: what the runtime opens must be listed and hashed."""
    graphs, files = data["graphs"], data["files"]
    for name in REQUIRED_GRAPHS:
        if name not in graphs:
            raise Invalid(f"graphs has no {name!r} graph (it has: {', '.join(sorted(graphs)) or 'none'})")
    if "tokenizer.json" not in files:
        raise Invalid("files does not list 'tokenizer.json'")
    for name, graph in graphs.items():
        if graph["file"] not in files:
            # an unlisted file would be loaded without a hash check
            raise Invalid(f"graphs.{name}.file {show(graph['file'])} is not listed in files")
    if data.get("segmentation") == SENTENCEPIECE and SENTENCEPIECE_FILE not in files:
        raise Invalid(f"segmentation {SENTENCEPIECE!r} needs {SENTENCEPIECE_FILE!r} listed in files")
    if data.get("segmentation") == SENTENCEPIECE and data.get("clean_up_tokenization_spaces") is not None:
        # that file holds its decoding rules, the clean-up included: one place says it
        raise Invalid(f"clean_up_tokenization_spaces is set where segmentation {SENTENCEPIECE!r} has "
                      f"{SENTENCEPIECE_FILE!r} say it")
    shortlist = data.get("shortlist")
    if shortlist is not None and shortlist["file"] not in files:
        raise Invalid(f"shortlist.file {show(shortlist['file'])} is not listed in files")
    precision = data.get("precision", "fp32")
    if (data.get("quantization") is not None) != (precision != "fp32"):
        raise Invalid(f"quantization must be set exactly when precision is not fp32 (precision: {show(precision)}, "
                      f"quantization: {'set' if data.get('quantization') is not None else 'none'})")
    if "encoder" in (data.get("quantization") or {}) and precision != "int8":
        raise Invalid(f"quantization.encoder is set in a {show(precision)} bundle: it says how an int8 encoder is "
                      "quantized")
    has_drafter = "drafter" in graphs
    if "drafter_int8" in graphs:
        if not has_drafter:
            raise Invalid("graphs has a 'drafter_int8' graph but no 'drafter' graph: drafter_int8 is the int8 copy "
                          "of the bundle's drafter")
        if precision != "fp32":
            raise Invalid(f"graphs has a 'drafter_int8' graph in a {show(precision)} bundle: only fp32 bundles carry "
                          "one (the drafter of an int8 bundle is int8 already)")
        for side in ("inputs", "outputs"):
            # the runtime drives either graph with the same arrays
            if graphs["drafter_int8"][side] != graphs["drafter"][side]:
                raise Invalid(f"graphs.drafter_int8.{side} differ from graphs.drafter.{side}: the two are one drafter "
                              "and must have the same IO")
    if "verifier_argmax" in graphs:
        # the runtime drives either verifier graph with one batch's arrays (graph_specs.VERIFIER_GRAPHS);
        # the argmax graph may take the positions to return the logits of after them (decision 050)
        inputs = graphs["verifier_argmax"]["inputs"]
        if inputs and inputs[-1].get("name") == HEAD_POSITIONS:
            inputs = inputs[:-1]
        if inputs != graphs["verifier"]["inputs"]:
            raise Invalid("graphs.verifier_argmax.inputs differ from graphs.verifier.inputs: the argmax graph is the "
                          f"verifier with another head and must take the same inputs (and {HEAD_POSITIONS!r} last)")
    if "drafter_source" in graphs and not has_drafter:
        raise Invalid("graphs has a 'drafter_source' graph but no 'drafter' graph: drafter_source is the drafter's "
                      "own encoder layers")
    for name in ("draft_k", "mask_token_id", "draft_window"):
        if (data.get(name) is not None) != has_drafter:
            raise Invalid(f"{name} must be set exactly when the bundle has a drafter graph "
                          f"(drafter graph: {'yes' if has_drafter else 'no'}, {name}: {show(data.get(name))})")
    if data.get("draft_positions") is not None and not has_drafter:  # absent in bundles from before the field
        raise Invalid(f"draft_positions is set ({show(data['draft_positions'])}) but the bundle has no drafter graph")


def validate_manifest(data: Any, source: str) -> None:
    """Raise :class:`BundleError` unless ``data`` (parsed JSON) is a well-formed manifest."""
    advice = "re-export the model with `aggdec export`."
    if not isinstance(data, dict):
        raise BundleError(f"{source} must hold a JSON object, not {type(data).__name__}; {advice}")
    try:
        _exact_keys(data, FIELDS, OPTIONAL_FIELDS)
    except Invalid as exc:
        raise BundleError(f"{source} {exc}; {advice}") from None
    for name, rule in FIELDS.items():
        if name in data:
            try:
                rule(data[name], data)
            except Invalid as exc:
                raise BundleError(f"{source}: {name}{exc.path} {exc.message}; {advice}") from None
    try:
        _cross_field(data)
    except Invalid as exc:
        raise BundleError(f"{source}: {exc}; {advice}") from None
