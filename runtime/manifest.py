"""The bundle manifest: the versioned contract between export and runtime.

A bundle is a directory holding ``encoder.onnx``, ``verifier.onnx``, optionally
``drafter.onnx`` (and ``drafter.int8.onnx``, the same drafter for the CPU), ``tokenizer.json``
and ``manifest.json``. The manifest records what the
runtime needs to drive the graphs (special ids, sizes, the exact IO of every graph) and a
sha256 of every file, so a bundle that was altered after export is refused.

A bundle is untrusted input. ``manifest.json`` is read without following symlinks, must be
UTF-8 JSON and pass the schema in :mod:`.bundle_schema` (types, ranges, plain file names)
before anything else happens; every file the runtime opens must be listed in ``files``, be a
regular file directly in the bundle directory and match its sha256, and the directory may
hold no symlink at all.

What the runtime reads is exactly what was hashed (:class:`BundleFiles`): each graph and the
tokenizer are read into memory once, hashed, and those bytes are what onnxruntime and
tokenizers are given, so a file edited or swapped between the check and the load is never what
runs. ONNX external data (weights kept beside a graph) follows the same rule without the
runtime parsing ONNX: onnxruntime gets, in memory, every listed file that is neither a graph
nor the tokenizer, and no directory to read anything else from, so a graph that names an
unlisted (unhashed) file, a path outside the bundle or a link fails to load with a
BundleError. Files in the directory that the manifest does not list are never read.

Why the manifest carries no hash of itself: a digest stored beside (or inside) what it
covers only detects accidental corruption, and that the JSON parser, the schema and the
per-file hashes already catch; whoever can edit the manifest can recompute such a digest. A
signature would resist an attacker but needs keys and a way to distribute and trust them,
which aggdec has no story for. What does protect is a digest obtained over a trusted
channel: ``aggdec export`` prints the manifest's sha256 (:func:`manifest_digest`), and
``load_manifest(..., expected_sha256=...)`` refuses any other manifest. Since the manifest
hashes every other file, pinning it pins the whole bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .bundle_schema import show, validate_manifest
from .errors import BundleError, BundleNotFoundError
from .segmentation import SENTENCEPIECE_FILE

# 2: fixed-capacity self-attention buffers written in place, per-layer cross K/V
# 3: the drafter reads a window of the output at an offset (position_offset, draft_window)
FORMAT_VERSION = 3
MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
MAX_MANIFEST_BYTES = 16 << 20  # far above any real manifest; bounds what a hostile one costs to parse

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

    family: str  # adapter name: "marian", "bart", "mbart", "t5", "m2m100"
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
    # the last output tokens the drafter reads before its slots (0: the whole output), as trained
    draft_window: int | None = None
    # the positions the drafter reads its tokens at, as trained: "output", or "source" (each
    # token at the source position it is aligned with, decoding/alignment.py); None (no
    # drafter, or a bundle from before the field) is "output"
    draft_positions: str | None = None
    exporter: dict[str, str] = field(default_factory=dict)  # versions used at export
    # "fp32", "int8" or "fp16" (`aggdec quantize`: int8 products for the CPU, see export/quantize.py;
    # float16 graphs for CUDA, export/half.py);
    # a manifest without it (older aggdec) is fp32
    precision: str = "fp32"
    # int8 and fp16 only: how it was converted and its agreement with the fp32 graphs it came from
    # (top1_agreement, max/mean_logprob_error, draft_agreement, ...; see bundle_schema.QUANTIZATION)
    quantization: dict[str, Any] | None = None
    # the verifier's own cache (runtime/decoding/cache.py CACHE_KINDS): "attention" (keys and
    # values; a manifest without the field) or "recurrent" (a recurrent decoder's state per position)
    cache_kind: str = "attention"
    # Marian's lexical shortlist (decoding/shortlist.py): {"file": the table in the bundle, "first":
    # the most frequent ids always allowed, "shared": source ids allowed too}; the verifier then
    # takes output_ids. None: every output id, as in every bundle before the field
    shortlist: dict[str, Any] | None = None
    # a per-row output cap from the row's own source (Marian's max-length-factor): at most
    # ceil(factor x source tokens, EOS included) generated tokens (decoding/common.py
    # source_length_cap), within max_target_len. None: no such cap (other families, older bundles)
    max_length_factor: float | None = None
    # where the verifier applies suppressed_token_ids: "after_log_softmax" (transformers' order:
    # log-probs normalized over every id, as beam search's scores need) or "before_log_softmax"
    # (bundles from before the field, which is None there; greedy's outputs are the same)
    suppression: str | None = None
    # beams with Marian's rules (decoding/marian_beam.py), for a bundle made from a Marian model:
    # {"family": "marian", "normalize": its decoding yml's normalize (the default length penalty),
    # "word_penalty": its word-penalty}. None: transformers' rules (decoding/beam.py)
    beam_rules: dict[str, Any] | None = None
    # the cross-attention keys' axes after [rows] (decoding/cache.py cross_dims): "heads_dim_source",
    # transposed once per sentence by the encoder so that the verifier multiplies Q by them as
    # they are; "heads_source_dim", as the values (the verifier transposes each key in every
    # call). None: a bundle from before the field, "heads_source_dim"
    cross_key_layout: str | None = None
    # how text becomes source ids (segmentation.py): "marian_sentencepiece", a bundle made from a
    # Marian model segments as Marian's SentencePiece does where the tokenizer's own Unigram model
    # would round a near-tie the other way; "sentencepiece", as a slow transformers SentencePiece
    # tokenizer (OPUS-MT's MarianTokenizer) does, from sentencepiece.json (sentencepiece.py).
    # None: as the tokenizer does (every other bundle)
    segmentation: str | None = None
    # whether decoded text gets transformers' clean-up of spaces before punctuation
    # (detokenization.py), as the checkpoint's tokenizer config asks and transformers applies it.
    # None: not applied (bundles from before the field, Marian models; a "sentencepiece" bundle's
    # own file says so for its decoding)
    clean_up_tokenization_spaces: bool | None = None
    # whether a special token's string in a text is read as text, not as that token (transformers'
    # split_special_tokens; the tokenizers library's encode_special_tokens, which tokenizer.json
    # does not keep): a checkpoint saved so, and a Marian folder's tokenizer.json, whose </s> the
    # bundle's copy adds as a special token only to end each source and be left out of outputs.
    # None: read as the token (every bundle before the field)
    split_special_tokens: bool | None = None
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, source: str = MANIFEST_FILE) -> Manifest:
        """Parse and validate a manifest; anything malformed raises :class:`BundleError`."""
        data = _parse_json(text, source)
        version = data.get("format_version")
        if version != FORMAT_VERSION or isinstance(version, bool):
            raise BundleError(
                f"{source} has format_version {show(version)}; this aggdec reads version {FORMAT_VERSION}. "
                "Re-export the model with this version of aggdec."
            )
        validate_manifest(data, source)
        data["graphs"] = {k: GraphSpec.from_json(v) for k, v in data["graphs"].items()}
        data["suppressed_token_ids"] = tuple(data["suppressed_token_ids"])
        return cls(**data)

    @property
    def encodes_one_source_per_call(self) -> bool:
        """The encoder couples the rows of a call (bundle_schema.ENCODER_QUANTIZATION): the
        runtime gives it one source at a time, unpadded, so that a source's encoding is the same
        whatever it is batched with."""
        return (self.quantization or {}).get("encoder") == "per-call"

    def graph(self, name: str) -> GraphSpec:
        try:
            return self.graphs[name]
        except KeyError:
            raise BundleError(
                f"this bundle has no {name!r} graph (it has: {', '.join(sorted(self.graphs))})."
            ) from None


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of repeated keys; two readers could disagree on which one counts
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"key {show(next(k for k in keys if keys.count(k) > 1))} appears more than once")
    return dict(pairs)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _parse_json(text: str | bytes, source: str) -> dict[str, Any]:
    advice = "re-run `aggdec export`."
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BundleError(f"{source} is not UTF-8 text (invalid byte at offset {exc.start}); {advice}") from None
    try:
        data = json.loads(text, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant)
    except RecursionError:
        raise BundleError(f"{source} is nested too deeply to be a manifest; {advice}") from None
    except ValueError as exc:  # JSONDecodeError, the hooks above, ints of more than 4300 digits
        raise BundleError(f"{source} is not valid JSON ({exc}); {advice}") from None
    if not isinstance(data, dict):
        raise BundleError(f"{source} must hold a JSON object, not {type(data).__name__}; {advice}")
    return data


def _open_regular(path: Path) -> int:
    """A read-only descriptor of ``path`` if it is a regular file and not a symlink."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise BundleNotFoundError(f"bundle file {str(path)!r} is missing; re-run `aggdec export`.") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise BundleError(f"bundle file {str(path)!r} is {kind}; a bundle holds regular files only. "
                          "Copy the bundle without links, or re-run `aggdec export`.")
    # O_NOFOLLOW/O_NONBLOCK: the name may have been swapped for a link or a FIFO since lstat
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise BundleError(f"cannot open bundle file {str(path)!r}: {exc.strerror}.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BundleError(f"bundle file {str(path)!r} is not a regular file.")
    return fd


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with os.fdopen(_open_regular(Path(path)), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hash_files(directory: Path) -> dict[str, str]:
    """The manifest's ``files`` for a bundle being written: the sha256 of every file in
    ``directory`` but the manifest, so that whatever an exporter writes (ONNX external data
    included) is covered, not only the files it meant to list."""
    files = {}
    for path in sorted(Path(directory).iterdir()):
        if path.name == MANIFEST_FILE:
            continue
        if not path.is_file() or path.is_symlink():
            raise BundleError(f"{str(path)!r} is not a regular file; a bundle holds regular files only.")
        files[path.name] = sha256_of(path)
    return files


def _read_regular(path: Path) -> bytes:
    with os.fdopen(_open_regular(path), "rb") as handle:
        return handle.read()


def read_capped(path: Path, limit: int = MAX_MANIFEST_BYTES, what: str = "an aggdec manifest") -> bytes:
    """The bytes of the regular file ``path`` (no symlink, no FIFO: BundleError), refused when it
    holds more than ``limit`` bytes: for the small JSON files aggdec reads beside graphs (a
    manifest, an engines manifest), whose size says nothing about a real model."""
    with os.fdopen(_open_regular(path), "rb") as handle:
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise BundleError(f"{str(path)!r} is larger than {limit} bytes: not {what}.")
    return raw


def manifest_digest(bundle_dir: str | Path) -> str:
    """The sha256 of a bundle's manifest.json: pin it to pin the whole bundle (see the module docstring)."""
    return hashlib.sha256(read_capped(Path(bundle_dir) / MANIFEST_FILE)).hexdigest()


def load_manifest(bundle_dir: str | Path, verify: bool = True, expected_sha256: str | None = None) -> Manifest:
    """Read and validate ``manifest.json`` from a bundle and, by default, check every file's sha256.

    Whatever ``verify`` says, every listed file must be a regular file (no symlink) in the
    bundle directory. ``expected_sha256``: refuse unless the manifest has this digest.
    """
    root = Path(bundle_dir)
    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "does not exist"
        raise BundleNotFoundError(f"bundle directory {str(root)!r} {what}; create one with `aggdec export`.")
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file() and not manifest_path.is_symlink():
        raise BundleNotFoundError(
            f"{str(root)!r} has no {MANIFEST_FILE}: it is not an aggdec bundle; create one with `aggdec export`."
        )
    raw = read_capped(manifest_path)
    if expected_sha256 is not None and hashlib.sha256(raw).hexdigest() != expected_sha256.lower():
        raise BundleError(f"{str(manifest_path)!r} is not the pinned manifest (sha256 "
                          f"{hashlib.sha256(raw).hexdigest()}, expected {expected_sha256}); the bundle differs "
                          "from the one you trusted.")
    manifest = Manifest.from_json(raw, source=str(manifest_path))
    _refuse_links(root)
    if verify:
        verify_files(root, manifest)
    else:
        for name in manifest.files:
            os.close(_open_regular(root / name))
    return manifest


def _refuse_links(root: Path) -> None:
    # a graph's external data is opened by onnxruntime by name, listed or not: no name may lead out
    with os.scandir(root) as entries:
        links = sorted(entry.name for entry in entries if entry.is_symlink())
    if links:
        raise BundleError(f"bundle directory {str(root)!r} holds symlinks ({', '.join(map(show, links[:5]))}); a "
                          "bundle holds regular files only. Copy the bundle without links, or re-run `aggdec export`.")


def _mismatch(path: Path, actual: str, expected: str) -> BundleError:
    return BundleError(
        f"bundle file {str(path)!r} does not match its manifest (sha256 {actual[:12]}..., "
        f"expected {expected[:12]}...): it was modified after export. Re-run `aggdec export`."
    )


def verify_files(root: Path, manifest: Manifest) -> None:
    """Refuse a bundle whose files are missing, links, or differ from what was exported.

    The names were checked to be plain file names by the schema, so ``root / name`` stays in
    ``root``."""
    for name, expected in manifest.files.items():
        path = root / name
        actual = sha256_of(path)
        if actual != expected:
            raise _mismatch(path, actual, expected)


class BundleFiles:
    """A bundle's listed files as the runtime reads them: each read once, into memory, and (with
    ``verify``) checked against its sha256 as it is read, so that the bytes handed on (to
    onnxruntime, to tokenizers) are the bytes that were hashed (see the module docstring)."""

    def __init__(self, root: str | Path, manifest: Manifest, verify: bool = True) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self.verify = verify
        self._data: dict[str, bytes] | None = None

    def read(self, name: str) -> bytes:
        """The content of listed file ``name``; BundleError if it differs from its sha256."""
        if name not in self.manifest.files:  # the schema lists every graph file and the tokenizer
            raise BundleError(f"{name!r} is not listed in the manifest's files, so it is not read.")
        path = self.root / name
        content = _read_regular(path)
        if self.verify:
            actual = hashlib.sha256(content).hexdigest()
            if actual != self.manifest.files[name]:
                raise _mismatch(path, actual, self.manifest.files[name])
        return content

    def external_data(self) -> dict[str, bytes]:
        """Every listed file that is neither a graph, the tokenizer nor the shortlist, by name: the
        only files a graph may keep external data in (read once, for every graph that needs them)."""
        if self._data is None:
            own = {spec.file for spec in self.manifest.graphs.values()} | {TOKENIZER_FILE, SENTENCEPIECE_FILE}
            if self.manifest.shortlist is not None:  # read by the loader as the shortlist, not by graphs
                own.add(self.manifest.shortlist["file"])
            self._data = {name: self.read(name) for name in self.manifest.files if name not in own}
        return self._data
