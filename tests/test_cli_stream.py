"""`aggdec generate` as a stream: each line answered as soon as it and those before it are
done, while stdin is still open, and Ctrl-C keeps what was written."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading

from aggdec.runtime.generator import Generator
from tests.test_cli import cli_bundle  # noqa: F401 - the fixture
from tests.support import interruptible

MAX_NEW = "6"


def start(bundle, *args: str) -> tuple[subprocess.Popen, queue.Queue]:
    process = subprocess.Popen([sys.executable, "-m", "aggdec", "generate", str(bundle), "--max-new-tokens", MAX_NEW,
                                *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=interruptible, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in process.stdout:
            lines.put(line.decode())
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return process, lines


def expected(bundle, texts: list[str]) -> list[str]:
    return [r.text + "\n" for r in Generator(bundle).generate(texts, max_new_tokens=int(MAX_NEW))]


def test_each_line_is_answered_while_stdin_is_still_open(cli_bundle):  # noqa: F811
    texts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9"]
    want = expected(cli_bundle, texts)
    process, lines = start(cli_bundle, "--batch-size", "8")
    try:
        for text, answer in zip(texts, want):
            process.stdin.write(text.encode() + b"\n")
            process.stdin.flush()
            # the line comes back before any more input is written: no waiting for a batch or EOF
            assert lines.get(timeout=120) == answer
        process.stdin.close()
        assert lines.get(timeout=120) is None
        assert process.wait(timeout=120) == 0
    finally:
        process.kill()


def test_ctrl_c_keeps_what_was_written_and_exits_cleanly(cli_bundle):  # noqa: F811
    texts = [f"w{1 + i % 9} w{1 + (i * 7) % 9} w{1 + (i * 5) % 9}" for i in range(400)]
    want = expected(cli_bundle, texts[:50])
    process, lines = start(cli_bundle, "--batch-size", "4")
    try:
        process.stdin.write(("\n".join(texts[:2]) + "\n").encode())
        process.stdin.flush()
        got = [lines.get(timeout=120), lines.get(timeout=120)]
        # then a burst, and Ctrl-C while it decodes, with stdin still open
        process.stdin.write(("\n".join(texts[2:]) + "\n").encode())
        process.stdin.flush()
        got.append(lines.get(timeout=120))
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
        while (line := lines.get(timeout=60)) is not None:
            got.append(line)
        stderr = process.stderr.read().decode()
    finally:
        process.kill()
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr, stderr
    assert len(got) < len(texts)  # it stopped
    # every line written is whole and is its input's answer, in order
    full = expected(cli_bundle, texts[: len(got)]) if len(got) > len(want) else want[: len(got)]
    assert got == full


def test_a_batch_size_no_memory_holds_is_one_error_line_while_stdin_is_still_open(cli_bundle):  # noqa: F811
    """On a pipe still open, a batch's buffers are made for all --batch-size rows at the first
    line: 10**9 of them was numpy's MemoryError traceback (the same input through a closed
    pipe ran, sized by its lines). Refused before any line is read, whether more come or not."""
    process, lines = start(cli_bundle, "--batch-size", "1000000000")
    try:
        process.stdin.write(b"w1 w2 w3\n")
        process.stdin.flush()
        assert lines.get(timeout=120) is None  # no output line, and stdin is still open
        assert process.wait(timeout=60) == 2
        stderr = process.stderr.read().decode()
    finally:
        process.kill()
    errors = [line for line in stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("aggdec: error: batch_size 1,000,000,000 needs cache buffers for "
                                                     "1,000,000,000 rows at "), stderr
    assert "more than this machine's physical memory" in errors[0]
