"""Load-time probes: every graph run once at the edges of the manifest's vocabulary, and the
encoder and verifier at the edges of its lengths (:func:`probe_lengths`).

A graph's IO says nothing of its vocabulary (token ids go in and out as int64 of any value),
and the runtime does not parse ONNX to count an embedding's rows. So, after the IO checks of
:mod:`.bundle_checks` and before any text is decoded, :func:`probe_vocabulary` runs each graph
once on a two-token source holding the manifest's last id (``vocab_size - 1``), and the drafter
on its [MASK] id, and requires every id a graph returns to lie in the vocabulary (and the
argmax verifier graph's ids to be the top-K graph's best, bitwise). A graph
traced from another model then fails at load with a :class:`BundleError` naming it:

- a smaller vocabulary than the manifest's: the id is past the graph's embedding, which
  onnxruntime refuses to look up (on the CPU; a GPU kernel may not check);
- a drafter for another vocabulary: its [MASK] (an extra row after the verifier's vocabulary)
  is past its embedding, or it drafts ids the verifier has no row for;
- a larger vocabulary: the verifier or drafter returns an id outside the manifest's, when it
  does here (the decode loop checks every call's ids as well, decoding/verifier.py and gad.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .bundle_checks import ADVICE
from .bundle_schema import ACTIVATION_DTYPES, DRAFTER_GRAPHS
from .decoding.cache import cross_names, self_cache_names
from .decoding.shortlist import union_feeds
from .errors import BundleError, GraphRunError
from .graph_specs import (HEAD_POSITIONS, LOGITS_OUTPUT, drafter_takes_output_ids, takes_head_positions,
                          takes_output_rows, takes_union_inputs)
from .manifest import Manifest

_PROBE_CAPACITY = 2  # decoder buffer positions the verifier probe gets (it writes two)
# the longest source and output the length probe runs: an encoder call's attention grows with
# the square of its length, and a manifest may claim up to bundle_schema.MAX_SEQUENCE_LEN
PROBE_MAX_LEN = 4096


def check_ids(ids: np.ndarray, vocab_size: int, what: str) -> None:
    """Refuse token ids outside [0, vocab_size) that a graph returned (``what`` names it)."""
    if not ids.size:
        return
    # it runs on every verifier call: int64 ids take one reduction (a negative id, read as
    # unsigned, is above any vocabulary)
    if ids.dtype == np.int64 and int(ids.view(np.uint64).max()) < vocab_size:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise BundleError(f"{what} returned token id {bad}, outside the manifest's vocabulary of {vocab_size}: "
                          f"the graph was made for another vocabulary; {ADVICE}")


def _run(session: Any, graph: str, feeds: dict[str, np.ndarray], probe: str) -> dict[str, np.ndarray]:
    try:
        return session.run(feeds)
    except GraphRunError as exc:
        raise BundleError(f"the {graph} graph fails at load on a probe with {probe} ({exc}); {ADVICE}") from None


def probe_vocabulary(manifest: Manifest, sessions: Mapping[str, Any]) -> None:
    """Raise :class:`BundleError` unless each graph in ``sessions`` (graph name -> a session
    with ``run(feeds) -> outputs``, as the runtime opened it) takes the vocabulary's last id
    and returns ids within the vocabulary (the module docstring)."""
    m = manifest
    last = m.vocab_size - 1
    source = np.array([[last, m.eos_token_id]], dtype=np.int64)
    mask = np.ones_like(source)
    probe = f"token id {last}, the last of manifest vocab_size {m.vocab_size}"
    rows = takes_output_rows(m)
    # an encoder that gathers each row's output matrix gathers the vocabulary's last row here
    encoded = _run(sessions["encoder"], "encoder", {"input_ids": source, "attention_mask": mask,
                                                    **({"output_ids": np.array([[last]])} if rows else {})}, probe)
    feeds = _verifier_feeds(m, encoded, mask, [m.decoder_start_token_id, last], past=0, capacity=_PROBE_CAPACITY)
    verified = _run(sessions["verifier"], "verifier", feeds, probe)
    check_ids(verified["top_ids"], m.vocab_size, "the verifier")
    if "verifier_argmax" in sessions:  # the same decoder with another head: the same best ids, bitwise
        out = _run(sessions["verifier_argmax"], "verifier_argmax", _argmax_feeds(m, feeds), probe)
        best = out["top1_ids"] if "top1_ids" in out else out[LOGITS_OUTPUT].argmax(-1).reshape(feeds["input_ids"].shape)
        if not np.array_equal(best, verified["top_ids"][..., 0]):
            raise BundleError(f"the verifier_argmax graph picks ids {best.ravel().tolist()} where the verifier's best "
                              f"are {verified['top_ids'][..., 0].ravel().tolist()} on a probe with {probe}: the two "
                              f"graphs are not one decoder; {ADVICE}")
    drafter = next((name for name in DRAFTER_GRAPHS if name in sessions), None)
    if drafter is None or m.draft_k is None or m.mask_token_id is None:
        return
    memory = encoded["encoder_hidden_states"]
    if "drafter_source" in sessions:
        memory = _run(sessions["drafter_source"], "drafter_source",
                      {"encoder_hidden_states": memory, "encoder_attention_mask": mask}, probe)["drafter_memory"]
    ids = np.array([[m.decoder_start_token_id, last] + [m.mask_token_id] * m.draft_k], dtype=np.int64)
    drafted = _run(sessions[drafter], drafter, {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "slot_start": np.array([2], dtype=np.int64),
        "position_offset": np.zeros(1, dtype=np.int64),
        "encoder_hidden_states": memory,
        "encoder_attention_mask": mask,
        **({"output_ids": feeds["output_ids"]} if drafter_takes_output_ids(m) else {}),  # every id, as the verifier's
    }, f"{probe} and its [MASK] id {m.mask_token_id}")
    check_ids(drafted["draft_ids"], m.vocab_size, f"the {drafter} graph")


def _verifier_feeds(m: Manifest, encoded: Mapping[str, np.ndarray], mask: np.ndarray, ids: list[int], past: int,
                    capacity: int) -> dict[str, np.ndarray]:
    """One row's verifier inputs: ``ids`` written at positions ``past``.. of zeroed buffers of
    ``capacity`` positions, attending to the ``encoded`` source."""
    act = np.dtype(ACTIVATION_DTYPES[m.precision])
    empty = np.zeros((1, m.num_heads, capacity, m.head_dim), dtype=act)
    return {
        "input_ids": np.array([ids], dtype=np.int64),
        "past_lengths": np.full(1, past, dtype=np.int64),
        **{name: empty.copy() for name in self_cache_names(m.decoder_layers, m.cache_kind)},
        **{name: encoded[name] for name in cross_names(m.decoder_layers)},
        "encoder_attention_mask": mask,
        # a shortlist bundle's verifier projects onto the ids it is given: all of them, so that
        # the vocabulary's last row is looked up too
        **({"output_ids": np.arange(m.vocab_size, dtype=np.int64)[None]} if m.shortlist is not None else {}),
        # an int8 shortlist head's union of those ids (all of them) and their columns
        **(union_feeds(np.arange(m.vocab_size, dtype=np.int64)[None], m.vocab_size) if takes_union_inputs(m) else {}),
        # and gathers their rows itself (an empty output_rows)
        **({"output_rows": np.zeros((1, 0, m.d_model), dtype=act)} if takes_output_rows(m) else {}),
    }


def _argmax_feeds(m: Manifest, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The argmax graph's inputs: the verifier's, and where it takes them every position's
    index as the positions to return the logits of (graph_specs.takes_head_positions)."""
    if not takes_head_positions(m):
        return feeds
    return {**feeds, HEAD_POSITIONS: np.arange(feeds["input_ids"].size, dtype=np.int64)}


def probe_lengths(manifest: Manifest, sessions: Mapping[str, Any]) -> None:
    """Raise :class:`BundleError` unless the encoder takes a source of the manifest's
    ``max_source_len`` tokens and the verifier a token at the last of its ``max_target_len``
    positions.

    The limits are the manifest's word, and the decode loop trusts them (it refuses longer
    texts and sizes its buffers by them); a graph whose position table is shorter (learned
    positions traced from another config, or a manifest that promises more) would otherwise
    load and then fail on the first long text, mid-batch, taking the rows decoded beside it
    along. One encoder call at the full source length is the cost, once per load; limits past
    :data:`PROBE_MAX_LEN` are probed at that length (no position table of the supported
    families is longer)."""
    m = manifest
    source_len, target_len = min(m.max_source_len, PROBE_MAX_LEN), min(m.max_target_len, PROBE_MAX_LEN)
    source = np.full((1, source_len), m.eos_token_id, dtype=np.int64)
    mask = np.ones_like(source)
    probe = f"a source of {source_len} tokens (the manifest's max_source_len is {m.max_source_len})"
    feeds = {"input_ids": source, "attention_mask": mask,
             **({"output_ids": np.array([[m.eos_token_id]])} if takes_output_rows(m) else {})}
    _run(sessions["encoder"], "encoder", feeds, probe)
    short = np.array([[m.eos_token_id, m.eos_token_id]], dtype=np.int64)
    encoded = _run(sessions["encoder"], "encoder", {**feeds, "input_ids": short, "attention_mask": np.ones_like(short)},
                   probe)
    last = target_len - 1
    feeds = _verifier_feeds(m, encoded, np.ones_like(short), [m.decoder_start_token_id], past=last,
                            capacity=target_len)
    for graph in ("verifier", "verifier_argmax"):
        if graph in sessions:
            _run(sessions[graph], graph, feeds if graph == "verifier" else _argmax_feeds(m, feeds),
                 f"a token at position {last} (the manifest's max_target_len is {m.max_target_len})")
