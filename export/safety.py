"""What `aggdec export` may replace, and what it leaves behind when it fails or is stopped.

- ``--force`` replaces only an aggdec bundle (its manifest and the files that manifest lists)
  or an empty directory: anything else in OUT_DIR may be somebody's data. OUT_DIR may not be
  SRC_DIR, lie inside it or contain it, be a file or a symlink.
- SIGINT and SIGTERM unwind the export like KeyboardInterrupt, so the temporary directory is
  removed, and are then delivered again to whatever handled them before.
- Failures are :class:`ExportError` (one ``aggdec: error:`` line from the CLI), and options
  that cannot work (an opset the tracer cannot write) are refused before any heavy work.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from ..runtime.bundle_schema import MAX_SEQUENCE_LEN
from ..runtime.errors import AggdecError, ExportError
from ..runtime.manifest import MANIFEST_FILE, Manifest

MIN_OPSET = 17  # the graphs use LayerNormalization, an ONNX operator since opset 17


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def max_opset() -> int:
    """The newest opset the TorchScript exporter (``dynamo=False``, which the tracer uses) writes."""
    from torch.onnx import _constants

    return int(getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", _constants.ONNX_MAX_OPSET))


DEFAULT_TOP_K = 8  # the verifier's candidates a position, where the vocabulary has as many


def top_k_within(top_k: int | None, vocab: int) -> int:
    """The verifier's candidates a position: ``top_k``, or not given :data:`DEFAULT_TOP_K` or
    the vocabulary's size where that is smaller; one given above the vocabulary's size is an
    ExportError (a default the caller never gave was refused so, naming a --top-k they had not
    passed)."""
    if top_k is None:
        return min(DEFAULT_TOP_K, vocab)
    if top_k > vocab:
        raise ExportError(f"--top-k {top_k} exceeds the vocabulary size {vocab}.")
    return top_k


def check_options(opset: int, top_k: int | None, max_source_len: int | None, max_target_len: int | None) -> None:
    """Refuse options that cannot work before any heavy work (loading, tracing)."""
    if not MIN_OPSET <= opset <= max_opset():
        raise ExportError(f"--opset {opset} is not supported: the graphs need at least {MIN_OPSET} "
                          f"(LayerNormalization) and torch's exporter writes at most {max_opset()}; "
                          f"choose {MIN_OPSET}..{max_opset()}.")
    if top_k is not None and top_k < 1:
        raise ExportError(f"--top-k must be at least 1, got {top_k}.")
    for flag, value in (("--max-source-len", max_source_len), ("--max-target-len", max_target_len)):
        if value is not None and not 2 <= value <= MAX_SEQUENCE_LEN:
            raise ExportError(f"{flag} must be between 2 and {MAX_SEQUENCE_LEN}, got {value}.")


def _replaceable(out: Path) -> str | None:
    """Why ``--force`` may not replace the directory ``out`` (None: it may).

    Only an empty directory or an aggdec bundle holding nothing but its manifest and the files
    that manifest lists: anything else may be somebody's data."""
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return None
    if MANIFEST_FILE not in entries:
        return f"it is not an aggdec bundle (no {MANIFEST_FILE}) and not empty"
    try:
        data = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"its {MANIFEST_FILE} is not an aggdec manifest"
    # any format version counts: --force must be able to replace a bundle of an older aggdec
    if not (isinstance(data, dict) and isinstance(data.get("format_version"), int)
            and isinstance(data.get("files"), dict) and isinstance(data.get("graphs"), dict)):
        return f"its {MANIFEST_FILE} is not an aggdec manifest"
    foreign = [name for name in entries if name != MANIFEST_FILE and not (
        name in data["files"] and (out / name).is_file() and not (out / name).is_symlink())]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        return f"it holds entries that are not part of the bundle ({shown})"
    return None


def check_destination(src: Path, out: Path, force: bool) -> None:
    """Refuse a destination whose replacement could destroy data that is not an aggdec bundle."""
    source, target = src.resolve(), out.resolve()
    if target == source or source in target.parents or target in source.parents:
        relation = "is" if target == source else "is inside" if source in target.parents else "contains"
        raise ExportError(f"OUT_DIR {str(out)!r} {relation} the checkpoint directory {str(src)!r}; "
                          "write the bundle somewhere else.")
    if target == Path.cwd().resolve():  # replacing it renames "." (EBUSY), after the whole export
        raise ExportError(f"OUT_DIR {str(out)!r} is the current directory; give the bundle a directory of its own.")
    if out.is_symlink():
        raise ExportError(f"OUT_DIR {str(out)!r} is a symbolic link; give the directory itself.")
    if out.exists() and not out.is_dir():
        raise ExportError(f"OUT_DIR {str(out)!r} is a file, not a directory; choose another path or remove it.")
    if out.exists() and not force:
        raise ExportError(f"{str(out)!r} already exists; pass --force to replace it.")
    reason = _replaceable(out) if out.exists() else None
    if reason is not None:
        raise ExportError(f"--force replaces only an aggdec bundle or an empty directory, and {str(out)!r}: {reason}. "
                          "Remove what you want to replace yourself, or choose another OUT_DIR.")


class _Interrupted(BaseException):
    """SIGTERM or SIGINT during an export: unwinds like KeyboardInterrupt, so cleanup runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _SignalGuard:
    """Turns SIGINT/SIGTERM into :class:`_Interrupted` while an export runs (main thread only).

    Once the export has unwound, the previous handlers are back and the signal is delivered
    to them again, so the caller's disposition holds (the default SIGTERM still ends the
    process, the default SIGINT still raises KeyboardInterrupt). ``hold()`` defers signals
    over steps that must not be cut in two (creating, removing or moving a directory).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    current = threading.local()  # the guard of the export running in this thread, if any

    def __init__(self) -> None:
        self.previous: dict[int, object] = {}
        self.holding, self.pending = 0, None
        self.interrupted: int | None = None  # the signal raised as _Interrupted, if any

    def _handle(self, signum: int, frame: object) -> None:
        if self.holding:
            self.pending = signum
        else:
            self.interrupted = signum
            raise _Interrupted(signum)

    def __enter__(self) -> _SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                previous = signal.getsignal(signum)
                if previous is not signal.SIG_IGN:  # an ignored signal stays ignored
                    self.previous[signum] = signal.signal(signum, self._handle)
        self.current.guard = self
        return self

    def __exit__(self, kind: object, exc: BaseException | None, trace: object) -> None:
        self.current.guard = None
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
        # The export was interrupted even when another exception arrives here: a library's own
        # cleanup, unwinding from _Interrupted, may raise one of its own (torch's ONNX exporter
        # asserts its export state on the way out), which would turn Ctrl-C into a traceback.
        signum = exc.signum if isinstance(exc, _Interrupted) else self.interrupted
        if signum is not None and exc is not None:
            signal.raise_signal(signum)  # the caller's handler decides; it usually does not return
            raise ExportError(f"export stopped by {signal.Signals(signum).name}.") from None

    @classmethod
    @contextlib.contextmanager
    def hold(cls, drop: bool = False) -> Iterator[None]:
        guard = getattr(cls.current, "guard", None)
        if guard is None:
            yield
            return
        guard.holding += 1
        try:
            yield
        finally:
            guard.holding -= 1
        if not guard.holding and guard.pending is not None:  # reached only if the body did not raise
            signum, guard.pending = guard.pending, None
            if not drop:
                guard.interrupted = signum
                raise _Interrupted(signum)


def guarded(export: Callable[..., Manifest]) -> Callable[..., Manifest]:
    """Every failure of ``export`` an AggdecError, and no temporary directory left when stopped."""

    @functools.wraps(export)
    def run(*args, **kwargs) -> Manifest:
        with _SignalGuard():
            try:
                return export(*args, **kwargs)
            except AggdecError:
                raise
            except OSError as exc:  # the destination is not writable, the disk is full, ...
                raise ExportError(f"export failed: {one_line(exc)}; check that OUT_DIR's parent is writable "
                                  "and has space.") from exc

    return run


def make_temp(out: Path) -> Path:
    with _SignalGuard.hold():  # a signal between creating and naming the directory would leak it
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))


def remove_temp(tmp: Path | None) -> None:
    with _SignalGuard.hold(drop=True):  # already unwinding: a second signal must not cut the cleanup short
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: Path, out: Path, manifest_json: str) -> None:
    """Finish a bundle staged in ``tmp`` and put it at ``out``: the manifest is written last (a
    directory without one is no bundle), the runtime must open it (:func:`check_runtime_opens`),
    the directory is opened to its readers (mkdtemp makes it private; a bundle is meant to be
    shared), then moved into place."""
    (tmp / MANIFEST_FILE).write_text(manifest_json, encoding="utf-8")
    check_runtime_opens(tmp)
    tmp.chmod(0o755)
    move_into_place(tmp, out)


def check_runtime_opens(bundle: Path) -> None:
    """ExportError unless aggdec's runtime opens ``bundle`` on the CPU, with every check it makes
    at load (the manifest's schema, the graphs' IO against it, the special ids against the
    tokenizer, the vocabulary and length probes): an export never publishes a bundle that its
    own runtime refuses (a forced BOS the tokenizer does not mark special once did that). An
    fp16 bundle runs on CUDA only and is not opened here."""
    from ..runtime.loader import open_bundle

    manifest = json.loads((bundle / MANIFEST_FILE).read_text(encoding="utf-8"))
    if manifest.get("precision") == "fp16":
        return
    try:
        open_bundle(bundle, device="cpu", threads=1, verify=False)
    except AggdecError as exc:
        raise ExportError(f"the bundle as written would be refused by aggdec's runtime ({one_line(exc)}); "
                          "nothing was written. Please report this with the checkpoint's config.json.") from exc


def move_into_place(tmp: Path, out: Path) -> None:
    """Replace ``out`` by ``tmp``: the old bundle is moved aside first and removed last."""
    with _SignalGuard.hold():
        old = None
        if out.exists():
            old = tmp.with_name(tmp.name + ".old")
            out.rename(old)
        try:
            tmp.rename(out)
        except BaseException:
            if old is not None:
                old.rename(out)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
