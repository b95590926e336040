"""The bundle manifest: the versioned contract between export and runtime.

A bundle is a directory holding ``encoder.onnx``, ``verifier.onnx``, optionally
``drafter.onnx``, ``tokenizer.json`` and ``manifest.json``. The manifest records what the
runtime needs to drive the graphs (special ids, sizes, the exact IO of every graph) and a
sha256 of every file, so a bundle that was altered after export is refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import BundleError, BundleNotFoundError

FORMAT_VERSION = 2  # 2: fixed-capacity self-attention buffers written in place, per-layer cross K/V
MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"

Dim = int | str


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: its name, element type and dims (ints or symbolic names)."""

    name: str
    dtype: str
    dims: tuple[Dim, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(name=data["name"], dtype=data["dtype"], dims=tuple(data["dims"]))


@dataclass(frozen=True)
class GraphSpec:
    """An ONNX graph of the bundle and its IO, in order."""

    file: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GraphSpec:
        return cls(
            file=data["file"],
            inputs=tuple(TensorSpec.from_json(t) for t in data["inputs"]),
            outputs=tuple(TensorSpec.from_json(t) for t in data["outputs"]),
        )

    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)


@dataclass(frozen=True)
class Manifest:
    """Everything the runtime knows about a bundle. Field meanings are documented inline."""

    family: str  # adapter name: "marian", "bart", "mbart", "t5"
    architecture: str  # the Hugging Face class the bundle was exported from
    vocab_size: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    num_heads: int
    head_dim: int
    decoder_start_token_id: int
    eos_token_id: int
    pad_token_id: int
    # Forced as the first generated token when set (BART-style checkpoints); decoding then
    # starts from [decoder_start, forced_bos] exactly as transformers' generate does.
    forced_bos_token_id: int | None
    # Forced as the last token when the length limit is reached (transformers' forced EOS).
    forced_eos_token_id: int | None
    # Token ids whose logits the verifier graph masks out (generation config bad_words_ids of
    # length one and suppress_tokens), so that greedy never emits them, as in transformers.
    suppressed_token_ids: tuple[int, ...]
    max_source_len: int
    max_target_len: int
    top_k: int  # how many (log-prob, id) candidates the verifier returns per position
    dtype: str
    opset: int
    graphs: dict[str, GraphSpec]
    files: dict[str, str]  # file name -> sha256 hex digest, for every file but the manifest
    # GAD: how many tokens drafter.onnx proposes per call, and its [MASK] id (vocab_size: an
    # extra embedding row of the drafter, outside the tokenizer's vocabulary)
    draft_k: int | None = None
    mask_token_id: int | None = None
    exporter: dict[str, str] = field(default_factory=dict)  # versions used at export
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = MANIFEST_FILE) -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BundleError(f"{source} is not valid JSON ({exc}); re-run `aggdec export`.") from exc
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise BundleError(
                f"{source} has format_version {version!r}; this aggdec reads version {FORMAT_VERSION}. "
                "Re-export the model with this version of aggdec."
            )
        try:
            data["graphs"] = {k: GraphSpec.from_json(v) for k, v in data["graphs"].items()}
            data["suppressed_token_ids"] = tuple(data["suppressed_token_ids"])
            return cls(**data)
        except (KeyError, TypeError) as exc:
            raise BundleError(f"{source} is missing or has malformed fields ({exc}); re-run `aggdec export`.") from exc

    def graph(self, name: str) -> GraphSpec:
        try:
            return self.graphs[name]
        except KeyError:
            raise BundleError(
                f"this bundle has no {name!r} graph (it has: {', '.join(sorted(self.graphs))})."
            ) from None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_manifest(bundle_dir: str | Path, verify: bool = True) -> Manifest:
    """Read ``manifest.json`` from a bundle and, by default, check every file's sha256."""
    root = Path(bundle_dir)
    if not root.is_dir():
        raise BundleNotFoundError(f"bundle directory {str(root)!r} does not exist; create one with `aggdec export`.")
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        raise BundleNotFoundError(
            f"{str(root)!r} has no {MANIFEST_FILE}: it is not an aggdec bundle; create one with `aggdec export`."
        )
    manifest = Manifest.from_json(manifest_path.read_text(encoding="utf-8"), source=str(manifest_path))
    if verify:
        verify_files(root, manifest)
    return manifest


def verify_files(root: Path, manifest: Manifest) -> None:
    """Refuse a bundle whose files are missing or differ from what was exported."""
    for name, expected in manifest.files.items():
        path = root / name
        if not path.is_file():
            raise BundleNotFoundError(f"bundle file {str(path)!r} is missing; re-run `aggdec export`.")
        actual = sha256_of(path)
        if actual != expected:
            raise BundleError(
                f"bundle file {str(path)!r} does not match its manifest (sha256 {actual[:12]}..., "
                f"expected {expected[:12]}...): it was modified after export. Re-run `aggdec export`."
            )
