"""The docs say only what the code has (the README, docs/ and benchmarks/results/INDEX.md).

Fast and static: the CLI's argparse parser, the API's signatures and the file tree are read,
no model is loaded and nothing is decoded. `mkdocs build --strict` checks links inside docs/
only; these checks cover the README, the links out of docs/ and the names the pages use.

Each check was seen to fail on a deliberately broken doc, then reverted: a made-up flag
(`aggdec generate --no-such-flag`, `--no-stats`) and a made-up command (`aggdec frobnicate`)
in a code block, an option left out of docs/cli.md's synopsis, a link to a missing file, a
removed script (`python benchmarks/ab_bundles.py`), a results folder left out of INDEX.md,
`Generator(..., no_such_kwarg=1)` and `DecodeOptions(..., no_such_field=1)` in a code span,
a decision record left out of its index and a page left out of mkdocs.yml's nav, a README
padded past 15,000 characters.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
README_LIMIT = 15_000  # characters; the project's brief keeps the README short (reference goes to docs/)

# the pages checked for commands and API names: the README and docs/*.md (decision records tell
# what was tried at the time, so they may name options since removed)
USER_PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
# the pages checked for links: every page of ours a reader follows links from
LINKED_PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), RESULTS / "INDEX.md"]

FENCE = re.compile(r"^[ \t]*(```|~~~)")


@dataclasses.dataclass(frozen=True)
class Code:
    """A piece of code in a page: a fenced block or an inline span."""

    page: Path
    line: int
    text: str
    block: bool


def split_code(page: Path) -> tuple[list[Code], str]:
    """The page's code (fenced blocks, then inline spans) and its prose with code blanked out.

    Inline spans may cross a line break within a paragraph (Markdown joins the lines), so they
    are matched over the whole prose; blanking keeps offsets, hence line numbers.
    """
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    blocks: list[Code] = []
    prose_lines: list[str] = []
    fence: str | None = None
    start = 0
    body: list[str] = []
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence, start, body = match.group(1), number, []
            prose_lines.append("\n")
        elif fence is not None:
            if match and match.group(1) == fence and not line.strip()[3:].strip():
                blocks.append(Code(page, start + 1, "".join(body), True))
                fence = None
            else:
                body.append(line)
            prose_lines.append("\n")
        else:
            prose_lines.append(line)
    prose = "".join(prose_lines)
    spans: list[Code] = []
    blanked = list(prose)
    for match in re.finditer(r"(`+)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", prose, re.DOTALL):  # not across paragraphs
        text = match.group(2).replace("\n", " ").strip()
        spans.append(Code(page, prose.count("\n", 0, match.start()) + 1, text, False))
        for i in range(match.start(), match.end()):
            if blanked[i] != "\n":
                blanked[i] = " "
    return blocks + spans, "".join(blanked)


# --------------------------------------------------------------------------- 1: CLI commands and flags

def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser, built as `aggdec` builds it (aggdec.cli.build_parser)."""
    from aggdec.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def logical_lines(block: str) -> Iterator[tuple[int, str, str]]:
    """A shell block's commands as (offset, command, comments): `\\` continuations joined, and
    so are the indented lines that go on a synopsis (a line starting with `[` or `--`, as in
    docs/cli.md); a `#` comment is set apart from the command it follows."""
    out: list[tuple[int, str, str]] = []
    pending_backslash = False
    for offset, raw in enumerate(block.splitlines()):
        hash_mark = re.search(r"(?:^|\s)#", raw)
        line, comment = (raw[:hash_mark.start()], raw[hash_mark.end():]) if hash_mark else (raw, "")
        line = line.rstrip()
        continued = pending_backslash or (out and re.match(r"\s+(\[|--)", raw) is not None)
        pending_backslash = line.endswith("\\")
        line = line.rstrip("\\")
        if continued and out:
            out[-1] = (out[-1][0], out[-1][1] + " " + line.strip(), out[-1][2] + " " + comment)
        else:
            out.append((offset, line, comment))
    return iter(out)


PREFIX = r"(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:nice\s+-n\s*\d+\s+|time\s+|timeout\s+\d+\s+)*"
LAUNCHER = r"(?:\S*python3?(?:\.\d+)?\s+-m\s+|\S*/)?"
AT_COMMAND_START = re.compile(r"(?:^|&&|\|\||[;|(]|\$\()\s*" + PREFIX + LAUNCHER + r"aggdec\s+([a-z][a-z0-9-]*)")
ANYWHERE = re.compile(r"(?<![\w./-])aggdec\s+([a-z][a-z0-9-]*)")


def flags_of(line: str, end_of_command: int) -> list[str]:
    """The flags from `end_of_command` to the end of the pipeline stage (a `|` outside
    brackets, `&&`, `||`, `;`); `--[no-]x` stands for `--x` and `--no-x`."""
    rest, depth, end = line[end_of_command:], 0, None
    for i, ch in enumerate(rest):
        depth += ch == "["
        depth -= ch == "]"
        if depth <= 0 and (ch == ";" or rest.startswith("&&", i) or rest.startswith("|", i)):
            end = i
            break
    flags: list[str] = []
    for flag in re.findall(r"(?<![\w-])--(?:\[no-\])?[a-z][a-z0-9-]*", rest[:end]):
        if flag.startswith("--[no-]"):
            flags += ["--" + flag[7:], "--no-" + flag[7:]]
        else:
            flags.append(flag)
    return flags


def aggdec_invocations(code: Code, commands: Iterable[str]) -> Iterator[tuple[int, str, list[str]]]:
    """(line, command, flags) for each `aggdec COMMAND ...` in a piece of code.

    In a block's commands, `aggdec` counts where a shell command starts (line start, after
    `&&`, `|`, `;`, `(`, `$(`, or a `python -m`, `nice -n N`, `time`, env-assignment prefix).
    An inline span counts where it starts so and names a command or gives a flag, and a
    block's comment where it names a command (else it is prose quoted in code, such as an
    error message: `aggdec cannot export ...`).
    """
    if code.block:
        for offset, line, comment in logical_lines(code.text):
            for match in AT_COMMAND_START.finditer(line):
                yield code.line + offset, match.group(1), flags_of(line, match.end())
            for match in ANYWHERE.finditer(comment):
                if match.group(1) in commands:
                    yield code.line + offset, match.group(1), flags_of(comment, match.end())
        return
    for match in AT_COMMAND_START.finditer(code.text):
        if match.group(1) in commands or "--" in code.text:
            yield code.line, match.group(1), flags_of(code.text, match.end())


def all_code() -> list[Code]:
    return [code for page in USER_PAGES for code in split_code(page)[0]]


def test_every_documented_command_and_flag_exists():
    parsers = cli_parsers()
    seen, wrong = 0, []
    for code in all_code():
        for line, command, flags in aggdec_invocations(code, parsers):
            seen += 1
            where = f"{code.page.relative_to(ROOT)}:{line}"
            if command not in parsers:
                wrong.append(f"{where}: `aggdec {command}`: no such command (there are {sorted(parsers)})")
                continue
            accepted = parsers[command]._option_string_actions
            wrong += [f"{where}: `aggdec {command} {flag}`: no such option" for flag in flags if flag not in accepted]
    assert seen > 50, "the matcher found almost no `aggdec COMMAND` in the docs: it is broken"
    assert not wrong, "\n".join(wrong)


def test_cli_page_synopsis_names_every_option():
    """The README sends readers to docs/cli.md for "every option": its synopsis block names each
    option of each command (one of an option's names is enough: `--batch-sizes` is an alias)."""
    parsers = cli_parsers()
    (synopsis, *_) = [code for code in split_code(DOCS / "cli.md")[0] if code.block]
    named: dict[str, set[str]] = {}
    for _, command, flags in aggdec_invocations(synopsis, parsers):
        named.setdefault(command, set()).update(flags)
    missing = [f"aggdec {command} {action.option_strings[-1]}"
               for command, parser in parsers.items() for action in parser._actions
               if action.option_strings and not isinstance(action, argparse._HelpAction)
               and not named.get(command, set()) & set(action.option_strings)]
    assert not missing, f"options missing from docs/cli.md's synopsis: {missing}"


# --------------------------------------------------------------------------- 2: links and INDEX.md

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def relative_links(page: Path) -> Iterator[tuple[int, str]]:
    """(line, target) of each relative link in the page's prose (code is not a link)."""
    prose = split_code(page)[1]
    for match in LINK.finditer(prose):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or an anchor in the page
        yield prose.count("\n", 0, match.start()) + 1, target


def resolve(page: Path, target: str) -> Path:
    return (page.parent / target.split("#")[0].split("?")[0]).resolve()


def test_every_relative_link_resolves():
    seen, broken = 0, []
    for page in LINKED_PAGES:
        for line, target in relative_links(page):
            seen += 1
            if not resolve(page, target).exists():
                broken.append(f"{page.relative_to(ROOT)}:{line}: ({target}) does not exist")
    assert seen > 100, "the matcher found almost no links: it is broken"
    assert not broken, "\n".join(broken)


def test_results_index_lists_every_run_folder():
    index = RESULTS / "INDEX.md"
    linked = {resolve(index, target) for _, target in relative_links(index)}
    # a run is listed when INDEX.md links its folder or a file in it
    listed = {path if path.is_dir() else path.parent for path in linked if path.exists()}
    folders = sorted(p for p in RESULTS.iterdir() if p.is_dir())
    missing = [f.name for f in folders if not any(f == p or f in p.parents for p in listed)]
    assert folders and not missing, f"benchmarks/results/ folders with no line in INDEX.md: {missing}"
    gone = sorted(str(p.relative_to(RESULTS)) for p in linked
                  if RESULTS in p.parents and not p.exists())
    assert not gone, f"INDEX.md links results that do not exist: {gone}"


# a path in code that starts at one of the repository's top folders (`benchmarks/ab.py`,
# `tests/test_import_graph.py`); placeholders (`<run>`, `$DIR`) and paths under other roots
# (`DIR/train_report.json`, `../shared/`) are not matched
REPO_PATH = re.compile(r"(?<![\w./$<>{}-])((?:benchmarks|tests|docs|examples|runtime|export|engines|aggdec|\.ci)"
                       r"/[\w.+-]+(?:/[\w.+-]+)*/?)")


def test_every_repository_path_in_code_exists():
    """The scripts and files a command or a code span names (a removed script's command no one
    can run was the case that prompted this)."""
    seen, missing = 0, []
    for code in all_code():
        for match in REPO_PATH.finditer(code.text):
            seen += 1
            path = match.group(1).rstrip(".")
            if not (ROOT / path).exists():
                line = code.line + code.text.count("\n", 0, match.start())
                missing.append(f"{code.page.relative_to(ROOT)}:{line}: {path} does not exist")
    assert seen > 100, "the matcher found almost no paths: it is broken"
    assert not missing, "\n".join(missing)


# --------------------------------------------------------------------------- 3: Python API names

def api_names() -> dict[str, set[str]]:
    from aggdec.runtime.decoding.sizing import BlockOptions
    from aggdec.runtime.generator import Generator
    from aggdec.runtime.options import DecodeOptions
    from aggdec.runtime.tuning import Tuning

    def keywords(function) -> set[str]:
        parameters = inspect.signature(function).parameters.values()
        assert not any(p.kind is p.VAR_KEYWORD for p in parameters), f"{function.__qualname__} takes **kwargs: " \
            "any documented keyword would pass; check its names another way"
        return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}

    return {
        "Generator": keywords(Generator.__init__) - {"self"},
        "Generator.from_bundle": keywords(Generator.from_bundle),
        "generate": keywords(Generator.generate) - {"self"},
        "stream": keywords(Generator.stream) - {"self"},
        "DecodeOptions": {f.name for f in dataclasses.fields(DecodeOptions)},
        "Tuning": {f.name for f in dataclasses.fields(Tuning)},
        "BlockOptions": {f.name for f in dataclasses.fields(BlockOptions)},
    }


# `generate(` and `stream(` are aggdec's when called on a generator (`generator.generate(`), or
# bare with a positional first argument (`generate(texts, ...)`): transformers' `generate(...)`,
# which the docs compare against, is written with keywords only (`generate(num_beams=N, ...)`)
CALL = re.compile(r"(?<![\w.])(Generator\.from_bundle|Generator|DecodeOptions|Tuning|BlockOptions)\(|"
                  r"(?:(?<![\w.])|\bgenerator\.)(generate|stream)\(")


def call_arguments(text: str, start: int) -> str | None:
    """The text inside the parentheses opened just before `start`, or None if they never close."""
    depth = 1
    for i in range(start, len(text)):
        depth += text[i] in "([{"
        depth -= text[i] in ")]}"
        if depth == 0:
            return text[start:i]
    return None


def top_level_keywords(arguments: str) -> tuple[list[str], bool]:
    """The `name=` keywords at the call's own level, and whether its first argument is positional."""
    flat, depth = [], 0
    for ch in arguments:  # blank out nested brackets and string literals' contents
        if ch in "([{":
            depth += 1
        flat.append(ch if depth == 0 else " ")
        if ch in ")]}":
            depth -= 1
    flat_text = re.sub(r"(['\"]).*?\1", "''", "".join(flat))
    names = re.findall(r"(?:^|,)\s*([A-Za-z_]\w*)\s*=(?!=)", flat_text)
    first = flat_text.split(",")[0].strip()
    positional_first = bool(first) and not re.match(r"[A-Za-z_]\w*\s*=(?!=)", first)
    return names, positional_first


def test_every_documented_keyword_exists():
    names = api_names()
    seen, wrong = 0, []
    for code in all_code():
        for match in CALL.finditer(code.text):
            callee = match.group(1) or match.group(2)
            arguments = call_arguments(code.text, match.end())
            if arguments is None:
                continue
            keywords, positional_first = top_level_keywords(arguments)
            if match.group(2) and not match.group(0).startswith("generator.") and not positional_first:
                continue  # a bare `generate(num_beams=...)`: transformers' (see CALL)
            line = code.line + code.text.count("\n", 0, match.start())
            for keyword in keywords:
                seen += 1
                if keyword not in names[callee]:
                    wrong.append(f"{code.page.relative_to(ROOT)}:{line}: `{callee}(..., {keyword}=...)`: "
                                 f"{callee} takes no {keyword!r}")
    assert seen > 20, "the matcher found almost no keywords in the docs: it is broken"
    assert not wrong, "\n".join(wrong)


# --------------------------------------------------------------------------- 4: indexes and the nav

def test_decision_index_lists_every_record():
    index = DOCS / "decisions" / "index.md"
    linked = {resolve(index, target) for _, target in relative_links(index)}
    records = sorted(p for p in index.parent.glob("[0-9]*.md"))
    missing = [p.name for p in records if p.resolve() not in linked]
    assert records and not missing, f"decision records missing from docs/decisions/index.md: {missing}"


def test_mkdocs_nav_lists_every_page():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = config[config.index("\nnav:"):]
    listed = set(re.findall(r"(?:^|[\s:])([\w./-]+\.md)\s*$", nav, re.MULTILINE))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages - listed == set(), f"docs pages missing from mkdocs.yml's nav: {sorted(pages - listed)}"
    assert listed - pages == set(), f"mkdocs.yml's nav names missing pages: {sorted(listed - pages)}"


# --------------------------------------------------------------------------- 5: the README's length

def test_readme_stays_short():
    length = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert length < README_LIMIT, f"README.md is {length} characters, the limit {README_LIMIT}: move reference to docs/"
