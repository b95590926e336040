"""Text <-> ids with the bundle's tokenizer.json (the `tokenizers` library, no transformers)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from .errors import BundleError
from .segmentation import MARIAN_SENTENCEPIECE, MarianSentencePiece


class TextCodec:
    def __init__(self, path: Path, contents: bytes | None = None, segmentation: str | None = None) -> None:
        """``contents``: the tokenizer file's bytes, as read and hashed (manifest.BundleFiles);
        without them it is read from ``path``. ``segmentation`` (Manifest.segmentation): None
        segments as the tokenizer does; "marian_sentencepiece" as Marian's SentencePiece does
        (segmentation.py), for a bundle made from a Marian model."""
        try:
            text = (path.read_bytes() if contents is None else contents).decode("utf-8")
            self._tokenizer = Tokenizer.from_str(text)
        except UnicodeDecodeError as exc:
            raise BundleError(f"the tokenizer {str(path)!r} is not UTF-8 text (invalid byte at offset "
                              f"{exc.start}).") from None
        except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
            raise BundleError(f"could not read the tokenizer {str(path)!r}: {exc}") from exc
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        unk = self._tokenizer.token_to_id("<unk>")
        self._unk_id: int | None = unk
        # The word-start marker of SentencePiece-style tokenizers, where the decoder turns it into
        # a space; a restored word-initial text takes it. Found by behaviour, not by component
        # names: other tokenizers (word level, byte-level BPE) would print it literally.
        decoder = self._tokenizer.decoder
        marked = decoder is not None and decoder.decode(["a", "\u2581b"]) == "a b"
        self._word_marker = "\u2581" if marked else None
        self._special_ids = [i for i, t in self._tokenizer.get_added_tokens_decoder().items() if t.special]
        self._segmenter = None
        if segmentation == MARIAN_SENTENCEPIECE:
            self._segmenter = MarianSentencePiece.from_json(self._tokenizer, text, str(path))
        elif segmentation is not None:  # the manifest's schema allows only the names above
            raise BundleError(f"{str(path)!r}: unknown segmentation {segmentation!r}.")

    @property
    def unk_id(self) -> int | None:
        return self._unk_id

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of the tokens the tokenizer marks special (decoding skips them)."""
        return frozenset(self._special_ids)

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce, added tokens included (for bundle_checks.check_consistency)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids with the special tokens the checkpoint's tokenizer adds (e.g. EOS)."""
        if self._segmenter is not None:
            return [self._segmenter.encode(text) for text in texts]
        return [encoding.ids for encoding in self._tokenizer.encode_batch(texts, add_special_tokens=True)]

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def decode_restoring(self, ids: list[int], source: str) -> str:
        """``decode``, with each ``<unk>`` of the output given back the source text it stands for.

        A tokenizer without byte fallback maps characters outside its vocabulary to ``<unk>``,
        and decoding drops it: ``км³`` would come out as ``км``. A correction tool must not
        damage what it cannot represent, so the k-th ``<unk>`` of the output takes the text of
        the k-th ``<unk>`` of the source (found by the tokenizer's own offsets) when both hold
        the same number; when they do not, every output ``<unk>`` takes the source's only
        unknown text if there is just one, and otherwise the output is decoded as is (no
        alignment is certain). Spacing follows the source: a restored text that began a word
        there begins one here.
        """
        unk = self._unk_id
        if unk is None or unk not in ids:
            return self.decode(ids)
        encoding = self._tokenizer.encode(source, add_special_tokens=False)
        spans = []
        for index, (token, (start, end)) in enumerate(zip(encoding.ids, encoding.offsets)):
            if token == unk:
                word_start = start == 0 or source[start - 1].isspace()
                after_marker = index > 0 and encoding.tokens[index - 1] == self._word_marker
                marker = self._word_marker if self._word_marker and word_start and not after_marker else ""
                spans.append(marker + source[start:end])
        wanted = ids.count(unk)
        if len(spans) != wanted:
            if len(set(spans)) != 1:
                return self.decode(ids)
            spans = spans[:1] * wanted
        restored = iter(spans)
        special = set(self._special_ids)
        tokens = [next(restored) if token == unk else self._tokenizer.id_to_token(token)
                  for token in ids if token == unk or token not in special]
        # an id past the tokenizer (a model's padded embedding rows: T5's 32128 for 32100 tokens)
        # has no text; decode() drops it too
        tokens = [token for token in tokens if token is not None]
        decoder = self._tokenizer.decoder
        # without a decoder, tokenizers joins tokens with spaces (as `decode` does)
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)
