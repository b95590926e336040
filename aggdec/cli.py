"""The `aggdec` command line: export a checkpoint, generate with a bundle.

Heavy subcommands import lazily: `generate` needs only the runtime (numpy, onnxruntime,
tokenizers); `export` needs the [export] extra and says so if it is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, TextIO

from aggdec.runtime.bundle_schema import ENCODER_QUANTIZATION, PRECISIONS
from aggdec.runtime.errors import AggdecError, InputError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _finite_non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _finite_non_negative(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aggdec", description="Lossless aggressive decoding for seq2seq models.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    export = commands.add_parser("export", help="export a Hugging Face checkpoint or a Marian model folder to an "
                                                "aggdec bundle")
    export.add_argument("src", metavar="SRC_DIR", help="a local save_pretrained directory (model + tokenizer), or a "
                                                       "Marian model folder as it ships (docs/marian.md)")
    export.add_argument("out", metavar="OUT_DIR", help="the bundle directory to write")
    export.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    export.add_argument("--top-k", type=int, default=8, help="candidates the verifier returns per position (8)")
    export.add_argument("--opset", type=int, default=17, help="ONNX opset (17)")
    export.add_argument("--max-source-len", type=int, help="longest source in tokens (default: the model's)")
    export.add_argument("--max-target-len", type=int, help="longest output in tokens (default: the model's)")
    export.add_argument("--drafter", metavar="DRAFTER_DIR", help="add drafter.onnx from `aggdec train-drafter` (GAD)")
    export.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="fp32 (default), int8 for the CPU or fp16 for CUDA: the fp32 export, then "
                             "`aggdec quantize --precision`")
    export.add_argument("--no-int8-drafter", action="store_true",
                        help="fp32: leave out drafter.int8.onnx, the drafter's int8 copy that GAD uses on the CPU")

    quantize = commands.add_parser("quantize", help="an int8 (CPU) or fp16 (CUDA) copy of an fp32 bundle "
                                   "(no torch needed)")
    quantize.add_argument("bundle", metavar="BUNDLE", help="an fp32 bundle written by `aggdec export`")
    quantize.add_argument("out", metavar="OUT_DIR", help="the bundle directory to write")
    quantize.add_argument("--precision", choices=[p for p in PRECISIONS if p != "fp32"], default="int8",
                          help="int8 (default): per-row int8 products for the CPU; fp16: float16 graphs for CUDA")
    quantize.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    quantize.add_argument("--fp32-output-projection", action="store_true",
                          help="keep the vocabulary projection in fp32 (slower, a little closer to fp32)")
    quantize.add_argument("--encoder-quantization", choices=ENCODER_QUANTIZATION,
                          help="int8 only: how the encoder quantizes its activations. per-call (default): "
                               "onnxruntime's dynamic quantization, faster, and the runtime encodes one source per "
                               "call; per-row: as the verifier, a batch encoded in one call")

    train = commands.add_parser("train-drafter", help="train a GAD drafter for a checkpoint by distillation")
    train.add_argument("src", metavar="SRC_DIR", help="the verifier: a local save_pretrained directory")
    train.add_argument("--sources", required=True, metavar="FILE", help="training sources, one per line")
    train.add_argument("--out", required=True, metavar="DIR", help="where the drafter and checkpoints go")
    train.add_argument("--k", type=int, default=25, help="tokens drafted per call (25)")
    train.add_argument("--layers", type=int, default=2, help="drafter decoder layers (2)")
    train.add_argument("--encoder-layers", type=int, default=0,
                       help="drafter-only layers over the verifier's encoder output, run once per request (0)")
    train.add_argument("--window", type=int, default=16,
                       help="output tokens the drafter reads before its slots, 0 = all (16): a bounded window "
                            "keeps a drafter call's cost flat as the output grows")
    train.add_argument("--positions", choices=("output", "source"), default=None,
                       help="positions the drafter reads its tokens at: output (default), or source, the "
                            "aligned source position of each token: for editing tasks (grammar correction), "
                            "where output positions drift from the source's after each edit")
    length = train.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, help="optimizer steps")
    length.add_argument("--epochs", type=int, help="passes over the sources (default 1)")
    train.add_argument("--batch-tokens", type=int, default=4096, help="tokens per batch (4096)")
    train.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint")
    train.add_argument("--seed", type=int, default=0, help="random seed (0)")
    train.add_argument("--glancing", type=float, default=0.0, help="glancing ratio, 0 = off (0)")
    train.add_argument("--heldout", type=int, default=100, help="sources held out for the acceptance report (100)")
    train.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to train (cpu)")
    train.add_argument("--no-speed", dest="speed", action="store_false", default=None,
                       help="skip timing GAD against greedy on the held-out sources with the runtime (CPU, "
                            "1 thread; a temporary bundle is exported for it)")

    gen = commands.add_parser("generate", help="decode one input per line with a bundle")
    gen.add_argument("bundle", metavar="BUNDLE", help="a directory written by `aggdec export`")
    gen.add_argument("--mode", choices=("greedy", "iad", "gad", "gad++"), default="greedy",
                     help="decoding mode (greedy)")
    gen.add_argument("--beta", type=_positive_int, help="gad++: accept drafts among the verifier's top-beta (3)")
    gen.add_argument("--tau", type=_finite_non_negative, help="gad++: ... within tau log-prob of its best (1.0)")
    gen.add_argument("--draft-k", type=_positive_int,
                     help="gad: tokens drafted per iteration (default: the drafter's k)")
    gen.add_argument("--fp32-drafter", action="store_true",
                     help="gad: on the CPU, run the float drafter instead of the bundle's int8 copy (same output)")
    gen.add_argument("--input", metavar="FILE", help="read inputs from FILE instead of stdin")
    gen.add_argument("--max-new-tokens", type=_positive_int,
                     help="tokens to generate at most (default: the bundle's limit)")
    gen.add_argument("--device", choices=("cpu", "cuda", "tensorrt"), default="cpu",
                     help="where to run (cpu); tensorrt: engines from `aggdec build-engines` (not yet run on a GPU)")
    gen.add_argument("--engines", metavar="DIR", help="tensorrt: the engines directory (default: BUNDLE.engines)")
    gen.add_argument("--threads", type=_positive_int, help="intra-op threads (default: onnxruntime's choice)")
    gen.add_argument("--batch-size", type=_positive_int, default=16,
                     help="rows per verifier call, every mode; finished rows make room for the next inputs (16)")
    gen.add_argument("--io-binding", choices=("auto", "on", "off"), default="auto",
                     help="onnxruntime IO binding: auto = on (the cache buffers are bound by pointer)")
    gen.add_argument("--no-shortlist", action="store_true",
                     help="a bundle with a lexical shortlist (Marian's): decode over the whole vocabulary instead")
    gen.add_argument("--tf32", action="store_true",
                     help="cuda: allow TF32 matrix products (faster, no longer float32: may differ from CPU greedy)")
    gen.add_argument("--stats", action="store_true",
                     help="print load, warm-up and decoding time, iterations and tokens to stderr")
    gen.add_argument("--format", choices=("text", "jsonl"), default="text",
                     help="text: one output per line; jsonl: one JSON object per line with text, ids, error, stats")
    gen.add_argument("--output", metavar="FILE", help="write to FILE (atomically, at the end) instead of stdout")

    engines = commands.add_parser(
        "build-engines", help="build TensorRT engines for a bundle (needs TensorRT and a GPU; not yet run on one)",
        description="Build a TensorRT engine per graph of BUNDLE, with optimization profiles derived from its "
                    "manifest, into a directory beside it (engines.json, *.engine, timing.cache). Engines are "
                    "keyed by bundle, GPU, TensorRT version, precision and profile; an up-to-date one is reused.")
    engines.add_argument("bundle", metavar="BUNDLE", help="a directory written by `aggdec export`")
    engines.add_argument("--out", metavar="DIR", help="where the engines go (default: BUNDLE.engines)")
    engines.add_argument("--fp16", action="store_true", help="allow fp16 kernels (faster; outputs may differ from fp32)")
    engines.add_argument("--tf32", action="store_true", help="allow TF32 kernels (off: TensorRT's default is on)")
    engines.add_argument("--max-batch", type=_positive_int, default=16, help="most rows per call (16)")
    engines.add_argument("--opt-batch", type=_positive_int, default=1, help="the batch size tuned for (1)")
    engines.add_argument("--max-block", type=_positive_int, default=64,
                         help="longest IAD draft block the verifier engine takes (64, the CUDA default)")
    engines.add_argument("--workspace", type=_positive_int, default=4096, metavar="MB",
                         help="TensorRT workspace memory pool, MiB (4096)")
    engines.add_argument("--force", action="store_true", help="rebuild engines that are up to date")
    engines.add_argument("--dry-run", action="store_true",
                         help="print the profiles that would be built, as JSON, and stop (no TensorRT needed)")

    serve = commands.add_parser(
        "serve", help="serve a bundle over HTTP with dynamic batching (the serve extra)",
        description="An HTTP JSON API over one bundle: POST /v1/generate, GET /healthz, /readyz, /metrics, /docs. "
                    "Texts of concurrent requests share batches. SIGTERM drains: requests in flight finish, "
                    "new ones get 503, then the process exits.")
    serve.add_argument("bundle", metavar="BUNDLE", help="a directory written by `aggdec export`")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on, 0 = any free one (8000)")
    serve.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to run (cpu)")
    serve.add_argument("--threads", type=_positive_int, help="intra-op threads (default: onnxruntime's choice)")
    serve.add_argument("--mode", choices=("greedy", "iad", "gad", "gad++"), default="iad",
                       help="mode of a request that names none (iad)")
    serve.add_argument("--max-batch", type=_positive_int, default=32, help="rows per verifier call (32)")
    serve.add_argument("--max-wait-ms", type=_finite_non_negative, default=5.0,
                       help="an idle decode loop waits this long to gather a batch after the first text (5)")
    serve.add_argument("--max-queue", type=_positive_int, default=256,
                       help="texts that may wait for a slot; past it requests get 429 (256)")
    serve.add_argument("--timeout-s", type=_positive_float, default=30.0,
                       help="a request's deadline; past it 504 and its work is dropped (30)")
    serve.add_argument("--max-texts", type=_positive_int, default=64, help="texts per request; more: 413 (64)")
    serve.add_argument("--max-body-bytes", type=_positive_int, default=1 << 20,
                       help="request body size; larger: 413 (1048576)")
    serve.add_argument("--drain-s", type=_finite_non_negative,
                       help="on SIGTERM, wait at most this long for requests in flight (default: --timeout-s + 5)")
    serve.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                       help="uvicorn's log level (warning)")
    serve.add_argument("--ray", action="store_true",
                       help="run as a Ray Serve application (the ray extra) on the Ray cluster of $RAY_ADDRESS, "
                            "or a local one")
    serve.add_argument("--replicas", type=_positive_int, default=1, help="--ray: replicas (1)")
    serve.add_argument("--max-replicas", type=_positive_int,
                       help="--ray: autoscale between --replicas and this many replicas (default: a fixed number)")

    load = commands.add_parser(
        "loadtest", help="closed-loop load test of an `aggdec serve` endpoint, every answer checked against greedy",
        description="Closed-loop clients (each sends its next request when the last is answered) at each "
                    "concurrency for a fixed time, over UA-GEC test sources; every output is compared with offline "
                    "greedy on the same bundle. Writes loadtest.json, loadtest.md and loadtest.png; exit status 1 "
                    "if any response was wrong or lost.")
    load.add_argument("url", metavar="URL", help="the server, on loopback: http://127.0.0.1:8000")
    load.add_argument("--bundle", required=True, metavar="DIR", help="the bundle the server runs (for the greedy "
                      "reference and the offline comparison)")
    load.add_argument("--data", default="uagec-test", metavar="FILE",
                      help="sources: uagec-test (the ua-gec package) or a file, one per line (uagec-test)")
    load.add_argument("--limit", type=_positive_int, default=512, help="distinct sentences to cycle through (512)")
    load.add_argument("--concurrency", type=_positive_int, nargs="+", default=[1, 8, 32, 64], metavar="N",
                      help="closed-loop clients per step (1 8 32 64)")
    load.add_argument("--duration", type=_positive_float, default=20.0, help="seconds per step (20)")
    load.add_argument("--max-requests", type=_positive_int, default=100000, help="requests per step at most (100000)")
    load.add_argument("--mode", choices=("greedy", "iad", "gad", "gad++"), default="iad", help="mode requested (iad)")
    load.add_argument("--texts-per-request", type=_positive_int, default=1, help="texts per request (1)")
    load.add_argument("--timeout-s", type=_positive_float, default=60.0, help="client timeout per request (60)")
    load.add_argument("--offline-batch", type=int, default=32,
                      help="also time offline batched decoding of the same sentences in --mode at this batch size, "
                           "for the served/offline ratio; 0 = skip (32)")
    load.add_argument("--threads", type=_positive_int, default=None,
                      help="intra-op threads of the offline reference (set it to the server's --threads)")
    load.add_argument("--max-new-tokens", type=_positive_int, help="tokens to generate at most, sent with every request")
    load.add_argument("--out", default="loadtest-out", metavar="DIR", help="where the report goes (loadtest-out)")

    bench = commands.add_parser(
        "bench", help="benchmark aggdec's modes against transformers, optimum and CTranslate2",
        description="Decode the same sentences with aggdec's modes and the peers that are installed, "
                    "interleaved, one worker process per system; write bench.json, bench.md and PNG plots.")
    bench.add_argument("bundle", metavar="BUNDLE", nargs="?",
                       help="an aggdec bundle (default: --checkpoint, or else the reference UA-GEC model, exported into --work)")
    bench.add_argument("--checkpoint", metavar="DIR",
                       help="the Hugging Face checkpoint the peers run; with no BUNDLE, aggdec runs it too, exported "
                            "into --work with the drafter at DIR/../drafter if there is one (default: the reference model)")
    bench.add_argument("--data", default="uagec-test", metavar="FILE",
                       help="sources, one per line, optionally TAB target [TAB target2] (default: uagec-test, "
                            "the UA-GEC test split from the ua-gec package)")
    bench.add_argument("--systems", nargs="+", metavar="NAME", help="systems to run (default: all): "
                       + ", ".join(spec for spec in _bench_system_names())
                       + " (aggdec-int8-*, aggdec-fp16-*: the bundle converted into --work; "
                       "int8 is CPU only, skipped on cuda)")
    bench.add_argument("--device", nargs="+", choices=("cpu", "cuda"), default=["cpu"],
                       help="devices to run on; cuda is skipped with a note where there is no GPU (cpu)")
    bench.add_argument("--threads", type=int, default=1, help="threads per system (1)")
    bench.add_argument("--tf32", action="store_true", help="aggdec on cuda: allow TF32 matrix products (off)")
    bench.add_argument("--batch-size", "--batch-sizes", dest="batch_sizes", type=int, nargs="+", metavar="N",
                       help="batch sizes (default: 1 8 32; batch 1 always runs)")
    bench.add_argument("--limit", type=int, metavar="N", help="only the first N sentences")
    bench.add_argument("--out", default="bench-out", metavar="DIR", help="where the report goes (bench-out)")
    bench.add_argument("--work", default="bench-work", metavar="DIR",
                       help="converted models, reused while the checkpoint is unchanged (bench-work)")
    bench.add_argument("--quick", action="store_true",
                       help="a few minutes on 2 cores: the first 48 sentences, batch sizes 1 and 8")
    bench.add_argument("--optimum-python", metavar="PYTHON",
                       help="the python of an environment with optimum-onnx (default: $AGGDEC_OPTIMUM_PYTHON or "
                            "this python); optimum-onnx pins transformers<4.58, see benchmarks/optimum_env.sh")
    bench.add_argument("--max-new-tokens", type=int, help="tokens to generate at most (default: the bundle's limit)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def _bench_system_names() -> list[str]:
    from aggdec.bench.systems import SYSTEMS

    return [spec.name for spec in SYSTEMS]


def _export(args: argparse.Namespace) -> int:
    try:
        from aggdec.export import export_bundle
    except ImportError as exc:
        raise AggdecError(
            f"`aggdec export` needs the export extra ({exc.name} is not installed): pip install 'aggdec[export]'"
        ) from None
    export_bundle(args.src, args.out, force=args.force, top_k=args.top_k, opset=args.opset,
                  max_source_len=args.max_source_len, max_target_len=args.max_target_len,
                  drafter_dir=args.drafter, precision=args.precision, int8_drafter=not args.no_int8_drafter,
                  progress=lambda message: print(message, file=sys.stderr, flush=True))
    return 0


def _quantize(args: argparse.Namespace) -> int:
    try:
        from aggdec.export.quantize import QuantizeOptions, quantize_bundle
    except ImportError as exc:
        raise AggdecError(
            f"`aggdec quantize` needs onnx ({exc.name} is not installed): pip install onnx, or 'aggdec[export]'"
        ) from None
    if args.encoder_quantization is not None and args.precision != "int8":
        raise InputError(f"--encoder-quantization is for int8 bundles; an {args.precision} encoder is converted "
                         "like the rest of the bundle.")
    quantize_bundle(args.bundle, args.out, precision=args.precision, force=args.force,
                    options=QuantizeOptions(output_projection=not args.fp32_output_projection,
                                            encoder=args.encoder_quantization or QuantizeOptions.encoder),
                    progress=lambda message: print(message, file=sys.stderr, flush=True))
    return 0


def _train_drafter(args: argparse.Namespace) -> int:
    try:
        from aggdec.export.train_drafter import run_from_args
    except ImportError as exc:
        raise AggdecError(
            f"`aggdec train-drafter` needs the export extra ({exc.name} is not installed): pip install 'aggdec[export]'"
        ) from None
    return run_from_args(args)


def _open_input(path: str | None) -> BinaryIO:
    """The input, unbuffered (stdin, or the file ``path``), refused at once if unreadable.

    Unbuffered, because a reader thread blocked on a buffered stdin holds its lock, and Python
    aborts at exit when Ctrl-C leaves it so; a raw read has no lock."""
    if path is None:
        return open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
    try:
        return open(path, "rb", buffering=0)
    except FileNotFoundError:
        raise InputError(f"input file {path!r} does not exist.") from None
    except IsADirectoryError:
        raise InputError(f"input {path!r} is a directory; give a file with one input per line.") from None
    except OSError as exc:
        raise InputError(f"cannot read input {path!r}: {exc.strerror or exc}.") from None


def _lines(stream: BinaryIO, name: str) -> Iterator[bytes]:
    """Input lines as they arrive, split on "\n" only ("\r\n" too): a form feed, NEL or U+2028
    inside a line is part of it, so that output line N always answers input line N. Lines stay
    bytes: one that is not UTF-8 is refused on its own by the generator."""
    pending: list[bytes] = []  # the current line's pieces, so that a long line costs linear time
    while True:
        try:
            chunk = stream.read(1 << 16)  # returns what has arrived, up to this much
        except OSError as exc:
            raise InputError(f"cannot read input {name}: {exc.strerror or exc}.") from None
        if not chunk:
            break
        *complete, rest = chunk.split(b"\n")
        for raw in complete:
            if pending:
                raw, pending = b"".join([*pending, raw]), []
            yield raw[:-1] if raw.endswith(b"\r") else raw
        if rest:
            pending.append(rest)
    if pending:  # a last line without "\n"
        raw = b"".join(pending)
        yield raw[:-1] if raw.endswith(b"\r") else raw


def _render(form: str, number: int, result, error: str | None) -> str:
    """One output line: the text (a refused input: empty), or a JSON object with ids, error, stats."""
    if form == "text":
        return ("" if result is None else result.text.replace("\n", " ")) + "\n"
    import dataclasses
    import json

    record = {"line": number, "text": None if result is None else result.text,
              "ids": None if result is None else list(result.ids), "error": error,
              "stats": None if result is None else dataclasses.asdict(result.stats)}
    return json.dumps(record, ensure_ascii=False) + "\n"


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[TextIO]:
    """stdout, or FILE written atomically: a temporary file beside it, renamed over it at the
    end; on any failure or Ctrl-C the temporary file is removed and FILE is left as it was."""
    if path is None:
        yield sys.stdout
        return
    import os
    import tempfile

    target = os.path.abspath(path)
    try:
        fd, temporary = tempfile.mkstemp(prefix=".aggdec-", dir=os.path.dirname(target))
    except OSError as exc:
        raise InputError(f"cannot write output {path!r}: {exc.strerror or exc}.") from None
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(temporary, 0o666 & ~mask)  # mkstemp makes it private; the output is an ordinary file
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def _progress(total: int | None) -> Iterator[Any]:
    """A progress bar on stderr when it is a terminal and tqdm is installed; otherwise None."""
    if not sys.stderr.isatty():
        yield None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield None
        return
    with tqdm(total=total, unit="line", file=sys.stderr, leave=False) as bar:
        yield bar


def _print_stats(results: list, mode: str, wall: float, graphs: float, out: TextIO, load: float = 0.0,
                 warm_up: float = 0.0, costs: tuple[float, float, float] | None = None) -> None:
    tokens = sum(len(r.ids) for r in results)
    iterations = sum(r.stats.iterations for r in results)
    outside = max(wall - graphs, 0.0)
    print(
        f"aggdec: {mode}: {len(results)} inputs, {tokens} tokens in {iterations} iterations "
        f"({tokens / max(iterations, 1):.2f} tokens/iteration); decoding {wall:.3f}s, {graphs:.3f}s in graphs, "
        f"{outside:.3f}s outside ({100 * outside / max(wall, 1e-9):.1f}%); {tokens / max(wall, 1e-9):.1f} tokens/s; "
        f"not counted: load {load:.3f}s, warm-up {warm_up:.3f}s",
        file=out,
    )
    if costs is not None and costs[0] > 0:  # GAD: what its draft lengths were chosen from
        one_token, ratio, drafter = costs
        print(f"aggdec: {mode}: measured costs: a one-token verifier call {1000 * one_token:.3f} ms, each extra "
              f"block position +{ratio:.3f} of it, a drafter call {1000 * drafter:.3f} ms", file=out)


def _generate(args: argparse.Namespace) -> int:
    from aggdec.runtime.generator import Generator

    if args.engines is not None and args.device != "tensorrt":
        raise InputError("--engines applies to --device tensorrt only.")
    loading = time.perf_counter()
    generator = Generator(args.bundle, device=args.device, threads=args.threads,
                          io_binding={"auto": None, "on": True, "off": False}[args.io_binding], tf32=args.tf32,
                          engines=args.engines, int8_drafter=False if args.fp32_drafter else None,
                          shortlist=not args.no_shortlist)
    generator.check_options(args.mode, beta=args.beta, tau=args.tau, draft_k=args.draft_k)
    load = time.perf_counter() - loading
    # onnxruntime's first calls allocate arenas and pick kernels (on CUDA, tenths of a second):
    # done here on a short made-up input, so that neither the first lines nor --stats pay for it
    warm_up = generator.warm_up(args.mode, args.batch_size)
    source = _open_input(args.input)
    name = "stdin" if args.input is None else repr(args.input)
    started, graphs_before = time.perf_counter(), generator.graph_seconds
    results: list = []
    refused = 0
    with contextlib.closing(source), _output(args.output) as out, _progress(None) as bar:
        # Lines are decoded while input still arrives; output line N is written (and flushed)
        # as soon as it and every line before it are done.
        done: dict[int, tuple[Any, str | None]] = {}
        written = 0  # input lines answered so far
        for index, result in generator.stream(_lines(source, name), mode=args.mode,
                                              max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                              beta=args.beta, tau=args.tau, draft_k=args.draft_k):
            if isinstance(result, InputError):
                refused += 1
                reason = str(result).replace(f"text {index} ", "input ", 1)
                print(f"aggdec: line {index + 1}: {reason}", file=sys.stderr, flush=True)
                done[index] = (None, reason)
            else:
                results.append(result)
                done[index] = (result, None)
            if written in done:
                while written in done:
                    out.write(_render(args.format, written + 1, *done.pop(written)))
                    written += 1
                out.flush()
            if bar is not None:
                bar.update(1)
    wall, graphs = time.perf_counter() - started, generator.graph_seconds - graphs_before
    if args.stats:
        costs = (*generator.gad_costs.fit(), generator.gad_costs.drafter_seconds) if args.mode in ("gad", "gad++") \
            else None
        _print_stats(results, args.mode, wall, graphs, sys.stderr, load, warm_up, costs)
    return 1 if refused else 0


def _bench(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from aggdec.bench import BenchOptions, command_line, run_bench

    options = BenchOptions(
        bundle=Path(args.bundle) if args.bundle else None,
        checkpoint=Path(args.checkpoint) if args.checkpoint else None,
        data=args.data, devices=tuple(args.device), threads=args.threads, tf32=args.tf32,
        batch_sizes=tuple(args.batch_sizes) if args.batch_sizes else None, limit=args.limit,
        out=Path(args.out), work=Path(args.work), quick=args.quick,
        optimum_python=args.optimum_python or os.environ.get("AGGDEC_OPTIMUM_PYTHON") or sys.executable,
        max_new_tokens=args.max_new_tokens, progress=not args.no_progress,
        command=command_line(sys.argv[1:] if args.argv is None else args.argv))
    if args.systems:
        options.systems = tuple(args.systems)
    return run_bench(options)


def _build_engines(args: argparse.Namespace) -> int:
    import json

    from aggdec.engines import BuildOptions, ProfileOptions, build_engines, plan

    options = BuildOptions(profile=ProfileOptions(max_batch=args.max_batch, opt_batch=args.opt_batch,
                                                  max_block=args.max_block),
                           fp16=args.fp16, tf32=args.tf32, workspace_mib=args.workspace, force=args.force)
    planned = plan(args.bundle, args.out, options)  # bundle and options checked before TensorRT is needed
    if args.dry_run:  # one line per input: {"min": "1x1", "opt": "1x16", "max": "16x66"}
        print(json.dumps({"out": str(planned.out)}))
        for graph, profile in planned.profiles.items():
            for name, shapes in profile.items():
                print(json.dumps({"graph": graph, "input": name,
                                  **{k: "x".join(map(str, v)) for k, v in shapes.items()}}))
        return 0
    out = build_engines(args.bundle, args.out, options,
                        progress=lambda message: print(f"aggdec build-engines: {message}", file=sys.stderr, flush=True))
    print(out)
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.max_replicas is not None and args.max_replicas < args.replicas:
        raise InputError(f"--max-replicas {args.max_replicas} is below --replicas {args.replicas}.")
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise AggdecError(
            f"`aggdec serve` needs the serve extra ({exc.name} is not installed): pip install 'aggdec[serve]'"
        ) from None
    from aggdec.serve.app import Settings

    settings = Settings(mode=args.mode, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                        max_queue=args.max_queue, timeout_s=args.timeout_s, max_texts=args.max_texts,
                        max_body_bytes=args.max_body_bytes)
    if args.ray:
        try:
            import ray  # noqa: F401
            from ray import serve  # noqa: F401
        except ImportError as exc:
            raise AggdecError(
                f"`aggdec serve --ray` needs the ray extra ({exc.name} is not installed): pip install 'aggdec[ray]'"
            ) from None
        from aggdec.serve.ray import run_ray

        return run_ray(args.bundle, host=args.host, port=args.port, device=args.device, threads=args.threads,
                       settings=settings, replicas=args.replicas, max_replicas=args.max_replicas)
    from aggdec.serve.server import serve

    return serve(args.bundle, host=args.host, port=args.port, device=args.device, threads=args.threads,
                 settings=settings, drain_s=args.drain_s, log_level=args.log_level)


def _loadtest(args: argparse.Namespace) -> int:
    try:
        import httpx  # noqa: F401
    except ImportError as exc:
        raise AggdecError(
            f"`aggdec loadtest` needs the serve extra ({exc.name} is not installed): pip install 'aggdec[serve]'"
        ) from None
    from aggdec.serve.loadtest import run_from_args

    return run_from_args(args)


def run(args: argparse.Namespace) -> int:
    if args.command == "build-engines":
        return _build_engines(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "loadtest":
        return _loadtest(args)
    if args.command == "export":
        return _export(args)
    if args.command == "quantize":
        return _quantize(args)
    if args.command == "train-drafter":
        return _train_drafter(args)
    if args.command == "bench":
        return _bench(args)
    return _generate(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = None if argv is None else list(argv)
    try:
        return run(args)
    except AggdecError as exc:
        print(f"aggdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`| head -1`): what it wanted was written; leave quietly, and keep
        # Python from complaining again when it flushes stdout at exit
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
