"""`aggdec generate`'s input and output as a careless user and a script meet them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggdec.runtime.errors import InputError
from aggdec.runtime.generator import Generator
from tests.test_cli import assert_one_clean_error, cli_bundle  # noqa: F401 - the fixture
from tests.support import interruptible

SEPARATORS = ["\x0c", "\x0b", "\x85", "\u2028", "\u2029", "\x1c", "\x1d", "\x1e"]


def run(bundle, data: bytes, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aggdec", "generate", str(bundle), "--max-new-tokens", "4", *args],
                          input=data, capture_output=True, timeout=300)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["w1", "w2 w3", "w4 w5 w6", ""]), st.sampled_from(SEPARATORS + [" "]),
                          st.sampled_from(["w7", "w8 w9"])), min_size=1, max_size=6),
       st.booleans())
def test_one_output_line_per_input_line_whatever_the_line_holds(cli_bundle, parts, crlf):  # noqa: F811
    lines = [f"{a}{sep}{b}" for a, sep, b in parts]
    end = "\r\n" if crlf else "\n"
    result = run(cli_bundle, (end.join(lines) + end).encode())
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode().split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)


def test_invalid_utf8_is_that_lines_error_only(cli_bundle, tmp_path):  # noqa: F811
    data = b"w1 w2\nw3 \xff\xfe w4\nw5\n"
    for args, stdin in (((), data), (("--input", str(tmp_path / "in.txt")), b"")):
        (tmp_path / "in.txt").write_bytes(data)
        result = run(cli_bundle, stdin, *args)
        assert result.returncode == 1
        out = result.stdout.decode().split("\n")
        assert len(out) == 4 and out[1] == "" and out[0] and out[2]
        assert b"line 2: input is not valid UTF-8" in result.stderr and b"Traceback" not in result.stderr


@pytest.mark.parametrize("option", [["--tau", "nan"], ["--tau", "inf"], ["--tau", "-1"], ["--max-new-tokens", "0"],
                                    ["--batch-size", "0"], ["--threads", "0"], ["--beta", "0"], ["--draft-k", "-2"]])
def test_bad_options_are_refused_before_reading_input(cli_bundle, option):  # noqa: F811
    for stdin in (b"", b"\n\n"):
        result = subprocess.run([sys.executable, "-m", "aggdec", "generate", str(cli_bundle), *option],
                                input=stdin, capture_output=True, timeout=300)
        assert result.returncode == 2 and b"Traceback" not in result.stderr
        assert option[0].encode() in result.stderr


def test_unreadable_inputs_and_a_closed_stdout_exit_quietly(cli_bundle, tmp_path):  # noqa: F811
    result = subprocess.run([sys.executable, "-m", "aggdec", "generate", str(cli_bundle), "--input", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert_one_clean_error(result, "is a directory")
    pipeline = subprocess.run(f"yes 'w1 w2' | head -400 | {sys.executable} -m aggdec generate {cli_bundle} "
                              "--max-new-tokens 3 --batch-size 2 | head -1", shell=True, capture_output=True,
                              text=True, timeout=300)
    assert len(pipeline.stdout.splitlines()) == 1
    assert "Traceback" not in pipeline.stderr and "Exception ignored" not in pipeline.stderr


def test_api_takes_any_iterable_and_refuses_what_no_tokenizer_can_take(cli_bundle):  # noqa: F811
    generator = Generator(cli_bundle)
    texts = ["w1 w2", "w3"]
    assert [r.ids for r in generator.generate(t for t in texts)] == [r.ids for r in generator.generate(texts)]
    with pytest.raises(InputError, match="text 1 .*surrogate"):
        generator.generate(["w1", "w2 \ud800"])
    vocab = generator.manifest.vocab_size
    for bad in (-1, vocab):
        with pytest.raises(InputError, match="outside this bundle's vocabulary"):
            generator.generate_ids([5, bad, 1])
    # int() made 5.9 a 5 and True a 1, "561" the ids 5, 6, 1 (another source, decoded silently), and
    # raised OverflowError on inf
    for bad in ([5, 6.9, 1], [5, True, 1], "561", [5, float("inf"), 1], [[5, 6, 1]]):
        with pytest.raises(InputError, match="source_ids must be a sequence of integers"):
            generator.generate_ids(bad)
    # integer knobs take numpy's integers, as DecodeOptions does ("must be an integer, got np.int64(2)")
    import numpy as np

    assert generator.generate_ids(np.array([5, 6, 1]), max_new_tokens=np.int64(2)).ids == \
        generator.generate_ids([5, 6, 1], max_new_tokens=2).ids
    assert [r.ids for r in generator.generate(texts, max_new_tokens=np.int32(2), batch_size=np.int64(1))] == \
        [r.ids for r in generator.generate(texts, max_new_tokens=2)]


def test_jsonl_gives_one_object_per_input_line(cli_bundle):  # noqa: F811
    import json

    data = b"w1 w2\n\xff\nw3\n"
    result = run(cli_bundle, data, "--format", "jsonl")
    assert result.returncode == 1
    records = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3]
    assert records[1]["error"] and records[1]["text"] is None and records[1]["ids"] is None
    for record in (records[0], records[2]):
        assert record["error"] is None and record["ids"] and record["stats"]["iterations"] >= 1
    text = run(cli_bundle, data).stdout.decode().splitlines()
    assert [r["text"] or "" for r in records] == text


def test_a_blank_line_is_answered_by_a_blank_line_without_an_error(cli_bundle):  # noqa: F811
    """A document's paragraph break (an empty line, or spaces only) is passed through as Marian
    does: nothing to decode, no message, exit status 0; the API still refuses an empty text."""
    import json

    data = b"w1 w2\n\n \t \r\nw3\n"
    text = run(cli_bundle, data)
    assert text.returncode == 0 and text.stderr == b""
    lines = text.stdout.decode().split("\n")
    assert len(lines) == 5 and lines[1] == lines[2] == lines[4] == "" and lines[0] and lines[3]
    jsonl = run(cli_bundle, data, "--format", "jsonl")
    assert jsonl.returncode == 0 and jsonl.stderr == b""
    records = [json.loads(line) for line in jsonl.stdout.decode().splitlines()]
    assert [(r["line"], r["text"], r["ids"], r["error"]) for r in records[1:3]] == [(2, "", [], None), (3, "", [], None)]
    assert [r["text"] for r in (records[0], records[3])] == [lines[0], lines[3]]
    with pytest.raises(InputError, match="text 1 is empty"):
        Generator(cli_bundle).generate(["w1", " "])


def test_output_file_is_written_whole_or_not_at_all(cli_bundle, tmp_path):  # noqa: F811
    import signal
    import time

    target = tmp_path / "out.txt"
    result = run(cli_bundle, b"w1 w2\nw3\n", "--output", str(target))
    assert result.returncode == 0 and result.stdout == b""
    assert len(target.read_text().splitlines()) == 2
    target.write_text("previous\n")
    source = tmp_path / "many.txt"
    source.write_text("w1 w2 w3 w4 w5\n" * 20000)
    process = subprocess.Popen([sys.executable, "-m", "aggdec", "generate", str(cli_bundle), "--input", str(source),
                                "--batch-size", "1", "--output", str(target)], stderr=subprocess.PIPE,
                               preexec_fn=interruptible)
    time.sleep(6)  # loaded and decoding
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert target.read_text() == "previous\n"  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.txt", "out.txt"]  # no temporary file left


def _one_error(capsys, argv: list[str], needle: str) -> None:
    """`aggdec ARGV` in this process: exit 2 and one `aggdec: error:` line that says ``needle``."""
    from aggdec.cli import main

    code = main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("aggdec: error:"), lines
    assert needle in lines[0], lines[0]


def test_an_output_that_is_a_directory_is_refused_before_decoding(cli_bundle, tmp_path, capsys):  # noqa: F811
    """It was a traceback (IsADirectoryError from the rename), after every line had been decoded."""
    source = tmp_path / "in.txt"
    source.write_text("w1 w2\nw3\n")
    _one_error(capsys, ["generate", str(cli_bundle), "--input", str(source), "--output", str(tmp_path)],
               f"cannot write output {str(tmp_path)!r}: it is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]  # no temporary file left


def test_an_output_that_is_a_pipe_or_a_symlink_is_written_through_not_replaced(cli_bundle, tmp_path):  # noqa: F811
    """The atomic rename replaced whatever --output named with a regular file: a named pipe (its
    reader never got a line), a symlink, and as root /dev/null or /dev/full themselves."""
    from aggdec.cli import main

    source = tmp_path / "in.txt"
    source.write_text("w1 w2\nw3\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that opening it to write does not wait
    try:
        assert main(["generate", str(cli_bundle), "--max-new-tokens", "3", "--input", str(source),
                     "--output", str(fifo)]) == 0
        assert fifo.is_fifo() and len(os.read(reader, 1 << 16).decode().splitlines()) == 2
    finally:
        os.close(reader)
    real, link = tmp_path / "real.txt", tmp_path / "link.txt"
    real.write_text("previous\n")
    link.symlink_to(real.name)
    assert main(["generate", str(cli_bundle), "--max-new-tokens", "3", "--input", str(source),
                 "--output", str(link)]) == 0
    assert link.is_symlink() and len(real.read_text().splitlines()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "in.txt", "link.txt", "real.txt"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_an_output_that_cannot_be_written_is_one_error_line(cli_bundle, tmp_path, capsys, monkeypatch):  # noqa: F811
    """A full disk (ENOSPC) was an OSError traceback from the write."""
    source = tmp_path / "in.txt"
    source.write_text("w1 w2\nw3\n")
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        _one_error(capsys, ["generate", str(cli_bundle), "--max-new-tokens", "3", "--input", str(source)],
                   "cannot write output stdout: No space left on device")


@pytest.mark.parametrize("threads", ["99999999999", "100000"])
def test_more_threads_than_the_machine_can_run_are_refused(cli_bundle, tmp_path, capsys, threads):  # noqa: F811
    """Past 2**31 onnxruntime raised TypeError (a traceback); 3,000 on two CPUs left one line
    decoding for minutes, each graph spinning that many threads."""
    _one_error(capsys, ["generate", str(cli_bundle), "--input", os.devnull, "--threads", threads],
               "threads must be an integer between 1 and ")


def test_serve_refuses_a_port_outside_0_to_65535(capsys):
    from aggdec.cli import main
    from aggdec.runtime.errors import AggdecError
    from aggdec.serve.server import bind

    for port in ("65536", "-1"):
        with pytest.raises(SystemExit) as exited:
            main(["serve", "no-bundle", "--port", port])
        assert exited.value.code == 2 and "--port: must be 0 (any free port) .. 65535" in capsys.readouterr().err
    with pytest.raises(AggdecError, match="cannot listen on '127.0.0.1' port 70000"):  # was an OverflowError
        bind("127.0.0.1", 70000)


def test_bench_data_that_is_not_utf8_is_one_error_line(cli_bundle, tmp_path, capsys):  # noqa: F811
    data = tmp_path / "data.txt"
    data.write_bytes(b"w1 w2\nw3 \xff w4\n")
    _one_error(capsys, ["bench", str(cli_bundle), "--data", str(data), "--out", str(tmp_path / "out")],
               f"{data}:2: not valid UTF-8 (byte 0xff at offset 9 of the file)")
    _one_error(capsys, ["bench", str(cli_bundle), "--data", str(tmp_path), "--out", str(tmp_path / "out")],
               "is not a file")


def test_numbers_no_float_holds_are_input_errors_not_overflow_errors():
    from aggdec.runtime.options import DecodeOptions

    for options in (dict(mode="gad++", tau=10**400), dict(mode="greedy", num_beams=2, length_penalty=-10**400)):
        with pytest.raises(InputError, match="must be a finite number"):
            DecodeOptions(**options)


def test_a_byte_order_mark_at_the_start_is_not_part_of_the_first_line(cli_bundle, tmp_path, capsys):  # noqa: F811
    """Windows editors start a UTF-8 file with one; the first line was decoded with it and its
    output differed from the same line's anywhere else. Only the start's is dropped."""
    from aggdec.cli import main

    source = tmp_path / "in.txt"
    source.write_bytes(b"\xef\xbb\xbfw1 w2 w3\r\nw1 w2 w3\r\n\xef\xbb\xbfw1 w2 w3\r\n")
    assert main(["generate", str(cli_bundle), "--input", str(source), "--max-new-tokens", "4",
                 "--format", "jsonl"]) == 0
    import json

    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    plain = Generator(cli_bundle).generate(["w1 w2 w3", "\ufeffw1 w2 w3"], max_new_tokens=4)
    assert plain[0].ids != plain[1].ids  # the mark is text to the tokenizer: dropping it matters
    assert [r["ids"] for r in records] == [list(plain[0].ids), list(plain[0].ids), list(plain[1].ids)]


def test_a_line_longer_than_any_text_is_refused_without_keeping_it(cli_bundle, tmp_path, capsys):  # noqa: F811
    """A line without an end (`--input /dev/zero`) ran out of memory (a MemoryError traceback, or
    the process killed); now at most MAX_TEXT_BYTES + 1 bytes of a line are kept, and the line is
    that line's error."""
    import io
    import json

    from aggdec.cli import main
    from aggdec.cli.generate import _lines
    from aggdec.runtime.generator import MAX_TEXT_BYTES

    endless = io.BytesIO(b"w1\r\n" + b"\0" * (2 * MAX_TEXT_BYTES + 5) + b"\r\nw2")
    assert [len(line) for line in _lines(endless, "test")] == [2, MAX_TEXT_BYTES + 1, 2]
    source = tmp_path / "in.txt"
    source.write_bytes(b"w1 w2\n" + b"w3 " * (MAX_TEXT_BYTES // 3 + 1) + b"\nw4\n")
    assert main(["generate", str(cli_bundle), "--input", str(source), "--max-new-tokens", "3",
                 "--format", "jsonl"]) == 1
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3] and records[1]["ids"] is None
    assert records[0]["ids"] and records[2]["ids"]
    assert f"aggdec: line 2: input is longer than {MAX_TEXT_BYTES:,} bytes" in captured.err


@pytest.mark.parametrize("encoding, data, sign", [
    ("UTF-16", "w1 w2\nw3\n".encode("utf-16"), "a byte order mark"),  # Python's utf-16 writes the mark
    ("UTF-16", "w1 w2\nw3\n".encode("utf-16-be"), "a control byte beside each character"),
    ("UTF-16", "w1 w2\nw3\n".encode("utf-16-le"), "a control byte beside each character"),
    # Cyrillic (high byte 0x04) and Greek (0x03) without a mark: every byte below 0x80, so read
    # as UTF-8 each line decoded as garbage, exit 0
    ("UTF-16", "Привіт , як справи ?\nДобре .\n".encode("utf-16-le"), "a control byte beside each character"),
    ("UTF-16", "Привіт , як справи ?\n".encode("utf-16-be"), "a control byte beside each character"),
    ("UTF-16", "Καλημέρα\n".encode("utf-16-le"), "a control byte beside each character"),
    ("UTF-32", "w1 w2\nw3\n".encode("utf-32"), "a byte order mark"),
    ("UTF-32", b"\x00\x00\xfe\xff" + "w1\n".encode("utf-32-be"), "a byte order mark"),
])
def test_an_input_in_utf16_or_utf32_is_refused_as_a_whole(cli_bundle, tmp_path, capsys,  # noqa: F811
                                                           encoding, data, sign):
    """Read as UTF-8, a UTF-16 file's first line was refused (byte 0xff) and each line after it
    was decoded as garbage, exit 1; now one line saying what it looks like and what to do, exit 2,
    and nothing written."""
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_bytes(data)
    _one_error(capsys, ["generate", str(cli_bundle), "--input", str(source), "--output", str(target)],
               f"input {str(source)!r} looks like {encoding} ({sign} at its start), and aggdec reads UTF-8; "
               f"convert it to UTF-8 first (iconv -f {encoding} -t UTF-8).")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]  # no output, not even a temporary file


def test_nul_bytes_in_utf8_input_are_not_taken_for_utf16(cli_bundle, tmp_path, capsys):  # noqa: F811
    """UTF-8 holds a NUL only as the character U+0000: lines of NULs, or a NUL among other
    characters, are lines like any other (one output line each), not UTF-16."""
    import io

    from aggdec.cli import main
    from aggdec.cli.generate import _lines

    for data in (b"\x00\n\x00\n", b"\x00\n\x00\nw1\n", b"\x00\x00\x00\x00\nw1\n", b"w1\x00w2\n\x00\n", b"\r\n\r\nw1\n",
                 b"w\x00"):
        assert len(list(_lines(io.BytesIO(data), "test"))) == data.count(b"\n") + (not data.endswith(b"\n"))
    source = tmp_path / "in.txt"
    source.write_bytes(b"\x00\n\x00\nw1 w2\n")
    assert main(["generate", str(cli_bundle), "--input", str(source), "--max-new-tokens", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_a_text_output_holding_a_line_break_stays_one_line():
    """A byte-fallback model wrote a lone carriage return into its text; read back with universal
    newlines (or str.splitlines) the output had one line more than the input."""
    from aggdec.cli.generate import _render
    from aggdec.runtime.generator import GenerationResult

    result = GenerationResult(text="a\rb\nc\u2028d\x85e\x0cf", ids=(), stats=None)
    line = _render("text", 1, result, None)
    assert line == "a b c d e f\n" and len(line.splitlines()) == 1
