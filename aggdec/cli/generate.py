"""`aggdec generate`."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, BinaryIO, TextIO

from aggdec.runtime.errors import EmptyTextError, InputError
from aggdec.runtime.options import MODES, DecodeOptions

from .arguments import (
    add_gpu_arguments, early_stopping, finite_float, finite_non_negative, gpu_options, path_text, positive_int,
)


def register(commands) -> argparse.ArgumentParser:
    """The `generate` subcommand, its arguments and what runs it."""
    parser = commands.add_parser("generate", help="decode one input per line with a bundle")
    add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", metavar="BUNDLE", type=path_text, help="a directory written by `aggdec export`")
    parser.add_argument("--mode", choices=MODES, default="greedy",
                        help="decoding mode (greedy)")
    parser.add_argument("--beta", type=positive_int, help="gad++: accept drafts among the verifier's top-beta (3)")
    parser.add_argument("--tau", type=finite_non_negative, help="gad++: ... within tau log-prob of its best (1.0)")
    parser.add_argument("--draft-k", type=positive_int,
                        help="gad: tokens drafted per iteration (default: the drafter's k)")
    parser.add_argument("--fp32-drafter", action="store_true",
                        help="gad: on the CPU, run the float drafter instead of the bundle's int8 copy (same output)")
    parser.add_argument("--num-beams", type=positive_int,
                        help="beam search with N hypotheses per input, equal to transformers' (a Marian bundle: "
                             "Marian's) (default: greedy; --mode iad or gad: speculative, same output); each input "
                             "takes N rows of --batch-size's inputs")
    parser.add_argument("--length-penalty", type=finite_float,
                        help="beam search: a finished hypothesis scores log-prob / length ** X (1.0; a Marian "
                             "bundle: its yml's normalize)")
    parser.add_argument("--early-stopping", type=early_stopping, metavar="{true,false,never}",
                        help="beam search: when an input is done, transformers' rule (false; not for Marian "
                             "bundles)")
    parser.add_argument("--num-return-sequences", type=positive_int,
                        help="beam search: the M best hypotheses (at most --num-beams), in --format jsonl (1)")
    parser.add_argument("--input", metavar="FILE", help="read inputs from FILE instead of stdin")
    parser.add_argument("--max-new-tokens", type=positive_int,
                        help="tokens to generate at most (default: the bundle's limit)")
    parser.add_argument("--device", choices=("cpu", "cuda", "tensorrt"), default="cpu",
                        help="where to run (cpu); tensorrt: engines from `aggdec build-engines` (not yet run on a GPU)")
    parser.add_argument("--engines", metavar="DIR", type=path_text, help="tensorrt: the engines directory (default: BUNDLE.engines)")
    parser.add_argument("--threads", type=positive_int, help="intra-op threads (default: one per core, or per CPU the process is pinned to)")
    parser.add_argument("--batch-size", type=positive_int, default=16,
                        help="rows per verifier call, every mode; finished rows make room for the next inputs (16)")
    parser.add_argument("--io-binding", choices=("auto", "on", "off"), default="auto",
                        help="onnxruntime IO binding: auto = on (the cache buffers are bound by pointer)")
    parser.add_argument("--no-shortlist", action="store_true",
                        help="a bundle with a lexical shortlist (Marian's): decode over the whole vocabulary instead")
    add_gpu_arguments(parser)
    parser.add_argument("--stats", action="store_true",
                        help="print load, warm-up and decoding time, iterations and tokens to stderr")
    parser.add_argument("--format", choices=("text", "jsonl"), default="text",
                        help="text: one output per line; jsonl: one JSON object per line with text, ids, error, stats")
    parser.add_argument("--output", metavar="FILE", type=path_text, help="write to FILE (atomically, at the end) instead of stdout")


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


UTF8_BOM = b"\xef\xbb\xbf"
# the byte order marks of the encodings an editor or a shell may write in place of UTF-8 (Windows
# PowerShell's `>` writes UTF-16); UTF-32's first, as its little-endian mark starts with UTF-16's
WIDE_MARKS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
              (b"\xfe\xff", "UTF-16"))


def _refuse_wide_encoding(start: bytes, name: str) -> None:
    """Refuse an input whose first bytes are UTF-16 or UTF-32, not UTF-8: a byte order mark of
    either, or UTF-16 without one (:func:`_control_interleaved`). Read as UTF-8, its first line
    was refused, or every line decoded as garbage with exit 0 (UTF-16 Cyrillic is all bytes
    below 0x80); the whole input is one error instead."""
    found = next(((encoding, "a byte order mark") for mark, encoding in WIDE_MARKS if start.startswith(mark)), None)
    if found is None and _control_interleaved(start[:64]):
        found = ("UTF-16", "a control byte beside each character")
    if found is not None:
        encoding, sign = found
        raise InputError(f"input {name} looks like {encoding} ({sign} at its start), and aggdec reads UTF-8; "
                         f"convert it to UTF-8 first (iconv -f {encoding} -t UTF-8).")


# bytes UTF-8 text holds only as control characters, which text does not hold: C0 less tab and line ends
CONTROL_BYTES = frozenset(byte for byte in range(0x20) if byte not in b"\t\n\r")


def _control_interleaved(start: bytes) -> bool:
    """Whether ``start`` reads as UTF-16 in a script whose characters' high byte is below 0x20:
    NUL for ASCII and Latin-1, 0x03 Greek, 0x04 Cyrillic, 0x05-0x06 Hebrew and Arabic. That is
    two or more two-byte units, each a control byte (:data:`CONTROL_BYTES`, NUL included) and a
    byte that is not NUL, the control byte on the same side in all, and not only line ends
    beside them. UTF-8 text holds such a byte only as a control character (a NUL is U+0000), so
    text with a NUL here and there, or a line of NULs, is not taken for UTF-16. UTF-16 of other
    scripts (CJK) is not recognized: its bytes read as other characters or as bad UTF-8."""
    units = [start[i : i + 2] for i in range(0, len(start) - 1, 2)]
    return len(units) >= 2 and any(all(unit[side] in CONTROL_BYTES and unit[1 - side] for unit in units)
                                   and any(unit[1 - side] not in b"\r\n" for unit in units) for side in (0, 1))


def _lines(stream: BinaryIO, name: str) -> Iterator[bytes]:
    """Input lines as they arrive (:func:`_split_lines`), without a UTF-8 byte order mark at the
    start of the input: Windows editors write one, and it is a mark of the encoding, not text
    (the first line was decoded with it, and its output differed from the same line's later)."""
    lines = _split_lines(stream, name)
    for first in lines:
        yield first[len(UTF8_BOM):] if first.startswith(UTF8_BOM) else first
        break
    yield from lines


def _split_lines(stream: BinaryIO, name: str) -> Iterator[bytes]:
    """Input lines as they arrive, split on "\n" only ("\r\n" too): a form feed, NEL or U+2028
    inside a line is part of it, so that output line N always answers input line N. Lines stay
    bytes: one that is not UTF-8 is refused on its own by the generator, an input in UTF-16 or
    UTF-32 as a whole, by its first bytes (:func:`_refuse_wide_encoding`). Of a line longer than
    MAX_TEXT_BYTES only MAX_TEXT_BYTES + 1 bytes are kept (the generator refuses it by its
    length): an input without an end of line (``--input /dev/zero``) ran out of memory."""
    from aggdec.runtime.generator import MAX_TEXT_BYTES  # the CLI's commands import lazily

    pending: list[bytes] = []  # the current line's pieces, so that a long line costs linear time
    size = 0  # bytes in pending

    def keep(piece: bytes) -> None:
        nonlocal size
        if size <= MAX_TEXT_BYTES:
            piece = piece[:MAX_TEXT_BYTES + 1 - size]
            pending.append(piece)
            size += len(piece)

    def line() -> bytes:
        nonlocal pending, size
        raw, pending, size = b"".join(pending), [], 0
        return raw[:-1] if raw.endswith(b"\r") and len(raw) <= MAX_TEXT_BYTES else raw

    first = True
    while True:
        try:
            chunk = stream.read(1 << 16)  # returns what has arrived, up to this much
        except OSError as exc:
            raise InputError(f"cannot read input {name}: {exc.strerror or exc}.") from None
        if not chunk:
            break
        if first:
            _refuse_wide_encoding(chunk, name)
            first = False
        *complete, rest = chunk.split(b"\n")
        for raw in complete:
            keep(raw)
            yield line()
        if rest:
            keep(rest)
    if pending:  # a last line without "\n"
        yield line()


# What a blank input line (empty, or spaces only) gets: a blank output line, without a message or
# an exit status of 1. There is nothing to decode (the API and the server refuse such a text),
# and in a document a blank line separates paragraphs: Marian and Bergamot pass it through so.
BLANK = object()
# Every character a reader may take for a line break (str.splitlines' set; universal newlines
# split at \r too): an output holding one is written with a space there, so that output line N
# stays input line N (a byte-fallback model can write a lone \r). --format jsonl keeps the text.
_LINE_BREAKS = str.maketrans(dict.fromkeys("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029", " "))


def _render(form: str, number: int, result, error: str | None) -> str:
    """One output line: the text (a refused input: empty), or a JSON object with ids, error, stats."""
    if form == "text":
        return ("" if result is None or result is BLANK else result.text.translate(_LINE_BREAKS)) + "\n"
    import dataclasses
    import json

    if result is BLANK:
        return json.dumps({"line": number, "text": "", "ids": [], "error": None, "stats": None}) + "\n"
    record = {"line": number, "text": None if result is None else result.text,
              "ids": None if result is None else list(result.ids), "error": error,
              "stats": None if result is None else dataclasses.asdict(result.stats)}
    if result is not None and result.sequences:  # beam search: the score, and every returned hypothesis
        record["score"] = result.score
        record["sequences"] = [{"text": h.text, "ids": list(h.ids), "score": h.score} for h in result.sequences]
    return json.dumps(record, ensure_ascii=False) + "\n"


class _Written:
    """The output stream, whose write errors (a full disk: ENOSPC; EIO) are one error line naming
    the output, not a traceback. A closed pipe (``| head -1``) is left to ``main``: it is no error."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self.stream = stream
        self.name = name

    def _failed(self, exc: OSError) -> InputError:
        if self.stream is sys.stdout:  # Python flushes stdout again at exit: let that one write nowhere
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return InputError(f"cannot write output {self.name}: {exc.strerror or exc}.")

    def write(self, text: str) -> None:
        self._guarded(self.stream.write, text)

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    def _guarded(self, call, *args) -> None:
        try:
            call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise self._failed(exc) from None


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[_Written]:
    """stdout, or FILE written atomically: a temporary file beside it, renamed over it at the
    end; on any failure or Ctrl-C the temporary file is removed and FILE is left as it was.
    FILE a symlink: the file it points to is replaced, the link kept. FILE a device, pipe or
    socket (/dev/null, /dev/stdout, a FIFO): written to as it is, since a rename would replace
    it with a regular file (as root, /dev/null itself)."""
    if path is None:
        yield _Written(sys.stdout, "stdout")
        return
    import os
    import stat
    import tempfile

    target = os.path.abspath(path)
    if os.path.isdir(target):  # found now, before decoding, not by the rename at the end
        raise InputError(f"cannot write output {path!r}: it is a directory; give a file name.")
    try:
        special = not stat.S_ISREG(os.stat(target).st_mode)
    except FileNotFoundError:  # a new file (or a dangling symlink: its file is made)
        special = False
    except OSError as exc:
        raise InputError(f"cannot write output {path!r}: {exc.strerror or exc}.") from None
    if special:
        try:
            handle = open(target, "w", encoding="utf-8", newline="\n")
        except OSError as exc:
            raise InputError(f"cannot write output {path!r}: {exc.strerror or exc}.") from None
        try:
            written = _Written(handle, repr(path))
            yield written
            written.flush()
        finally:
            with contextlib.suppress(OSError):  # what failed to write was reported; close() would retry it
                handle.close()
        return
    target = os.path.realpath(target)
    try:
        fd, temporary = tempfile.mkstemp(prefix=".aggdec-", dir=os.path.dirname(target))
    except OSError as exc:
        raise InputError(f"cannot write output {path!r}: {exc.strerror or exc}.") from None
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(temporary, 0o666 & ~mask)  # mkstemp makes it private; the output is an ordinary file
    handle = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
    try:
        written = _Written(handle, repr(path))
        yield written
        written.flush()
        try:
            os.fsync(handle.fileno())
        except OSError as exc:
            raise written._failed(exc) from None
        handle.close()
        os.replace(temporary, target)
    except BaseException:
        for undo in (handle.close, lambda: os.unlink(temporary)):  # close() would retry a failed write
            with contextlib.suppress(OSError):
                undo()
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


def run(args: argparse.Namespace) -> int:
    from aggdec.runtime.generator import Generator

    if args.engines is not None and args.device != "tensorrt":
        raise InputError("--engines applies to --device tensorrt only.")
    loading = time.perf_counter()
    generator = Generator(args.bundle, device=args.device, threads=args.threads,
                          io_binding={"auto": None, "on": True, "off": False}[args.io_binding],
                          engines=args.engines, int8_drafter=False if args.fp32_drafter else None,
                          shortlist=not args.no_shortlist, **gpu_options(args))
    options = generator.resolve_options(DecodeOptions(
        args.mode, beta=args.beta, tau=args.tau, draft_k=args.draft_k, num_beams=args.num_beams,
        length_penalty=args.length_penalty, early_stopping=args.early_stopping,
        num_return_sequences=args.num_return_sequences))
    if (options.num_return_sequences or 1) > 1 and args.format == "text":
        raise InputError("--num-return-sequences above 1 needs --format jsonl (text output is one line per input).")
    load = time.perf_counter() - loading
    # onnxruntime's first calls allocate arenas and pick kernels (on CUDA, tenths of a second):
    # done here on a short made-up input, so that neither the first lines nor --stats pay for it
    warm_up = generator.warm_up(options, args.batch_size)
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
        for index, result in generator.stream(_lines(source, name), options, max_new_tokens=args.max_new_tokens,
                                              batch_size=args.batch_size):
            if isinstance(result, EmptyTextError):  # a blank line: answered by a blank line (Marian's way)
                done[index] = (BLANK, None)
            elif isinstance(result, InputError):
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
        # the costs measured at the run's batch width (CallCost fits each width class apart)
        costs = (*generator.gad_costs.fit(args.batch_size), generator.gad_costs.drafter_seconds) \
            if options.mode.needs_drafter else None
        _print_stats(results, args.mode, wall, graphs, sys.stderr, load, warm_up, costs)
    return 1 if refused else 0
