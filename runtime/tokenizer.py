"""Text <-> ids with the bundle's tokenizer.json (the `tokenizers` library, no transformers)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from .errors import BundleError


class TextCodec:
    def __init__(self, path: Path) -> None:
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
            raise BundleError(f"could not read the tokenizer {str(path)!r}: {exc}") from exc
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce, added tokens included (for bundle_checks.check_consistency)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids with the special tokens the checkpoint's tokenizer adds (e.g. EOS)."""
        return [encoding.ids for encoding in self._tokenizer.encode_batch(texts, add_special_tokens=True)]

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)
