"""The `aggdec` command line, run as a user runs it: in a subprocess."""

from __future__ import annotations

import shutil
import json
import subprocess
import sys

import pytest


def aggdec(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aggdec", *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def assert_one_clean_error(result: subprocess.CompletedProcess, needle: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("aggdec: error:") and needle in lines[0], result.stderr


@pytest.fixture(scope="module")
def cli_bundle(random_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "bundle"
    result = aggdec("export", str(random_checkpoint("t5")), str(out), "--top-k", "4", "--max-source-len", "40")
    assert result.returncode == 0, result.stderr
    assert "[1/5]" in result.stderr and "[5/5]" in result.stderr  # progress per stage
    return out


def test_generate_keeps_one_line_per_input_and_reports_bad_lines(cli_bundle, tmp_path):
    too_long = " ".join(["w3"] * 60)
    lines = ["w1 w2 w3", "", "w5 w6 w7 w8", too_long, "w9"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    greedy = aggdec("generate", str(cli_bundle), "--input", str(source), "--max-new-tokens", "20")
    iad = aggdec("generate", str(cli_bundle), "--mode", "iad", "--input", str(source), "--max-new-tokens", "20",
                 "--stats")
    for result in (greedy, iad):
        assert result.returncode == 1  # a line was refused
        assert "Traceback" not in result.stderr
        outputs = result.stdout.split("\n")[:-1]
        assert len(outputs) == len(lines)
        assert outputs[1] == "" and outputs[3] == ""
        # the blank line is a paragraph break, answered by a blank line without a message
        assert "aggdec: line 2:" not in result.stderr and "aggdec: line 4:" in result.stderr
        assert "at most 40" in result.stderr
    assert greedy.stdout == iad.stdout
    assert "tokens/iteration" in iad.stderr and "outside" in iad.stderr


def test_generate_reads_stdin(cli_bundle):
    result = aggdec("generate", str(cli_bundle), "--max-new-tokens", "8", stdin="w1 w2\nw3\n")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2


def test_modified_bundle_is_one_error_line(cli_bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(cli_bundle, copy)
    with open(copy / "encoder.onnx", "ab") as handle:
        handle.write(b"tampered")
    assert_one_clean_error(aggdec("generate", str(copy), stdin="w1\n"), "encoder.onnx")


def test_cuda_without_gpu_is_one_error_line(cli_bundle):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has the CUDA provider")
    assert_one_clean_error(aggdec("generate", str(cli_bundle), "--device", "cuda", stdin="w1\n"), "cuda")


def test_unknown_family_is_one_error_line(tmp_path):
    from transformers import FSMTConfig

    FSMTConfig(langs=["en", "de"], src_vocab_size=50, tgt_vocab_size=50, d_model=16, encoder_layers=1,
               decoder_layers=1).save_pretrained(tmp_path / "ckpt")
    assert_one_clean_error(aggdec("export", str(tmp_path / "ckpt"), str(tmp_path / "out")), "supported")


def test_export_refuses_to_overwrite(cli_bundle):
    assert_one_clean_error(aggdec("export", "anything", str(cli_bundle)), "--force")


def test_missing_input_file(cli_bundle, tmp_path):
    assert_one_clean_error(aggdec("generate", str(cli_bundle), "--input", str(tmp_path / "nope.txt")), "nope.txt")


def test_gad_modes_through_the_cli(random_checkpoint, tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    from aggdec.export.drafter import new_drafter_from_verifier

    checkpoint = random_checkpoint("marian")
    new_drafter_from_verifier(AutoModelForSeq2SeqLM.from_pretrained(checkpoint), k=6).save(tmp_path / "drafter")
    exported = aggdec("export", str(checkpoint), str(tmp_path / "bundle"), "--drafter", str(tmp_path / "drafter"))
    assert exported.returncode == 0, exported.stderr
    assert "drafter" in exported.stderr
    lines = "w1 w2 w3 w4\nw5 w6\nw7\n"
    greedy = aggdec("generate", str(tmp_path / "bundle"), "--max-new-tokens", "16", stdin=lines)
    gad = aggdec("generate", str(tmp_path / "bundle"), "--mode", "gad", "--max-new-tokens", "16", "--stats",
                 stdin=lines)
    relaxed = aggdec("generate", str(tmp_path / "bundle"), "--mode", "gad++", "--beta", "3", "--tau", "1",
                     "--max-new-tokens", "16", stdin=lines)
    assert greedy.returncode == gad.returncode == relaxed.returncode == 0, gad.stderr + relaxed.stderr
    assert gad.stdout == greedy.stdout
    assert len(relaxed.stdout.splitlines()) == 3
    assert_one_clean_error(aggdec("generate", str(tmp_path / "bundle"), "--mode", "gad++", "--beta", "99",
                                  stdin=lines), "beta")
    assert_one_clean_error(aggdec("generate", str(tmp_path / "bundle"), "--mode", "gad", "--draft-k", "999",
                                  stdin=lines), "draft_k")


def test_train_drafter_refuses_bad_arguments_in_one_line(random_checkpoint, tmp_path):
    checkpoint = str(random_checkpoint("marian"))
    sources = tmp_path / "sources.txt"
    sources.write_text("w1 w2\nw3\n")
    assert_one_clean_error(aggdec("train-drafter", checkpoint, "--sources", str(tmp_path / "nope.txt"),
                                  "--out", str(tmp_path / "d")), "nope.txt")
    assert_one_clean_error(aggdec("train-drafter", checkpoint, "--sources", str(sources), "--out",
                                  str(tmp_path / "d"), "--k", "0"), "k")
    assert_one_clean_error(aggdec("train-drafter", checkpoint, "--sources", str(sources), "--out",
                                  str(tmp_path / "d"), "--ffn-dim", "-1"), "ffn_dim")


def test_train_drafter_then_export_and_gad(random_checkpoint, tmp_path):
    checkpoint = str(random_checkpoint("t5"))
    sources = tmp_path / "sources.txt"
    sources.write_text("\n".join(f"w{i} w{i + 1} w{i + 2}" for i in range(40)) + "\n")
    trained = aggdec("train-drafter", checkpoint, "--sources", str(sources), "--out", str(tmp_path / "drafter"),
                     "--k", "4", "--steps", "4", "--heldout", "5", "--batch-tokens", "256", "--no-speed")
    assert trained.returncode == 0, trained.stderr
    assert "Tok." in trained.stderr and "on the runtime" not in trained.stderr
    resumed = aggdec("train-drafter", checkpoint, "--sources", str(sources), "--out", str(tmp_path / "drafter"),
                     "--k", "4", "--steps", "6", "--heldout", "5", "--batch-tokens", "256", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    exported = aggdec("export", checkpoint, str(tmp_path / "bundle"), "--drafter", str(tmp_path / "drafter"))
    assert exported.returncode == 0, exported.stderr
    lines = "w1 w2 w3\nw7 w8\n"
    gad = aggdec("generate", str(tmp_path / "bundle"), "--mode", "gad", "--max-new-tokens", "12", stdin=lines)
    greedy = aggdec("generate", str(tmp_path / "bundle"), "--max-new-tokens", "12", stdin=lines)
    assert gad.returncode == 0 and gad.stdout == greedy.stdout


def test_tf32_without_cuda_is_one_error_line(cli_bundle):
    assert_one_clean_error(aggdec("generate", str(cli_bundle), "--tf32", stdin="w1\n"), "tf32 applies to device 'cuda'")


def test_stats_keep_load_and_warm_up_out_of_the_decoding_time(cli_bundle):
    result = aggdec("generate", str(cli_bundle), "--mode", "iad", "--max-new-tokens", "12", "--stats",
                    stdin="w1 w2 w3\nw4 w5\n")
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("aggdec: iad:")]
    assert "decoding " in line and "not counted: load " in line and "warm-up " in line
    warm = float(line.split("warm-up ")[1].rstrip("s"))
    assert warm > 0  # the sessions really ran before the timed part


def test_generate_with_beams_in_jsonl_equals_the_api(cli_bundle, tmp_path):
    """Two beams: the bundle has top-k 4."""
    from aggdec.runtime.generator import Generator

    texts = ["w1 w2 w3", "w4 w5", "w6"]
    source = tmp_path / "in.txt"
    source.write_text("".join(t + "\n" for t in texts))
    result = aggdec("generate", str(cli_bundle), "--input", str(source), "--num-beams", "2", "--length-penalty",
                    "0.6", "--early-stopping", "never", "--num-return-sequences", "2", "--format", "jsonl",
                    "--max-new-tokens", "10")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    want = Generator(cli_bundle).generate(texts, num_beams=2, length_penalty=0.6, early_stopping="never",
                                          num_return_sequences=2, max_new_tokens=10)
    assert [r["ids"] for r in records] == [list(w.ids) for w in want]
    assert [[(s["ids"], s["score"]) for s in r["sequences"]] for r in records] == \
        [[(list(h.ids), h.score) for h in w.sequences] for w in want]
    assert [r["score"] for r in records] == [w.score for w in want]
    text = aggdec("generate", str(cli_bundle), "--input", str(source), "--num-beams", "2", "--max-new-tokens", "10")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == [w.text for w in Generator(cli_bundle).generate(texts, num_beams=2,
                                                                                         max_new_tokens=10)]


@pytest.mark.parametrize("args, needle", [
    (["--num-beams", "2", "--num-return-sequences", "3"], "num_return_sequences (3) must be at most num_beams (2)"),
    (["--length-penalty", "2"], "length_penalty applies to beam search only"),
    (["--num-beams", "2", "--num-return-sequences", "2"], "needs --format jsonl"),
    (["--num-beams", "3"], "re-export with --top-k 6"),  # the bundle has top-k 4
    (["--num-beams", "2", "--mode", "gad"], "mode 'gad' needs a drafter"),  # the bundle has none
    (["--num-beams", "2", "--mode", "gad++"], "num_beams applies to modes 'greedy', 'iad' and 'gad' only"),
])
def test_bad_beam_arguments_are_one_error_line(cli_bundle, args, needle):
    assert_one_clean_error(aggdec("generate", str(cli_bundle), *args, stdin="w1\n"), needle)


@pytest.mark.parametrize("args, needle", [
    (["--num-beams", "0"], "argument --num-beams: must be at least 1, got 0"),
    (["--num-beams", "2", "--early-stopping", "maybe"], "argument --early-stopping: expected one of true, false, never"),
])
def test_malformed_beam_arguments_get_argparses_usage_error(cli_bundle, args, needle):
    result = aggdec("generate", str(cli_bundle), *args, stdin="w1\n")
    assert result.returncode == 2 and needle in result.stderr and "Traceback" not in result.stderr
    # one `aggdec: error:` line, as the docs promise for every option error (argparse printed its usage block)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("aggdec: error: aggdec generate: argument"), result.stderr


def test_generate_with_static_shapes_gives_the_same_lines(cli_bundle):
    lines = "w1 w2 w3\nw4 w5\nw6\n"
    plain = aggdec("generate", str(cli_bundle), "--mode", "iad", "--max-new-tokens", "12", stdin=lines)
    static = aggdec("generate", str(cli_bundle), "--mode", "iad", "--max-new-tokens", "12", "--static-shapes",
                    stdin=lines)
    assert plain.returncode == static.returncode == 0, plain.stderr + static.stderr
    assert static.stdout == plain.stdout and len(static.stdout.splitlines()) == 3


def test_generate_refuses_cuda_graphs_where_they_cannot_run(cli_bundle):
    result = aggdec("generate", str(cli_bundle), "--static-shapes", "--cuda-graphs", stdin="w1\n")
    assert_one_clean_error(result, "cuda_graphs needs device 'cuda'")
