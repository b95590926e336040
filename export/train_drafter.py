"""Train a GAD drafter for a verifier by sequence-level distillation (``aggdec train-drafter``).

Recipe (SpecDec section 3.1.3 / GAD section 3.1): the targets are the verifier's *own* greedy
outputs on the sources (sequence-level knowledge distillation, so the drafter learns to predict
exactly what greedy verification will accept). Each time an example is used a fresh prefix
length ``p`` is drawn; the drafter reads the decoder start ids + ``target[:p]`` + k [MASK] slots,
cross-attends to the frozen verifier encoder, and learns ``target[p:p+k]`` (slots past the end
of the target are left out of the loss: their drafts are never used). Optionally GLAT-style
glancing reveals some slots as a curriculum.

Everything that decides the batches, prefixes and glanced slots is a pure function of
``(seed, epoch)`` or ``(seed, step)``, and the learning-rate schedule is a function of the step
alone, so a run stopped and resumed from its checkpoint ends with the same weights as a
straight run (on the same device and thread count).

Writes to ``out_dir``: ``distill.jsonl`` (cached targets), ``checkpoint/state.pt`` (periodic),
``drafter.json`` + ``drafter.safetensors`` (the drafter) and ``train_report.json``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import reprlib
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..runtime.bundle_schema import MAX_SEQUENCE_LEN
from ..runtime.errors import ExportError
from ..runtime.decoding.alignment import source_position_offsets
from ..runtime.decoding.cache import physical_memory
from .checkpoint_limits import DRAFTER_SIZE_LIMITS, load_model
from .drafter import (CONFIG_FILE, POSITIONS, WEIGHTS_FILE, Drafter, drafter_inputs, drafter_shape,
                      new_drafter_from_verifier)
from .safety import one_line
from .marian.export import is_marian_folder

DISTILL_FILE = "distill.jsonl"
CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_FILE = "state.pt"
REPORT_FILE = "train_report.json"
_DISTILL_FORMAT = 1
_DISTILL_BATCH = 64  # sources per generate() call
_EVAL_BATCH = 64  # held-out rows simulated in lockstep
_IGNORE = -100  # cross_entropy's ignore_index: slots past the target's end, and glanced slots (inputs)
# Paper values (SpecDec Table 7) where they make sense at this scale.
_BETAS = (0.9, 0.999)
_EPS = 1e-6
_WEIGHT_DECAY = 0.01
_CLIP_NORM = 1.0
# far above any real run (a drafter trains for thousands of steps), and below what makes the
# schedule's arithmetic and the report meaningless
MAX_STEPS = 10**9
MAX_EPOCHS = 10**6
# Options that may change between a run and its --resume (they do not change what is learned).
_RESUMABLE_CHANGES = frozenset({"steps", "epochs", "checkpoint_every", "device", "speed"})


@dataclass(frozen=True)
class TrainOptions:
    k: int = 25  # [MASK] slots drafted per call
    layers: int = 2  # drafter decoder layers
    ffn_dim: int = 0  # the drafter layers' feed-forward width; 0: the verifier's
    encoder_layers: int = 0  # drafter-only layers over the verifier's encoder output (once per request)
    window: int = 16  # output tokens the drafter reads before its slots (0: all of them)
    positions: str = "output"  # "source": read tokens at their aligned source positions (DrafterConfig)
    steps: int | None = None  # optimizer steps; exclusive with epochs (default: 1 epoch)
    epochs: int | None = None
    batch_tokens: int = 4096  # padded source + prefix + k tokens per batch
    learning_rate: float = 5e-4  # peak, reached after warmup_steps
    warmup_steps: int = 200  # linear warmup, then inverse square root decay
    seed: int = 0
    glancing: float = 0.0  # GLAT glancing ratio in [0, 1]; 0 = off
    heldout: int = 100  # sources (from the end of the file) kept out of training for the report
    checkpoint_every: int = 200
    max_new_tokens: int = 256  # longest distillation target
    device: str = "cpu"
    speed: bool = True  # time GAD against greedy on the held-out sources with the runtime (CPU)


@dataclass(frozen=True)
class _Example:
    source: list[int]  # tokenized source, specials included
    target: list[int]  # the verifier's greedy output after the decoder start, EOS included
    # A Marian folder's examples (export/marian/teacher.py) also carry the source's encoder output
    # [S, d], computed once (the verifier is frozen, and its 6 encoder layers cost more than the
    # drafter's step), and the ids the sentence's shortlist allows (sorted): the drafter's head
    # is trained and evaluated over them only, as the runtime's drafter argmaxes over them.
    hidden: Tensor | None = field(default=None, compare=False, repr=False)
    allowed: Tensor | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class _Layout:
    """The ids every drafter input is built from (shared by training and evaluation)."""

    start: list[int]  # decoder start; the runtime feeds it as the first output token
    first_p: int  # 1 where a forced BOS opens every target: the runtime never drafts before it
    k: int
    mask_id: int
    pad_id: int
    source_pad_id: int
    window: int  # the drafter reads the last ``window`` prefix tokens (0: all)
    source_positions: bool  # DrafterConfig.positions == "source"

    def inputs(self, prefixes: list[list[int]], sources: list[list[int]], device: torch.device
               ) -> tuple[Tensor, ...]:
        """(input_ids, attention_mask, slot_start, position_offset) for ``prefixes`` (after
        ``sources``, the examples' tokenized sources), on ``device``."""
        ids, mask, slot_start, offset = drafter_inputs(prefixes, self.k, self.mask_id, self.pad_id, self.window)
        if self.source_positions:  # exactly what the runtime's Drafter.draft feeds
            offset = torch.from_numpy(source_position_offsets(offset.tolist(), prefixes, sources, self.window))
        return tuple(t.to(device) for t in (ids, mask, slot_start, offset))

    def prefix(self, example: _Example, p: int) -> list[int]:
        return self.start + example.target[:p]

    def labels(self, example: _Example, p: int) -> tuple[list[int], int]:
        """(k labels, how many are real target tokens).

        Slots past the end of the target are left out of the loss: the runtime stops at EOS, so
        their drafts are never used, and <pad> is a poor label anyway -- Marian-style checkpoints
        silence it with a -100 logit bias, which the drafter's head inherits, and its ~100 nats of
        loss would swamp the real slots.
        """
        real = example.target[p : p + self.k]
        return real + [_IGNORE] * (self.k - len(real)), len(real)


# ---------------------------------------------------------------------------------- entry points


def train_drafter(src_dir: str | Path, sources_file: str | Path, out_dir: str | Path,
                  options: TrainOptions = TrainOptions(), resume: bool = False, progress: bool = True) -> dict:
    """Distil, train and save a drafter for the checkpoint in ``src_dir``; returns the report.

    The report (also ``out_dir/train_report.json``) holds ``tokens_per_iteration`` -- the mean
    number of tokens greedy GAD would accept per iteration on the held-out sources (the papers'
    "Tok.") -- and ``slot_accuracy``, plus the steps, seconds and options of the run; unless
    ``options.speed`` is False, ``runtime`` holds GAD's measured speedup over greedy on the same
    held-out sources, decoded by the runtime from a temporary bundle (:func:`_speed_on_runtime`).
    """
    src, sources_path, out = Path(src_dir), Path(sources_file), Path(out_dir)
    _validate(src, sources_path, out, options, resume)
    device = _device(options.device)
    sources = _read_sources(sources_path)
    if options.heldout >= len(sources):
        raise ExportError(f"--heldout {options.heldout} leaves no sources to train on ({sources_path} has "
                          f"{len(sources)}); pass a smaller --heldout or more sources.")
    saved = _load_checkpoint(out, options) if resume else None
    started = time.monotonic()

    teacher = None
    if is_marian_folder(src):  # Marian's own format: the runtime's greedy is the teacher (marian/teacher.py)
        from .marian.teacher import MarianTeacher, new_marian_drafter

        teacher = MarianTeacher(src, progress)
        sources = [text for text, ok in zip(sources, teacher.usable(sources)) if ok]
        if options.heldout >= len(sources):
            raise ExportError(f"--heldout {options.heldout} leaves no sources to train on ({sources_path} has "
                              f"{len(sources)} the model can take); pass a smaller --heldout or more sources.")
        model = teacher.model.to(device)
        config = teacher.model.config
        check_training_memory(options, config.d_model, config.heads, config.ffn_dim, device)
        out.mkdir(parents=True, exist_ok=True)
        targets = _distill_marian(teacher, sources, src, out / DISTILL_FILE, options.max_new_tokens, progress)
        drafter = new_marian_drafter(model, layers=options.layers, k=options.k, seed=options.seed,
                                     window=options.window, encoder_layers=options.encoder_layers,
                                     positions=options.positions, max_target_len=teacher.max_target_len,
                                     ffn_dim=options.ffn_dim or None).to(device)
        layout = _Layout(start=teacher.start, first_p=0, k=drafter.config.k, mask_id=drafter.config.mask_token_id,
                         pad_id=drafter.config.pad_token_id, source_pad_id=teacher.pad_id, window=options.window,
                         source_positions=False)
        longest = drafter.config.max_positions - layout.k - len(layout.start)
        examples = [_Example(source=ids, target=target[:longest], allowed=teacher.allowed(ids))
                    for ids, target in zip(teacher.source_ids(sources), targets)]
        examples = _with_encoder_outputs(model, examples, layout, device, progress)
    else:
        model, tokenizer = _load_verifier(src, device)
        shape = drafter_shape(model)
        check_training_memory(options, shape.d_model, shape.num_heads, shape.ffn_dim, device)
        out.mkdir(parents=True, exist_ok=True)
        targets = _distill(model, tokenizer, sources, src, out / DISTILL_FILE, options.max_new_tokens, device,
                           progress)
        drafter = new_drafter_from_verifier(model, layers=options.layers, k=options.k, seed=options.seed,
                                            window=options.window, encoder_layers=options.encoder_layers,
                                            positions=options.positions, ffn_dim=options.ffn_dim or None).to(device)
        layout = _layout(model, tokenizer, drafter)
        examples = _examples(tokenizer, sources, targets, layout, drafter.config.max_positions,
                             _position_limit(model))
    cut = len(examples) - options.heldout
    train = [ex for ex in examples[:cut] if _trainable(ex, layout)]
    heldout = [ex for ex in examples[cut:] if _trainable(ex, layout)]
    if not train:
        raise ExportError(f"no usable training examples in {sources_path}: every greedy output is empty.")

    optimizer = torch.optim.AdamW(drafter.parameters(), lr=options.learning_rate, betas=_BETAS, eps=_EPS,
                                  weight_decay=_WEIGHT_DECAY)
    plan = _Plan(train, layout, options)
    total = plan.total_steps()
    position = _Position(step=0, epoch=0, index=0)
    if saved is not None:
        try:
            drafter.load_state_dict(saved["drafter"])
            optimizer.load_state_dict(saved["optimizer"])
            torch.set_rng_state(saved["torch_rng"])
        except Exception as exc:  # noqa: BLE001 - torch's own errors: shapes, missing keys, a bad RNG state
            raise ExportError(f"the checkpoint in {str(out / CHECKPOINT_DIR)!r} does not fit this drafter "
                              f"({one_line(exc)}); run without --resume into another --out directory.") from None
        position = _Position(**saved["position"])

    try:
        trained = _train_loop(drafter, model, optimizer, plan, layout, options, position, total, out, device,
                              progress)
    except RuntimeError as exc:  # torch.OutOfMemoryError too: the CPU allocator raises a plain RuntimeError
        if not isinstance(exc, torch.OutOfMemoryError) and "can't allocate memory" not in str(exc):
            raise
        raise ExportError(f"training ran out of memory ({one_line(exc)[:200]}); pass a smaller --batch-tokens, --k "
                          "or --ffn-dim.") from None
    drafter.eval()
    drafter.cpu().save(out)
    drafter.to(device)
    evaluation = _evaluate(drafter, model, heldout, layout, device) if heldout else {}
    if teacher is not None:
        teacher.close()
    if heldout and options.speed:
        evaluation["runtime"] = _speed_on_runtime(src, out, sources[len(sources) - options.heldout:], progress)
    report = {
        **evaluation,
        "heldout": len(heldout),
        "train_examples": len(train),
        "steps": trained["step"],
        "final_loss": trained["loss"],
        "final_slot_accuracy": trained["accuracy"],
        "seconds": round(time.monotonic() - started, 1),
        "train_seconds": round(trained["seconds"], 1),
        "resumed_from_step": saved["position"]["step"] if saved is not None else None,
        "options": asdict(options),
    }
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def run_from_args(args: Any) -> int:
    """``aggdec train-drafter``: build :class:`TrainOptions` from parsed arguments, train, summarise."""
    given = {f.name: getattr(args, f.name, None) for f in fields(TrainOptions)}
    options = TrainOptions(**{name: value for name, value in given.items() if value is not None})
    report = train_drafter(args.src, args.sources, args.out, options, resume=bool(getattr(args, "resume", False)))
    tok = report.get("tokens_per_iteration")
    summary = (f"drafter saved to {args.out} after {report['steps']} steps ({report['train_seconds']} s): "
               + (f"Tok. {tok:.2f} tokens per GAD iteration (k={options.k}), slot accuracy "
                  f"{report['slot_accuracy']:.3f} on {report['heldout']} held-out sources."
                  if tok is not None else "no held-out sources, so no acceptance report."))
    print(summary, file=sys.stderr)
    speed = report.get("runtime")
    if speed:
        print(f"on the runtime (CPU, 1 thread, batch 1, {speed['sentences']} held-out sources): GAD "
              f"{speed['speedup']:.2f}x greedy's speed, {speed['gad_tokens_per_call']:.2f} tokens per call; a drafter "
              f"call {speed['drafter_call_ms']:.2f} ms, a one-token verifier call {speed['verifier_call_ms']:.2f} ms "
              f"(+{speed['block_position_ratio']:.2f} of it per block position).", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------- validation


def check_training_memory(options: TrainOptions, d_model: int, heads: int, verifier_ffn_dim: int,
                          device: torch.device) -> None:
    """Refuse, before distillation, a drafter whose training cannot fit this machine's memory
    by a lower bound of what it needs. ``--k 65536`` trained for as long as distillation took,
    then asked the allocator for 64 GiB: every training example is at least its k slots long,
    and each layer keeps a heads x slots x slots attention map for the backward pass. The
    weights count four times (the weights, their gradients, Adam's two moments) and each layer
    keeps its feed-forward activations. Only the CPU's memory is known here (a GPU's is
    torch's to report)."""
    if device.type != "cpu":
        return
    memory = physical_memory()
    if memory is None:
        return
    ffn = options.ffn_dim or verifier_ffn_dim
    slots = options.k + 1  # the shortest sequence a training example makes: one prefix token and k slots
    layers = options.layers + options.encoder_layers
    weights = layers * (4 * d_model * d_model + 2 * d_model * ffn)
    needed = 4 * (4 * weights + options.layers * (heads * slots * slots + 2 * slots * ffn))
    if needed > memory:
        raise ExportError(f"training this drafter needs at least {needed / 2**30:,.1f} GiB (k {options.k}: each of "
                          f"{options.layers} layer(s) keeps a {heads} x {slots} x {slots} attention map; feed-forward "
                          f"width {ffn}), more than this machine's {memory / 2**30:,.1f} GiB; pass a smaller "
                          "--k or --ffn-dim.")


def _validate(src: Path, sources: Path, out: Path, options: TrainOptions, resume: bool) -> None:
    """Every argument check that needs no model, with one sentence saying how to fix it."""
    if options.k < 1:
        raise ExportError(f"k must be at least 1 (tokens drafted per call), got {options.k}.")
    if options.layers < 1:
        raise ExportError(f"layers must be at least 1, got {options.layers}.")
    if options.ffn_dim < 0:
        raise ExportError(f"ffn_dim must be 0 (the verifier's) or a width, got {options.ffn_dim}.")
    if options.encoder_layers < 0:
        raise ExportError(f"encoder_layers must be 0 (none) or more, got {options.encoder_layers}.")
    if options.positions not in POSITIONS:
        raise ExportError(f"positions must be one of {', '.join(POSITIONS)}, got {options.positions!r}.")
    if not 0 <= options.window <= MAX_SEQUENCE_LEN:  # a bundle's draft_window is held to the same
        raise ExportError(f"window must be 0 (the whole output) or a number of tokens up to {MAX_SEQUENCE_LEN}, "
                          f"got {options.window}.")
    # the drafter's modules are built from these before training starts: --k 1000000000 made a
    # position table of a billion rows, --layers 10**9 built modules for hours (the limits a
    # drafter.json is held to, export/checkpoint_limits.py)
    for name in ("k", "layers", "ffn_dim", "encoder_layers"):
        if getattr(options, name) > DRAFTER_SIZE_LIMITS[name]:
            raise ExportError(f"{name} must be at most {DRAFTER_SIZE_LIMITS[name]}, got {getattr(options, name)}.")
    # torch seeds from a 64-bit integer, and each step's glancing seed is seed * 1,000,003 + step:
    # --seed 2**64 was an OverflowError traceback once the model had loaded
    if isinstance(options.seed, bool) or not isinstance(options.seed, int) or not abs(options.seed) < 2**32:
        raise ExportError(f"seed must be an integer of at most {2**32 - 1} either way, got {options.seed!r}.")
    if options.steps is not None and options.epochs is not None:
        raise ExportError("give either steps or epochs, not both.")
    for name, most in (("steps", MAX_STEPS), ("epochs", MAX_EPOCHS)):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise ExportError(f"{name} must be at least 1, got {value}.")
        if value is not None and value > most:
            raise ExportError(f"{name} must be at most {most:,}, got {value:,}.")
    for name in ("batch_tokens", "checkpoint_every", "max_new_tokens"):
        if getattr(options, name) < 1:
            raise ExportError(f"{name} must be at least 1, got {getattr(options, name)}.")
    for name in ("warmup_steps", "heldout"):  # named alone: the command line has --heldout only
        if getattr(options, name) < 0:
            raise ExportError(f"{name} must not be negative, got {getattr(options, name)}.")
    if not 0.0 <= options.glancing <= 1.0:
        raise ExportError(f"glancing must be between 0 (off) and 1, got {options.glancing}.")
    if not options.learning_rate > 0:
        raise ExportError(f"learning_rate must be positive, got {options.learning_rate}.")
    if not sources.is_file():
        what = "is not a file" if sources.exists() else "does not exist"
        raise ExportError(f"sources file {str(sources)!r} {what}; pass a text file with one source per line.")
    if not _source_text(sources).strip():
        raise ExportError(f"sources file {str(sources)!r} is empty; it needs one source per line.")
    if not (src / "config.json").is_file() and not is_marian_folder(src):
        raise ExportError(f"{str(src)!r} is not a checkpoint directory (no config.json, no Marian model*.bin or "
                          "model*.npz); pass a local save_pretrained directory or a Marian model folder.")
    if is_marian_folder(src) and options.positions != "output":
        raise ExportError("a Marian drafter reads output positions (--positions output): translation has no "
                          "source-aligned positions to follow.")
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {str(out)!r} is a file; choose a directory.")
    source, target = src.resolve(), out.resolve()
    if target == source or source in target.parents:
        # its drafter.safetensors beside the model would be counted as the model's weights (and a
        # sharded checkpoint's glob could take it for a shard), as export refuses the same layout
        raise ExportError(f"--out {str(out)!r} {'is' if target == source else 'is inside'} the checkpoint "
                          f"directory {str(src)!r}; write the drafter somewhere else.")
    checkpoint = out / CHECKPOINT_DIR / CHECKPOINT_FILE
    if resume and not checkpoint.is_file():
        raise ExportError(f"nothing to resume: {str(checkpoint)!r} does not exist; run without --resume.")
    if not resume and ((out / CONFIG_FILE).is_file() or (out / WEIGHTS_FILE).is_file() or checkpoint.is_file()):
        raise ExportError(f"{str(out)!r} already holds a drafter or a training checkpoint; pass --resume to "
                          "continue it or choose another --out directory.")


def _device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ExportError("device 'cuda' was asked for but torch sees no CUDA GPU; use --device cpu.")
        return torch.device("cuda")
    raise ExportError(f"device must be 'cpu' or 'cuda', got {name!r}.")


def _source_text(path: Path) -> str:
    """The sources file's text; one that is not UTF-8 is refused naming the line and byte."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ExportError(f"sources file {str(path)!r}, line {line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at "
                          f"offset {exc.start} of the file); the sources must be UTF-8.") from None


def _read_sources(path: Path) -> list[str]:
    # Blank lines carry nothing to learn from (and would be a lone EOS).
    return [line.strip() for line in _source_text(path).splitlines() if line.strip()]


# ---------------------------------------------------------------------------------- verifier + distillation


def _load_verifier(src: Path, device: torch.device) -> tuple[nn.Module, Any]:
    """The checkpoint's model, frozen (only the drafter learns), and tokenizer, with the checks
    ``aggdec export`` makes of an untrusted checkpoint (sizes, weight index, weights that lack a
    tensor) before and while loading it."""
    from transformers import AutoTokenizer

    from .pipeline import read_config

    config, _family = read_config(src)  # unsupported architectures fail before loading weights
    model, _unused = load_model(src, config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(src)
    except Exception as exc:  # noqa: BLE001 - any tokenizer failure gets the same one line
        raise ExportError(f"could not load the tokenizer from {str(src)!r} ({one_line(exc)}).") from exc
    return model.to(device), tokenizer


def _distill_key(src: Path, sources: Sequence[str], max_new_tokens: int) -> str:
    """What the targets depend on: weights, configs (generation settings), sources and length cap."""
    patterns = ("*.safetensors", "*.bin", "config.json", "generation_config.json")
    return _files_key(sorted({p for pattern in patterns for p in src.glob(pattern)}), sources, max_new_tokens)


def _files_key(paths: Sequence[Path], sources: Sequence[str], max_new_tokens: int, salt: bytes = b"") -> str:
    """A digest of ``paths``' names and bytes, the sources and the length cap: a distillation
    cache's key."""
    digest = hashlib.sha256(salt)
    for path in paths:
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    digest.update("\n".join(sources).encode("utf-8"))
    digest.update(f"|max_new_tokens={max_new_tokens}".encode())
    return digest.hexdigest()


def _distill_marian(teacher: Any, sources: list[str], src: Path, cache: Path, max_new_tokens: int, progress: bool
                    ) -> list[list[int]]:
    """A Marian folder's targets: the runtime's greedy over each sentence's shortlist
    (export/marian/teacher.py), cached like :func:`_distill`'s."""
    # weights, configs, shortlist, tokenizer
    key = _files_key(sorted(p for p in src.iterdir() if p.is_file()), sources, max_new_tokens,
                     salt=b"marian-runtime-greedy")
    cached = _read_distill_cache(cache, key, len(sources))
    if cached is not None:
        return cached
    targets = teacher.greedy(sources, max_new_tokens, progress)
    _write_distill_cache(cache, key, targets)
    return targets


def _write_distill_cache(cache: Path, key: str, targets: list[list[int]]) -> None:
    tmp = cache.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(json.dumps({"format": _DISTILL_FORMAT, "key": key, "count": len(targets)}) + "\n")
        handle.writelines(json.dumps(row) + "\n" for row in targets)
    os.replace(tmp, cache)  # never leave a half-written cache behind


def _read_distill_cache(path: Path, key: str, count: int) -> list[list[int]] | None:
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as handle:
        header = json.loads(handle.readline() or "{}")
        if header != {"format": _DISTILL_FORMAT, "key": key, "count": count}:
            return None  # another model, other sources or settings: regenerate
        rows = [json.loads(line) for line in handle]
    return rows if len(rows) == count else None


def _distill(model: nn.Module, tokenizer: Any, sources: list[str], src: Path, cache: Path, max_new_tokens: int,
             device: torch.device, progress: bool) -> list[list[int]]:
    """The verifier's greedy output ids per source (after the decoder start, cut after EOS)."""
    from tqdm.auto import tqdm

    key = _distill_key(src, sources, max_new_tokens)
    cached = _read_distill_cache(cache, key, len(sources))
    if cached is not None:
        return cached
    eos = int(model.config.eos_token_id)
    settings = _runtime_greedy(model, max_new_tokens)
    source_limit = _position_limit(model)
    targets: list[list[int]] = [[] for _ in sources]
    # Similar lengths together: less padding, so fewer wasted decoder steps per batch.
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    from transformers.utils import logging as transformers_logging

    # generate() warns on every batch that max_new_tokens overrides the config's max_length
    transformers_logging.set_verbosity_error()
    with tqdm(total=len(sources), desc="distilling", unit="src", file=sys.stderr, disable=not progress) as bar:
        for start in range(0, len(order), _DISTILL_BATCH):
            chunk = order[start : start + _DISTILL_BATCH]
            enc = tokenizer([sources[i] for i in chunk], return_tensors="pt", padding=True, truncation=True,
                            max_length=source_limit)
            with torch.no_grad():
                out = model.generate(**enc.to(device), generation_config=settings)
            for i, row in zip(chunk, out[:, 1:].tolist()):  # drop the decoder start token
                targets[i] = row[: row.index(eos) + 1] if eos in row else row
            bar.update(len(chunk))
    _write_distill_cache(cache, key, targets)
    return targets


def _position_limit(model: nn.Module) -> int | None:
    """The most source/target positions the checkpoint embeds (None: no hard limit, e.g. T5)."""
    from .families import family_for

    return family_for(model.config).position_limit(model.config)


def _runtime_greedy(model: nn.Module, max_new_tokens: int) -> Any:
    """The checkpoint's generation config reduced to what aggdec's runtime decodes: plain greedy.

    The runtime keeps forced BOS/EOS and single-token bans (bad_words_ids, suppress_tokens) and
    ignores penalties, n-gram blocking and minimum lengths (see pipeline.py), so the targets must
    too -- otherwise the drafter would learn outputs that greedy verification never produces.
    """
    from .pipeline import IGNORED_GENERATION_SETTINGS  # one list, shared with the exporter

    settings = copy.deepcopy(model.generation_config)
    for name, neutral in IGNORED_GENERATION_SETTINGS.items():
        setattr(settings, name, neutral)
    single_bans = [words for words in (settings.bad_words_ids or []) if len(words) == 1]
    settings.bad_words_ids = single_bans or None
    limit = _position_limit(model)
    # The start token takes a position, so at most limit - 1 tokens are generated (as in the runtime).
    settings.max_new_tokens = min(max_new_tokens, limit - 1) if limit is not None else max_new_tokens
    settings.max_length = None
    settings.do_sample, settings.num_beams = False, 1
    return settings


def _layout(model: nn.Module, tokenizer: Any, drafter: Drafter) -> _Layout:
    from .pipeline import generation_ids

    forced_bos = getattr(model.generation_config, "forced_bos_token_id", None)
    return _Layout(
        start=[generation_ids(model.config, model.generation_config)[0]],  # the start generate() uses
        first_p=1 if forced_bos is not None else 0,
        k=drafter.config.k,
        mask_id=drafter.config.mask_token_id,
        pad_id=drafter.config.pad_token_id,
        source_pad_id=int(tokenizer.pad_token_id),
        window=drafter.config.window,
        source_positions=drafter.config.positions == "source",
    )


def _examples(tokenizer: Any, sources: list[str], targets: list[list[int]], layout: _Layout,
              max_positions: int, source_limit: int | None) -> list[_Example]:
    # The drafter cannot see past max_positions; longer targets are cut (the runtime cannot draft there).
    longest = max_positions - layout.k - len(layout.start)
    encoded = tokenizer(sources, truncation=True, max_length=source_limit)["input_ids"]
    return [_Example(source=list(ids), target=target[:longest]) for ids, target in zip(encoded, targets)]


def _trainable(example: _Example, layout: _Layout) -> bool:
    # Needs a token after the forced BOS (if any) to draft; otherwise the loss would have no slot.
    return len(example.target) > layout.first_p


# ---------------------------------------------------------------------------------- batching


@dataclass(frozen=True)
class _Position:
    step: int  # optimizer steps done
    epoch: int  # the epoch of the next batch
    index: int  # the next batch's index within that epoch


class _Plan:
    """Deterministic batches per epoch: fresh prefix lengths, length-sorted packing, shuffled order."""

    def __init__(self, examples: list[_Example], layout: _Layout, options: TrainOptions) -> None:
        self.examples, self.layout, self.options = examples, layout, options
        self._cache: tuple[int, list[list[tuple[int, int]]]] | None = None

    def epoch(self, epoch: int) -> list[list[tuple[int, int]]]:
        """Batches of (example index, prefix length p) for ``epoch``."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        rng = random.Random(f"aggdec-drafter-{self.options.seed}-{epoch}")
        k, first = self.layout.k, self.layout.first_p
        # p < len(target): the runtime stops after EOS, so a prefix holding EOS is never drafted from.
        drawn = [(i, rng.randint(first, max(first, len(ex.target) - 1))) for i, ex in enumerate(self.examples)]
        # Sort by length (random tie-break) so a batch pads little, then pack by padded token count.
        lengths = {i: (len(self.examples[i].source), len(self.layout.start) + p + k) for i, p in drawn}
        drawn.sort(key=lambda item: (sum(lengths[item[0]]), rng.random()))
        batches: list[list[tuple[int, int]]] = []
        current: list[tuple[int, int]] = []
        widest = (0, 0)
        for item in drawn:
            src_len, dec_len = lengths[item[0]]
            grown = (max(widest[0], src_len), max(widest[1], dec_len))
            if current and (len(current) + 1) * sum(grown) > self.options.batch_tokens:
                batches.append(current)
                current, grown = [], (src_len, dec_len)
            current.append(item)
            widest = grown
        if current:
            batches.append(current)
        rng.shuffle(batches)
        self._cache = (epoch, batches)
        return batches

    def total_steps(self) -> int:
        if self.options.steps is not None:
            return self.options.steps
        return sum(len(self.epoch(e)) for e in range(self.options.epochs or 1))

    def batches(self, position: _Position) -> Iterator[tuple[_Position, list[tuple[int, int]]]]:
        """(position after the batch, batch) from ``position`` on, cycling epochs forever."""
        epoch, index, step = position.epoch, position.index, position.step
        while True:
            batches = self.epoch(epoch)
            if index >= len(batches):
                epoch, index = epoch + 1, 0
                continue
            step, index = step + 1, index + 1
            yield _Position(step=step, epoch=epoch, index=index), batches[index - 1]


def _source_batch(examples: Sequence[_Example], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    width = max(len(ex.source) for ex in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(examples), width), dtype=torch.int64)
    for row, ex in enumerate(examples):
        ids[row, : len(ex.source)] = torch.tensor(ex.source, dtype=torch.int64)
        mask[row, : len(ex.source)] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def _encode(model: nn.Module, examples: Sequence[_Example], layout: _Layout, device: torch.device
            ) -> tuple[Tensor, Tensor]:
    """The frozen verifier's encoder output (what the runtime hands the drafter) and its mask."""
    ids, mask = _source_batch(examples, layout.source_pad_id, device)
    if all(ex.hidden is not None for ex in examples):  # computed once (Marian: _with_encoder_outputs)
        hidden = torch.zeros((len(examples), ids.shape[1], examples[0].hidden.shape[1]), dtype=torch.float32)
        for row, ex in enumerate(examples):
            hidden[row, : len(ex.source)] = ex.hidden
        return hidden.to(device), mask
    return model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state, mask


@torch.no_grad()
def _with_encoder_outputs(model: nn.Module, examples: list[_Example], layout: _Layout, device: torch.device,
                          progress: bool) -> list[_Example]:
    """``examples`` each with its encoder output, encoded in length-sorted batches of 64 (a pure
    function of the examples, so a resumed run sees what a straight one saw)."""
    from tqdm.auto import tqdm

    order = sorted(range(len(examples)), key=lambda i: len(examples[i].source))
    done: list[_Example | None] = [None] * len(examples)
    for start in tqdm(range(0, len(order), 64), desc="encoding sources", unit="batch", file=sys.stderr,
                      disable=not progress):
        chunk = order[start : start + 64]
        hidden, _mask = _encode(model, [examples[i] for i in chunk], layout, device)
        for row, i in enumerate(chunk):
            ex = examples[i]
            done[i] = _Example(ex.source, ex.target, hidden[row, : len(ex.source)].cpu().clone(), ex.allowed)
    return done  # type: ignore[return-value]


def _shortlist_logits(drafter: Drafter, slots: Tensor, examples: Sequence[_Example], labels: Tensor | None = None
                      ) -> tuple[Tensor, Tensor, Tensor | None]:
    """Logits [B, k, U] of the slot states ``slots`` [B, k, d] over the union U of the rows'
    shortlists, ids outside a row's own list at -inf; the union's ids [U]; and ``labels`` as
    indices into the union (ignored slots kept). A label outside its row's list (none, when the
    targets are the runtime's greedy over it) stays allowed, so the loss stays finite."""
    union = torch.unique(torch.cat([ex.allowed for ex in examples])).to(slots.device)
    allowed = torch.zeros((len(examples), union.numel()), dtype=torch.bool, device=slots.device)
    for row, ex in enumerate(examples):
        allowed[row, torch.searchsorted(union, ex.allowed.to(slots.device))] = True
    mapped = None
    if labels is not None:
        real = labels != _IGNORE
        where = torch.searchsorted(union, labels.clamp(min=0)).clamp(max=union.numel() - 1)
        real &= union[where] == labels  # a label outside the union is left out of the loss
        mapped = torch.where(real, where, torch.full_like(labels, _IGNORE))
        rows = torch.arange(len(examples), device=slots.device).unsqueeze(1).expand_as(labels)
        allowed[rows[real], where[real]] = True
    weight, bias = drafter.head.weight[union], drafter.head.bias[union]
    logits = torch.matmul(slots, weight.transpose(0, 1)) + bias
    return logits.masked_fill(~allowed.unsqueeze(1), float("-inf")), union, mapped


# ---------------------------------------------------------------------------------- training


def _learning_rate(options: TrainOptions, step: int) -> float:
    """Linear warmup then inverse square root (SpecDec's schedule): a function of the step alone,
    so a resumed run follows exactly the schedule of a straight one whatever the total."""
    warmup = max(1, options.warmup_steps)
    n = step + 1
    return options.learning_rate * min(n / warmup, math.sqrt(warmup / n))


def _glance(drafter: Drafter, ids: Tensor, mask: Tensor, slot_start: Tensor, offset: Tensor, memory: Tensor,
            memory_mask: Tensor, labels: Tensor, real: Tensor, ratio: float, generator: torch.Generator
            ) -> tuple[Tensor, Tensor]:
    """GLAT: reveal ``ratio`` x (wrong slots) random real slots as inputs; they leave the loss."""
    with torch.no_grad(), labels.device:
        wrong = ((drafter.slot_logits(ids, mask, slot_start, memory, memory_mask, offset).argmax(-1) != labels)
                 & real)
    reveal_count = (wrong.sum(1).to(torch.float32) * ratio).floor().to(torch.int64)  # [B]
    # Random order among real slots: rank < count is revealed (non-real slots rank last).
    noise = torch.rand(labels.shape, generator=generator).to(labels.device).masked_fill(~real, 2.0)
    rank = noise.argsort(1).argsort(1)
    revealed = (rank < reveal_count.unsqueeze(1)) & real
    slot_index = slot_start.unsqueeze(1) + torch.arange(labels.shape[1], device=labels.device)
    glanced = ids.clone()
    glanced.scatter_(1, slot_index, torch.where(revealed, labels, glanced.gather(1, slot_index)))
    return glanced, labels.masked_fill(revealed, _IGNORE)


def _train_step(drafter: Drafter, model: nn.Module, optimizer: torch.optim.Optimizer, batch: list[tuple[int, int]],
                plan: _Plan, layout: _Layout, options: TrainOptions, step: int, device: torch.device
                ) -> tuple[float, int, int]:
    """One optimizer step; returns (loss, correct real slots, real slots)."""
    examples = [plan.examples[i] for i, _ in batch]
    memory, memory_mask = _encode(model, examples, layout, device)
    rows = [layout.labels(ex, p) for ex, (_, p) in zip(examples, batch)]
    labels = torch.tensor([r[0] for r in rows], dtype=torch.int64, device=device)
    real = torch.arange(layout.k, device=device).unsqueeze(0) < torch.tensor([[r[1]] for r in rows], device=device)
    ids, mask, slot_start, offset = layout.inputs([layout.prefix(ex, p) for ex, (_, p) in zip(examples, batch)],
                                                  [ex.source for ex in examples], device)
    drafter.train()
    if options.glancing > 0:
        generator = torch.Generator().manual_seed(options.seed * 1_000_003 + step)
        ids, labels = _glance(drafter, ids, mask, slot_start, offset, memory, memory_mask, labels, real,
                              options.glancing, generator)
    if examples[0].allowed is not None:  # the head over the rows' shortlists only (_shortlist_logits)
        slots = drafter.slot_hidden(ids, mask, slot_start, memory, memory_mask, offset)
        logits, union, labels = _shortlist_logits(drafter, slots, examples, labels)
    else:
        logits = drafter.slot_logits(ids, mask, slot_start, memory, memory_mask, offset)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                       ignore_index=_IGNORE)
    for group in optimizer.param_groups:
        group["lr"] = _learning_rate(options, step)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(drafter.parameters(), _CLIP_NORM)
    optimizer.step()
    scored = real & (labels != _IGNORE)
    correct = int(((logits.detach().argmax(-1) == labels) & scored).sum())
    return float(loss.detach()), correct, int(scored.sum())


def _train_loop(drafter: Drafter, model: nn.Module, optimizer: torch.optim.Optimizer, plan: _Plan, layout: _Layout,
                options: TrainOptions, position: _Position, total: int, out: Path, device: torch.device,
                progress: bool) -> dict[str, Any]:
    from tqdm.auto import tqdm

    started = time.monotonic()
    loss_avg = accuracy_avg = None
    with tqdm(total=total, initial=min(position.step, total), desc="training drafter", unit="step",
              file=sys.stderr, disable=not progress) as bar:
        for after, batch in (plan.batches(position) if position.step < total else ()):
            loss, correct, counted = _train_step(drafter, model, optimizer, batch, plan, layout, options,
                                                 after.step - 1, device)
            accuracy = correct / counted if counted else 0.0
            # Exponential moving averages: one batch is noisy, the bar should show the trend.
            loss_avg = loss if loss_avg is None else 0.95 * loss_avg + 0.05 * loss
            accuracy_avg = accuracy if accuracy_avg is None else 0.95 * accuracy_avg + 0.05 * accuracy
            bar.set_postfix(loss=f"{loss_avg:.3f}", acc=f"{accuracy_avg:.3f}", refresh=False)
            bar.update(1)
            position = after
            if after.step % options.checkpoint_every == 0 and after.step < total:
                _save_checkpoint(out, drafter, optimizer, position, options)
            if after.step >= total:
                break
    if position.step >= total:
        _save_checkpoint(out, drafter, optimizer, position, options)  # also when resumed past the end
    return {"step": position.step, "loss": loss_avg, "accuracy": accuracy_avg,
            "seconds": time.monotonic() - started}


# ---------------------------------------------------------------------------------- checkpoints


def _save_checkpoint(out: Path, drafter: Drafter, optimizer: torch.optim.Optimizer, position: _Position,
                     options: TrainOptions) -> None:
    directory = out / CHECKPOINT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "drafter": {name: t.detach().cpu() for name, t in drafter.state_dict().items()},
        "drafter_config": asdict(drafter.config),
        "optimizer": optimizer.state_dict(),
        "position": asdict(position),
        "torch_rng": torch.get_rng_state(),
        "options": asdict(options),
        # The schedule is a pure function of the step and the batches of (seed, epoch), so the
        # position above is all the "scheduler" and data-loader state there is.
    }
    tmp = directory / (CHECKPOINT_FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, directory / CHECKPOINT_FILE)  # an interrupted save keeps the previous checkpoint


def _load_checkpoint(out: Path, options: TrainOptions) -> dict[str, Any]:
    path = out / CHECKPOINT_DIR / CHECKPOINT_FILE
    damaged = f"{str(path)!r} is not a training checkpoint this aggdec wrote"
    advice = "run without --resume into another --out directory."
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, UnpicklingError, EOFError, ...
        raise ExportError(f"{damaged} ({one_line(exc)}); {advice}") from None
    # the structure _save_checkpoint writes: anything else (damaged, or another program's) is
    # refused here, not as a KeyError or TypeError halfway through restoring it
    parts = {"drafter": dict, "optimizer": dict, "position": dict, "torch_rng": torch.Tensor, "options": dict}
    if not isinstance(state, dict) or any(not isinstance(state.get(key), kind) for key, kind in parts.items()):
        raise ExportError(f"{damaged} (it lacks {', '.join(parts)}, or holds them as other types); {advice}")
    if set(state["position"]) != {f.name for f in fields(_Position)} or not all(
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
            for value in state["position"].values()):
        raise ExportError(f"{damaged} (its position is {str(state['position'])[:80]}); {advice}")
    saved = state["options"]
    defaults = asdict(TrainOptions())  # an option added since the checkpoint was saved had its default
    changed = sorted(name for name, value in asdict(options).items()
                     if name not in _RESUMABLE_CHANGES and saved.get(name, defaults[name]) != value)
    if changed:
        # a checkpoint's values are shown cut short: it is a file like any other
        details = ", ".join(f"{name} {reprlib.repr(saved.get(name))} -> {getattr(options, name)!r}" for name in changed)
        raise ExportError(f"cannot resume {str(out)!r} with different settings ({details}); use the original "
                          "settings or choose another --out directory.")
    return state


# ---------------------------------------------------------------------------------- speed on the runtime


def _speed_on_runtime(src: Path, drafter_dir: Path, texts: list[str], progress: bool) -> dict[str, Any] | None:
    """GAD against greedy on the held-out sources as the runtime decodes them: a temporary bundle
    of the checkpoint with this drafter (and its int8 copy), CPU, 1 thread, batch 1, whole
    ``generate`` time (encoder, graphs and the loop). Also the costs GAD measured on the way
    (``CallCost``: a one-token verifier call, each further block position relative to it, a
    drafter call). None if no held-out source fits the bundle.

    Measured rather than predicted from Tok. and those costs: on the reference drafter the
    prediction, ``Tok / (drafter + 1 + ratio * k)`` one-token calls, said 1.17x where GAD ran
    2.01x (a one-off run, not committed), as the graphs' costs leave out each iteration's work outside them (which GAD saves)
    and GAD sizes each draft instead of checking all k.
    """
    from ..runtime.generator import Generator
    from ..runtime.options import Mode
    from .pipeline import export_bundle

    if progress:
        print(f"timing GAD against greedy on {len(texts)} held-out sources (CPU, 1 thread)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="aggdec-drafter-speed-") as tmp:
        bundle = Path(tmp) / "bundle"
        export_bundle(src, bundle, drafter_dir=drafter_dir, progress=None)
        generator = Generator(bundle, device="cpu", threads=1)
        usable = [text for text in texts if generator.check(text) is None]
        if not usable:
            return None
        seconds: dict[str, float] = {}
        calls = tokens = 0
        for mode in (Mode.GREEDY, Mode.GAD):
            options = generator.resolve_options(mode)
            generator.warm_up(options)
            started = time.perf_counter()
            results = generator.generate(usable, options, batch_size=1)
            seconds[mode.value] = time.perf_counter() - started
            if mode is Mode.GAD:
                calls = sum(r.stats.iterations for r in results)
                tokens = sum(sum(r.stats.accepted) for r in results)
        one_token, ratio = generator.gad_costs.fit()
        drafter = generator.gad_costs.drafter_seconds
        drafter_graph = generator.drafter_graph
    return {
        "device": "cpu", "threads": 1, "batch_size": 1, "sentences": len(usable), "drafter_graph": drafter_graph,
        "greedy_seconds": round(seconds["greedy"], 6), "gad_seconds": round(seconds["gad"], 6),
        "speedup": round(seconds["greedy"] / seconds["gad"], 3),
        "gad_tokens_per_call": round(tokens / calls, 3) if calls else None,
        "verifier_call_ms": round(one_token * 1000, 3), "block_position_ratio": round(ratio, 4),
        "drafter_call_ms": round(drafter * 1000, 3),
    }


# ---------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def _evaluate(drafter: Drafter, model: nn.Module, examples: list[_Example], layout: _Layout, device: torch.device
              ) -> dict[str, float]:
    """Simulate greedy GAD against the teacher's targets: Tok. (tokens per iteration) and slot accuracy.

    Each iteration drafts k tokens after target[:p]; the verifier (whose greedy output *is* the
    target) accepts the common prefix n of draft and target and adds its own next token.
    """
    drafter.eval()
    tokens = iterations = correct = scored = 0
    for start in range(0, len(examples), _EVAL_BATCH):
        chunk = examples[start : start + _EVAL_BATCH]
        encoded, memory_mask = _encode(model, chunk, layout, device)
        memory = drafter.memory(encoded, memory_mask)  # once per source, as the runtime does
        p = [layout.first_p] * len(chunk)
        tokens += sum(len(ex.target) - layout.first_p for ex in chunk)
        while active := [row for row, ex in enumerate(chunk) if p[row] < len(ex.target)]:
            ids, mask, slot_start, offset = layout.inputs([layout.prefix(chunk[row], p[row]) for row in active],
                                                          [chunk[row].source for row in active], device)
            index = torch.tensor(active, device=device)
            args = (ids, mask, slot_start, encoded.index_select(0, index), memory_mask.index_select(0, index),
                    offset)
            if chunk[0].allowed is not None:  # argmax over each row's shortlist, as the runtime's drafter
                slots = drafter.slot_hidden(*args, memory=memory.index_select(0, index))
                logits, union, _ = _shortlist_logits(drafter, slots, [chunk[row] for row in active])
                drafts = union[logits.argmax(-1)].tolist()
            else:
                drafts = drafter.slot_logits(*args, memory=memory.index_select(0, index)).argmax(-1).tolist()
            for row, draft in zip(active, drafts):
                expected = chunk[row].target[p[row] : p[row] + layout.k]
                hits = [d == e for d, e in zip(draft, expected)]
                accepted = hits.index(False) if False in hits else len(hits)
                correct, scored = correct + sum(hits), scored + len(hits)
                p[row] += accepted + 1
                iterations += 1
    return {"tokens_per_iteration": tokens / iterations, "slot_accuracy": correct / scored,
            "iterations": iterations, "target_tokens": tokens}
