"""`aggdec quantize`."""

from __future__ import annotations

import argparse
import sys

from aggdec.runtime.bundle_schema import ENCODER_QUANTIZATION, PRECISIONS
from aggdec.runtime.errors import AggdecError, InputError

from .arguments import path_text


def register(commands) -> argparse.ArgumentParser:
    """The `quantize` subcommand, its arguments and what runs it."""
    parser = commands.add_parser(
        "quantize", help="an int8 (CPU) or fp16 (CUDA) copy of an fp32 bundle "
                         "(no torch needed)")
    add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", metavar="BUNDLE", type=path_text, help="an fp32 bundle written by `aggdec export`")
    parser.add_argument("out", metavar="OUT_DIR", type=path_text, help="the bundle directory to write")
    parser.add_argument("--precision", choices=[p for p in PRECISIONS if p != "fp32"], default="int8",
                        help="int8 (default): per-row int8 products for the CPU; fp16: float16 graphs for CUDA")
    parser.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    parser.add_argument("--fp32-output-projection", action="store_true",
                        help="keep the vocabulary projection in fp32 (slower, a little closer to fp32)")
    parser.add_argument("--encoder-quantization", choices=ENCODER_QUANTIZATION,
                        help="int8 only: how the encoder quantizes its activations. per-call (default): "
                             "onnxruntime's dynamic quantization, and the runtime encodes one source per call: faster "
                             "one text at a time; per-row: as the verifier, a batch encoded in one call: faster for "
                             "batches on CPUs with AMX (docs/quantization.md); the only choice, and the default, "
                             "with --activations two-pass")
    parser.add_argument("--activations", choices=("per-row", "two-pass"), default="per-row",
                        help="int8 only: per-row (default): one 8-bit pass per activation row against 7-bit "
                             "weights; two-pass: two 7-bit passes (the value and its rounding residual) against "
                             "8-bit weights, a Marian int8 model's own weights kept exactly: much closer to fp32, "
                             "slower (docs/quantization.md has the figures)")
    parser.add_argument("--float-products", metavar="REGEX",
                        help="int8 only: keep in float32 the products whose weight's name matches REGEX "
                             "(Python re.search on the graph's initializer names)")


def run(args: argparse.Namespace) -> int:
    try:
        from aggdec.export.quantize import QuantizeOptions, quantize_bundle
    except ImportError as exc:
        raise AggdecError(
            f"`aggdec quantize` needs onnx ({exc.name} is not installed): pip install onnx, or 'aggdec[export]'"
        ) from None
    int8_only = [flag for flag, given in (("--encoder-quantization", args.encoder_quantization is not None),
                                          ("--activations", args.activations != "per-row"),
                                          ("--float-products", args.float_products is not None)) if given]
    if int8_only and args.precision != "int8":
        raise InputError(f"{int8_only[0]} is for int8 bundles; an {args.precision} bundle converts every product "
                         "the same way.")
    if args.activations == "two-pass" and args.encoder_quantization == "per-call":
        raise InputError("--activations two-pass quantizes the encoder per row: leave out --encoder-quantization, "
                         "or give per-row.")
    default_encoder = "per-row" if args.activations == "two-pass" else QuantizeOptions.encoder
    quantize_bundle(args.bundle, args.out, precision=args.precision, force=args.force,
                    options=QuantizeOptions(output_projection=not args.fp32_output_projection,
                                            encoder=args.encoder_quantization or default_encoder,
                                            activations=args.activations, float_products=args.float_products),
                    progress=lambda message: print(message, file=sys.stderr, flush=True))
    return 0
