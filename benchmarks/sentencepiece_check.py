"""aggdec's Python SentencePiece (runtime/sentencepiece.py) and the ``tokenizers`` library's
Unigram model (converted by transformers from the same ``.spm``) against SentencePiece itself.

For each ``.spm`` model: every line of the text files, plus ``--random`` texts drawn from an
alphabet of what breaks tokenizers (whitespace of every kind, characters the normalizer
rewrites, combining marks, emoji, the added tokens' strings) and ``--random`` texts of random
code points, are encoded to pieces by ``SentencePieceProcessor.encode(text, out_type=str)``,
by aggdec's copy and by the converted tokenizer; the texts where each differs are counted and
the first few printed. Exits 1 if aggdec's copy differs on any text.

    python benchmarks/sentencepiece_check.py --models A.spm [B.spm ...] --texts FILE [FILE ...] [--random 30000]

Needs the [export] extra (sentencepiece, transformers' converter and protobuf reader).
"""

from __future__ import annotations

import argparse
import random
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--texts", nargs="*", default=[])
    parser.add_argument("--random", type=int, default=30000)
    parser.add_argument("--show", type=int, default=5)
    args = parser.parse_args(argv)

    import sentencepiece
    from transformers.convert_slow_tokenizer import SpmConverter

    from aggdec.export.piece_tokenizer import model_spec
    from aggdec.runtime.sentencepiece import SentencePieceModel

    texts = [line.rstrip("\n") for name in args.texts for line in open(name, encoding="utf-8", errors="replace")]
    natural = len(texts)
    rng = random.Random(0)
    alphabet = list("ab c.\u00a0\t\n  ﬁé\u0301ÅＡ１…—“”😀\u200b\u3000ß▁x\r\x00\x7f\u0085\u2028①㍿ｶﾞ") + ["<unk>", "</s>"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(args.random)]
    texts += ["".join(chr(rng.choice([rng.randint(1, 0xD7FF), rng.randint(0xE000, 0x2FFFF)]))
                      for _ in range(rng.randint(0, 8))) for _ in range(args.random // 10)]
    print(f"texts: {natural} from files, {len(texts) - natural} random")
    failed = False
    for path in args.models:
        spec, proto = model_spec(path, "checked")
        ours = SentencePieceModel(spec, path)
        converted = SpmConverter.build_tokenizer_from_spm_proto(proto, [(p.piece, p.score) for p in proto.pieces])
        reference = sentencepiece.SentencePieceProcessor(model_file=path)
        differ = {"aggdec": [], "tokenizers": []}
        started = time.perf_counter()
        for index, text in enumerate(texts):
            expected = reference.encode(text, out_type=str)
            if ours.encode(text) != expected:
                differ["aggdec"].append(index)
            if converted.encode(text, add_special_tokens=False).tokens != expected:
                differ["tokenizers"].append(index)
        normalizer = proto.normalizer_spec
        print(f"\n{path}: normalizer {normalizer.name!r}, add_dummy_prefix {normalizer.add_dummy_prefix}, "
              f"remove_extra_whitespaces {normalizer.remove_extra_whitespaces} ({time.perf_counter() - started:.1f} s)")
        for name, indices in differ.items():
            from_files = sum(1 for index in indices if index < natural)
            print(f"  {name}: differs on {len(indices)} of {len(texts)} texts ({from_files} of {natural} from files)")
            for index in indices[: args.show]:
                print(f"    {texts[index]!r}: sentencepiece {reference.encode(texts[index], out_type=str)}")
        failed |= bool(differ["aggdec"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
