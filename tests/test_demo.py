"""examples/uagec_demo.py, run as a newcomer runs it (a subprocess of the real script)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "uagec_demo.py"


def demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEMO), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("count", ["0", "-3", "101", "many"])
def test_a_sentence_count_out_of_range_is_one_error_line(count):
    result = demo("--sentences", count)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert lines[-1].startswith("uagec_demo.py: error: argument --sentences:"), lines


@pytest.mark.slow
def test_a_checkpoint_without_a_drafter_says_gad_is_left_out_and_shows_progress(random_checkpoint, tmp_path):
    result = demo("--checkpoint", str(random_checkpoint("marian")), "--sentences", "2", "--work", str(tmp_path),
                  "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert "no GAD drafter for this checkpoint" in result.stderr and "GAD is left out" in result.stderr
    assert "correcting (greedy, iad)" in result.stderr and "2/2" in result.stderr  # the progress bar
    assert "identical to greedy 2/2" in result.stdout and " gad " not in result.stdout
