"""Configurations of real checkpoints, as tiny random models: exported and decoded exactly, or refused.

For each variant a tiny random model is built with the architectural flags (and, where it
matters, the generation config) of a real checkpoint users deploy, saved with
``save_pretrained``, exported with ``aggdec.export.export_bundle`` and checked:

- greedy == transformers' ``generate(do_sample=False, num_beams=1)`` (fp32, one text at a time,
  with the checkpoint's own generation config, as a user's call would have it) on random texts,
  at batch 1 and 8, IO binding on and off;
- IAD == greedy at batch 1 and 8;
- the int8 bundle (``aggdec quantize``): IAD == its own greedy;
- beam 4 == transformers' beam 4 (tokens; transformers one text at a time, aggdec batch 8),
  with the generation config's length_penalty and early_stopping passed to both;

or, for a variant aggdec does not support, that the export raises one AggdecError whose one
line names the unsupported thing, and writes nothing (no OUT_DIR, no temporary directory).

    python benchmarks/config_sweep.py [--only NAME ...] [--texts 20] [--max-new 24] [--out DIR]

Writes ``results.json`` and ``table.md`` under ``--out``. Needs the [export] extra; nothing is
downloaded (the flags are those of the named checkpoints' configs, written down here).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.support (the tokenizer builders the tests use)

EXACT, REFUSED = "exact", "refused"


@dataclass
class Variant:
    name: str
    family: str  # tests/support/tiny.py family of the tokenizer (and, for supported ones, the model)
    what: str  # the real checkpoint and the flags taken from it
    config: dict[str, Any] = field(default_factory=dict)  # config overrides
    generation: dict[str, Any] = field(default_factory=dict)  # generation_config.json settings
    expect: str = EXACT
    build: Callable[[Path], None] | None = None  # a model of another architecture (unsupported ones)
    beams: bool = True
    max_new: int | None = None  # this variant's own limit of new tokens (default: --max-new)
    long_text: bool = False  # also check that a text past the position limit is refused clearly
    refusal_words: tuple[str, ...] = ()  # words the refusal must contain
    extra_specials: tuple[str, ...] = ()  # special tokens added to the tokenizer (mBART-50's language codes)
    export_options: dict[str, Any] = field(default_factory=dict)  # export_bundle keywords
    # generate() keywords of the transformers reference (what the export options make aggdec do)
    reference_options: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ building


def _config(family: str, tokenizer, overrides: dict[str, Any]):
    from tests.support import tiny

    config_cls, _ = tiny._MODEL_CLASSES[family]
    is_t5 = family in ("t5", "mt5")
    kwargs = {**tiny._NO_DROPOUT["t5-like" if is_t5 else "bart-like"], **tiny._ARCH_DEFAULTS[family],
              **tiny._special_ids(family, tokenizer), "vocab_size": len(tokenizer)}
    if family == "marian":
        kwargs.update(decoder_vocab_size=len(tokenizer), share_encoder_decoder_embeddings=True)
    kwargs.update(overrides)
    return config_cls(**kwargs)


def build_supported(variant: Variant, out: Path, seed: int = 0, calibrate: bool = True) -> None:
    """A tiny random model of a supported family, its EOS calibrated as tests/support/tiny.py does
    (so outputs have varied lengths), with ``variant.generation`` in its generation config."""
    import torch
    from transformers import GenerationConfig

    from tests.support import tiny

    family = variant.family
    words = tiny.default_words()
    tokenizer = tiny.build_tokenizer(family, words)
    if variant.extra_specials:
        tokenizer.add_special_tokens({"additional_special_tokens": list(variant.extra_specials)})
    config = _config(family, tokenizer, variant.config)
    _, model_cls = tiny._MODEL_CLASSES[family]
    # a short position table: calibrate on texts and outputs that fit it
    positions = int(variant.config.get("max_position_embeddings", 128))
    texts = tiny._random_sources(words, 48, random.Random(f"calibrate-{variant.name}"), hi=min(20, positions // 2))
    with tiny._torch_threads(1), tiny._seeded(seed):
        model = model_cls(config).eval()
        if family == "mt5" or (family == "t5" and variant.config.get("tie_word_embeddings") is False):
            tiny._untie_output_embeddings(model)
        model.generation_config = tiny._neutral_generation_config(config)
        if family != "t5" and family != "mt5":  # BART-like configs force EOS at the limit by default
            model.generation_config.forced_eos_token_id = getattr(config, "forced_eos_token_id", None)
        if calibrate:  # a model that is to be refused needs no sensible outputs (and may not run at all)
            tiny._sharpen(model, family)
            tiny._calibrate_eos(model, tokenizer, texts, max_new_tokens=min(40, positions - 2))
    generation = {name: tokenizer.convert_tokens_to_ids(value) if isinstance(value, str) else value
                  for name, value in variant.generation.items()}  # a token's text: its id
    model.generation_config = GenerationConfig(**{**model.generation_config.to_diff_dict(), **generation})
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if family == "mt5" or (family == "t5" and variant.config.get("tie_word_embeddings") is False):
        tiny._patch_json(out / "config.json", tie_word_embeddings=False)
    del torch


def _save_other(model_cls_name: str, config_cls_name: str, tokenizer_family: str, **config: Any):
    """A builder of a tiny model of an architecture aggdec does not export."""

    def build(out: Path) -> None:
        import transformers

        from tests.support import tiny

        tokenizer = tiny.build_tokenizer(tokenizer_family, tiny.default_words(40))
        config_obj = getattr(transformers, config_cls_name)(vocab_size=len(tokenizer), **config)
        model = getattr(transformers, model_cls_name)(config_obj)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)

    return build



# bart-large-cnn's generation config (generation_config.json on the Hub)
CNN_GENERATION = dict(forced_bos_token_id=0, forced_eos_token_id=2, no_repeat_ngram_size=3, min_length=56,
                      length_penalty=2.0, num_beams=4, early_stopping=True, max_length=142)

VARIANTS: list[Variant] = [
    # ---------------------------------------------------------------- Marian
    Variant("marian-opus-mt-en-de", "marian",
            "opus-mt-en-de: swish, scale_embedding, shared vocabulary, bad_words_ids [[pad]], num_beams 4",
            config=dict(activation_function="swish", static_position_embeddings=True, normalize_before=False),
            generation=dict(bad_words_ids=[[122]], num_beams=4, max_length=512)),
    Variant("marian-gelu-noscale", "marian", "Marian with gelu, scale_embedding False",
            config=dict(activation_function="gelu", scale_embedding=False)),
    Variant("marian-relu", "marian", "Marian with relu", config=dict(activation_function="relu")),
    Variant("marian-normalize-before", "marian",
            "a legacy config field normalize_before True (MarianMTModel has no pre-norm: transformers ignores it)",
            config=dict(normalize_before=True)),
    Variant("marian-untied-same-vocab", "marian",
            "share_encoder_decoder_embeddings False, decoder_vocab_size == vocab_size (own decoder embeddings)",
            config=dict(share_encoder_decoder_embeddings=False, tie_word_embeddings=False)),
    Variant("marian-asymmetric", "marian",
            "encoder and decoder of different shapes: 1 vs 3 layers, 2 vs 8 heads, FFN 48 vs 96",
            config=dict(encoder_layers=1, decoder_layers=3, encoder_attention_heads=2, decoder_attention_heads=8,
                        encoder_ffn_dim=48, decoder_ffn_dim=96)),
    Variant("marian-separate-vocab", "marian",
            "opus-mt-tc style separate vocabularies: share_encoder_decoder_embeddings False, "
            "decoder_vocab_size != vocab_size",
            config=dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=130), expect=REFUSED,
            refusal_words=("decoder_vocab_size",)),
    Variant("marian-short-positions", "marian", "max_position_embeddings 24: a longer text must be refused",
            config=dict(max_position_embeddings=24), long_text=True),
    # ---------------------------------------------------------------- BART
    Variant("bart-base", "bart",
            "bart-base: gelu, learned positions (offset 2), layernorm_embedding, scale_embedding False, "
            "forced_eos_token_id 2",
            config=dict(activation_function="gelu", scale_embedding=False, forced_eos_token_id=2)),
    Variant("bart-large-cnn-generation", "bart",
            "bart-large-cnn's generation config: forced_bos 0, forced_eos 2, no_repeat_ngram_size 3, "
            "min_length 56, length_penalty 2.0, num_beams 4, early_stopping",
            config=dict(forced_eos_token_id=2), generation=CNN_GENERATION, expect=REFUSED,
            refusal_words=("no_repeat_ngram_size", "min_length")),
    Variant("bart-large-cnn-ignored", "bart",
            "bart-large-cnn's generation config, exported with ignore_generation_settings=True: compared with "
            "transformers' generate at no_repeat_ngram_size 0, min_length 0",
            config=dict(forced_eos_token_id=2), generation=CNN_GENERATION,
            export_options=dict(ignore_generation_settings=True),
            reference_options=dict(no_repeat_ngram_size=0, min_length=0)),
    Variant("bart-several-eos", "bart", "a generation config with eos_token_id [2, 50] (several end tokens)",
            generation=dict(eos_token_id=[2, 50]), expect=REFUSED, refusal_words=("eos_token_id",)),
    Variant("bart-forced-bos-eos", "bart", "bart-large: forced_bos_token_id 0, forced_eos_token_id 2 alone",
            config=dict(forced_eos_token_id=2), generation=dict(forced_bos_token_id=0, forced_eos_token_id=2)),
    Variant("bart-generation-start-token", "bart",
            "a generation config whose decoder_start_token_id (0, <s>) differs from config.json's (2, </s>)",
            generation=dict(decoder_start_token_id=0)),
    Variant("bart-short-positions", "bart", "BART with max_position_embeddings 24", config=dict(
        max_position_embeddings=24), long_text=True),
    # ---------------------------------------------------------------- mBART
    Variant("mbart-large-50", "mbart",
            "mbart-large-50: pre-norm, final layer norms, scale_embedding True, decoder_start = eos, "
            "forced_bos_token_id = a language id, forced_eos 2",
            config=dict(scale_embedding=True, activation_function="gelu", forced_eos_token_id=2),
            extra_specials=("de_DE",), generation=dict(forced_bos_token_id="de_DE", forced_eos_token_id=2)),
    Variant("mbart-forced-bos-ordinary", "mbart",
            "forced_bos_token_id naming an ordinary (not special) token of the tokenizer",
            generation=dict(forced_bos_token_id=50), expect=REFUSED, refusal_words=("forced_bos_token_id",)),
    Variant("mbart-relu-noscale", "mbart", "mBART with relu and scale_embedding False",
            config=dict(scale_embedding=False, activation_function="relu")),
    # ---------------------------------------------------------------- T5
    Variant("t5-small", "t5", "t5-small: relu, tied head with the d_model**-0.5 rescale, 32 buckets, max_distance 128",
            config=dict(feed_forward_proj="relu", relative_attention_num_buckets=32,
                        relative_attention_max_distance=128)),
    Variant("flan-t5", "t5", "flan-t5: gated-gelu (is_gated_act), untied lm_head (no rescale)",
            config=dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    Variant("t5-gated-silu", "t5", "T5 with gated-silu", config=dict(feed_forward_proj="gated-silu")),
    Variant("t5-buckets-16-dist-20", "t5", "relative_attention_num_buckets 16, max_distance 20",
            config=dict(relative_attention_num_buckets=16, relative_attention_max_distance=20)),
    Variant("t5-buckets-8-dist-6", "t5",
            "relative_attention_num_buckets 8, max_distance 6: outputs run four times past max_distance",
            config=dict(relative_attention_num_buckets=8, relative_attention_max_distance=6)),
    Variant("t5-long-outputs", "t5",
            "16 buckets, max_distance 12, outputs of up to 80 tokens: six times past max_distance",
            config=dict(relative_attention_num_buckets=16, relative_attention_max_distance=12), max_new=80),
    Variant("t5-buckets-64-dist-256", "t5", "relative_attention_num_buckets 64, max_distance 256",
            config=dict(relative_attention_num_buckets=64, relative_attention_max_distance=256)),
    Variant("t5-padded-vocab", "t5",
            "t5-small/flan-t5's vocab_size 32128 for a 32100-token tokenizer: 28 embedding rows no token has",
            config=dict(vocab_size=151)),
    Variant("t5-degenerate-buckets", "t5",
            "relative_attention_max_distance 8 = num_buckets 16 // 2: transformers' own bucket formula divides by "
            "log(1) (a configuration no real checkpoint has)",
            config=dict(relative_attention_num_buckets=16, relative_attention_max_distance=8), expect=REFUSED,
            refusal_words=("relative_attention_max_distance",)),
    Variant("mt5-small", "mt5", "mT5: gated-gelu, untied head, 32 buckets / 128",
            config=dict(relative_attention_num_buckets=32, relative_attention_max_distance=128)),
    # ---------------------------------------------------------------- M2M100, NLLB
    Variant("m2m100-418m", "m2m100", "m2m100_418M: relu, scale_embedding True, sinusoidal positions that skip "
            "padding, no logits bias, decoder_start = eos, forced_bos_token_id = a language id",
            config=dict(scale_embedding=True, init_std=0.2), extra_specials=("__de__",),
            generation=dict(forced_bos_token_id="__de__")),
    Variant("nllb-200", "m2m100", "nllb-200-distilled: as M2M100, with the target language given at export "
            "by setting forced_bos_token_id", extra_specials=("fra_Latn",),
            generation=dict(forced_bos_token_id="fra_Latn")),
    Variant("m2m100-short-positions", "m2m100", "M2M100 with max_position_embeddings 24",
            config=dict(max_position_embeddings=24), long_text=True),
    # ---------------------------------------------------------------- Pegasus
    Variant("pegasus-xsum", "pegasus", "pegasus-xsum: pre-norm, relu, scale_embedding True, fixed sinusoids at "
            "offset 0, decoder start = pad, num_beams 8 and length_penalty 0.6 in its generation config",
            config=dict(scale_embedding=True, init_std=0.2), generation=dict(num_beams=8, length_penalty=0.6)),
    Variant("pegasus-gelu-noscale", "pegasus", "Pegasus with gelu and scale_embedding False",
            config=dict(activation_function="gelu")),
    Variant("pegasus-short-positions", "pegasus", "Pegasus with max_position_embeddings 24",
            config=dict(max_position_embeddings=24), long_text=True),
    # ---------------------------------------------------------------- not supported
    Variant("led", "bart", "LED (Longformer encoder-decoder)", expect=REFUSED, refusal_words=("LEDConfig",),
            build=_save_other("LEDForConditionalGeneration", "LEDConfig", "bart", d_model=16, encoder_layers=1,
                              decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                              encoder_ffn_dim=32, decoder_ffn_dim=32, attention_window=4,
                              max_encoder_position_embeddings=64, max_decoder_position_embeddings=64)),
    Variant("prophetnet", "bart", "ProphetNet", expect=REFUSED, refusal_words=("ProphetNetConfig",),
            build=_save_other("ProphetNetForConditionalGeneration", "ProphetNetConfig", "bart", hidden_size=16,
                              encoder_ffn_dim=32, decoder_ffn_dim=32, num_encoder_layers=1, num_decoder_layers=1,
                              num_encoder_attention_heads=2, num_decoder_attention_heads=2, ngram=2)),
    Variant("fsmt", "bart", "FSMT (fairseq WMT19)", expect=REFUSED, refusal_words=("FSMTConfig",),
            build=_save_other("FSMTForConditionalGeneration", "FSMTConfig", "bart", langs=["en", "de"],
                              src_vocab_size=44, tgt_vocab_size=44, d_model=16, encoder_layers=1, decoder_layers=1,
                              encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                              decoder_ffn_dim=32)),
    Variant("gpt2-decoder-only", "bart", "a decoder-only model (GPT-2)", expect=REFUSED,
            refusal_words=("GPT2Config",),
            build=_save_other("GPT2LMHeadModel", "GPT2Config", "bart", n_embd=16, n_layer=1, n_head=2,
                              n_positions=64)),
    Variant("bert-encoder-only", "bart", "an encoder-only model (BERT)", expect=REFUSED,
            refusal_words=("BertConfig",),
            build=_save_other("BertForMaskedLM", "BertConfig", "bart", hidden_size=16, num_hidden_layers=1,
                              num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)),
]


# ------------------------------------------------------------------ checking


def random_texts(seed: int, count: int) -> list[str]:
    from tests.runtime.test_lossless import random_texts as texts

    return texts(seed, count)


def transformers_outputs(checkpoint: Path, texts: list[str], max_new: int, **options: Any) -> list[tuple[int, ...]]:
    """transformers' generate, one text at a time (fp32), ids after the decoder start token."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    outputs = []
    for text in texts:
        with torch.no_grad():
            ids = model.generate(**tokenizer([text], return_tensors="pt"), do_sample=False, max_new_tokens=max_new,
                                 **options)[0].tolist()
        outputs.append(tuple(ids[1:]))
    return outputs


def _strip_pad(ids: tuple[int, ...], pad: int, eos: int) -> tuple[int, ...]:
    """A beam output after its EOS: transformers pads a single text's beam output only where
    num_return_sequences > 1, but trim defensively."""
    ids = list(ids)
    if eos in ids:
        ids = ids[: ids.index(eos) + 1]
    return tuple(ids)


def check_exact(variant: Variant, work: Path, texts: list[str], max_new: int, progress: list[str]) -> dict:
    from aggdec.export import export_bundle
    from aggdec.export.quantize import quantize_bundle
    from aggdec.runtime.errors import AggdecError, InputError
    from aggdec.runtime.generator import Generator

    checkpoint, bundle, int8 = work / "checkpoint", work / "bundle", work / "bundle-int8"
    build_supported(variant, checkpoint)
    export_bundle(checkpoint, bundle, progress=progress.append, **variant.export_options)
    result: dict[str, Any] = {"notes": [line.strip() for line in progress if "note:" in line]}
    generator = Generator(bundle)
    if variant.long_text:
        limit = generator.manifest.max_source_len
        fitting = [t for t in texts if len(generator.codec.encode([t])[0]) <= limit]
        longest = " ".join(["w1"] * (limit + 3))
        try:
            generator.generate([longest], mode="greedy", max_new_tokens=4)
            result["long_text"] = "decoded (NOT refused)"
        except InputError as exc:
            result["long_text"] = f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001 - the point: anything else is a crash
            result["long_text"] = f"CRASH {type(exc).__name__}: {exc}"
        texts = fitting
        max_new = min(max_new, generator.manifest.max_target_len - 1)
        try:
            generator.generate([texts[0]], mode="greedy", max_new_tokens=generator.manifest.max_target_len)
            result["long_output"] = "decoded (NOT refused)"
        except InputError as exc:
            result["long_output"] = f"refused: {exc}"
    result["texts"] = len(texts)
    expected = transformers_outputs(checkpoint, texts, max_new, num_beams=1, **variant.reference_options)
    failures = []
    for io_binding in (True, False):
        gen = Generator(bundle, io_binding=io_binding)
        for batch in (1, 8):
            greedy = [r.ids for r in gen.generate(texts, mode="greedy", max_new_tokens=max_new, batch_size=batch)]
            if greedy != expected:
                bad = sum(a != b for a, b in zip(greedy, expected))
                failures.append(f"greedy != transformers ({bad}/{len(texts)} texts; io_binding {io_binding}, "
                                f"batch {batch})")
            iad = [r.ids for r in gen.generate(texts, mode="iad", max_new_tokens=max_new, batch_size=batch)]
            if iad != greedy:
                failures.append(f"IAD != greedy (io_binding {io_binding}, batch {batch})")
    result["lengths"] = sorted({len(ids) for ids in expected})
    quantize_bundle(bundle, int8, precision="int8", progress=None)
    q = Generator(int8)
    for batch in (1, 8):
        greedy = [r.ids for r in q.generate(texts, mode="greedy", max_new_tokens=max_new, batch_size=batch)]
        iad = [r.ids for r in q.generate(texts, mode="iad", max_new_tokens=max_new, batch_size=batch)]
        if iad != greedy:
            failures.append(f"int8 IAD != int8 greedy (batch {batch})")
    if variant.beams:
        beam_texts = texts[:8]
        gen_settings = {k: variant.generation[k] for k in ("length_penalty", "early_stopping")
                        if k in variant.generation}
        want = transformers_outputs(checkpoint, beam_texts, max_new, num_beams=4, **gen_settings,
                                    **variant.reference_options)
        try:
            got = [r.ids for r in generator.generate(beam_texts, num_beams=4, max_new_tokens=max_new, batch_size=8,
                                                     **gen_settings)]
            m = generator.manifest
            want = [_strip_pad(w, m.pad_token_id, m.eos_token_id) for w in want]
            if got != want:
                bad = sum(a != b for a, b in zip(got, want))
                failures.append(f"beam 4 != transformers beam 4 ({bad}/{len(beam_texts)} texts)")
            result["beam4"] = "equal" if got == want else "DIFFERS"
        except AggdecError as exc:
            result["beam4"] = f"refused: {exc}"
    result["failures"] = failures
    result["result"] = "exact" if not failures else "MISMATCH"
    return result


def check_refused(variant: Variant, work: Path, progress: list[str]) -> dict:
    from aggdec.export import export_bundle
    from aggdec.runtime.errors import AggdecError

    checkpoint, bundle = work / "checkpoint", work / "bundle"
    if variant.build is not None:
        variant.build(checkpoint)
    else:
        build_supported(variant, checkpoint, calibrate=False)
    before = set(work.iterdir())
    try:
        export_bundle(checkpoint, bundle, progress=progress.append, **variant.export_options)
    except AggdecError as exc:
        message = str(exc)
        written = sorted(p.name for p in set(work.iterdir()) - before)
        problems = []
        if "\n" in message:
            problems.append("message is more than one line")
        missing = [w for w in variant.refusal_words if w not in message]
        if missing:
            problems.append(f"message does not name {missing}")
        if written:
            problems.append(f"left {written}")
        return {"result": "refused" if not problems else "REFUSED BADLY", "error": type(exc).__name__,
                "message": message, "failures": problems}
    except Exception as exc:  # noqa: BLE001 - a crash is what this looks for
        return {"result": "CRASH", "error": type(exc).__name__, "message": str(exc).splitlines()[0][:300],
                "failures": ["not an AggdecError"]}
    return {"result": "EXPORTED (expected a refusal)", "failures": ["exported"]}


def run_variant(variant: Variant, texts: list[str], max_new: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"sweep-{variant.name}-") as scratch:
        progress: list[str] = []
        started = time.perf_counter()
        try:
            if variant.expect == REFUSED:
                result = check_refused(variant, Path(scratch), progress)
            else:
                result = check_exact(variant, Path(scratch), texts, variant.max_new or max_new, progress)
        except Exception as exc:  # noqa: BLE001
            result = {"result": "CRASH", "error": type(exc).__name__, "message": str(exc).splitlines()[0][:300]
                      if str(exc) else "", "failures": [traceback.format_exc(limit=4)]}
        result["seconds"] = round(time.perf_counter() - started, 1)
    return {"variant": variant.name, "family": variant.family, "what": variant.what, "expect": variant.expect,
            **result}


def table(results: list[dict]) -> str:
    lines = ["| variant | checkpoint flags | expected | result | details |", "|---|---|---|---|---|"]
    for r in results:
        details = []
        if r.get("message"):
            details.append(f"`{r['message']}`")
        for key in ("long_text", "long_output"):
            if key in r:
                details.append(f"{key}: {r[key]}")
        if "beam4" in r:
            details.append(f"beam 4: {r['beam4']}")
        if r.get("lengths"):
            details.append(f"{r['texts']} texts, output lengths {r['lengths'][0]}-{r['lengths'][-1]}")
        details += r.get("notes", [])
        details += [f"**{f}**" for f in r.get("failures", []) if "Traceback" not in f]
        text = "; ".join(details).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r['variant']} | {r['what']} | {r['expect']} | {r['result']} | {text} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    parser.add_argument("--texts", type=int, default=20)
    parser.add_argument("--max-new", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path("config-sweep-out"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    texts = random_texts(seed=11, count=args.texts - 1)  # random_texts adds a one-word text
    chosen = [v for v in VARIANTS if not args.only or v.name in args.only]
    results = []
    for variant in chosen:
        result = run_variant(variant, texts, args.max_new)
        print(f"{variant.name}: {result['result']} ({result['seconds']}s) {result.get('failures', '')}", flush=True)
        results.append(result)
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    meta = {"commit": commit, "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
            "texts": args.texts, "max_new": args.max_new}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    (args.out / "table.md").write_text(table(results))
    bad = [r for r in results if r["result"] not in ("exact", "refused")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
