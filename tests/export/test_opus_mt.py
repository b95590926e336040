"""Hub OPUS-MT checkpoints (MarianTokenizer: source.spm, target.spm, vocab.json): exported with
the runtime's own copy of SentencePiece and of the tokenizer's rules (runtime/sentencepiece.py,
export/piece_tokenizer.py), and decoded exactly as transformers decodes them, text included."""

from __future__ import annotations

import base64
import json
import random
import shutil
import struct

import pytest

from aggdec.export import export_bundle
from aggdec.runtime.errors import BundleError, ExportError
from aggdec.runtime.segmentation import SENTENCEPIECE, SENTENCEPIECE_FILE

sentencepiece = pytest.importorskip("sentencepiece")

WORDS = ("the cat dog sat on mat a big small house river über straße café naïve déjà-vu 2024 10,5 % "
         "don't I'm Hmmm ... !!!! (ok) \"quoted\" — “curly” ﬁne Ｆｕｌｌ").split()
# what a hostile text may hold: whitespace of every kind, what the normalizer rewrites, combining
# marks, characters no piece covers, the added tokens' and the language codes' strings
HOSTILE = ["a", "b", " ", "  ", "\t", "\n", "\u00a0", "\u3000", "\u200b", "\u0301", "e\u0301", "ﬁ", "Ａ", "①", "ｶﾞ",
           "…", "😀", "ß", "\u2581", "<unk>", "</s>", "<pad>", ">>fra<<", ">>", "<<", ".", "the", "cat", "\r", "\x00"]


def _corpus(rng: random.Random, lines: int) -> str:
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(lines))


def _train(folder, name, rng, **options):
    corpus = folder / f"{name}.txt"
    corpus.write_text(_corpus(rng, 400), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / name), vocab_size=120,
                                             bos_id=-1, eos_id=0, unk_id=1, pad_id=-1, hard_vocab_limit=False,
                                             minloglevel=2, **options)
    return folder / f"{name}.model"


def _hostile_texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(HOSTILE) for _ in range(rng.randint(1, 10))) for _ in range(count)]


@pytest.fixture(scope="module")
def opus_checkpoint(tmp_path_factory):
    """A tiny random OPUS-MT checkpoint as the Hub ships them: a joint vocab.json over two
    SentencePiece models (the source one with the default nmt_nfkc normalizer), language codes."""
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    folder = tmp_path_factory.mktemp("opus")
    rng = random.Random(0)
    source, target = _train(folder, "source", rng), _train(folder, "target", rng, normalization_rule_name="identity")
    vocab: dict[str, int] = {}
    for model in (source, target):
        processor = sentencepiece.SentencePieceProcessor(model_file=str(model))
        for index in range(processor.get_piece_size()):
            vocab.setdefault(processor.id_to_piece(index), len(vocab))
    for code in (">>fra<<", ">>por<<"):
        vocab[code] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    checkpoint = folder / "ckpt"
    MarianTokenizer(source_spm=str(source), target_spm=str(target), vocab=str(folder / "vocab.json")
                    ).save_pretrained(checkpoint)
    torch.manual_seed(0)
    MarianMTModel(MarianConfig(vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                               decoder_ffn_dim=64, pad_token_id=len(vocab) - 1, eos_token_id=0,
                               decoder_start_token_id=len(vocab) - 1, max_position_embeddings=128)
                  ).save_pretrained(checkpoint)
    bundle = folder / "bundle"
    export_bundle(checkpoint, bundle, progress=None)
    return checkpoint, bundle, source


@pytest.mark.xdist_group("opus_mt")
def test_an_opus_mt_checkpoint_decodes_as_transformers_does_ids_and_text(opus_checkpoint):
    from transformers import AutoTokenizer

    from aggdec.runtime.generator import Generator
    from aggdec.runtime.manifest import load_manifest
    from tests.runtime.test_lossless import transformers_greedy

    checkpoint, bundle, _ = opus_checkpoint
    manifest = load_manifest(bundle)
    assert manifest.segmentation == SENTENCEPIECE and SENTENCEPIECE_FILE in manifest.files
    rng = random.Random(3)
    texts = [_corpus(rng, 1) for _ in range(10)] + [">>fra<< the cat sat", "the </s> cat", "Hmmm ... ﬁne!!!!",
                                                  "\u00a0déjà-vu  😀 e\u0301"] + _hostile_texts(4, 6)
    texts = [text for text in texts if text.strip()]
    expected = transformers_greedy(checkpoint, texts, 24)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    for io_binding in (True, False):
        generator = Generator(bundle, io_binding=io_binding)
        assert [generator.encode([text])[0] for text in texts] == [tokenizer(text).input_ids for text in texts]
        for batch in (1, 8):
            for mode in ("greedy", "iad"):
                results = [result for start in range(0, len(texts), batch)
                           for result in generator.generate(texts[start : start + batch], mode=mode,
                                                            max_new_tokens=24)]
                for text, want, got in zip(texts, expected, results):
                    assert list(got.ids) == list(want), (text, mode, batch)
                    assert got.text == tokenizer.decode(list(want), skip_special_tokens=True), (text, mode, batch)


@pytest.mark.xdist_group("opus_mt")
def test_the_runtime_tokenizer_equals_marian_tokenizer_on_hostile_text(opus_checkpoint):
    from transformers import AutoTokenizer

    from aggdec.runtime.tokenizer import TextCodec

    checkpoint, bundle, _ = opus_checkpoint
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    codec = TextCodec(bundle / "tokenizer.json", segmentation=SENTENCEPIECE)
    texts = _hostile_texts(5, 1500)
    assert codec.encode(texts) == [tokenizer(text).input_ids for text in texts]
    rng = random.Random(6)
    for _ in range(500):
        ids = [rng.randrange(len(tokenizer.encoder)) for _ in range(rng.randint(1, 12))]
        assert codec.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True), ids


@pytest.mark.parametrize("options", [{}, {"normalization_rule_name": "identity"}, {"normalization_rule_name": "nfkc_cf"},
                                     {"remove_extra_whitespaces": False}, {"add_dummy_prefix": False}],
                         ids=["nmt_nfkc", "identity", "nfkc_cf", "extra-whitespace", "no-dummy-prefix"])
def test_the_python_sentencepiece_segments_as_sentencepiece_does(tmp_path, options):
    """Normalizer (the precompiled rules on bytes, whitespace) and search (float32 ties) alike,
    on natural and hostile text: the tokenizers library's Unigram model does not (module docstring)."""
    from aggdec.export.piece_tokenizer import model_spec
    from aggdec.runtime.sentencepiece import SentencePieceModel

    model = _train(tmp_path, "m", random.Random(7), **options)
    ours = SentencePieceModel(model_spec(str(model), "test")[0], "test")  # the library's arithmetic
    theirs = sentencepiece.SentencePieceProcessor(model_file=str(model))
    rng = random.Random(8)
    texts = [_corpus(rng, 1) for _ in range(300)] + _hostile_texts(9, 3000)
    for text in texts:
        expected = theirs.encode(text, out_type=str)
        assert ours.encode(text) == expected, text
        # a caller that refuses more pieces gets them all, or None only where there are more
        for most in (len(expected), len(expected) - 1, len(expected) // 4):
            got = ours.encode(text, most)
            assert got == expected or (got is None and len(expected) > most), (text, most)
        assert ours.pieces.fewest(ours.normalize(text)) <= len(expected), text


@pytest.mark.xdist_group("opus_mt")
def test_a_text_longer_than_the_bundle_takes_is_refused_before_all_of_it_is_segmented(opus_checkpoint):
    """The Python segmenter stops where a text is certain to exceed max_source_len: a megabyte is
    refused as a short text is, after normalizing a bounded prefix (the normalizer gives up)."""
    from transformers import AutoTokenizer

    from aggdec.runtime.errors import InputError
    from aggdec.runtime.generator import Generator
    from aggdec.runtime.sentencepiece import SentencePieceModel

    checkpoint, bundle, _ = opus_checkpoint
    generator = Generator(bundle, threads=1)
    limit = generator.manifest.max_source_len
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    rng = random.Random(10)
    words = [rng.choice(WORDS) for _ in range(limit)]
    for count in range(limit // 4, limit):  # around the limit: refused exactly when the tokenizer's ids exceed it
        text = " ".join(words[:count])
        want = tokenizer(text).input_ids
        if len(want) <= limit:
            assert generator.encode([text]) == [want]
        else:
            refused = f"is (more than )?[0-9]+ tokens long; this bundle accepts at most {limit}"
            with pytest.raises(InputError, match=refused):
                generator.encode([text])
    huge = " ".join(words) * 2000
    with pytest.raises(InputError, match=f"text 0 is more than {limit} tokens long"):
        generator.encode([huge])
    model = SentencePieceModel(json.loads((bundle / SENTENCEPIECE_FILE).read_text(encoding="utf-8"))["model"], "test")
    assert model.normalize(huge, most_known=limit) is None  # stopped, not normalized whole
    assert model.normalize(huge, most_known=len(huge)) == model.normalize(huge)  # a bound never reached


def test_separate_vocabularies_are_refused_and_nothing_is_written(opus_checkpoint, tmp_path):
    from transformers import MarianTokenizer

    checkpoint, _, _ = opus_checkpoint
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint, copy)
    MarianTokenizer(source_spm=str(copy / "source.spm"), target_spm=str(copy / "target.spm"),
                    vocab=str(copy / "vocab.json"), target_vocab_file=str(copy / "vocab.json"),
                    separate_vocabs=True).save_pretrained(copy)
    with pytest.raises(ExportError, match="separate source and target vocabularies"):
        export_bundle(copy, tmp_path / "out", progress=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_bundle_without_its_sentencepiece_file_or_with_a_bad_one_is_refused(opus_checkpoint, tmp_path):
    from aggdec.runtime.manifest import load_manifest
    from aggdec.runtime.tokenizer import TextCodec

    _, bundle, _ = opus_checkpoint
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["files"][SENTENCEPIECE_FILE]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="sentencepiece.json"):
        load_manifest(copy)
    # its decoding rules (the clean-up of spaces included) are that file's: the manifest may not say otherwise
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["clean_up_tokenization_spaces"] = True
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="clean_up_tokenization_spaces is set where segmentation"):
        load_manifest(copy)
    manifest["clean_up_tokenization_spaces"] = "yes"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="clean_up_tokenization_spaces"):
        load_manifest(copy)
    spec = json.loads((bundle / SENTENCEPIECE_FILE).read_text(encoding="utf-8"))
    def charsmap(strings: bytes) -> str:  # an empty trie (one unit) and the replacement strings
        return base64.b64encode(struct.pack("<II", 4, 0) + strings).decode("ascii")

    for damage, message in ((lambda s: s["model"].update(precompiled_charsmap="AAAA"), "character map"),
                            (lambda s: s["model"].update(precompiled_charsmap=charsmap(b"\xff\xfe\0")), "not UTF-8"),
                            (lambda s: s["model"].update(precompiled_charsmap=charsmap(b"w" * 300 + b"\0")),
                             "300 bytes"),
                            (lambda s: s["model"].update(unk_id=10**6), "unk_id"),
                            (lambda s: s["model"]["pieces"].__setitem__(5, ["x", "nan", 1]), "piece 5"),
                            (lambda s: s.update(eos_token="<nowhere>"), "eos_token"),
                            (lambda s: s.update(added_tokens=s["added_tokens"] * 300), "more than the 256 allowed")):
        broken = json.loads(json.dumps(spec))
        damage(broken)
        with pytest.raises(BundleError, match=message):
            TextCodec(bundle / "tokenizer.json", segmentation=SENTENCEPIECE,
                      pieces=json.dumps(broken).encode("utf-8")).encode(["the cat"])


def test_pieces_that_would_make_a_huge_search_trie_are_refused(opus_checkpoint, monkeypatch):
    """Each trie node is a Python dictionary (about 250 bytes): a small sentencepiece.json of long
    distinct pieces could take all memory. The bound is lowered here so the test stays fast;
    the real bundle's pieces make about 1,000 nodes."""
    from aggdec.runtime import sentencepiece as module
    from aggdec.runtime.tokenizer import TextCodec

    _, bundle, _ = opus_checkpoint
    spec = json.loads((bundle / SENTENCEPIECE_FILE).read_text(encoding="utf-8"))
    monkeypatch.setattr(module, "MAX_TRIE_NODES", 5000)
    TextCodec(bundle / "tokenizer.json", segmentation=SENTENCEPIECE)  # within the bound
    for index in range(2, 40):
        spec["model"]["pieces"][index][0] = f"{index:03d}" + "x" * 200
    with pytest.raises(BundleError, match="more than 5,000 trie nodes"):
        TextCodec(bundle / "tokenizer.json", segmentation=SENTENCEPIECE, pieces=json.dumps(spec).encode("utf-8"))


@pytest.mark.xdist_group("opus_mt")
def test_an_int8_opus_mt_bundle_keeps_the_tokenizer_and_iad_equals_its_greedy(opus_checkpoint, tmp_path):
    from aggdec.export.quantize import quantize_bundle
    from aggdec.runtime.generator import Generator

    _, bundle, _ = opus_checkpoint
    quantize_bundle(bundle, tmp_path / "int8", precision="int8", progress=None)
    generator = Generator(tmp_path / "int8")
    texts = [">>fra<< the cat sat on the mat", "a big house", "Hmmm ... ﬁne!!!!"]
    greedy = generator.generate(texts, max_new_tokens=16)
    assert [r.ids for r in generator.generate(texts, mode="iad", max_new_tokens=16)] == [r.ids for r in greedy]
    assert [r.text for r in greedy] == [Generator(bundle).codec.decode(list(r.ids)) for r in greedy]


def test_a_rule_that_ends_inside_a_character_gives_a_replacement_character_not_a_crash(opus_checkpoint):
    """A hostile bundle's normalization rule may match the first byte of a two-byte character;
    the byte after it is then read as SentencePiece reads malformed UTF-8: U+FFFD for one byte."""
    from aggdec.runtime.sentencepiece import SentencePieceModel

    _, bundle, _ = opus_checkpoint
    spec = json.loads((bundle / SENTENCEPIECE_FILE).read_text(encoding="utf-8"))["model"]
    # a darts-clone double array with one rule: the byte 0xC3 (the lead of "é") -> "x"
    units = [0] * 196
    units[0] = 1 << 10  # the root, its children at 1 ^ byte
    units[1 ^ 0xC3] = 0xC3 | (1 << 8) | (1 << 10)  # label 0xC3, a leaf below, children at node ^ 1
    units[(1 ^ 0xC3) ^ 1] = (1 << 31) | 0  # the leaf: the rule's replacement at offset 0
    blob = struct.pack("<I", 4 * len(units)) + struct.pack(f"<{len(units)}I", *units) + b"x\0"
    spec["precompiled_charsmap"] = base64.b64encode(blob).decode("ascii")
    model = SentencePieceModel(spec, "test")
    assert model.normalize("é") == "\u2581x\ufffd"
    assert model.encode("caf\u00e9 ok")  # pieces, not an exception
