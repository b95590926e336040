"""benchmarks/marian_corpus.py's text handling, on small files written here (the Debian packages
it reads are not needed): fortune entries and the WEB's OSIS verses become plain sentences."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "marian_corpus.py"


@pytest.fixture(scope="module")
def corpus():
    spec = importlib.util.spec_from_file_location("marian_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fortunes_are_joined_and_filtered(corpus, tmp_path):
    path = tmp_path / "cookies"
    path.write_text("Porque a galinha atravessa a rua?\nPorque o upstream mandou!\n    -- Alguém (hmh)\n%\n"
                    "Tab-indented attributions leave the entry out.\n\t-- Alguém\n%\n"
                    "Short.\n%\n"
                    "A table:\n\tcol1\tcol2\n%\n"
                    "Two lines of plain\ntext , with a stray space.\n    -- Somebody\n%\n" + "x" * 400 + "\n",
                    encoding="utf-8")
    assert corpus.fortunes(path) == ["Porque a galinha atravessa a rua? Porque o upstream mandou!",
                                     "Two lines of plain text, with a stray space."]


def test_osis_notes_become_spaces_before_the_markup_goes(corpus):
    pytest.importorskip("pysword")
    from pysword.cleaner import OSISCleaner

    verse = ('<w lemma="strong:G3439">only</w> born</q><note placement="foot"><reference type="annotateRef">3:16 '
             '</reference>The phrase “only born” is from the Greek.</note><q marker="" who="Jesus">'
             '<w lemma="strong:G5207">Son</w>, <w>that</w> <w>whoever</w> believes. ')
    assert corpus.tidy(OSISCleaner().clean(corpus.NOTE.sub(" ", verse))) == "only born Son, that whoever believes."
