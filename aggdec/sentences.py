"""What a benchmark decodes: the UA-GEC test split, or a file of the user's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aggdec.runtime.errors import InputError

UAGEC_TEST = "uagec-test"


@dataclass(frozen=True)
class Example:
    source: str
    target: str | None = None  # a human correction, when the data has one (for GEC scores)
    target2: str | None = None  # a second annotator's


def load_examples(data: str, limit: int | None = None) -> list[Example]:
    """``data``: "uagec-test" (the `ua-gec` package's gec-only test split, annotators a1 and a2),
    or a UTF-8 file: one source per line, optionally followed by tab-separated targets."""
    if data == UAGEC_TEST:
        try:
            from aggdec.uagec import load_pairs

            examples = [Example(p.source, p.target, p.target2) for p in load_pairs("test")]
        except ModuleNotFoundError:
            raise InputError("the UA-GEC test split comes from the `ua-gec` package: "
                             "pip install 'aggdec[bench]', or give --data FILE") from None
    else:
        path = Path(data)
        if not path.is_file():
            raise InputError(f"data file {data!r} {'is not a file' if path.exists() else 'does not exist'}.")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read data file {data!r}: {exc.strerror or exc}.") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise InputError(f"{data}:{line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start} of "
                             "the file); the data file must be UTF-8.") from None
        examples = []
        for number, line in enumerate(text.splitlines(), start=1):
            fields = line.split("\t")
            if not fields[0].strip():
                raise InputError(f"{data}:{number}: empty source.")
            examples.append(Example(fields[0], *(f or None for f in fields[1:3])))
    if limit is not None:
        examples = examples[:limit]
    if not examples:
        raise InputError(f"no sentences to benchmark in {data!r}.")
    return examples
