"""Tiny random Marian models written in Marian's own formats (.bin with int8 matrices, .npz),
for fast tests of export/marian/ without the Bergamot models.

The .bin writer follows Marian's layout (export/marian/weights.py): headers, names, shapes,
alignment, then each item padded to 256 bytes with non-zero filler (as Bergamot's files are,
so a reader that read past an item's values would be caught); int8 matrices are stored
transposed with their multiplier after the values, except Wemb.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import yaml

FLOAT32, INT8_INTGEMM, INT8 = 0x0404, 0x4101, 0x0101
ALIGN = 256
WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "in", "park", "big", "red", "sun", "and", "is"]


def tiny_config(decoder: str = "ssru", **overrides) -> dict:
    config = {
        "type": "transformer", "enc-depth": 2, "dec-depth": 2, "dim-emb": 16, "transformer-heads": 2,
        "transformer-dim-ffn": 32, "transformer-ffn-activation": "relu", "transformer-ffn-depth": 2,
        "transformer-postprocess": "dan", "transformer-postprocess-emb": "d", "transformer-postprocess-top": "",
        "transformer-preprocess": "", "tied-embeddings-all": True, "tied-embeddings": False,
        "tied-embeddings-src": False, "transformer-train-position-embeddings": False, "right-left": False,
        "output-omit-bias": False, "dim-vocabs": [0, 0], "version": "v1.9.56 test",
        "transformer-decoder-autoreg": "rnn" if decoder == "ssru" else "self-attention",
    }
    if decoder == "ssru":
        config["dec-cell"] = "ssru"
    config.update(overrides)
    return config


def tokenizer_pieces() -> list[str]:
    return ["</s>", "<unk>", "\u2581", *(f"\u2581{w}" for w in WORDS), *"abcdefghijklmnopqrstuvwxyz"]


def write_tokenizer(path: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pieces = tokenizer_pieces()
    vocab = [(piece, 0.0 if i < 2 else -1.0 - 0.01 * i) for i, piece in enumerate(pieces)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=1, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.save(str(path))
    return len(pieces)


def tiny_weights(config: dict, seed: int = 0, gate_bias: float = 0.0, eos_bias: float = 6.5, emb_scale: float = 0.5,
                weight_scale: float = 0.4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, ffn, vocab = config["dim-emb"], config["transformer-dim-ffn"], config["dim-vocabs"][1]

    def m(rows: int, cols: int, scale: float = weight_scale) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def b(cols: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal((1, cols)) * scale).astype(np.float32)

    def attention(prefix: str) -> dict:
        out = {}
        for part in "qkvo":
            out[f"{prefix}_W{part}"], out[f"{prefix}_b{part}"] = m(d, d), b(d)
        out[f"{prefix}_Wo_ln_scale"] = (1 + b(d)).astype(np.float32)
        out[f"{prefix}_Wo_ln_bias"] = b(d)
        return out

    def feed_forward(prefix: str) -> dict:
        return {f"{prefix}_W1": m(d, ffn), f"{prefix}_b1": b(ffn), f"{prefix}_W2": m(ffn, d), f"{prefix}_b2": b(d),
                f"{prefix}_ffn_ln_scale": (1 + b(d)).astype(np.float32), f"{prefix}_ffn_ln_bias": b(d)}

    if config.get("tied-embeddings-all"):
        tensors = {"Wemb": m(vocab, d, emb_scale)}
    else:  # separate source and target embeddings, and an output matrix of its own unless tied-embeddings
        tensors = {"encoder_Wemb": m(config["dim-vocabs"][0], d, emb_scale), "decoder_Wemb": m(vocab, d, emb_scale)}
        if not config.get("tied-embeddings"):
            tensors["decoder_ff_logit_out_W"] = m(d, vocab, emb_scale)
    tensors["decoder_ff_logit_out_b"] = b(vocab, 0.1)
    tensors["decoder_ff_logit_out_b"][0, 0] += eos_bias  # so that outputs end at varied lengths
    for layer in range(1, config["enc-depth"] + 1):
        tensors.update(attention(f"encoder_l{layer}_self"))
        tensors.update(feed_forward(f"encoder_l{layer}_ffn"))
    for layer in range(1, config["dec-depth"] + 1):
        prefix = f"decoder_l{layer}"
        if config.get("transformer-decoder-autoreg") == "rnn":
            tensors[f"{prefix}_rnn_W"], tensors[f"{prefix}_rnn_Wf"] = m(d, d), m(d, d)
            # gate_bias pushes alternate gates towards 1 and 0 (saturated: sigmoid exactly 1.0 or 0.0)
            signs = np.where(np.arange(d) % 2 == 0, 1.0, -1.0)
            tensors[f"{prefix}_rnn_bf"] = (b(d) + gate_bias * signs).astype(np.float32)
            tensors[f"{prefix}_rnn_ffn_ln_scale"] = (1 + b(d)).astype(np.float32)
            tensors[f"{prefix}_rnn_ffn_ln_bias"] = b(d)
        else:
            tensors.update(attention(f"{prefix}_self"))
        tensors.update(attention(f"{prefix}_context"))
        tensors.update(feed_forward(f"{prefix}_ffn"))
    return tensors


def quantize(values: np.ndarray) -> tuple[np.ndarray, float]:
    """Marian's int8 storage of a matrix: int8 values and the multiplier, value = int8 / multiplier."""
    multiplier = 127.0 / float(np.abs(values).max())
    return np.clip(np.round(values * multiplier), -127, 127).astype(np.int8), multiplier


def bin_items(tensors: dict[str, np.ndarray], config_text: str, int8: bool
              ) -> tuple[list[tuple[str, int, tuple, bytes]], dict[str, np.ndarray]]:
    """(name, type, shape, data) per item as Marian writes them (int8 matrices get a _QuantMultA),
    and the float values a reader must see."""
    items, expected = [], {}
    for name, values in sorted(tensors.items()):
        if int8 and values.ndim == 2 and min(values.shape) > 1:
            q, multiplier = quantize(values)
            stored = q if name == "Wemb" else np.ascontiguousarray(q.T)
            items.append((name, INT8_INTGEMM, values.shape, stored.tobytes() + struct.pack("<f", multiplier)))
            expected[name] = q.astype(np.float32) / np.float32(multiplier)
            if name != "Wemb":
                items.append((name + "_QuantMultA", FLOAT32, (1,), struct.pack("<f", 3.5)))
        else:
            items.append((name, FLOAT32, values.shape, values.astype("<f4").tobytes()))
            expected[name] = values
    text = config_text.encode("utf-8") + b"\0"
    items.append(("special:model.yml", INT8, (len(text),), text))
    return items, expected


def encode_bin(items: list[tuple[str, int, tuple, bytes]]) -> bytes:
    out = bytearray(struct.pack("<QQ", 1, len(items)))
    padded = []
    for name, kind, shape, data in items:
        size = -(-len(data) // ALIGN) * ALIGN
        padded.append(data + bytes((0xA5,)) * (size - len(data)))
        out += struct.pack("<4Q", len(name) + 1, kind, len(shape), size)
    for name, *_rest in items:
        out += name.encode("utf-8") + b"\0"
    for _name, _kind, shape, _data in items:
        out += struct.pack(f"<{len(shape)}i", *shape)
    skip = (-(len(out) + 8)) % ALIGN
    out += struct.pack("<Q", skip) + bytes((0x5A,)) * skip
    for data in padded:
        out += data
    return bytes(out)


def write_model(folder: Path, decoder: str = "ssru", seed: int = 0, fmt: str = "bin", int8: bool = True,
                gate_bias: float = 0.0, config_overrides: dict | None = None,
                decoding: dict | None = None) -> tuple[Path, dict, dict[str, np.ndarray]]:
    """A Marian model folder: weights (``fmt`` "bin" or "npz"), tokenizer.json, decoding yml.
    Returns the folder, the config and the float weights as the reader should see them."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder / "tokenizer.json")
    config = tiny_config(decoder, **(config_overrides or {}))
    config["dim-vocabs"] = [vocab, vocab]
    tensors = tiny_weights(config, seed, gate_bias)
    text = yaml.safe_dump(config)
    if fmt == "bin":
        items, expected = bin_items(tensors, text, int8)
        (folder / "model.tiny.bin").write_bytes(encode_bin(items))
    else:
        text_bytes = np.frombuffer(text.encode("utf-8") + b"\0", dtype=np.int8)
        np.savez(folder / "model.tiny.npz", **tensors, **{"special:model.yml": text_bytes})
        expected = tensors
    settings = {"relative-paths": True, "models": [f"model.tiny.{fmt}"], "vocabs": ["vocab.spm", "vocab.spm"],
                "beam-size": 1, "normalize": 1.0, "word-penalty": 0, "mini-batch": 8, "max-length-factor": 2.5}
    settings.update(decoding or {})
    (folder / "config.tiny.yml").write_text(yaml.safe_dump(settings), encoding="utf-8")
    return folder, config, expected


SHORTLIST_MAGIC = 0xF11A48D5013417F5


def shortlist_bytes(vocab: int, first: int, best: int, seed: int = 0) -> bytes:
    """Marian's binary lexical shortlist: for each source id, ``best`` random target ids."""
    rng = np.random.default_rng(seed)
    targets = [np.sort(rng.choice(np.arange(first, vocab), size=best, replace=False)) for _ in range(vocab)]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in targets])]).astype("<u8")
    flat = np.concatenate(targets).astype("<u4")
    header = struct.pack("<6Q", SHORTLIST_MAGIC, 0, first, best, offsets.size, flat.size)
    return header + offsets.tobytes() + flat.tobytes()


def add_shortlist(folder: Path, first: int = 3, best: int = 4, seed: int = 0) -> Path:
    """Give a tiny model folder (write_model) a lexical shortlist, named in its decoding yml."""
    vocab = len(tokenizer_pieces())
    path = folder / "lex.tiny.s2t.bin"
    path.write_bytes(shortlist_bytes(vocab, first, best, seed))
    settings = yaml.safe_load((folder / "config.tiny.yml").read_text(encoding="utf-8"))
    settings["shortlist"] = [path.name, False]
    (folder / "config.tiny.yml").write_text(yaml.safe_dump(settings), encoding="utf-8")
    return path


def write_opus_model(folder: Path, seed: int = 0, eos_bias: float = 6.5) -> tuple[Path, dict]:
    """An OPUS-MT folder as it ships in Marian's format: a self-attention model in a float .npz
    named as OPUS-MT names it, ``source.spm`` and ``target.spm`` (SentencePiece, trained here on
    :data:`WORDS`), the joint vocabulary .yml (piece: id) the model's ids come from, and
    ``decoder.yml``. Returns the folder and the vocabulary."""
    import sentencepiece

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(WORDS, size=rng.integers(3, 10))) + rng.choice([".", "!", ""])
                                for _ in range(300)), encoding="utf-8")
    vocabulary: dict[str, int] = {}
    for name, options in (("source", {}), ("target", {"normalization_rule_name": "identity"})):
        sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / name), vocab_size=60,
                                                 bos_id=-1, eos_id=0, unk_id=1, pad_id=-1, hard_vocab_limit=False,
                                                 minloglevel=2, **options)
        (folder / f"{name}.model").rename(folder / f"{name}.spm")
        (folder / f"{name}.vocab").unlink()
        processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / f"{name}.spm"))
        for index in range(processor.get_piece_size()):
            vocabulary.setdefault(processor.id_to_piece(index), len(vocabulary))
    corpus.unlink()
    for code in (">>fra<<", ">>por<<"):
        vocabulary[code] = len(vocabulary)
    config = tiny_config("self-attention")
    config["dim-vocabs"] = [len(vocabulary), len(vocabulary)]
    tensors = tiny_weights(config, seed, eos_bias=eos_bias)
    text_bytes = np.frombuffer(yaml.safe_dump(config).encode("utf-8") + b"\0", dtype=np.int8)
    weights = "opus.spm60-spm60.transformer-align.model1.npz.best-perplexity.npz"
    np.savez(folder / weights, **tensors, **{"special:model.yml": text_bytes})
    (folder / "opus.spm60-spm60.vocab.yml").write_text(yaml.safe_dump(vocabulary, allow_unicode=True),
                                                       encoding="utf-8")
    settings = {"models": [weights], "vocabs": ["opus.spm60-spm60.vocab.yml"] * 2, "beam-size": 6, "normalize": 0.6,
                "word-penalty": 0, "mini-batch": 16, "maxi-batch": 100, "maxi-batch-sort": "src",
                "relative-paths": True}
    (folder / "decoder.yml").write_text(yaml.safe_dump(settings), encoding="utf-8")
    return folder, vocabulary
