"""A checkpoint's config.json is untrusted: its sizes are checked before transformers builds
the model from them.

transformers builds a model's modules from its config before it reads a weight, and
initializes whatever the weight files lack. A config claiming ten million encoder layers kept
`aggdec export` building modules for minutes (until memory ran out); one claiming larger
layers than its files hold makes transformers allocate and initialize the difference. So:

- every size field a seq2seq config has (layers, heads, widths, vocabulary, positions) must be
  an integer in a range far above any real model's (:data:`SIZE_LIMITS`);
- the model built on the ``meta`` device (no memory) may have at most
  :data:`PARAMETERS_PER_STORED_BYTE` parameters per byte of its weight files: a float32 file
  holds a quarter of a parameter per byte, float16 half, so real checkpoints stay far below
  it. Only the parameters a checkpoint stores count: tied ones once, and not the frozen ones
  transformers computes and never saves (Marian's sinusoidal position tables, which outweigh a
  small model's trained weights).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from ..runtime.errors import ExportError
from .safety import one_line

# the largest value each size field may take; real seq2seq models stay far below (NLLB 54B:
# 24 + 24 layers, d_model 2048, vocabulary 256k; T5-XXL d_ff 10240 and 128 heads of 128)
SIZE_LIMITS = {
    **dict.fromkeys(("encoder_layers", "decoder_layers", "num_layers", "num_decoder_layers", "num_hidden_layers"), 512),
    **dict.fromkeys(("encoder_attention_heads", "decoder_attention_heads", "num_heads", "num_attention_heads"), 1024),
    **dict.fromkeys(("d_model", "hidden_size", "d_kv"), 1 << 16),
    **dict.fromkeys(("encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "intermediate_size"), 1 << 20),
    **dict.fromkeys(("vocab_size", "decoder_vocab_size"), 1 << 24),
    "max_position_embeddings": 1 << 20,
    # T5's relative positions: the export tabulates max_distance + 1 buckets (families._t5_position_bias)
    "relative_attention_num_buckets": 1 << 16,
    "relative_attention_max_distance": 1 << 20,
}
# The same for a GAD drafter (drafter.json, and `aggdec train-drafter`'s options): its modules
# are built from these before a weight is read. k and the positions are bounded by the longest
# sequence a bundle may declare (bundle_schema.MAX_SEQUENCE_LEN): a k of 10**9 made a position
# table of 10**9 rows
DRAFTER_SIZE_LIMITS = {
    "layers": 512, "encoder_layers": 512, "num_heads": 1024, "d_model": 1 << 16, "head_dim": 1 << 16,
    "ffn_dim": 1 << 20, "vocab_size": 1 << 24, "k": 1 << 16, "max_positions": (1 << 17) + 1,
}
PARAMETERS_PER_STORED_BYTE = 1.0
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
# a sharded checkpoint's map of tensor -> shard file, which transformers opens as it names them
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
MAX_INDEX_BYTES = 64 << 20  # real indexes list a few thousand tensors: tens of kilobytes


def check_sizes(config: Any, where: str) -> None:
    """Refuse a size field of ``config`` that is not an integer in 1 .. its limit, naming it."""
    for name, limit in SIZE_LIMITS.items():
        value = getattr(config, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
            raise ExportError(f"{where}: {name} must be an integer from 1 to {limit}, got {shown}.")


def check_weight_index(src: Path) -> None:
    """Refuse a sharded checkpoint's index (:data:`WEIGHT_INDEXES`) that names anything but regular
    files by their names in ``src`` itself. transformers opens each shard the index names: a FIFO
    held the export blocked for good (signals did not end it), ``/dev/zero`` read until memory
    ran out, and ``../elsewhere`` loaded weights the size check below (which counts the files in
    ``src``) never saw. A name in ``src`` may be a link to a regular file elsewhere, as the Hub's
    cache lays out a snapshot: the size check counts what it points to."""
    for name in WEIGHT_INDEXES:
        path = src / name
        if not path.exists() and not path.is_symlink():
            continue
        where = str(path)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise ExportError(f"{where!r} is not a regular file.")
            with open(path, "rb") as handle:
                raw = handle.read(MAX_INDEX_BYTES + 1)
        except OSError as exc:
            raise ExportError(f"could not read {where!r}: {exc.strerror or exc}.") from None
        if len(raw) > MAX_INDEX_BYTES:
            raise ExportError(f"{where!r} is over {MAX_INDEX_BYTES >> 20} MiB; a weight index lists tensor names.")
        try:
            weight_map = json.loads(raw.decode("utf-8"))["weight_map"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ExportError(f"{where!r} is not a weight index (JSON with a weight_map object).") from None
        if not isinstance(weight_map, dict):
            raise ExportError(f"{where!r}: weight_map is not an object of tensor name -> file.")
        shards: list = []  # each file once, in the index's order (a list: a hostile value may be unhashable)
        for value in weight_map.values():
            if value not in shards:
                shards.append(value)
        for shard in shards:
            shown = repr(shard)[:80]
            plain = (isinstance(shard, str) and shard and not any(c in shard for c in "/\\\0")
                     and shard not in (".", ".."))
            if not plain:
                raise ExportError(f"{where!r} names the shard {shown}, which is not a file name in the checkpoint "
                                  "folder; shards lie beside the index.")
            target = src / shard
            try:
                regular = stat.S_ISREG(os.stat(target).st_mode)
            except OSError:
                raise ExportError(f"{where!r} names the shard {shown}, which the checkpoint folder does not "
                                  "hold.") from None
            if not regular:
                raise ExportError(f"{where!r} names the shard {shown}, which is not a regular file (a device, "
                                  "a FIFO or a directory).")


def check_parameters(src: Path, config: Any) -> None:
    """Refuse a config whose model has more parameters than its weight files could hold (the
    model built on the meta device, which allocates nothing)."""
    stored = sum(path.stat().st_size for pattern in WEIGHT_FILES for path in src.glob(pattern) if path.is_file())
    if not stored:
        return  # no weight files: loading them says so
    import torch
    from transformers import AutoModelForSeq2SeqLM

    try:
        with torch.device("meta"):
            skeleton = AutoModelForSeq2SeqLM.from_config(config)
    except Exception:  # noqa: BLE001 - a config transformers cannot build: loading it says why
        return
    unsaved = set(getattr(skeleton, "_keys_to_ignore_on_save", None) or ())
    parameters = sum(parameter.numel() for name, parameter in skeleton.named_parameters()
                     if parameter.requires_grad or name not in unsaved)
    if parameters > PARAMETERS_PER_STORED_BYTE * stored:
        raise ExportError(f"{str(src / 'config.json')!r} describes a model of {parameters:,} parameters, but its "
                          f"weight files hold only {stored:,} bytes: the weights are cut short, or the config "
                          "belongs to another model.")


def load_model(src: Path, config: Any) -> tuple[Any, list[str]]:
    """``AutoModelForSeq2SeqLM.from_pretrained(src)`` in float32, for export and train-drafter
    alike: after :func:`check_weight_index` and :func:`check_parameters` (``config``: the
    checkpoint's, as the caller read it), refusing weight files that lack a tensor the config's
    model has. transformers initializes a missing tensor at random and
    only logs it, so the export would validate its graphs against that random draw and publish
    a bundle of it. transformers leaves out of ``missing_keys`` what a model legitimately does
    not store (tied weights, Marian's sinusoidal tables, a zero ``final_logits_bias``), so any
    key left there was meant to be in the files: a tensor dropped, or a config with more or
    larger layers than the files hold. A weight holding NaN or infinity is refused by name (the
    export's checks failed on it as if a graph were wrong). Stored tensors the config has no
    place for (``unexpected_keys``) are returned for the caller to report: transformers
    ignores them, as the bundle then does."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    check_weight_index(src)
    check_parameters(src, config)
    try:
        model, info = AutoModelForSeq2SeqLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager",
                                                            output_loading_info=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, RuntimeError, ...
        raise ExportError(f"could not load the model weights from {str(src)!r} ({one_line(exc)}); give a directory "
                          "written by save_pretrained() with model.safetensors or pytorch_model.bin.") from exc
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ExportError(f"the weight files in {str(src)!r} lack {len(missing)} tensor(s) its config.json describes "
                          f"({shown}); transformers would fill them with random values. The files are incomplete, or "
                          "config.json belongs to another model (more or larger layers than stored).")
    for name, parameter in model.named_parameters():  # buffers may hold -inf masks on purpose; weights never
        if not torch.isfinite(parameter).all():
            bad = int((~torch.isfinite(parameter)).sum())
            raise ExportError(f"the weights in {str(src)!r} hold {bad:,} NaN or infinite value(s) in {name}; the "
                              "checkpoint is damaged (or was saved after training diverged).")
    model.eval()
    model.requires_grad_(False)
    return model, sorted(info.get("unexpected_keys") or ())
