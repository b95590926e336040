"""Post-export validation: the ONNX graphs, run by onnxruntime, against the torch checkpoint.

References are computed from the Hugging Face model *before* anything is traced (tracing a
decoder has been seen to change what the same in-process module returns afterwards), and
they come from transformers' own full forward pass, not from our wrapper, so the check
covers the wrapper's arithmetic, the cache compaction and the export together.

The verifier is checked the way the runtime drives it: one call fills a cache for a prefix,
a second call continues from per-row lengths shorter than that cache (rejected drafts being
dropped), at T in {1, 2, 7}, P in {0, 5}, B in {1, 3}, sources of up to 9 tokens: each shape
capped at the bundle's own limits (max_target_len positions a call, max_source_len source
tokens), since transformers' reference cannot go past a checkpoint's position table and the
bundle is never asked to.

The random tokens are ids from 3 up (0-2 are mostly special) and never the pad id: transformers'
uncached forward numbers M2M100's positions skipping every pad in the input, while generate (a
token at a time) and the bundle give a token its own position, so a pad inside the input makes
the reference something generate never computes; and a source never holds an unmasked pad.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..runtime.decoding.cache import cross_names, self_cache_names
from ..runtime.errors import ValidationError

BATCHES = (1, 3)
NEW_LENS = (1, 2, 7)
PAST_LENS = (0, 5)
SOURCE_LEN = 9
NOISE_FACTOR = 8.0  # the graph may differ from torch by this many times torch's own fp32 error


@dataclass
class EncoderCase:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    hidden: np.ndarray  # reference [B,S,D]
    noise: np.ndarray  # [B,S,1] torch's own fp32 error at each position (vs float64)


@dataclass
class VerifierCase:
    source: EncoderCase
    prefix: np.ndarray  # [B, P] tokens fed by the first call
    kept: np.ndarray  # [B] lengths passed to the second call (<= P)
    new_ids: np.ndarray  # [B, T]
    reference: np.ndarray  # [B, T, V] log-probs for the new positions
    noise: np.ndarray  # [B, T, 1] torch's own fp32 error at each position (vs float64)


def token_pool(vocab: int, pad_id: int) -> np.ndarray:
    """The ids validation draws its random tokens from: 3 to vocab - 1 without the pad id (the
    module's docstring says why), or where that leaves none (a vocabulary of a few tokens), every
    id but the pad; a vocabulary of the pad alone has nothing else to draw."""
    for low in (min(3, vocab), 0):
        ids = np.arange(low, vocab, dtype=np.int64)
        ids = ids[ids != pad_id]
        if ids.size:
            return ids
    return np.array([pad_id], dtype=np.int64)


def _draw(rng: np.random.Generator, pool: np.ndarray, size) -> np.ndarray:
    """Random ids of ``pool`` (for a pool 3..vocab-1, the draws ``rng.integers(3, vocab)`` gives)."""
    return pool[rng.integers(0, len(pool), size=size)]


def verifier_shapes(max_target: int | None = None) -> list[tuple[int, int]]:
    """The (P, T) of every verifier case: PAST_LENS x NEW_LENS, with a prefix and block of at most
    ``max_target`` positions together (the block first shortened to fit, then the prefix), each
    shape once."""
    shapes: list[tuple[int, int]] = []
    for past in PAST_LENS:
        for new in NEW_LENS:
            if max_target is not None:
                new = min(new, max_target)
                past = min(past, max_target - new)
            if (past, new) not in shapes:
                shapes.append((past, new))
    return shapes


def _random_source(rng: np.random.Generator, batch: int, pool: np.ndarray, pad_id: int,
                   source_len: int = SOURCE_LEN) -> tuple[np.ndarray, np.ndarray]:
    lengths = [source_len] + [int(rng.integers(2, source_len + 1)) for _ in range(batch - 1)]
    ids = np.full((batch, source_len), pad_id, dtype=np.int64)
    mask = np.zeros((batch, source_len), dtype=np.int64)
    for row, length in enumerate(lengths):
        ids[row, :length] = _draw(rng, pool, length)
        mask[row, :length] = 1
    return ids, mask


@torch.no_grad()
def _reference_pass(model: torch.nn.Module, inputs: list, bias: torch.Tensor, suppress_after: bool = True
                    ) -> tuple[list, list]:
    """Encoder hidden states and decoder log-probs of the model for every (kind, ...) input;
    ``suppress_after``: the banned ids are masked after the log-softmax (transformers' order,
    Manifest.suppression), else before it."""
    dtype = next(model.parameters()).dtype
    encoder = model.get_encoder()
    outputs = []
    for kind, ids, mask, decoder_ids, new in inputs:
        if kind == "encoder":
            out = encoder(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
            outputs.append(out.double().numpy())
        else:
            logits = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                           decoder_input_ids=torch.from_numpy(decoder_ids)).logits[0, -new:]
            if suppress_after:
                log_probs = torch.log_softmax(logits, dim=-1) + bias.to(dtype)
            else:
                log_probs = torch.log_softmax(logits + bias.to(dtype), dim=-1)
            outputs.append(log_probs.double().numpy())
    return outputs


def _noise(fp32: np.ndarray, fp64: np.ndarray) -> np.ndarray:
    finite = np.isfinite(fp64)  # suppressed tokens are -inf in both
    difference = np.abs(np.where(finite, fp32, 0.0) - np.where(finite, fp64, 0.0))
    return difference.max(axis=-1, keepdims=True)


@torch.no_grad()
def reference_cases(model: torch.nn.Module, vocab: int, pad_id: int, suppress: tuple[int, ...], seed: int = 0,
                    suppress_after: bool = True, max_source: int | None = None, max_target: int | None = None
                    ) -> tuple[list[EncoderCase], list[VerifierCase]]:
    """transformers' own outputs for every validation shape, with torch's own fp32 error.
    ``max_source``, ``max_target``: the bundle's max_source_len and max_target_len, which no
    source or decoder input here exceeds (None: the shapes as they are).

    The model runs once in float32 (the reference) and once in float64; their difference is
    how much float32 arithmetic alone moves each output of this checkpoint. A badly
    conditioned model (large activations, unscaled attention) legitimately differs by more
    between two float32 implementations, so that measured noise widens the tolerance.
    The model is returned to float32 afterwards (exactly: every float32 value survives the
    round trip through float64).
    """
    rng = np.random.default_rng(seed)
    bias = torch.zeros(vocab, dtype=torch.float64)
    if suppress:
        bias[list(suppress)] = float("-inf")
    pool = token_pool(vocab, pad_id)
    source_len = min(SOURCE_LEN, max_source or SOURCE_LEN)
    inputs: list = []
    plan: list = []
    for batch in BATCHES:
        ids, mask = _random_source(rng, batch, pool, pad_id, source_len)
        inputs.append(("encoder", ids, mask, None, 0))
        plan.append(("encoder", ids, mask))
        for past, new in verifier_shapes(max_target):
            prefix = _draw(rng, pool, (batch, past))
            # row 0 keeps the whole prefix; other rows drop part of it, as after a rejection
            kept = np.array([past] + [int(rng.integers(0, past + 1)) for _ in range(batch - 1)], dtype=np.int64)
            new_ids = _draw(rng, pool, (batch, new))
            for row in range(batch):
                decoder_ids = np.concatenate([prefix[row, : kept[row]], new_ids[row]])[None]
                inputs.append(("decoder", ids[row : row + 1], mask[row : row + 1], decoder_ids, new))
            plan.append(("verifier", prefix, kept, new_ids))
    fp32 = _reference_pass(model.float(), inputs, bias, suppress_after)
    fp64 = _reference_pass(model.double(), inputs, bias, suppress_after)
    model.float()

    encoder_cases: list[EncoderCase] = []
    verifier_cases: list[VerifierCase] = []
    cursor = 0
    for item in plan:
        if item[0] == "encoder":
            _, ids, mask = item
            source = EncoderCase(ids, mask, fp32[cursor].astype(np.float32), _noise(fp32[cursor], fp64[cursor]))
            encoder_cases.append(source)
            cursor += 1
            continue
        _, prefix, kept, new_ids = item
        rows = range(cursor, cursor + len(kept))
        reference = np.stack([fp32[i] for i in rows]).astype(np.float32)
        noise = np.stack([_noise(fp32[i], fp64[i]) for i in rows])
        verifier_cases.append(VerifierCase(source, prefix, kept, new_ids, reference, noise))
        cursor += len(kept)
    return encoder_cases, verifier_cases


def _check_close(name: str, got: np.ndarray, want: np.ndarray, tolerance: np.ndarray | float) -> None:
    if got.shape != want.shape:
        raise ValidationError(f"{name}: shape {got.shape} differs from torch's {want.shape}.")
    excess = np.abs(got - want) - tolerance
    if excess.size and float(excess.max()) > 0:
        worst = float(np.abs(got - want).max())
        raise ValidationError(f"{name}: differs from torch by up to {worst:.2e}, beyond the tolerance.")


def _row_tolerance(reference: np.ndarray, noise: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """atol, plus rtol times each position's log-prob range, plus a multiple of torch's own noise.

    Float error in the logits grows with their magnitude, and a log-prob inherits the error
    of the logits, not of its own (small) value; so the tolerance of a position follows the
    spread of its finite log-probs. ``noise`` is how far torch's float32 result is from
    float64 at that position: the graph may be as far off as another float32 implementation.
    """
    finite = np.where(np.isfinite(reference), reference, 0.0)
    spread = finite.max(axis=-1, keepdims=True) - finite.min(axis=-1, keepdims=True)
    return atol + rtol * spread + NOISE_FACTOR * noise


def _run_verifier(encoder_session, verifier_session, case: VerifierCase, layers: int, heads: int,
                  head_dim: int, cache_kind: str = "attention") -> tuple[np.ndarray, np.ndarray]:
    """Drive the verifier as the runtime does: fill a cache with the prefix, then continue from
    each row's kept length. The buffers start with random values and have spare capacity, so
    a graph that read past a row's length, or wrote anywhere but after it, would be caught."""
    src = case.source
    batch, new = case.new_ids.shape
    past = case.prefix.shape[1]
    capacity = past + new + 3
    rng = np.random.default_rng(past * 10 + new)
    outputs = encoder_session.run(None, {"input_ids": src.input_ids, "attention_mask": src.attention_mask})
    cross = dict(zip(cross_names(layers), outputs[1:]))
    names = self_cache_names(layers, cache_kind)
    buffers = {name: rng.standard_normal((batch, heads, capacity, head_dim)).astype(np.float32) for name in names}

    def call(ids: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        results = verifier_session.run(None, {"input_ids": ids, "past_lengths": lengths, **buffers, **cross,
                                              "encoder_attention_mask": src.attention_mask})
        top_logprobs, top_ids, presents = results[0], results[1], results[2:]
        for name, before, after in zip(names, buffers.values(), presents):
            if after.shape != before.shape:
                raise ValidationError(f"verifier: {name} comes back with shape {after.shape}, not {before.shape}.")
            written = np.zeros(capacity, dtype=bool)
            for row in range(batch):
                written[:] = False
                written[lengths[row] : lengths[row] + ids.shape[1]] = True
                if not np.array_equal(after[row][:, ~written], before[row][:, ~written]):
                    raise ValidationError(f"verifier: {name} changed outside row {row}'s new positions.")
            buffers[name] = after
        return top_logprobs, top_ids

    if past:
        call(case.prefix, np.zeros(batch, dtype=np.int64))
    return call(case.new_ids, case.kept)


def validate(encoder_session, verifier_session, encoder_cases: list[EncoderCase],
             verifier_cases: list[VerifierCase], layers: int, heads: int, head_dim: int,
             atol: float, rtol: float, cache_kind: str = "attention") -> int:
    """Run the graphs on every reference case; raise ValidationError on the first disagreement.

    Returns the number of cases checked.
    """
    for case in encoder_cases:
        hidden = encoder_session.run(None, {"input_ids": case.input_ids, "attention_mask": case.attention_mask})[0]
        mask = case.attention_mask.astype(bool)
        want = case.hidden[mask]
        tolerance = atol + rtol * np.abs(want).max(axis=-1, keepdims=True) + NOISE_FACTOR * case.noise[mask]
        _check_close(f"encoder (batch {len(mask)})", hidden[mask], want, tolerance)
    for case in verifier_cases:
        batch, new = case.new_ids.shape
        past = case.prefix.shape[1]
        label = f"verifier (batch {batch}, P={past}, T={new})"
        top_logprobs, top_ids = _run_verifier(encoder_session, verifier_session, case, layers, heads, head_dim,
                                              cache_kind)
        k = top_ids.shape[-1]
        want_top = -np.sort(-case.reference, axis=-1)[..., :k]
        tolerance = _row_tolerance(case.reference, case.noise, atol, rtol)
        _check_close(f"{label} top-{k} log-probs", top_logprobs, want_top, tolerance)
        # each returned id must really carry the returned log-prob (ids may swap only among ties)
        claimed = np.take_along_axis(case.reference, top_ids, axis=-1)
        _check_close(f"{label} log-probs of the returned ids", top_logprobs, claimed, tolerance)
        gap = want_top[..., 0] - (want_top[..., 1] if k > 1 else -np.inf)
        decisive = gap > 2 * tolerance[..., 0]
        if np.any(top_ids[..., 0][decisive] != case.reference.argmax(-1)[decisive]):
            raise ValidationError(f"{label}: the top-1 id differs from torch's argmax.")
    return len(encoder_cases) + len(verifier_cases)


@dataclass
class DrafterCase:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    slot_start: np.ndarray
    position_offset: np.ndarray
    encoder_hidden: np.ndarray
    encoder_attention_mask: np.ndarray
    logits: np.ndarray  # torch's slot logits [B, k, V]
    memory: np.ndarray  # what the drafter cross-attends: torch's drafter-only layers over encoder_hidden
    # a shortlist drafter's output_ids (each row's allowed ids, -1 padded); None: no such input
    output_ids: np.ndarray | None = None

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """drafter.onnx's inputs (its encoder_hidden_states: the memory drafter_source computes)."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "slot_start": self.slot_start,
                "position_offset": self.position_offset, "encoder_hidden_states": self.memory,
                "encoder_attention_mask": self.encoder_attention_mask,
                **({"output_ids": self.output_ids} if self.output_ids is not None else {})}

    def allowed_logits(self) -> np.ndarray:
        """torch's slot logits with every id outside the row's output_ids at -inf."""
        if self.output_ids is None:
            return self.logits
        rows = np.broadcast_to(self.output_ids, (self.logits.shape[0], self.output_ids.shape[1]))
        allowed = np.zeros((self.logits.shape[0], self.logits.shape[2]), dtype=bool)
        for row, ids in enumerate(rows):
            allowed[row, ids[ids >= 0]] = True
        return np.where(allowed[:, None, :], self.logits, -np.inf)


@torch.no_grad()
def drafter_cases(drafter: torch.nn.Module, model: torch.nn.Module, vocab: int, pad_id: int, start_id: int,
                  seed: int = 1, shortlist: bool = False, max_source: int | None = None,
                  max_target: int | None = None) -> list[DrafterCase]:
    """The drafter's torch slot logits at B in {1, 3} and prefixes of 1 to 9 tokens, and past its
    window (prefixes it reads only the end of, at an offset). ``shortlist``: each case also feeds
    ``output_ids``, alternately every id and random per-row lists of different
    lengths, -1 padded, as the runtime feeds them. ``max_source``, ``max_target``: as
    :func:`reference_cases`', which no source or prefix exceeds."""
    from .drafter import drafter_inputs

    rng = np.random.default_rng(seed)
    pool = token_pool(vocab, pad_id)
    source_len = min(SOURCE_LEN, max_source or SOURCE_LEN)
    cases = []
    for batch in BATCHES:
        window = drafter.config.window
        longests = (1, 6, 9, *((window + 3,) if window else ()))
        for longest in dict.fromkeys(min(n, max_target or n) for n in longests):
            ids, mask = _random_source(rng, batch, pool, pad_id, source_len)
            hidden = model.get_encoder()(input_ids=torch.from_numpy(ids),
                                         attention_mask=torch.from_numpy(mask)).last_hidden_state
            lengths = [longest] + [int(rng.integers(1, longest + 1)) for _ in range(batch - 1)]
            prefixes = [[start_id] + _draw(rng, pool, n - 1).tolist() for n in lengths]
            draft_ids, draft_mask, slot_start, offset = drafter_inputs(prefixes, drafter.config.k,
                                                                       drafter.config.mask_token_id, pad_id, window)
            memory = drafter.memory(hidden, torch.from_numpy(mask))
            logits = drafter.slot_logits(draft_ids, draft_mask, slot_start, hidden, torch.from_numpy(mask), offset,
                                         memory=memory)
            output_ids = None
            if shortlist and len(cases) % 2:
                sizes = rng.integers(1, vocab + 1, size=batch)
                output_ids = np.full((batch, int(sizes.max())), -1, dtype=np.int64)
                for row, size in enumerate(sizes):
                    output_ids[row, :size] = np.sort(rng.choice(vocab, size=size, replace=False))
            elif shortlist:
                output_ids = np.repeat(np.arange(vocab, dtype=np.int64)[None], batch, axis=0)
            cases.append(DrafterCase(draft_ids.numpy(), draft_mask.numpy(), slot_start.numpy(), offset.numpy(),
                                     hidden.numpy(), mask, logits.numpy(), memory.numpy(), output_ids))
    return cases


def validate_drafter(session, cases: list[DrafterCase], atol: float, rtol: float) -> int:
    """drafter.onnx must pick torch's argmax wherever it is decisive, and a tied one elsewhere."""
    for case in cases:
        (draft_ids,) = session.run(None, case.feeds)
        label = (f"drafter (batch {len(case.slot_start)}, prefix up to "
                 f"{int((case.slot_start + case.position_offset).max())})")
        if draft_ids.shape != case.logits.shape[:2]:
            raise ValidationError(f"{label}: draft ids have shape {draft_ids.shape}, expected {case.logits.shape[:2]}.")
        if np.any(draft_ids < 0) or np.any(draft_ids >= case.logits.shape[2]):
            raise ValidationError(f"{label}: a drafted id is outside the vocabulary ({draft_ids.min()}..{draft_ids.max()}).")
        logits = case.allowed_logits()
        best = logits.max(axis=-1)
        chosen = np.take_along_axis(logits, draft_ids[..., None], axis=-1)[..., 0]
        tolerance = atol + rtol * (best - case.logits.min(axis=-1))
        if np.any(best - chosen > tolerance):
            raise ValidationError(f"{label}: a drafted id is not torch's argmax (logit gap up to "
                                  f"{float((best - chosen).max()):.2e}).")
    return len(cases)


def validate_drafter_source(session, cases: list[DrafterCase], atol: float, rtol: float) -> int:
    """drafter_source.onnx must compute torch's drafter memory at every real source position
    (padded positions are never attended)."""
    for case in cases:
        (memory,) = session.run(None, {"encoder_hidden_states": case.encoder_hidden,
                                       "encoder_attention_mask": case.encoder_attention_mask})
        label = f"drafter_source (batch {len(case.slot_start)}, source {case.encoder_hidden.shape[1]})"
        if memory.shape != case.memory.shape:
            raise ValidationError(f"{label}: output has shape {memory.shape}, expected {case.memory.shape}.")
        real = case.encoder_attention_mask.astype(bool)
        gap = np.abs(memory - case.memory)[real]
        if np.any(gap > atol + rtol * np.abs(case.memory[real])):
            raise ValidationError(f"{label}: differs from torch by up to {float(gap.max()):.2e}.")
    return len(cases)
