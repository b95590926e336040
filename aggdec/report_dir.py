"""Where a long run writes its results (``aggdec bench --out``, ``aggdec loadtest --out``),
checked before the run: a directory that cannot be made or written is one InputError now, not
an OSError traceback after minutes of work whose results it loses."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from aggdec.runtime.errors import InputError


def report_dir(path: str | Path, option: str = "--out") -> Path:
    """``path``, made if missing and written to once; ``option`` names it in the error."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # a file made and removed: mkdir succeeds on a directory it cannot write (read-only
        # file systems, permissions), and /proc or /sys refuse files in their own ways
        handle, probe = tempfile.mkstemp(prefix=".aggdec-probe-", dir=out)
        os.close(handle)
        os.unlink(probe)
    except FileExistsError:  # mkdir's answer for a path that is there and is no directory (/dev/full)
        raise InputError(f"cannot write to {option} {str(path)!r}: it is not a directory.") from None
    except OSError as exc:
        raise InputError(f"cannot write to {option} {str(path)!r}: {exc.strerror or exc}.") from None
    return out
