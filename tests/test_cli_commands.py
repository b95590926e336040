"""The command line's structure: one module per subcommand, `aggdec --version`, and options
built once as DecodeOptions (an option the bundle refuses is one error line, exit 2)."""

from __future__ import annotations

import argparse

import pytest

from aggdec import __version__
from aggdec.cli import COMMANDS, build_parser, main
from tests.runtime.test_gad import K, gad_bundle  # noqa: F401 - a fixture


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"aggdec {__version__}"


def test_every_subcommand_is_a_module_with_its_arguments():
    names = []
    for command in COMMANDS:
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)  # usable on any parser, e.g. a wrapper's own
        assert parser._actions[1:], command.__name__
        commands = argparse.ArgumentParser().add_subparsers(dest="command")
        names.append(command.register(commands).prog.split()[-1])
    assert names == ["export", "quantize", "train-drafter", "generate", "build-engines", "serve", "loadtest", "bench"]
    args = build_parser().parse_args(["generate", "b", "--mode", "gad", "--draft-k", "3"])
    assert args.run is COMMANDS[3].run and (args.mode, args.draft_k) == ("gad", 3)


def test_generate_refuses_options_the_bundle_cannot_honour(gad_bundle, tmp_path, capsys):  # noqa: F811
    source = tmp_path / "in.txt"
    source.write_text("w1 w2 w3\n")
    bundle = gad_bundle("marian")
    capsys.readouterr()  # what making the fixture printed
    for extra, needle in ((["--mode", "gad", "--draft-k", str(K + 1)], f"drafter's k ({K}), got {K + 1}"),
                          (["--mode", "iad", "--beta", "2"], "beta applies to mode 'gad++' only, not 'iad'")):
        assert main(["generate", str(bundle), "--input", str(source), *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1 and needle in captured.err, captured.err
    assert main(["generate", str(bundle), "--input", str(source), "--mode", "gad", "--draft-k",
                 str(K), "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out.count("\n") == 1


@pytest.mark.parametrize("argv", [
    ["export", "", "out"], ["export", "src", ""], ["export", "src", "out", "--drafter", ""],
    ["quantize", "", "out"], ["quantize", "bundle", " "],
    ["train-drafter", "", "--sources", "s.txt", "--out", "o"], ["train-drafter", "src", "--sources", "", "--out", "o"],
    ["train-drafter", "src", "--sources", "s.txt", "--out", ""],
    ["generate", ""], ["generate", "b", "--output", ""], ["serve", ""], ["build-engines", ""],
    ["bench", "", "--checkpoint", "c"], ["bench", "b", "--out", ""], ["bench", "b", "--work", ""],
    ["loadtest", "http://127.0.0.1:1", "--bundle", ""],
])
def test_an_empty_path_argument_is_a_usage_error(argv, capsys, tmp_path, monkeypatch):
    """The file system reads "" as the current directory: `aggdec export "" OUT` exported the
    working directory, and an OUT_DIR of "" ran a whole export before failing to replace "."."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2 and "expected a path, got an empty string" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
