"""A model's embedding may have rows no token has (T5's vocab_size 32128 for 32100 tokens, mT5's
250112): an id among them has no text, and decoding drops it, with or without <unk> restoring."""

from __future__ import annotations

from aggdec.runtime.tokenizer import TextCodec
from tests.support.tiny import build_tokenizer


def test_an_id_past_the_tokenizer_is_dropped_from_the_text(tmp_path):
    build_tokenizer("t5", ["a", "b", "c"]).save_pretrained(tmp_path)
    codec = TextCodec(tmp_path / "tokenizer.json")
    past = codec.vocab_size + 3  # a padded embedding row
    source = "a zz b"  # zz: not in the vocabulary, <unk>
    ids = codec.encode([source])[0]
    assert codec.unk_id in ids
    with_padded = ids[:1] + [past] + ids[1:]
    assert codec.decode(with_padded) == codec.decode(ids)
    # restoring <unk> from the source used to fail on the padded id (no token: None in the join)
    assert codec.decode_restoring(with_padded, source) == codec.decode_restoring(ids, source) == source
