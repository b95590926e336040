"""Load-time consistency: the manifest against the graphs onnxruntime loaded and the tokenizer.

The sha256s only say that the files are the ones the manifest lists; they do not say that a
hand-edited manifest, a drafter or tokenizer copied from another model, or a graph from
another export agree with each other. :func:`check_consistency` checks that, after the
sessions are created and before anything is decoded, so such a bundle fails at load with a
:class:`BundleError` naming the field and both values, not deep inside a decode with an
onnxruntime shape error (or, worse, with wrong output).

What IO cannot show (a graph's vocabulary) is checked by running the graphs once at load:
:mod:`.bundle_probe`.

Everything here is generic over the graphs' IO: tensors are recognised by their role (which
graph, input or output, element type, rank), never by name, so the exporter can rename or
split tensors (a stacked cache or one tensor per layer) without changing this module.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from .bundle_schema import DRAFTER_GRAPHS, DTYPES, show
from .errors import BundleError
from .graph_specs import runtime_specs
from .manifest import GraphSpec, Manifest, TensorSpec

ADVICE = "the bundle's files do not belong together; re-run `aggdec export`."
# The last dim of a tensor of this role must equal this manifest field:
# (graph, side, float tensor? (None: any), rank) -> field
LAST_DIM_FIELDS = (
    ("encoder", "outputs", True, 3, "d_model"),  # hidden states for the drafter
    ("drafter", "inputs", True, 3, "d_model"),
    ("drafter_source", "inputs", True, 3, "d_model"),
    ("drafter_source", "outputs", True, 3, "d_model"),
    ("verifier", "outputs", None, 3, "top_k"),  # [batch, new_len, top_k] candidates, never full logits
    ("drafter", "outputs", False, 2, "draft_k"),
)
_FIRST_NUMBER = re.compile(r"\d+")


def _is_float(dtype: str) -> bool:
    return "float" in dtype


def _real(session: Any, side: str) -> list[TensorSpec]:
    """A session's IO as TensorSpecs (dims: int where fixed, a name or None where not)."""
    session = getattr(session, "_session", session)  # accept aggdec's OrtSession wrapper too
    # inputs with a default (an initializer of the same name, e.g. a shortlist encoder's
    # output_ids) are inputs a caller may feed: onnxruntime lists them apart
    args = ([*session.get_inputs(), *session.get_overridable_initializers()] if side == "inputs"
            else session.get_outputs())
    dtypes = {ort: ours for ours, ort in DTYPES.items()}
    return [TensorSpec(a.name, dtypes.get(a.type, a.type), tuple(a.shape or ())) for a in args]


def _compare_io(graph: str, spec: GraphSpec, session: Any) -> dict[str, list[TensorSpec]]:
    """The graph's real IO must be the spec's: names, element types, ranks and fixed dims."""
    real = {}
    for side in ("inputs", "outputs"):
        declared: Sequence[TensorSpec] = getattr(spec, side)
        actual = _real(session, side)
        real[side] = actual
        want, have = [t.name for t in declared], [t.name for t in actual]
        if sorted(want) != sorted(have):
            missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
            raise BundleError(
                f"{spec.file} ({graph}) has {side} {', '.join(map(show, have))} but the manifest lists "
                f"{', '.join(map(show, want))} (missing {missing or 'none'}, unexpected {extra or 'none'}); {ADVICE}"
            )
        by_name = {t.name: t for t in actual}
        for tensor in declared:
            found = by_name[tensor.name]
            where = f"{spec.file} ({graph}) {side[:-1]} {tensor.name!r}"
            if found.dtype != tensor.dtype:
                raise BundleError(f"{where} is {found.dtype} in the graph but {tensor.dtype} in the manifest; {ADVICE}")
            if len(found.dims) != len(tensor.dims):
                raise BundleError(f"{where} has {len(found.dims)} dims {list(found.dims)} in the graph but "
                                  f"{len(tensor.dims)} {list(tensor.dims)} in the manifest; {ADVICE}")
            for axis, (mine, theirs) in enumerate(zip(tensor.dims, found.dims)):
                if isinstance(mine, int) and isinstance(theirs, int) and mine != theirs:
                    raise BundleError(f"{where} dim {axis} is {theirs} in the graph but {mine} in the manifest; "
                                      f"{ADVICE}")
                # a graph that fixes an input dim the runtime varies (batch, lengths) would fail mid-decode
                if side == "inputs" and isinstance(mine, str) and isinstance(theirs, int):
                    raise BundleError(f"{where} dim {axis} is fixed to {theirs} in the graph but varies ({mine!r}) "
                                      f"in the manifest; {ADVICE}")
    return real


def _field_error(field: str, value: Any, where: str, axis: int, found: int) -> BundleError:
    return BundleError(f"manifest {field} is {value} but {where} has {found} at dim {axis} "
                       f"(where {field} belongs); {ADVICE}")


def _check_fields(manifest: Manifest, graph: str, side: str, tensors: Iterable[TensorSpec], origin: str,
                  seen: set[str]) -> None:
    """Manifest sizes against the dims of tensors with a known role, wherever those dims are fixed."""
    m = manifest
    graph = "drafter" if graph in DRAFTER_GRAPHS else graph  # both drafter graphs have the drafter's roles
    for tensor in tensors:
        where = f"{graph} {side[:-1]} {tensor.name!r} in {origin}"
        dims = tensor.dims
        for role_graph, role_side, floating, rank, field in LAST_DIM_FIELDS:
            if (graph, side, rank) == (role_graph, role_side, len(dims)) and \
                    floating in (None, _is_float(tensor.dtype)) and isinstance(dims[-1], int):
                seen.add(field)
                if dims[-1] != getattr(m, field):
                    raise _field_error(field, getattr(m, field), where, rank - 1, dims[-1])
        # attention caches: [..., heads, length, head_dim], stacked ones led by [layers, 2 (key/value)]
        if _is_float(tensor.dtype) and len(dims) >= 4:
            for axis, field in ((len(dims) - 3, "num_heads"), (len(dims) - 1, "head_dim")):
                if isinstance(dims[axis], int):
                    seen.add(field)
                    if dims[axis] != getattr(m, field):
                        raise _field_error(field, getattr(m, field), where, axis, dims[axis])
            if len(dims) == 6 and isinstance(dims[0], int):
                seen.add("decoder_layers")
                if dims[0] != m.decoder_layers:
                    raise _field_error("decoder_layers", m.decoder_layers, where, 0, dims[0])


def _check_layer_count(manifest: Manifest, graph: str, side: str, tensors: Iterable[TensorSpec], origin: str,
                       seen: set[str]) -> None:
    """Per-layer caches ("key_cache.0", "past.1.value", ...): each family of names must be numbered
    exactly 0 .. decoder_layers - 1."""
    families: dict[str, list[int]] = {}
    for tensor in tensors:
        number = _FIRST_NUMBER.search(tensor.name)
        if number is None or not _is_float(tensor.dtype) or len(tensor.dims) != 4:
            continue
        pattern = tensor.name[: number.start()] + "#" + tensor.name[number.end():]
        families.setdefault(pattern, []).append(int(number.group()))
    for pattern, numbers in sorted(families.items()):
        seen.add("decoder_layers")
        if sorted(numbers) != list(range(manifest.decoder_layers)):
            raise BundleError(
                f"manifest decoder_layers is {manifest.decoder_layers} but {graph} in {origin} has "
                f"{len(numbers)} {side} {pattern!r} numbered {sorted(numbers)[:8]}{'...' if len(numbers) > 8 else ''}; "
                f"{ADVICE}"
            )


def _check_contract(manifest: Manifest) -> None:
    """Each graph's IO, as the manifest declares it, must be what this runtime feeds and reads:
    the same names, element types and ranks (graph_specs). A graph and manifest that agree with
    each other on other names would otherwise load, and fail at their first call."""
    expected = runtime_specs(manifest)
    for graph, spec in manifest.graphs.items():
        if graph not in expected:
            raise BundleError(f"the bundle has a graph {graph!r} this aggdec does not know (it drives "
                              f"{', '.join(sorted(expected))}); {ADVICE}")
        for side in ("inputs", "outputs"):
            have = {(t.name, t.dtype, len(t.dims)) for t in getattr(spec, side)}
            want = {(t.name, t.dtype, len(t.dims)) for t in getattr(expected[graph], side)}
            if have != want:
                def shown(tensors: set[tuple[str, str, int]]) -> str:
                    listed = (f"{name} ({dtype}, rank {rank})" for name, dtype, rank in sorted(tensors))
                    return ", ".join(listed) or "none"

                raise BundleError(f"{spec.file} ({graph}) {side} are not the ones this aggdec {_USE[side]}: "
                                  f"unexpected {shown(have - want)}; missing {shown(want - have)}; {ADVICE}")
            # the cross keys' axes follow cross_key_layout: ranks alike, a key fed in the other
            # layout would be refused by onnxruntime, or read wrongly where source_len = head_dim
            layout = {t.name: t.dims for t in getattr(expected[graph], side) if t.name.startswith("cross_")}
            for tensor in getattr(spec, side):
                if tensor.name in layout and tensor.dims != layout[tensor.name]:
                    raise BundleError(f"{spec.file} ({graph}) {side[:-1]} {tensor.name!r} has dims {list(tensor.dims)} "
                                      f"in the manifest, but its cross_key_layout {show(manifest.cross_key_layout)} "
                                      f"has them {list(layout[tensor.name])}; {ADVICE}")


_USE = {"inputs": "feeds", "outputs": "reads"}


# the ids decoding starts, stops and pads with, and forces: tokens the tokenizer must know, as special
SPECIAL_ID_FIELDS = ("decoder_start_token_id", "eos_token_id", "pad_token_id", "forced_bos_token_id",
                     "forced_eos_token_id")


def _check_tokenizer(manifest: Manifest, tokenizer_vocab_size: int, special_ids: Collection[int] | None) -> None:
    m = manifest
    # the model's embedding may be larger than the tokenizer (padded rows), never smaller
    if tokenizer_vocab_size > m.vocab_size:
        raise BundleError(f"tokenizer.json has token ids up to {tokenizer_vocab_size - 1} but manifest vocab_size is "
                          f"{m.vocab_size}: the tokenizer belongs to another model; {ADVICE}")
    for field in SPECIAL_ID_FIELDS:
        value = getattr(m, field)
        if value is not None and value >= tokenizer_vocab_size:
            raise BundleError(f"manifest {field} is {value} but tokenizer.json has token ids up to "
                              f"{tokenizer_vocab_size - 1} only; {ADVICE}")
        # a tokenizer of the same size from another model has ordinary words at these ids: the
        # output would end, start or be dropped (decoding skips special tokens) at the wrong tokens
        if value is not None and special_ids is not None and value not in special_ids:
            raise BundleError(f"manifest {field} is {value}, which tokenizer.json has as an ordinary token, not a "
                              f"special one (its special ids: {sorted(special_ids)[:8]}): the tokenizer belongs to "
                              f"another model; {ADVICE}")
    # the drafter's [MASK] is an extra embedding row: an id the tokenizer produces would be read as text
    if m.mask_token_id is not None and m.mask_token_id < tokenizer_vocab_size:
        raise BundleError(f"manifest mask_token_id is {m.mask_token_id}, a token of tokenizer.json (which has "
                          f"{tokenizer_vocab_size}): the drafter's [MASK] must be outside the tokenizer's "
                          f"vocabulary; {ADVICE}")


def check_consistency(manifest: Manifest, sessions: Mapping[str, Any], tokenizer_vocab_size: int,
                      special_ids: Collection[int] | None = None, unopened: Collection[str] = ()) -> None:
    """Raise :class:`BundleError` unless the manifest, the graphs and the tokenizer agree.

    ``sessions``: graph name ("encoder", "verifier", "drafter") -> the onnxruntime
    InferenceSession (or aggdec OrtSession) created for it; every graph of the manifest must
    be there, except that of a bundle's two drafter graphs (``DRAFTER_GRAPHS``) the one the
    runtime did not open may be absent. ``tokenizer_vocab_size``: the tokenizer's size with added tokens;
    ``special_ids``: the ids it marks special (None: not checked).
    Checks each graph's real IO against the manifest's spec (names, element types, ranks,
    fixed dims), the manifest's sizes (d_model, num_heads, head_dim, top_k, draft_k,
    decoder_layers) against the dims where they appear, that IO against what this runtime feeds
    and reads (names, element types, ranks: ``graph_specs``), and the special ids against the
    tokenizer: within its vocabulary, special there, and the drafter's [MASK] outside it.
    """
    # the drafter graph not chosen, and ``unopened``: graphs the device does not run (graph_specs.argmax_graph_runs_on)
    skipped = (set(DRAFTER_GRAPHS) - set(sessions) if set(DRAFTER_GRAPHS) & set(sessions) else set()) | set(unopened)
    missing = sorted(set(manifest.graphs) - set(sessions) - skipped)
    if missing:
        raise BundleError(f"no session for the bundle's graphs {', '.join(missing)} to check.")
    seen: set[str] = set()
    for graph, spec in manifest.graphs.items():
        if graph not in sessions:
            continue  # not opened: the other drafter graph (its IO equals the opened one's: bundle_schema), or unopened
        real = _compare_io(graph, spec, sessions[graph])
        for side in ("inputs", "outputs"):
            for origin, tensors in (("the manifest's graph spec", getattr(spec, side)), (spec.file, real[side])):
                _check_fields(manifest, graph, side, tensors, origin, seen)
                _check_layer_count(manifest, graph, side, tensors, origin, seen)
    _check_contract(manifest)  # the graphs are what the manifest says: now, is that what the runtime drives?
    wanted = {"d_model", "top_k", "num_heads", "head_dim", "decoder_layers"} | (
        {"draft_k"} if "drafter" in manifest.graphs else set())
    unchecked = sorted(wanted - seen)
    if unchecked:  # a size no graph shows cannot be trusted: the runtime sizes buffers from it
        raise BundleError(f"no graph of the bundle has a fixed dim for manifest {', '.join(unchecked)}; {ADVICE}")
    _check_tokenizer(manifest, tokenizer_vocab_size, special_ids)
