"""The reference-model recipe (benchmarks/models/uagec): byte-fallback tokenizer and rare characters.

The tokenizer tests train the recipe's own BPE on real UA-GEC sentences (seconds) and check the
round trip through both transformers' fast tokenizer and the runtime's ``TextCodec`` (the
``tokenizers`` library alone), which is what a bundle decodes with. The larger reference model's
tokenizer in ``../shared`` is checked too where that directory exists.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[1] / "benchmarks" / "models" / "uagec"
SHARED_BASE = Path(__file__).resolve().parents[2] / "shared" / "models" / "uagec-base" / "model"

pytest.importorskip("ua_gec")
pytest.importorskip("transformers")
sys.path.insert(0, str(RECIPE))
import data  # noqa: E402  (the recipe's modules are scripts beside their data, not a package)
import train  # noqa: E402

from aggdec.runtime.tokenizer import TextCodec  # noqa: E402

# Characters the UA-GEC training text never contains: emoji (with skin tone, ZWJ, flags and
# variation selectors), superscripts, other scripts, symbols; and whitespace at the edges.
RARE = [
    "Площа 5 км³, а не 5 км2.",
    "Дякую 👍🏽 і до зустрічі 👩‍💻 🇺🇦 ❤️",
    "Формула x₂ + y² = z⁽ⁿ⁾",
    "Грецькою αβγ, івритом שלום, арабською سلام, китайською 中文, корейською 한국어.",
    "Символи ∀x ∈ ℝ → ⊥ ✓",
    "  два пробіли на початку",
    "табуляція\tусередині",
    "😀",
]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    pairs = data.load_pairs("train")[:1500]
    return [p.source for p in pairs] + [p.target for p in pairs]


@pytest.fixture(scope="module")
def byte_tokenizer(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("byte-tok")
    return train.train_tokenizer(corpus, 2000, out, byte_fallback=True), out / "tokenizer.json"


def test_byte_fallback_round_trips_rare_characters(byte_tokenizer, corpus):
    fast, path = byte_tokenizer
    codec = TextCodec(path)
    unk = fast.unk_token_id
    for text in RARE + corpus[:300]:
        ids = fast(text)["input_ids"]
        assert unk not in ids, text
        assert fast.decode(ids, skip_special_tokens=True) == text
        assert codec.encode([text])[0] == ids  # the runtime sees the same ids
        assert codec.decode(ids) == text


def test_byte_fallback_layout(byte_tokenizer):
    fast, path = byte_tokenizer
    assert len(fast) == 2000  # the byte tokens come out of the pieces' share, not on top
    vocab = json.loads(path.read_text())["model"]["vocab"]
    assert [vocab[t] for t in ("</s>", "<unk>", "<pad>")] == [0, 1, 2]
    assert [vocab[f"<0x{b:02X}>"] for b in range(256)] == list(range(3, 259))
    # Byte tokens are ordinary vocabulary: skip_special_tokens must not drop them.
    ids = fast("😀")["input_ids"]
    assert any(3 <= i < 259 for i in ids)
    assert fast.decode(ids, skip_special_tokens=True) == "😀"


def test_without_byte_fallback_rare_characters_are_unknown(corpus, tmp_path):
    """Without --byte-fallback the tokenizer is as before: emoji become <unk>."""
    fast = train.train_tokenizer(corpus, 2000, tmp_path)
    assert fast.unk_token_id in fast("Дякую 👍")["input_ids"]
    assert not any(t.startswith("<0x") for t in fast.get_vocab())


def test_extending_a_tokenizer_with_byte_fallback_keeps_every_id(corpus, tmp_path):
    """``--init-from``'s tokenizer: a trained tokenizer without byte fallback, the byte tokens
    appended after its vocabulary. Every text its pieces cover keeps its ids (so the model keeps
    its embedding rows); characters that were ``<unk>`` become byte tokens and round-trip."""
    plain = train.train_tokenizer(corpus, 2000, tmp_path / "plain")
    extended = train.extend_with_byte_fallback(tmp_path / "plain", tmp_path / "extended")
    assert len(extended) == len(plain) + 256
    assert extended.convert_tokens_to_ids(["<0x00>", "<0xFF>"]) == [len(plain), len(plain) + 255]
    for text in corpus[:500]:
        assert extended(text)["input_ids"] == plain(text)["input_ids"], text
    codec = TextCodec(tmp_path / "extended" / "tokenizer.json")
    for text in RARE:
        ids = extended(text)["input_ids"]
        assert plain.unk_token_id not in ids and codec.encode([text])[0] == ids, text
        if text == " ".join(text.split()):  # this tokenizer's pre-tokenizer does not keep runs of spaces
            assert extended.decode(ids, skip_special_tokens=True) == codec.decode(ids) == text
    with pytest.raises(SystemExit, match="byte fallback already"):
        train.extend_with_byte_fallback(tmp_path / "extended", tmp_path / "twice")


@pytest.mark.skipif(not SHARED_BASE.is_dir(), reason="../shared/models/uagec-base is not here")
def test_larger_reference_model_tokenizer_round_trips_the_test_split():
    codec = TextCodec(SHARED_BASE / "tokenizer.json")
    sources = [p.source for p in data.load_pairs("test")]
    for text in sources + RARE:
        ids = codec.encode([text])[0]
        assert codec.unk_id not in ids, text
        assert codec.decode(ids) == text


def test_rare_pairs_keep_rare_characters_identical(corpus):
    targets = corpus[1500:]
    common = frozenset("".join(corpus))
    plain = data.synthetic_pairs(targets, 400, seed=3)
    rare = data.synthetic_pairs(targets, 400, seed=3, rare_rate=0.3, common_chars=common)
    changed = 0
    for (ps, pt), (rs, rt) in zip(plain, rare):
        if rt == pt:  # not drawn for rare characters: exactly the plain pair
            assert (rs, rt) == (ps, pt)
            continue
        changed += 1
        want = [c for c in rt if c not in common]
        assert want, rt
        assert [c for c in rs if c not in common] == want
        # the target is the plain target with rare strings added, nothing else changed
        assert "".join(c for c in rt if c in common).replace(" ", "") == pt.replace(" ", "")
    assert 60 <= changed <= 180  # about 30% of 400
    assert data.synthetic_pairs(targets, 400, seed=3, rare_rate=0.0) == plain


def test_rare_characters_reach_every_byte_token_the_test_split_needs():
    """The pool spans the UTF-8 lead bytes of the test split's rare characters (``³`` C2, ``ѕ``
    and ``ѣ`` D1, a combining breve CC, Cyrillic Extended-B EA) and every continuation byte, so
    each byte token a model must copy occurs in its training pairs."""
    rng = random.Random(0)
    encoded = "".join(data.rare_string(rng) for _ in range(20000)).encode()
    assert {0xC2, 0xCC, 0xD1, 0xEA, 0xF0} <= {b for b in encoded if b >= 0xC0}
    assert {b for b in encoded if 0x80 <= b < 0xC0} == set(range(0x80, 0xC0))


def test_rare_strings_avoid_common_characters():
    rng = random.Random(0)
    common = frozenset("αβγ😀")
    for _ in range(2000):
        s = data.rare_string(rng, common)
        assert s and not set(s) & common
        assert all(c.isprintable() or c == "\u200d" for c in s), ascii(s)  # ZWJ joins emoji


def test_rare_char_rate_needs_byte_fallback(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train.main(["--out", str(tmp_path), "--rare-char-rate", "0.1"])
    assert "--byte-fallback" in capsys.readouterr().err


TINY = ["--threads", "1", "--seed", "0", "--vocab-size", "600", "--d-model", "32", "--heads", "2", "--ffn-dim", "64",
        "--encoder-layers", "1", "--decoder-layers", "1", "--max-tokens", "300", "--dev-size", "8",
        "--eval-every", "0", "--byte-fallback", "--rare-char-rate", "0.1"]


def _train(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The recipe as users run it, in its own process (it sets torch's global determinism)."""
    return subprocess.run([sys.executable, str(RECIPE / "train.py"), "--out", str(out), *TINY, *extra],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_resumed_run_reaches_the_weights_of_an_uninterrupted_one(tmp_path):
    """A CPU run of the small model spans hours: stopped at step 3 and resumed, it must end on
    the same weights, bit for bit, as a run that went straight to step 6."""
    whole = _train(tmp_path / "whole", "--max-steps", "6")
    assert whole.returncode == 0, whole.stderr
    first = _train(tmp_path / "parts", "--max-steps", "3")
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "parts" / "resume.pt").is_file()
    second = _train(tmp_path / "parts", "--max-steps", "6", "--resume")
    assert second.returncode == 0, second.stderr
    assert "resumed at step 3" in second.stdout
    weights = [(tmp_path / run / "model.safetensors").read_bytes() for run in ("whole", "parts")]
    assert weights[0] == weights[1]
    log = json.loads((tmp_path / "parts" / "train_log.json").read_text())
    assert log["steps"] == 6 and log["resumed"][0]["step"] == 3
    # a resumption with other options would train another model: refused, naming them
    other = _train(tmp_path / "parts", "--max-steps", "9", "--resume", "--lr", "0.002")
    assert other.returncode == 2 and "lr 0.001 -> 0.002" in other.stderr
    missing = _train(tmp_path / "nothing", "--resume")
    assert missing.returncode == 2 and "no " in missing.stderr and "resume.pt" in missing.stderr
