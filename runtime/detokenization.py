"""transformers' clean-up of decoded text (``clean_up_tokenization_spaces``).

A checkpoint whose tokenizer config sets ``clean_up_tokenization_spaces`` has transformers'
``decode`` remove the space before punctuation and English contractions after the tokenizer
has decoded: ``"Hello , world !"`` becomes ``"Hello, world!"``. transformers 5 does it for
every tokenizer but a BPE one (where it would damage legitimate spaces, unless the config
forces it); many T5, mT5, mBART and Pegasus checkpoints saved by transformers 4 set it. The
export records whether transformers applies it to the bundle's tokenizer (Manifest
``clean_up_tokenization_spaces``) and checks the runtime's decoding against transformers'
(export/codec_check.py), so that an output's text, not only its ids, is transformers'.
"""

from __future__ import annotations

# transformers' PreTrainedTokenizerBase.clean_up_tokenization, in its order
CLEAN_UP_REPLACEMENTS = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"),
    (" 've", "'ve"), (" 're", "'re"),
)


def clean_up_tokenization(text: str) -> str:
    """``text`` with transformers' ``clean_up_tokenization`` applied."""
    for before, after in CLEAN_UP_REPLACEMENTS:
        text = text.replace(before, after)
    return text
