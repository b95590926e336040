"""Each position of a verifier block computed exactly as it would be alone: the property that
makes IAD, GAD and GAD++ at beta 1 equal greedy *by construction*, not merely in tests.

Greedy verifies one position per call; IAD/GAD verify a block of T. If a position's log-probs
or the cache it writes depended on what else is in the call, a block could accept a token that
greedy would not have chosen, in a near tie. Measured on the reference verifier as traced:
MLAS's float32 GEMM picks its kernel and summation order by the number of rows M, so the
attention products (Q.K^T, weights.V) of a block of 7 differ from one position alone by
7e-7 (log-probs by up to 4e-6). :func:`isolate_positions` rewrites those products so every
position is a one-row matrix; :func:`check_position_independence` proves, bitwise, on every
bundle written (fp32 at export, int8 at quantization), that a block and the same positions one
at a time agree. The weight MatMuls need no rewrite: their kernel's summation order does not
depend on M (the check covers them too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runtime.decoding.cache import cross_names, self_cache_names, self_cache_out_names, source_axis
from ..runtime.errors import ValidationError
from ..runtime.graph_specs import HEAD_POSITIONS, LOGITS_OUTPUT
from ..runtime.manifest import Manifest
from .shape_folding import graphs_within


ISOLATE_ROWS = "/IsolateRows"  # the name suffix of the Unsqueeze that makes a position a one-row matrix
# the name suffix of the Unsqueeze that makes a position's query a one-column matrix (self-attention
# scores taken as K.q^T, :func:`isolate_positions`)
ISOLATE_COLUMNS = "/IsolateColumns"
SELF_KEY_OUT = "self_key_out."  # cache.self_cache_out_names: a layer's self-attention keys, new tokens written
# the name suffix of a shortlist head's one-column product (export/shortlist_head.py), by which
# aggdec quantize finds the head to replace with its int8 one
PER_POSITION = "/PerPositionMatMul"


def fresh_names(graph):
    """A function that returns a name no node, input, output or initializer of ``graph`` (an
    onnx GraphProto) or of a subgraph in it uses yet, ``base`` itself when it is free, and
    remembers it: for the nodes and initializers a rewrite adds."""
    names = {n for g in graphs_within(graph) for node in g.node for n in (*node.input, *node.output)}
    names |= {i.name for g in graphs_within(graph) for i in g.initializer}

    def fresh(base: str) -> str:
        name, index = base, 0
        while name in names:
            index += 1
            name = f"{base}_{index}"
        names.add(name)
        return name

    return fresh


def replace_placeholders(model, domain: str, op_type: str, replacement) -> int:
    """Replace each ``domain::op_type`` node of ``model`` (an onnx ModelProto; a placeholder a
    traced torch.autograd.Function left) by ``replacement(node, index)``'s node (or list of
    nodes, in order), in place, and drop the placeholder's domain from the opset imports;
    returns how many were replaced."""
    graph = model.graph
    rewritten, count = [], 0
    for node in graph.node:
        if node.domain == domain and node.op_type == op_type:
            replaced = replacement(node, count)
            rewritten.extend(replaced if isinstance(replaced, list) else [replaced])
            count += 1
            continue
        rewritten.append(node)
    del graph.node[:]
    graph.node.extend(rewritten)
    kept = [op for op in model.opset_import if op.domain != domain]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return count


def isolate_positions(model, one_head: bool = False) -> tuple[object, int]:
    """Make every MatMul between two activations (attention scores Q.K^T, weights.V) compute
    each position as a matrix of its own row: A [..., T, K] -> [..., T, 1, K], B [..., K, N] ->
    [..., 1, K, N], product [..., T, 1, N] -> [..., T, N].

    Why: MLAS's float32 GEMM picks its kernel and summation order by the number of rows M, so
    row t of a [T, K] x [K, N] product is not bitwise the product of row t alone (measured on
    the reference verifier: Q.K^T differs by 7e-7 between a block of 7 and one position).
    Greedy multiplies one row (M = 1); after this rewrite a block does T products of M = 1
    each, the same kernel on the same numbers. Weight MatMuls need no such care: in fp32 their
    kernel sums in the same order whatever M (the check below proves it on every bundle), in
    int8 their MatMulInteger is exact. A product already isolated is left as it is, so a
    bundle exported with this rewrite can be quantized (which applies it again for bundles
    exported before it).

    The self-attention scores are the exception to the shape above: Q.K^T's right operand
    there is the transpose of the cache buffer the call has just written (a Transpose of a
    ``self_key_out`` output), a copy of every row's whole buffer in every call (5-6% of a
    greedy batch-32 call's kernel time). Each position's scores are taken as K.q^T instead,
    K [..., C, Dh] by the query as a one-column matrix, q [..., T, Dh, 1] -> [..., T, C, 1]:
    the buffer is read as it is and the Transpose goes. Each position is still a product of
    its own (M = C rows, N = 1, one kernel whatever T: MLAS's one-column path, a dot product
    per key), so a block is bitwise its positions alone, as the check proves; the scores are
    the same dot products summed in another order than the M = 1 kernel's, so they may
    differ from a bundle exported before in the last bit.

    ``one_head``: the attention has one head, so at batch 1 the broadcast operand's batch dims
    are all 1, and onnxruntime then computes the product as one GEMM of all T rows (as if B
    were 2-D), the very dependence on T the rewrite removes. Its operand is expanded along the
    positions ([..., T, K, N]: a copy a call, the price of a layout no checkpoint worth
    serving has), so each position stays a product of its own.

    Changes ``model`` in place; returns it and the number of MatMuls rewritten."""
    from onnx import helper

    graph = model.graph
    inits = {init.name for init in graph.initializer}
    fresh = fresh_names(graph)
    axes: dict[int, str] = {}

    def axis(value: int) -> str:
        if value not in axes:
            axes[value] = fresh(f"isolate_axis_{'m' if value < 0 else ''}{abs(value)}")
            graph.initializer.append(helper.make_tensor(axes[value], 7, [1], [value]))  # 7: INT64
        return axes[value]

    producers = {out: node for node in graph.node for out in node.output}

    def isolated(node) -> bool:
        rows, columns = producers.get(node.input[0]), producers.get(node.input[1])
        return ((rows is not None and rows.op_type == "Unsqueeze" and ISOLATE_ROWS in rows.name)
                or (columns is not None and columns.op_type == "Unsqueeze" and ISOLATE_COLUMNS in columns.name))

    def self_keys_transposed(node) -> str | None:
        """The self-attention key buffer whose K^T is ``node``'s right operand, or None."""
        transpose = producers.get(node.input[1])
        if transpose is None or transpose.op_type != "Transpose" or not transpose.input[0].startswith(SELF_KEY_OUT):
            return None
        perm = list(next((a.ints for a in transpose.attribute if a.name == "perm"), []))  # none: all axes reversed
        swaps_last_two = len(perm) >= 2 and perm == [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2]
        return transpose.input[0] if swaps_last_two else None

    rewritten, count, bypassed = [], 0, set()
    for node in graph.node:
        if (node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or any(i in inits for i in node.input)
                or isolated(node)):
            rewritten.append(node)
            continue
        base = (node.name or node.output[0]).strip("/").replace("/", "_")
        keys = self_keys_transposed(node)
        if keys is not None:  # scores as K.q^T, each position's query a column (see above)
            broadcast, column, product = fresh(f"{base}_keys"), fresh(f"{base}_column"), fresh(f"{base}_per_column")
            rewritten += [
                helper.make_node("Unsqueeze", [keys, axis(-3)], [broadcast], name=fresh(f"{base}/BroadcastKeys")),
                helper.make_node("Unsqueeze", [node.input[0], axis(-1)], [column],
                                 name=fresh(f"{base}{ISOLATE_COLUMNS}")),
                helper.make_node("MatMul", [broadcast, column], [product], name=fresh(f"{base}/PerColumnMatMul")),
                helper.make_node("Squeeze", [product, axis(-1)], [node.output[0]], name=fresh(f"{base}/Join")),
            ]
            bypassed.add(node.input[1])
            count += 1
            continue
        rows, columns, product = fresh(f"{base}_rows"), fresh(f"{base}_columns"), fresh(f"{base}_per_row")
        rewritten += [
            helper.make_node("Unsqueeze", [node.input[0], axis(-2)], [rows], name=fresh(f"{base}{ISOLATE_ROWS}")),
            helper.make_node("Unsqueeze", [node.input[1], axis(-3)], [columns], name=fresh(f"{base}/BroadcastB")),
        ]
        if one_head:  # B [..., 1, K, N] expanded to [..., T, K, N], T read from A [..., T, K]
            shape, positions = fresh(f"{base}_shape"), fresh(f"{base}_positions")
            target, expanded = fresh(f"{base}_expand_to"), fresh(f"{base}_columns_expanded")
            rewritten += [
                helper.make_node("Shape", [node.input[0]], [shape], name=fresh(f"{base}/RowsShape")),
                helper.make_node("Slice", [shape, axis(-2), axis(-1)], [positions], name=fresh(f"{base}/Positions")),
                helper.make_node("Concat", [positions, axis(1), axis(1)], [target], axis=0,
                                 name=fresh(f"{base}/ExpandTo")),
                helper.make_node("Expand", [columns, target], [expanded], name=fresh(f"{base}/ExpandB")),
            ]
            columns = expanded
        rewritten += [
            helper.make_node("MatMul", [rows, columns], [product], name=fresh(f"{base}/PerRowMatMul")),
            helper.make_node("Squeeze", [product, axis(-2)], [node.output[0]], name=fresh(f"{base}/Join")),
        ]
        count += 1
    # the K^T a rewritten score product no longer reads: dropped when nothing else does
    read = {name for node in rewritten for name in node.input} | {output.name for output in graph.output}
    rewritten = [node for node in rewritten if not (set(node.output) & bypassed and not set(node.output) & read)]
    del graph.node[:]
    graph.node.extend(rewritten)
    return model, count


# ------------------------------------------------------------------ the check

# batches, past and new lengths: the export validation's shapes (export/validate.py), plus a
# block past the CPU's default max_block of 32, where a GEMM may switch to another kernel
BATCHES, PAST_LENS, NEW_LENS, SOURCE_LEN = (1, 3), (0, 5), (1, 2, 7, 33), 9
# a static-shape Driver's cache room past the longest prefix, block and padding
STATIC_CAPACITY = 3


class PlainSession:
    """An onnxruntime session as the runtime's Session protocol (``run`` with named outputs)."""

    def __init__(self, session) -> None:
        self.session = session
        self.names = [o.name for o in session.get_outputs()]

    def run(self, feeds: dict) -> dict:
        return dict(zip(self.names, self.session.run(None, feeds)))


def cpu_session(ort, path: Path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1  # validation is small; never compete with the caller for cores
    return PlainSession(ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]))


@dataclass
class Case:
    ids: np.ndarray
    mask: np.ndarray
    prefix: np.ndarray
    kept: np.ndarray
    new_ids: np.ndarray


def validation_cases(manifest: Manifest, seed: int = 0, batches: tuple[int, ...] = BATCHES) -> list[Case]:
    """Random sources, prefixes and blocks at the export validation's shapes; rows after the
    first keep only part of their prefix, as after a rejected draft. ``batches``: the batch
    sizes (a graph with another path for wide calls adds one that takes it). A source has at
    most the bundle's max_source_len tokens (the encoder reads a checkpoint's position table
    as it is; the verifier clamps a position past its table, so its shapes stay the same)."""
    rng = np.random.default_rng(seed)
    vocab, pad = manifest.vocab_size, manifest.pad_token_id
    low = min(3, vocab - 1)
    source_len = min(SOURCE_LEN, manifest.max_source_len)
    cases = []
    for batch in batches:
        lengths = [source_len] + [int(rng.integers(2, source_len + 1)) for _ in range(batch - 1)]
        ids = np.full((batch, source_len), pad, dtype=np.int64)
        mask = np.zeros((batch, source_len), dtype=np.int64)
        for row, length in enumerate(lengths):
            ids[row, :length] = rng.integers(low, vocab, size=length)
            mask[row, :length] = 1
        for past in PAST_LENS:
            for new in NEW_LENS:
                prefix = rng.integers(low, vocab, size=(batch, past)).astype(np.int64)
                kept = np.array([past] + [int(rng.integers(0, past + 1)) for _ in range(batch - 1)], dtype=np.int64)
                cases.append(Case(ids, mask, prefix, kept, rng.integers(low, vocab, size=(batch, new)).astype(np.int64)))
    return cases


class Driver:
    """Runs encoder + verifier the way the runtime does: fill a cache with the prefix, then
    continue from each row's kept length."""

    def __init__(self, encoder, verifier, manifest: Manifest, dtype: str = "float32", per_source: bool = False,
                 static_width: int | None = None, head_positions: bool = False) -> None:
        """``dtype``: the graphs' activation type, of the self-attention buffers fed to the verifier;
        ``per_source``: encode one unpadded source per call, as the runtime does for an encoder
        that couples the rows of a call (Manifest.encodes_one_source_per_call).
        ``static_width``: every call at one shape: each block padded to this many positions and
        every cache of one capacity (room for the longest prefix, block and padding, plus
        :data:`STATIC_CAPACITY`), so that no
        product changes its shape between a block and a position alone. A GPU's libraries
        choose their kernels by shape (cuBLAS), and two kernels may sum a row in another
        order; at one shape, a row is computed the same way wherever it is.
        ``head_positions``: the verifier takes graph_specs.HEAD_POSITIONS; a call asks for every
        position unless :meth:`call` is given some."""
        self.encoder, self.verifier, self.m = encoder, verifier, manifest
        self.dtype = np.dtype(dtype)
        self.per_source = per_source
        self.static_width = static_width
        self.head_positions = head_positions

    def encode(self, case: Case) -> dict:
        names = ["encoder_hidden_states", *cross_names(self.m.decoder_layers)]
        if not self.per_source:
            out = self.encoder.run({"input_ids": case.ids, "attention_mask": case.mask})
            return {"hidden": out[names[0]], **{n: out[n] for n in names[1:]}}
        # each row alone at its own length, then zero-padded to the case's width as the
        # runtime's buffers are (hidden [B, S, d]: source axis 1; cross K/V: cache.source_axis)
        width = case.ids.shape[1]
        rows = []
        for ids, mask in zip(case.ids, case.mask):
            length = int(mask.sum())
            rows.append(self.encoder.run({"input_ids": ids[None, :length], "attention_mask": mask[None, :length]}))
        encoded = {}
        for name in names:
            axis = 1 if name == names[0] else source_axis(name.startswith("cross_key"), self.m.cross_key_layout)
            padded = []
            for out in rows:
                pad = [(0, 0)] * out[name].ndim
                pad[axis] = (0, width - out[name].shape[axis])
                padded.append(np.pad(out[name], pad))
            encoded[name] = np.concatenate(padded)
        return {"hidden": encoded[names[0]], **{n: encoded[n] for n in names[1:]}}

    def call(self, case: Case, encoded: dict, cache: dict, ids: np.ndarray, lengths: np.ndarray,
             positions: np.ndarray | None = None):
        """``positions`` (a verifier that takes HEAD_POSITIONS): the block positions to return
        the logits of, [N] indexes into the call's rows x width, returned as [N, vocab] (and
        their argmax); by default every position, returned as [rows, width, vocab]. The graph
        returns them as [1, N, vocab] either way."""
        layers = self.m.decoder_layers
        cross = {n: encoded[n] for n in cross_names(layers)}
        new = ids.shape[1]
        if self.static_width is not None:  # padding after the block: causal, it changes no position before it
            if new > self.static_width:
                raise ValueError(f"a block of {new} positions is wider than the static width {self.static_width}")
            ids = np.pad(ids, ((0, 0), (0, self.static_width - new)), constant_values=self.m.pad_token_id)
        feeds = {"input_ids": ids, "past_lengths": lengths, **cache, **cross, "encoder_attention_mask": case.mask}
        if self.head_positions:
            feeds[HEAD_POSITIONS] = np.arange(ids.size, dtype=np.int64) if positions is None else positions
        out = self.verifier.run(feeds)
        kind = self.m.cache_kind
        written = dict(zip(self_cache_names(layers, kind), (out[n] for n in self_cache_out_names(layers, kind))))
        if "top1_ids" in out:  # the argmax graph: its best id as the only candidate, no log-probs
            return out["top1_ids"][:, :new, None], out["top1_ids"][:, :new, None], written
        if LOGITS_OUTPUT in out:  # the argmax graph's logits (checked bitwise) and their argmax, as the runtime takes it
            logits = out[LOGITS_OUTPUT]
            if self.head_positions:  # [1, N, vocab]
                logits = logits[0] if positions is not None else logits.reshape(*ids.shape, -1)
            if positions is None:
                logits = logits[:, :new]
            return logits, logits.argmax(-1)[..., None], written
        return out["top_logprobs"][:, :new], out["top_ids"][:, :new], written

    def prefill(self, case: Case, encoded: dict) -> dict:
        m = self.m
        batch, new = case.new_ids.shape
        capacity = case.prefix.shape[1] + new + 3
        if self.static_width is not None:
            capacity = max(PAST_LENS) + max(NEW_LENS) + self.static_width + STATIC_CAPACITY
        cache = {n: np.zeros((batch, m.num_heads, capacity, m.head_dim), self.dtype)
                 for n in self_cache_names(m.decoder_layers, m.cache_kind)}
        if case.prefix.shape[1]:
            cache = self.call(case, encoded, cache, case.prefix, np.zeros(batch, dtype=np.int64))[2]
        return cache


def check_verifier_graphs(encoder, verifiers: dict, manifest: Manifest, cases: list[Case], dtype: str = "float32",
                          per_source: bool = False, static_width: int | None = None) -> int:
    """Every verifier graph of a bundle (graph name -> session: "verifier", and
    "verifier_argmax" where the bundle has it) position-independent
    (:func:`check_position_independence`), and the argmax graph's ids bitwise the top-K graph's
    first on every case and position, with the same cache written: greedy and IAD/GAD, which
    run the argmax graph, then equal GAD++ at beta 1 and beams, which run the top-K one.
    Returns the positions checked. ``static_width``: every call at one shape (:class:`Driver`)."""
    drivers = {name: Driver(encoder, session, manifest, dtype, per_source, static_width,
                            HEAD_POSITIONS in manifest.graphs[name].input_names())
               for name, session in verifiers.items()}
    # each verifier's positions alone against its block, and the positions asked for (HEAD_POSITIONS)
    checked = sum(check_position_independence(driver, cases) for driver in drivers.values())
    if "verifier_argmax" not in drivers:
        return checked
    for case in cases:
        results = []
        for name in ("verifier", "verifier_argmax"):
            driver = drivers[name]
            encoded = driver.encode(case)
            results.append(driver.call(case, encoded, driver.prefill(case, encoded), case.new_ids, case.kept))
        (_, top_ids, top_cache), (_, best, best_cache) = results
        where = f"batch {len(case.kept)}, prefix {case.prefix.shape[1]}, block {case.new_ids.shape[1]}"
        if not np.array_equal(best[..., 0], top_ids[..., 0]):
            raise ValidationError(f"the argmax verifier graph's best ids differ from the top-K graph's first ({where});"
                                  " greedy would not equal GAD++ at beta 1. Report this with your onnxruntime version.")
        if any(not np.array_equal(values, top_cache[name]) for name, values in best_cache.items()):
            raise ValidationError(f"the argmax verifier graph writes another cache than the top-K graph ({where}).")
    return checked


def check_head_positions(driver: Driver, cases: list[Case]) -> int:
    """A verifier that returns the logits of the positions it is told (HEAD_POSITIONS) must
    return, bitwise, what it returns for them among every position: the runtime asks for each
    row's block alone, as many positions a call as the rows' blocks have, never their padding.
    Raises ValidationError naming the first difference. Returns the positions checked.
    (:func:`check_position_independence` makes this check too, on the block call it makes.)"""
    checked = 0
    for case in cases:
        encoded, cache, (every, _, _) = _block_call(driver, case)
        checked += _check_head_positions(driver, case, encoded, cache, every)
    return checked


def _block_call(driver: Driver, case: Case) -> tuple[dict, dict, tuple]:
    """A case's encoding, its prefilled cache, and the verifier's call on the case's whole block."""
    encoded = driver.encode(case)
    cache = driver.prefill(case, encoded)
    return encoded, cache, driver.call(case, encoded, dict(cache), case.new_ids, case.kept)


def _check_head_positions(driver: Driver, case: Case, encoded: dict, cache: dict, every: np.ndarray) -> int:
    """:func:`check_head_positions` for one case, against ``every``, the logits of the call on
    its whole block: each row asks for a prefix of its block of another length, in reverse
    order, as one call."""
    batch, new = case.new_ids.shape
    width = new if driver.static_width is None else driver.static_width
    positions = np.array([row * width + t for row in range(batch) for t in range(1 + (new - 1 - row) % new)],
                         dtype=np.int64)[::-1]
    some, _, _ = driver.call(case, encoded, dict(cache), case.new_ids, case.kept, positions)
    rows, steps = np.divmod(positions, width)
    if not np.array_equal(some, every[rows, steps]):
        raise ValidationError(f"the verifier's logits for some positions of a block differ from the same "
                              f"positions' among all of them (batch {batch}, block {new}); IAD/GAD would not "
                              "equal greedy. Report this with your onnxruntime version.")
    return len(positions)


def check_position_independence(driver: Driver, cases: list[Case]) -> int:
    """The verifier on a block of T positions must return, bitwise, what it returns for each
    position alone on the same cache (log-probs, ids and the cache it writes): the property
    that makes IAD/GAD equal greedy; with a driver whose verifier takes HEAD_POSITIONS, also
    :func:`check_head_positions` on the same block call. Raises ValidationError naming the first
    difference. Returns the positions checked."""
    checked = 0
    for case in cases:
        batch, new = case.new_ids.shape
        encoded, cache, (block_lp, block_ids, block_cache) = _block_call(driver, case)
        if driver.head_positions:
            checked += _check_head_positions(driver, case, encoded, cache, block_lp)
        single = dict(cache)
        for t in range(new):
            lp, ids, single = driver.call(case, encoded, single, case.new_ids[:, t : t + 1], case.kept + t)
            where = f"batch {batch}, prefix {case.prefix.shape[1]}, block {new}, position {t}"
            if not (np.array_equal(lp[:, 0], block_lp[:, t]) and np.array_equal(ids[:, 0], block_ids[:, t])):
                worst = float(np.abs(lp[:, 0] - block_lp[:, t]).max())
                raise ValidationError(f"the verifier's result for one position depends on the block it is verified "
                                      f"in ({where}: log-probs differ by up to {worst:.2e}); IAD/GAD would not "
                                      "equal greedy. Report this with your onnxruntime version.")
            checked += 1
        for name, values in block_cache.items():
            other = single[name]
            if driver.static_width is not None:  # past each row's block: padding's entries, never attended
                valid = (np.arange(values.shape[2])[None, :] < (case.kept + new)[:, None])[:, None, :, None]
                values, other = np.where(valid, values, 0), np.where(valid, other, 0)
            if not np.array_equal(values, other):
                raise ValidationError(f"the verifier writes a different {name} for a block than position by position "
                                      f"(batch {batch}, block {new}); IAD/GAD would not equal greedy.")
    return checked
