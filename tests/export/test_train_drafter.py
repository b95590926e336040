"""aggdec.export.train_drafter: distillation, argument checks, resume, every family, acceptance."""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aggdec.export.drafter import CONFIG_FILE, WEIGHTS_FILE, Drafter
from aggdec.export.train_drafter import (
    CHECKPOINT_DIR,
    CHECKPOINT_FILE,
    DISTILL_FILE,
    REPORT_FILE,
    TrainOptions,
    check_training_memory,
    run_from_args,
    train_drafter,
)
from aggdec.runtime.errors import ExportError
from tests.support import tiny
from tests.support.fixtures import DRAFTER_K, trained_drafter_dir  # noqa: F401 - the fixture

# Measured: 6.4 tokens per iteration with k = 8 (slot accuracy 0.97) after 600 steps; an untrained
# drafter gets ~1.0.  The margin absorbs changes in the recipe or in torch's numerics.
MIN_TOKENS_PER_ITERATION = 4.0


@pytest.fixture(autouse=True)
def _one_thread():
    # The models are tiny: extra threads only fight whatever else runs on the machine.
    with tiny._torch_threads(1):
        yield


def _sources(path: Path, count: int, seed: int = 0) -> Path:
    rng = random.Random(f"train-drafter-test-{seed}")
    words = tiny.default_words()
    path.write_text("".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "\n"
                            for _ in range(count)))
    return path


def _quick(**overrides) -> TrainOptions:
    """A few-step run on small batches: exercises everything, learns nothing much."""
    settings = dict(k=4, layers=1, steps=2, batch_tokens=200, heldout=3, max_new_tokens=12, warmup_steps=2,
                    speed=False)
    return TrainOptions(**{**settings, **overrides})


# ---------------------------------------------------------------------------------- the trained drafter


def test_trained_drafter_is_accepted_several_tokens_per_iteration(trained_drafter_dir):  # noqa: F811
    report = json.loads((trained_drafter_dir / REPORT_FILE).read_text())
    assert report["options"]["k"] == DRAFTER_K
    assert report["heldout"] == 100
    assert report["tokens_per_iteration"] >= MIN_TOKENS_PER_ITERATION, report
    assert report["tokens_per_iteration"] <= DRAFTER_K + 1  # can never beat k drafts + 1 verifier token
    assert report["slot_accuracy"] > 0.8
    drafter = Drafter.load(trained_drafter_dir)
    assert drafter.config.k == DRAFTER_K and drafter.config.family == "marian"


def test_report_matches_what_the_runtime_accepts(tmp_path, editing_marian_dir, trained_drafter_dir):  # noqa: F811
    """The report simulates greedy GAD against the distilled targets; the exported bundle must agree."""
    from aggdec.export import export_bundle
    from aggdec.runtime.generator import Generator, Strategy

    from aggdec.runtime.decoding.arrivals import Arrivals
    from aggdec.runtime.decoding.common import GREEDY
    from aggdec.runtime.decoding.gad import DrafterDraft

    report = json.loads((trained_drafter_dir / REPORT_FILE).read_text())
    export_bundle(editing_marian_dir, tmp_path / "bundle", drafter_dir=trained_drafter_dir, progress=None)
    heldout = (trained_drafter_dir.parent / "sources.txt").read_text().splitlines()[-report["heldout"]:]
    # what the report simulates: the trained (float) drafter, all k of its drafts checked every
    # iteration, and no repetition drafts (generate's draft lengths follow measured timings, the
    # CPU's default drafter is its int8 copy, and a looping output drafts its repetition: all
    # change the counts, never the outputs)
    generator = Generator(tmp_path / "bundle", threads=1, int8_drafter=False)
    drafts = DrafterDraft(generator.drafter, generator.manifest.pad_token_id, adaptive=False, repeats=False)
    done = list(generator._decode(Arrivals.of(generator.encode(heldout)), generator._limits(None),
                                  Strategy(drafts, GREEDY), 16))
    accepted = sum(sum(d.trace.accepted) for d in done)
    iterations = sum(len(d.trace.accepted) for d in done)
    assert (accepted, iterations) == (report["target_tokens"], report["iterations"])


# ---------------------------------------------------------------------------------- glancing


def test_glancing_reveals_a_share_of_the_wrong_slots():
    from aggdec.export.drafter import DrafterConfig, drafter_inputs
    from aggdec.export.train_drafter import _IGNORE, _glance

    torch.manual_seed(0)
    config = DrafterConfig(vocab_size=20, d_model=16, num_heads=2, head_dim=8, ffn_dim=32, layers=1, k=6,
                           max_positions=32)
    drafter = Drafter(config)
    ids, mask, slot_start, offset = drafter_inputs([[0, 5, 6], [0]], config.k, config.mask_token_id, 0)
    labels = torch.tensor([[7, 8, 9, 10, 11, _IGNORE], [3, 4, 5, 6, 7, 8]])
    real = labels != _IGNORE
    memory, memory_mask = torch.randn(2, 4, 16), torch.ones(2, 4, dtype=torch.int64)
    wrong = (drafter.slot_logits(ids, mask, slot_start, memory, memory_mask, offset).argmax(-1) != labels) & real
    glanced, left = _glance(drafter, ids, mask, slot_start, offset, memory, memory_mask, labels, real, 1.0,
                            torch.Generator().manual_seed(0))
    revealed = (left == _IGNORE) & real
    # ratio 1: as many slots revealed as were wrong, all of them real; they become inputs, not labels
    assert revealed.sum(1).tolist() == wrong.sum(1).tolist()
    for row in range(2):
        slots = slice(int(slot_start[row]), int(slot_start[row]) + config.k)
        assert torch.equal(glanced[row, slots][revealed[row]], labels[row][revealed[row]])
        assert (glanced[row, slots][~revealed[row]] == config.mask_token_id).all()
    assert torch.equal(glanced[:, :1], ids[:, :1])  # the prefix is untouched
    none, kept = _glance(drafter, ids, mask, slot_start, offset, memory, memory_mask, labels, real, 0.0,
                         torch.Generator().manual_seed(0))
    assert torch.equal(none, ids) and torch.equal(kept, labels)


# ---------------------------------------------------------------------------------- argument checks


@pytest.fixture
def fake_checkpoint(tmp_path) -> Path:
    # Arguments are checked before any model is loaded, so a config.json is all the checks see.
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text("{}")
    return src


@pytest.mark.parametrize(("options", "message"), [
    (TrainOptions(k=0), "k must be at least 1"),
    (TrainOptions(layers=0), "layers must be at least 1"),
    (TrainOptions(encoder_layers=-1), "encoder_layers must be 0"),
    (TrainOptions(steps=10, epochs=2), "either steps or epochs, not both"),
    (TrainOptions(steps=0), "steps must be at least 1"),
    (TrainOptions(epochs=0), "epochs must be at least 1"),
    (TrainOptions(glancing=1.5), "glancing must be between"),
    (TrainOptions(positions="left"), "positions must be one of output, source"),
    (TrainOptions(batch_tokens=0), "batch_tokens must be at least 1"),
    # the drafter is built from these before training: a billion-row position table, a billion layers
    (TrainOptions(k=10**9), "k must be at most 65536"),
    (TrainOptions(layers=10**9), "layers must be at most 512"),
    (TrainOptions(ffn_dim=10**12), "ffn_dim must be at most 1048576"),
    (TrainOptions(encoder_layers=10**8), "encoder_layers must be at most 512"),
    # taken, then trained "forever" / refused by export once trained
    (TrainOptions(steps=10**21), "steps must be at most 1,000,000,000"),
    (TrainOptions(epochs=10**7), "epochs must be at most 1,000,000"),
    (TrainOptions(window=10**11), "window must be 0 .* up to 65536"),
    (TrainOptions(heldout=-5), "heldout must not be negative, got -5"),  # it named warmup_steps, not an option there
    # torch's seed overflowed after the model had loaded (a ValueError traceback)
    (TrainOptions(seed=2**64), "seed must be an integer of at most 4294967295 either way"),
    (TrainOptions(seed=-2**63), "seed must be an integer of at most 4294967295 either way"),
])
def test_bad_options_are_refused(tmp_path, fake_checkpoint, options, message):
    with pytest.raises(ExportError, match=message):
        train_drafter(fake_checkpoint, _sources(tmp_path / "s.txt", 5), tmp_path / "out", options, progress=False)


def test_bad_paths_are_refused(tmp_path, fake_checkpoint):
    sources = _sources(tmp_path / "s.txt", 5)
    with pytest.raises(ExportError, match="does not exist"):
        train_drafter(fake_checkpoint, tmp_path / "missing.txt", tmp_path / "out", progress=False)
    with pytest.raises(ExportError, match="is not a file"):  # it said "does not exist"
        train_drafter(fake_checkpoint, tmp_path, tmp_path / "out", progress=False)
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(ExportError, match="is empty"):
        train_drafter(fake_checkpoint, tmp_path / "empty.txt", tmp_path / "out", progress=False)
    with pytest.raises(ExportError, match="not a checkpoint directory"):
        train_drafter(tmp_path / "nowhere", sources, tmp_path / "out", progress=False)
    with pytest.raises(ExportError, match="nothing to resume"):
        train_drafter(fake_checkpoint, sources, tmp_path / "out", resume=True, progress=False)
    finished = tmp_path / "finished"
    finished.mkdir()
    (finished / CONFIG_FILE).write_text("{}")
    with pytest.raises(ExportError, match="pass --resume .* or choose another --out"):
        train_drafter(fake_checkpoint, sources, finished, progress=False)
    for inside in (fake_checkpoint, fake_checkpoint / "drafter"):  # it wrote into the checkpoint folder
        with pytest.raises(ExportError, match="the checkpoint directory .*; write the drafter somewhere else"):
            train_drafter(fake_checkpoint, sources, inside, progress=False)
    assert not (fake_checkpoint / "drafter").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_without_a_gpu_is_refused(tmp_path, fake_checkpoint):
    with pytest.raises(ExportError, match="no CUDA GPU"):
        train_drafter(fake_checkpoint, _sources(tmp_path / "s.txt", 5), tmp_path / "out",
                      TrainOptions(device="cuda"), progress=False)


def test_too_many_heldout_sources_are_refused(tmp_path, random_checkpoint):
    with pytest.raises(ExportError, match="smaller --heldout"):
        train_drafter(random_checkpoint("t5"), _sources(tmp_path / "s.txt", 5), tmp_path / "out",
                      TrainOptions(heldout=5), progress=False)


def test_a_checkpoint_whose_weights_lack_a_tensor_is_refused_before_distilling(tmp_path, random_checkpoint):
    """As `aggdec export` refuses it: transformers would train against a randomly filled tensor."""
    import shutil

    from safetensors.torch import load_file, save_file

    source = tmp_path / "ckpt"
    shutil.copytree(random_checkpoint("t5"), source)
    (weights,) = source.glob("*.safetensors")
    tensors = load_file(weights)
    del tensors[next(key for key in tensors if "decoder" in key)]
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ExportError, match=r"lack 1 tensor\(s\) its config.json describes"):
        train_drafter(source, _sources(tmp_path / "s.txt", 5), tmp_path / "out", TrainOptions(heldout=1),
                      progress=False)
    assert not (tmp_path / "out" / "distill.jsonl").exists()


def test_a_drafter_too_large_to_train_here_is_refused_before_distilling(tmp_path, random_checkpoint):
    """--k 65536 distilled, then asked the allocator for 64 GiB of attention maps: a lower bound
    of training's memory is checked against this machine's once the verifier has loaded."""
    options = TrainOptions(k=65536, layers=512, heldout=1)  # 512 x heads x 65537^2 floats: terabytes
    with pytest.raises(ExportError, match="training this drafter needs at least .* GiB .* more than this machine"):
        train_drafter(random_checkpoint("t5"), _sources(tmp_path / "s.txt", 5), tmp_path / "out", options,
                      progress=False)
    assert not (tmp_path / "out" / "distill.jsonl").exists()
    check_training_memory(TrainOptions(), 512, 8, 2048, torch.device("cpu"))  # a real drafter's size fits


def test_sources_that_are_not_utf8_are_one_error_naming_the_line(tmp_path, random_checkpoint):
    """It was a UnicodeDecodeError traceback."""
    sources = tmp_path / "s.txt"
    sources.write_bytes(b"w1 w2\nw3 \xff\n")
    with pytest.raises(ExportError, match=re.escape("line 2: not valid UTF-8 (byte 0xff at offset 9 of the file)")):
        train_drafter(random_checkpoint("t5"), sources, tmp_path / "out", TrainOptions(), progress=False)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------- resume


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / WEIGHTS_FILE))


def test_resume_continues_to_the_same_weights_as_a_straight_run(tmp_path, random_checkpoint):
    src, sources = random_checkpoint("t5"), _sources(tmp_path / "s.txt", 40)
    # ~6 batches an epoch, so 6 steps cross an epoch boundary; glancing exercises the seeded reveals.
    options = _quick(steps=6, checkpoint_every=3, glancing=0.5)
    straight = train_drafter(src, sources, tmp_path / "straight", options, progress=False)

    halves = tmp_path / "halves"
    first = train_drafter(src, sources, halves, _quick(steps=3, checkpoint_every=3, glancing=0.5), progress=False)
    assert first["steps"] == 3
    distilled = (halves / DISTILL_FILE).stat().st_mtime_ns
    second = train_drafter(src, sources, halves, options, resume=True, progress=False)
    assert (second["steps"], second["resumed_from_step"]) == (6, 3)
    assert (halves / DISTILL_FILE).stat().st_mtime_ns == distilled, "the distilled targets were regenerated"
    state = torch.load(halves / CHECKPOINT_DIR / CHECKPOINT_FILE, weights_only=True)
    assert state["position"]["step"] == 6

    expected, got = _weights(tmp_path / "straight"), _weights(halves)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[name], got[name]) for name in expected), "resumed weights differ"
    assert second["tokens_per_iteration"] == straight["tokens_per_iteration"]


def _damaged_checkpoint(path: Path, kind: str) -> None:
    position = {"step": 1, "epoch": 0, "index": 1}
    whole = {"drafter": {}, "optimizer": {}, "position": position, "torch_rng": torch.get_rng_state(),
             "options": {}}
    if kind == "random bytes":
        path.write_bytes(random.Random(0).randbytes(3000))
    elif kind == "truncated":
        torch.save(whole, path)
        path.write_bytes(path.read_bytes()[:400])
    elif kind == "a list":
        torch.save([1, 2, 3], path)
    elif kind == "no options":
        torch.save({key: value for key, value in whole.items() if key != "options"}, path)
    elif kind == "options a list":
        torch.save({**whole, "options": [1]}, path)
    elif kind == "position negative":
        torch.save({**whole, "position": {**position, "step": -4}}, path)


@pytest.mark.parametrize("kind", ["random bytes", "truncated", "a list", "no options", "options a list",
                                  "position negative"])
def test_a_damaged_checkpoint_is_refused_before_training(tmp_path, fake_checkpoint, kind):
    """Each was a traceback (UnpicklingError, RuntimeError, TypeError, AttributeError, KeyError)
    or, for the position, a run from a step that cannot be."""
    out = tmp_path / "out"
    (out / CHECKPOINT_DIR).mkdir(parents=True)
    _damaged_checkpoint(out / CHECKPOINT_DIR / CHECKPOINT_FILE, kind)
    with pytest.raises(ExportError, match="is not a training checkpoint this aggdec wrote .*run without --resume"):
        train_drafter(fake_checkpoint, _sources(tmp_path / "s.txt", 5), out, TrainOptions(heldout=1), resume=True,
                      progress=False)


def test_a_checkpoint_of_another_drafter_is_refused_in_one_error(tmp_path, random_checkpoint):
    """Its tensors do not fit the drafter the options build: load_state_dict's RuntimeError was a traceback."""
    src, sources = random_checkpoint("t5"), _sources(tmp_path / "s.txt", 12)
    train_drafter(src, sources, tmp_path / "out", _quick(steps=1), progress=False)
    path = tmp_path / "out" / CHECKPOINT_DIR / CHECKPOINT_FILE
    state = torch.load(path, weights_only=True)
    name = next(iter(state["drafter"]))
    state["drafter"][name] = torch.zeros(3, 3)
    torch.save(state, path)
    with pytest.raises(ExportError, match="does not fit this drafter"):
        train_drafter(src, sources, tmp_path / "out", _quick(steps=2), resume=True, progress=False)


def test_resume_refuses_changed_settings(tmp_path, random_checkpoint):
    src, sources = random_checkpoint("t5"), _sources(tmp_path / "s.txt", 12)
    train_drafter(src, sources, tmp_path / "out", _quick(steps=1), progress=False)
    with pytest.raises(ExportError, match=r"different settings \(k 4 -> 5\)"):
        train_drafter(src, sources, tmp_path / "out", _quick(steps=2, k=5), resume=True, progress=False)


# ---------------------------------------------------------------------------------- every family


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_a_few_steps_train_for_every_family(tmp_path, random_checkpoint, family):
    out = tmp_path / "drafter"
    report = train_drafter(random_checkpoint(family), _sources(tmp_path / "s.txt", 16), out,
                           _quick(glancing=0.3), progress=False)
    assert report["steps"] == 2 and report["heldout"] == 3
    assert 1.0 <= report["tokens_per_iteration"] <= 5.0  # k + 1 at most
    assert json.loads((out / REPORT_FILE).read_text())["steps"] == 2
    drafter = Drafter.load(out)
    assert (drafter.config.k, drafter.config.layers) == (4, 1)
    assert drafter.config.family == {"mt5": "t5"}.get(family, family)  # mT5 shares T5's adapter
    header = json.loads((out / DISTILL_FILE).read_text().splitlines()[0])
    assert header["count"] == 16


def test_drafter_only_encoder_layers_train_and_run_once_per_source(tmp_path, random_checkpoint):
    """--encoder-layers: the layers learn (they start as the identity), and the report's runtime
    timing runs them from a real bundle's drafter_source graph."""
    out = tmp_path / "drafter"
    report = train_drafter(random_checkpoint("bart"), _sources(tmp_path / "s.txt", 16), out,
                           _quick(encoder_layers=1, steps=3, speed=True), progress=False)
    drafter = Drafter.load(out)
    assert drafter.config.encoder_layers == 1 and report["options"]["encoder_layers"] == 1
    assert float(drafter.source_layers[0].fc2.weight.detach().abs().max()) > 0  # trained away from the identity
    assert report["runtime"]["sentences"] == 3 and report["runtime"]["gad_seconds"] > 0


def test_source_positions_train_and_reach_the_bundle(tmp_path, random_checkpoint):
    """--positions source: saved in the drafter's config, carried to the manifest, and the report's
    runtime timing decodes with it (tests/runtime/test_source_positions.py: the positions agree)."""
    from aggdec.export import export_bundle

    src, out = random_checkpoint("marian"), tmp_path / "drafter"
    report = train_drafter(src, _sources(tmp_path / "s.txt", 16), out, _quick(positions="source", steps=3, speed=True),
                           progress=False)
    assert Drafter.load(out).config.positions == "source" and report["options"]["positions"] == "source"
    assert report["runtime"]["sentences"] == 3 and report["runtime"]["gad_seconds"] > 0
    export_bundle(src, tmp_path / "bundle", drafter_dir=out, progress=None)
    assert json.loads((tmp_path / "bundle" / "manifest.json").read_text())["draft_positions"] == "source"


@pytest.mark.parametrize(("text", "needle"), [
    ("[1]", "must hold a JSON object, not list"),
    ("{not json", "is not a readable drafter config"),
    ('{"vocab_size": 3}', "missing keys: ['d_model', 'ffn_dim', 'head_dim', 'num_heads']"),
    ('{"vocab_size": 3, "d_model": 4, "num_heads": 1, "head_dim": 4, "ffn_dim": 8, "extra": 1}',
     "unknown keys: ['extra']"),
    ('{"vocab_size": 3, "d_model": 4, "num_heads": 1, "head_dim": 4, "ffn_dim": 8, "k": -2}', "k = -2"),
    ('{"vocab_size": 3, "d_model": 4, "num_heads": 1, "head_dim": 4, "ffn_dim": 8, "layers": true}', "layers = True"),
    ('{"vocab_size": 3, "d_model": 4, "num_heads": 1, "head_dim": 4, "ffn_dim": 8, "family": 7}', "family = 7"),
    ('{"vocab_size": 3, "d_model": 4, "num_heads": 1, "head_dim": 4, "ffn_dim": 8, "positions": "left"}',
     "positions = 'left' is not one of ['output', 'source']"),
    # built before a weight is read: a hundred million layers, a feed-forward width of 2**30
    ('{"vocab_size": 3, "d_model": 4, "num_heads": 1, "head_dim": 4, "ffn_dim": 8, "layers": 100000000}',
     "layers = 100000000 is above the largest a drafter may have (512)"),
    ('{"vocab_size": 3, "d_model": 4, "num_heads": 1, "head_dim": 4, "ffn_dim": 1073741824}',
     "ffn_dim = 1073741824 is above the largest a drafter may have (1048576)"),
])
def test_a_malformed_drafter_config_is_named(tmp_path, text, needle):
    from aggdec.export.drafter import DrafterConfig

    (tmp_path / CONFIG_FILE).write_text(text)
    with pytest.raises(ExportError, match=re.escape(needle)):
        DrafterConfig.load(tmp_path)


def _small_drafter(directory: Path) -> None:
    from aggdec.export.drafter import DrafterConfig

    Drafter(DrafterConfig(vocab_size=12, d_model=8, num_heads=2, head_dim=4, ffn_dim=16, layers=1, k=3,
                          max_positions=40)).save(directory)


@pytest.mark.parametrize(("edit", "needle"), [
    ({"ffn_dim": 4096}, "tensor 'layers.0.fc1.bias' is [16] in the file, [4096] by the config"),
    ({"layers": 300}, "tensor 'layers.1.cross_attn.k.bias' is missing in the file"),
    ({"max_positions": 2**17}, "tensor 'positions.weight' is [40, 8] in the file, [131072, 8] by the config"),
])
def test_a_drafter_config_that_does_not_match_its_weights_is_refused_before_building(tmp_path, edit, needle):
    """A drafter.json edited up (or another drafter's) was built for real first (300 layers of
    that width, a position table of 2**17 rows), then refused by load_state_dict as a traceback."""
    _small_drafter(tmp_path)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**config, **edit}))
    with pytest.raises(ExportError, match=re.escape(needle)):
        Drafter.load(tmp_path)


@pytest.mark.parametrize("damage", ["random bytes", "truncated"])
def test_damaged_drafter_weights_are_one_error(tmp_path, damage):
    _small_drafter(tmp_path)
    weights = tmp_path / WEIGHTS_FILE
    data = weights.read_bytes()
    weights.write_bytes(random.Random(0).randbytes(4096) if damage == "random bytes" else data[: len(data) // 2])
    with pytest.raises(ExportError, match="drafter.safetensors"):
        Drafter.load(tmp_path)


def test_run_from_args_trains_one_epoch_by_default(tmp_path, random_checkpoint, capsys):
    args = argparse.Namespace(
        src=str(random_checkpoint("marian")), sources=str(_sources(tmp_path / "s.txt", 10)),
        out=str(tmp_path / "out"), k=3, layers=1, steps=None, epochs=None, batch_tokens=4096, resume=False,
        seed=1, glancing=0.0, heldout=2, device="cpu",
    )
    assert run_from_args(args) == 0
    report = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert report["steps"] == 1  # 8 training sources fit one 4096-token batch: one epoch is one step
    assert report["options"]["seed"] == 1
    err = capsys.readouterr().err
    assert "Tok." in err
    # by default, GAD is timed against greedy on the held-out sources by the runtime, on a real bundle
    speed = report["runtime"]
    assert speed["sentences"] == 2 and speed["drafter_graph"] == "drafter_int8"
    assert speed["greedy_seconds"] > 0 and speed["gad_seconds"] > 0
    assert speed["speedup"] == pytest.approx(speed["greedy_seconds"] / speed["gad_seconds"], rel=1e-2)
    assert 1.0 <= speed["gad_tokens_per_call"] <= 4.0  # k + 1 at most
    assert speed["verifier_call_ms"] > 0 and speed["drafter_call_ms"] > 0
    assert "on the runtime (CPU, 1 thread, batch 1, 2 held-out sources): GAD" in err
