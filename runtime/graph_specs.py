"""The IO of every bundle graph, as data: the contract between export and runtime.

These specs drive the exporter's input/output names and dynamic axes, are written into the
manifest, and are what the runtime feeds, binds and reads by name. A bundle whose manifest
declares other IO for a graph is refused at load (:func:`runtime_specs`, bundle_checks), not
when the first call fails. Dims are ints or symbolic names.
"""

from __future__ import annotations

from .decoding.cache import cross_dims, cross_names, self_cache_names, self_cache_out_names
from .bundle_schema import ACTIVATION_DTYPES, HEAD_POSITIONS
from .manifest import GraphSpec, Manifest, TensorSpec


def cross_specs(layers: int, heads: int, head_dim: int, act: str,
                cross_key_layout: str | None) -> tuple[TensorSpec, ...]:
    """Every layer's cross-attention key and value, as the encoder returns them and the
    verifier takes them (decoding/cache.py :func:`cross_dims`)."""
    return tuple(TensorSpec(name, act, cross_dims("batch", heads, "source_len", head_dim, name.startswith("cross_key"),
                                                  cross_key_layout))
                 for name in cross_names(layers))


def encoder_spec(layers: int, heads: int, head_dim: int, d_model: int, act: str = "float32",
                 output_rows: bool = False, cross_key_layout: str | None = None) -> GraphSpec:
    """``act`` (in every spec): the element type of the float tensors between graphs (the
    bundle's ``ACTIVATION_DTYPES[precision]``). ``output_rows`` (a shortlist bundle's encoder,
    :func:`takes_output_rows`): it also takes ``output_ids``, each new row's shortlist (-1
    padded; optional, an empty [1, 0] when not fed), and returns ``output_rows``, those rows of
    the output matrix, which the runtime keeps per slot and feeds the verifier every call.
    ``cross_key_layout`` (in the verifier's spec too): Manifest.cross_key_layout."""
    rows = ("output_rows", "output_len")
    return GraphSpec(
        file="encoder.onnx",
        inputs=(
            TensorSpec("input_ids", "int64", ("batch", "source_len")),
            TensorSpec("attention_mask", "int64", ("batch", "source_len")),
            *((TensorSpec("output_ids", "int64", rows),) if output_rows else ()),
        ),
        outputs=(
            TensorSpec("encoder_hidden_states", act, ("batch", "source_len", d_model)),
            *cross_specs(layers, heads, head_dim, act, cross_key_layout),
            *((TensorSpec("output_rows", act, (*rows, d_model)),) if output_rows else ()),
        ),
    )


# The verifier's graphs, by the candidates they return: "verifier" the top-K (log-prob, id) of
# each position, chosen on the logits (GAD++ and beams read them); "verifier_argmax" only the
# first of them, its id, for the modes that read nothing else (greedy, IAD, GAD). Same inputs,
# same cache outputs, same decoder: onnxruntime runs every node of a graph whatever outputs are
# requested (benchmarks/results/profile-step-cpu), so skipping log-softmax and top-k takes a
# graph of its own. Bundles exported before it have "verifier" alone (the runtime then reads
# the first candidate of the top-K).
VERIFIER_GRAPHS = {"verifier": "top_k", "verifier_argmax": "argmax"}
# What the argmax graph returns of each position: "logits", the scored logits, whose argmax the
# runtime takes in numpy on the CPU (onnxruntime's ArgMax takes 13x numpy's: decision 039), as
# bundles since it are exported; or "argmax", the best id (bundles before it, and shortlist
# bundles, whose graph maps a row's list positions to ids). The manifest's declared outputs say
# which (:func:`argmax_head`).
ARGMAX_HEADS = ("argmax", "logits")
LOGITS_OUTPUT = "best_logits"
# an int8 shortlist head's union of a call's lists and each list position's column in it (decision 049)
UNION_INPUTS = ("union_ids", "union_columns")
UNION_SPECS = (TensorSpec(UNION_INPUTS[0], "int64", ("union_len",)),
               TensorSpec(UNION_INPUTS[1], "int64", ("output_rows", "output_len")))  # fed as output_ids is


def argmax_head(manifest: Manifest) -> str:
    """The head of ``manifest``'s argmax graph (:data:`ARGMAX_HEADS`; "argmax" where it has none)."""
    spec = manifest.graphs.get("verifier_argmax")
    return "logits" if spec is not None and any(t.name == LOGITS_OUTPUT for t in spec.outputs) else "argmax"


def argmax_graph_runs_on(manifest: Manifest, device: str) -> bool:
    """Whether ``device`` runs the bundle's argmax graph: off the CPU, one that returns the logits
    does not (they would cross to the host at every call, where the top-K graph's few candidates
    do, and the export proves both choose the same ids, bitwise), so it is neither opened there
    nor built as a TensorRT engine."""
    return "verifier_argmax" in manifest.graphs and (device == "cpu" or argmax_head(manifest) != "logits")


def verifier_spec(layers: int, heads: int, head_dim: int, top_k: int, act: str = "float32",
                  cache_kind: str = "attention", shortlist: bool = False, head: str = "top_k",
                  d_model: int | None = None, cross_key_layout: str | None = None,
                  vocab: int | None = None, union: bool = False, head_positions: bool = False) -> GraphSpec:
    """``shortlist``: the verifier also takes ``output_ids``, each row's allowed output ids
    (decoding/shortlist.py), -1 padded, or one row of every id. ``head``: what it returns of
    each position (:data:`VERIFIER_GRAPHS`). ``d_model`` (a shortlist verifier that takes
    ``output_rows``, :func:`takes_output_rows`): it also takes each row's gathered output
    matrix, [rows, L, d_model] as the encoder returned it for that row's ``output_ids``, or an
    empty [1, 0, d_model] to gather it itself from ``output_ids`` (every id, one row for all).
    ``vocab``: the logits' width (the "logits" head's, which needs it). ``union`` (an int8
    shortlist head, :func:`takes_union_inputs`): it also takes :data:`UNION_INPUTS`, the union
    of the call's ``output_ids`` and each list position's column in it (decoding/shortlist.py
    ``union_feeds``). ``head_positions`` (the "logits" head only; bundles since decision 050,
    :func:`takes_head_positions`): it also takes :data:`HEAD_POSITIONS`, last, and returns the
    logits of those positions alone, [1, head_len, vocab] (the head's product stays rank 3, as
    the top-K graph's: export/graphs.py head_rows)."""
    head_positions = head_positions and head == "logits"
    # the decoder's own buffers (decoding/cache.py CACHE_KINDS): capacity is the runtime's choice,
    # fixed while a batch runs
    buffer = ("batch", heads, "capacity", head_dim)
    if head == "argmax":  # each position's best id: top_ids[..., 0] of the top-K graph, bitwise
        candidates: tuple[TensorSpec, ...] = (TensorSpec("top1_ids", "int64", ("batch", "new_len")),)
    elif head == "logits":  # the logits the top-K graph chooses on, float32 at every precision
        if vocab is None:
            raise ValueError("the logits head's spec needs the vocabulary size")
        candidates = (TensorSpec(LOGITS_OUTPUT, "float32", (1, "head_len", vocab) if head_positions
                                 else ("batch", "new_len", vocab)),)
    else:
        candidates = (
            # float32 at every precision: log-softmax and top-k run in float32 (export/half.py)
            TensorSpec("top_logprobs", "float32", ("batch", "new_len", top_k)),
            TensorSpec("top_ids", "int64", ("batch", "new_len", top_k)),
        )
    return GraphSpec(
        file="verifier.onnx" if head == "top_k" else "verifier_argmax.onnx",
        inputs=(
            TensorSpec("input_ids", "int64", ("batch", "new_len")),
            TensorSpec("past_lengths", "int64", ("batch",)),  # valid cached positions per row
            *(TensorSpec(name, act, buffer) for name in self_cache_names(layers, cache_kind)),
            *cross_specs(layers, heads, head_dim, act, cross_key_layout),
            TensorSpec("encoder_attention_mask", "int64", ("batch", "source_len")),
            *((TensorSpec("output_ids", "int64", ("output_rows", "output_len")),) if shortlist else ()),
            # not the output_ids dims: empty ([1, 0, d]) when every id is fed
            *((TensorSpec("output_rows", act, ("matrix_rows", "matrix_len", d_model)),)
              if shortlist and d_model is not None else ()),
            *(UNION_SPECS if shortlist and union else ()),
            *((TensorSpec(HEAD_POSITIONS, "int64", ("head_len",)),) if head_positions else ()),
        ),
        outputs=(
            *candidates,
            # the input buffers with the new tokens written at each row's length: bound to the
            # inputs' own memory by the runtime, so the write happens in place
            *(TensorSpec(name, act, buffer) for name in self_cache_out_names(layers, cache_kind)),
        ),
    )


def drafter_spec(d_model: int, k: int, act: str = "float32", shortlist: bool = False) -> GraphSpec:
    """``shortlist``: the drafter also takes ``output_ids``, as the verifier does (its head
    projects onto each row's allowed ids only)."""
    return GraphSpec(
        file="drafter.onnx",
        inputs=(
            # the last draft_window output tokens (decoder start included while the output is
            # shorter), then k [MASK] ids, right-padded
            TensorSpec("input_ids", "int64", ("batch", "draft_len")),
            TensorSpec("attention_mask", "int64", ("batch", "draft_len")),
            TensorSpec("slot_start", "int64", ("batch",)),  # where each row's [MASK] slots begin
            TensorSpec("position_offset", "int64", ("batch",)),  # the output position of input_ids[:, 0]
            # the encoder output; in a bundle with drafter_source, that graph's drafter_memory
            TensorSpec("encoder_hidden_states", act, ("batch", "source_len", d_model)),
            TensorSpec("encoder_attention_mask", "int64", ("batch", "source_len")),
            # one row per row (the verifier's may be one row for all: see export/drafter.py)
            *((TensorSpec("output_ids", "int64", ("batch", "output_len")),) if shortlist else ()),
        ),
        outputs=(TensorSpec("draft_ids", "int64", ("batch", k)),),
    )


def drafter_source_spec(d_model: int, act: str = "float32") -> GraphSpec:
    """The drafter-only encoder layers (``DrafterConfig.encoder_layers``), run once per request:
    the encoder output in, what drafter.onnx then reads as ``encoder_hidden_states`` out."""
    return GraphSpec(
        file="drafter_source.onnx",
        inputs=(
            TensorSpec("encoder_hidden_states", act, ("batch", "source_len", d_model)),
            TensorSpec("encoder_attention_mask", "int64", ("batch", "source_len")),
        ),
        outputs=(TensorSpec("drafter_memory", act, ("batch", "source_len", d_model)),),
    )


def takes_union_inputs(manifest: Manifest) -> bool:
    """Whether the bundle's verifier is fed the union of a call's shortlists and each list
    position's column in it (:data:`UNION_INPUTS`), made on the host when the rows change: an
    int8 shortlist head's since decision 049; one quantized before finds the union itself at
    every call."""
    verifier = manifest.graphs.get("verifier")
    return manifest.shortlist is not None and verifier is not None and UNION_INPUTS[0] in verifier.input_names()


def takes_head_positions(manifest: Manifest) -> bool:
    """Whether the bundle's argmax graph returns the logits of the block positions it is told
    (:data:`HEAD_POSITIONS`) rather than of every position: one exported since decision 050."""
    spec = manifest.graphs.get("verifier_argmax")
    return spec is not None and HEAD_POSITIONS in spec.input_names()


def runtime_specs(manifest: Manifest) -> dict[str, GraphSpec]:
    """The IO this runtime drives each graph a bundle may have with, for ``manifest``'s sizes."""
    m = manifest
    act = ACTIVATION_DTYPES[m.precision]
    rows = takes_output_rows(m)
    specs = {"encoder": encoder_spec(m.decoder_layers, m.num_heads, m.head_dim, m.d_model, act, rows,
                                     m.cross_key_layout),
             **{graph: verifier_spec(m.decoder_layers, m.num_heads, m.head_dim, m.top_k, act, m.cache_kind,
                                     m.shortlist is not None, argmax_head(m) if head == "argmax" else head,
                                     m.d_model if rows else None, m.cross_key_layout, m.vocab_size,
                                     takes_union_inputs(m), takes_head_positions(m))
                for graph, head in VERIFIER_GRAPHS.items()},
             "drafter_source": drafter_source_spec(m.d_model, act)}
    if m.draft_k is not None:
        specs["drafter"] = specs["drafter_int8"] = drafter_spec(m.d_model, m.draft_k, act,
                                                                drafter_takes_output_ids(m))
    return specs


def drafter_takes_output_ids(manifest: Manifest) -> bool:
    """Whether the bundle's drafter drafts over each row's shortlist (takes ``output_ids``):
    a shortlist bundle's drafter does since it was added; one exported before drafts over the
    whole vocabulary and is fed as before."""
    drafter = manifest.graphs.get("drafter")
    return manifest.shortlist is not None and drafter is not None and "output_ids" in drafter.input_names()


def takes_output_rows(manifest: Manifest) -> bool:
    """Whether the bundle's verifier takes each row's gathered output matrix (``output_rows``,
    made by its encoder when the row is admitted) instead of gathering it every call: a
    shortlist bundle's does since it was added (docs/marian.md); one exported before gathers
    and is fed ``output_ids`` alone, as before."""
    verifier = manifest.graphs.get("verifier")
    return manifest.shortlist is not None and verifier is not None and "output_rows" in verifier.input_names()
