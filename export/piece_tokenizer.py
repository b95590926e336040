"""Bundles that segment with aggdec's own copy of SentencePiece (the manifest's segmentation
"sentencepiece", runtime/sentencepiece.py, decision 046), from three sources:

- :func:`convert`: a slow transformers ``MarianTokenizer``, which every OPUS-MT checkpoint on
  the Hub ships (``source.spm``, ``target.spm``, ``vocab.json``) and which transformers cannot
  convert to tokenizer.json; checked against the checkpoint's tokenizer on probe texts
  (encoding) and id sequences (decoding);
- :func:`marian_vocabulary_files`: an OPUS-MT folder in Marian's format (a vocabulary .yml and
  ``source.spm``); checked against SentencePiece's segmentation;
- :func:`marian_spm_files`: a Marian folder with its ``.spm`` (Bergamot's), searched with
  Marian's arithmetic; checked against SentencePiece's normalizer.

The bundle gets two files: ``tokenizer.json``, the model's vocabulary (piece -> id, the special
tokens), and ``sentencepiece.json``, the ``.spm``'s pieces, scores and normalizer (read here
from its protobuf, which the runtime cannot read) and the tokenizer's rules. Any difference in
the checks refuses the export, naming the text, before anything is written.

Refused, naming the setting: separate source and target vocabularies, SentencePiece sampling
options, ``split_special_tokens``, single-word added tokens, SentencePiece models with
user-defined or byte pieces, byte fallback or whitespace as a suffix, a vocabulary that gives
two pieces one id or leaves an id of the model without a piece.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.errors import ExportError
from ..runtime.manifest import TOKENIZER_FILE
from ..runtime.segmentation import SENTENCEPIECE, SENTENCEPIECE_FILE
from ..runtime.sentencepiece import CONTROL, NORMAL, UNKNOWN, UNUSED
from .codec_check import check_codec, probe_texts
from .safety import one_line

@dataclass
class PieceTokenizerFiles:
    """What export writes for such a tokenizer, and the vocabulary as a ``tokenizers`` object
    (the pipeline's special-id checks read it)."""

    backend_tokenizer: Any
    pieces: dict
    segmentation: str = SENTENCEPIECE

    def save(self, folder: Path, tokenizer_file: str) -> None:
        self.backend_tokenizer.save(str(folder / tokenizer_file))
        (folder / SENTENCEPIECE_FILE).write_text(json.dumps(self.pieces, ensure_ascii=False), encoding="utf-8")


def is_piece_tokenizer(tokenizer: Any) -> bool:
    return not getattr(tokenizer, "is_fast", False) and type(tokenizer).__name__ == "MarianTokenizer"


def model_spec(path: str, role: str, arithmetic: str = "sentencepiece") -> tuple[dict, Any]:
    """The ``.spm`` at ``path`` as runtime/sentencepiece.py's JSON (searched with ``arithmetic``:
    runtime/sentencepiece.py ARITHMETIC), and its protobuf."""
    from transformers.convert_slow_tokenizer import import_protobuf

    proto = import_protobuf().ModelProto()
    try:
        proto.ParseFromString(Path(path).read_bytes())
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, OSError
        raise ExportError(f"could not read the {role} SentencePiece model {path!r} ({one_line(exc)}).") from None
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    kinds = {piece.type for piece in proto.pieces}
    unsupported = kinds - {NORMAL, UNKNOWN, CONTROL, UNUSED}
    if unsupported or trainer.byte_fallback or trainer.treat_whitespace_as_suffix or trainer.model_type != 1:
        what = ("user-defined or byte pieces" if unsupported else "byte fallback" if trainer.byte_fallback
                else "whitespace as a suffix" if trainer.treat_whitespace_as_suffix else "a model type other than unigram")
        raise ExportError(f"the {role} SentencePiece model {path!r} has {what}, which aggdec's copy of SentencePiece "
                          "does not reproduce.")
    spec = {"pieces": [[piece.piece, piece.score, piece.type] for piece in proto.pieces], "unk_id": trainer.unk_id,
            "precompiled_charsmap": base64.b64encode(normalizer.precompiled_charsmap).decode("ascii"),
            "add_dummy_prefix": normalizer.add_dummy_prefix,
            "remove_extra_whitespaces": normalizer.remove_extra_whitespaces,
            "escape_whitespaces": normalizer.escape_whitespaces, "arithmetic": arithmetic}
    return spec, proto


def convert(tokenizer: Any, vocab_size: int, where: str, seed: int = 0) -> PieceTokenizerFiles:
    """``tokenizer`` (a slow MarianTokenizer) as the bundle's two files, checked against it."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel

    def refuse(what: str) -> ExportError:
        return ExportError(f"the tokenizer in {where!r} (MarianTokenizer) {what}; aggdec cannot export it.")

    if getattr(tokenizer, "separate_vocabs", False):
        raise refuse("has separate source and target vocabularies (separate_vocabs)")
    if getattr(tokenizer, "sp_model_kwargs", None):
        raise refuse(f"passes SentencePiece options {sorted(tokenizer.sp_model_kwargs)} (sp_model_kwargs)")
    if getattr(tokenizer, "split_special_tokens", False):
        raise refuse("sets split_special_tokens")
    encoder = dict(tokenizer.encoder)
    ids = list(encoder.values())
    if len(set(ids)) != len(ids):
        raise refuse("gives two pieces of vocab.json one id")
    missing = sorted(set(range(vocab_size)) - set(ids))
    if missing:
        raise refuse(f"has no piece for {len(missing)} of the model's {vocab_size} ids (first: {missing[0]})")
    # decode() reads pieces with the source model too unless the vocabularies are separate (refused above)
    source_spec, decoding = model_spec(tokenizer.spm_files[0], "source")
    added = tokenizer.added_tokens_decoder
    if any(token.single_word for token in added.values()):
        raise refuse("has a single-word added token")

    backend = Tokenizer(WordLevel(vocab=encoder, unk_token=str(tokenizer.unk_token)))
    for index, token in sorted(added.items()):
        made = AddedToken(token.content, single_word=False, lstrip=token.lstrip, rstrip=token.rstrip,
                          normalized=False, special=token.special)
        (backend.add_special_tokens if token.special else backend.add_tokens)([made])
        if backend.token_to_id(token.content) != index:
            raise refuse(f"has the added token {token.content!r} at id {index}, outside vocab.json's ids")
    special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    if special != set(tokenizer.all_special_ids):
        raise refuse(f"marks ids {sorted(set(tokenizer.all_special_ids))} special, not its added tokens' "
                     f"{sorted(special)}")
    pieces = {
        "model": source_spec,
        "added_tokens": [{"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip} for t in added.values()],
        "language_codes": True,  # MarianTokenizer._tokenize keeps a leading >>code<< whole
        "eos_token": str(tokenizer.eos_token),
        "unk_token": str(tokenizer.unk_token),
        "silent_pieces": [p.piece for p in decoding.pieces if p.type == CONTROL],
        "unknown_piece": decoding.pieces[decoding.trainer_spec.unk_id].piece,
        "clean_up_tokenization_spaces": bool(getattr(tokenizer, "clean_up_tokenization_spaces", False)),
        "decode": "joined",
    }
    files = PieceTokenizerFiles(backend, pieces)
    _check(tokenizer, files, vocab_size, where, seed)
    return files


def _check(tokenizer: Any, files: PieceTokenizerFiles, vocab_size: int, where: str, seed: int) -> None:
    """The runtime's codec, made from the two files as the loader makes it, against ``tokenizer``
    itself (codec_check.py)."""
    from ..runtime.tokenizer import TextCodec

    codec = TextCodec(Path(where) / TOKENIZER_FILE, files.backend_tokenizer.to_str().encode("utf-8"), SENTENCEPIECE,
                      vocab_size, json.dumps(files.pieces).encode("utf-8"))
    check_codec(tokenizer, codec, list(tokenizer.encoder), vocab_size, where, seed)


def marian_vocabulary_files(vocabulary: dict[str, int], source_spm: Path, where: str,
                            seed: int = 0) -> PieceTokenizerFiles:
    """An OPUS-MT folder in Marian's own format (a vocabulary .yml and ``source.spm``) as the
    bundle's two files. Marian reads pieces, not text: OPUS-MT's ``preprocess.sh`` runs
    ``spm_encode`` with ``source.spm`` (a target-language ``>>code<<`` before them for
    multilingual models), Marian looks each piece up in the .yml (``<unk>`` if absent) and
    appends ``</s>``; ``postprocess.sh`` joins the output pieces and reads U+2581 as a space.
    Checked against SentencePiece itself on probe texts before anything is written."""
    backend = _marian_vocabulary(vocabulary, where)
    spec, _ = model_spec(str(source_spm), "source")
    pieces = {"model": spec, "added_tokens": [], "language_codes": True, "eos_token": "</s>", "unk_token": "<unk>",
              "silent_pieces": [], "unknown_piece": "<unk>", "clean_up_tokenization_spaces": False, "decode": "joined"}
    _check_against_sentencepiece(source_spm, spec, seed, normalized_only=False)
    return PieceTokenizerFiles(backend, pieces)


def _check_against_sentencepiece(path: Path, spec: dict, seed: int, normalized_only: bool) -> None:
    """aggdec's copy of SentencePiece against the library on probe texts: the pieces, or with
    ``normalized_only`` the normalized text (where the search is Marian's, not the library's)."""
    import sentencepiece

    from ..runtime.sentencepiece import SentencePieceModel

    copy = SentencePieceModel(spec, str(path))  # the runtime's own refusals first (BundleError, naming the field)
    try:
        reference = sentencepiece.SentencePieceProcessor(model_file=str(path))
    except Exception as exc:  # noqa: BLE001 - the library's RuntimeError ("INTERNAL: ...") for a malformed model
        # a precompiled charsmap whose trie is cut short, a NaN score, an empty piece: tracebacks before
        raise ExportError(f"SentencePiece refuses {str(path)!r} ({one_line(exc)}); it is not a usable "
                          "SentencePiece model.") from None
    pieces = [reference.id_to_piece(i) for i in range(reference.get_piece_size())]
    for text in probe_texts(pieces, random.Random(seed)):
        if normalized_only:
            what, expected, got = "normalizes", reference.normalize(text), copy.normalize(text)
        else:
            what, expected, got = "segments", reference.encode(text, out_type=str), copy.encode(text)
        if got != expected:
            raise ExportError(f"aggdec's copy of SentencePiece {what} {text!r} with {str(path)!r} as {got!r}, "
                              f"SentencePiece as {expected!r}; refusing to export a bundle whose sources would "
                              "differ.")


def marian_spm_files(tokenizer: Any, source_spm: Path, where: str, vocab_size: int | None = None,
                     seed: int = 0) -> PieceTokenizerFiles:
    """A Marian folder whose vocabulary is a SentencePiece model (Bergamot's ``vocab.*.spm``, its
    ids the model's) as the bundle's two files: ``tokenizer`` (the folder's tokenizer.json, the
    same pieces at the same ids: export.py checks them; None for a folder that ships none,
    Firefox Translations' releases: the ``.spm``'s pieces then) for the vocabulary, and the
    ``.spm`` searched with the arithmetic of the SentencePiece built into Marian (decision 035)
    after SentencePiece's own normalizer, which the ``tokenizers`` library's differs from on
    combining marks. Marian decodes with SentencePiece. The normalizer is checked against the
    library's on probe texts before anything is written."""
    spec, proto = model_spec(str(source_spm), "source", arithmetic="marian")
    if tokenizer is None:
        vocabulary = {piece.piece: index for index, piece in enumerate(proto.pieces)}
        if len(proto.pieces) != vocab_size or len(vocabulary) != vocab_size:
            raise ExportError(f"{where!r} holds {len(proto.pieces)} pieces ({len(vocabulary)} distinct); the model's "
                              f"vocabulary has {vocab_size}: it is not this model's vocabulary.")
        tokenizer = _marian_vocabulary(vocabulary, where)
    if not 0 <= proto.trainer_spec.unk_id < len(proto.pieces):  # an IndexError (or, below 0, another piece) before
        raise ExportError(f"{where!r}: its unk_id {proto.trainer_spec.unk_id} names none of its {len(proto.pieces)} "
                          "pieces; it is not a usable SentencePiece model.")
    pieces = {"model": spec, "added_tokens": [], "language_codes": False, "eos_token": "</s>", "unk_token": "<unk>",
              "silent_pieces": [p.piece for p in proto.pieces if p.type == CONTROL],
              "unknown_piece": proto.pieces[proto.trainer_spec.unk_id].piece, "clean_up_tokenization_spaces": False,
              "decode": "sentencepiece"}
    _check_against_sentencepiece(source_spm, spec, seed, normalized_only=True)
    return PieceTokenizerFiles(tokenizer, pieces)


def _marian_vocabulary(vocabulary: dict[str, int], where: str) -> Any:
    """Marian's vocabulary (piece -> id) as a ``tokenizers`` word-level model, ``</s>`` and
    ``<unk>`` special (decoding skips them); refused without them."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel

    for token in ("</s>", "<unk>"):
        if token not in vocabulary:
            raise ExportError(f"{where} has no {token!r}; Marian's vocabularies hold </s> and <unk>.")
    backend = Tokenizer(WordLevel(vocab=dict(vocabulary), unk_token="<unk>"))
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in ("</s>", "<unk>")])
    return backend
