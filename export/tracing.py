"""The tracing steps every export family shares: graphs traced from torch modules, the verifier's
positions isolated, a drafter traced and checked (export/pipeline.py for Hugging Face
checkpoints, export/marian/ for Marian's own format). A module of its own so that a family's
exporter and the pipeline that dispatches to it do not import each other."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path

from ..runtime.errors import ExportError
from .positions import isolate_positions
from .shape_folding import fold_reshapes
from .specs import drafter_source_spec, drafter_spec, dynamic_axes
from .validate import validate_drafter, validate_drafter_source

INT8_DRAFTER_FILE = "drafter.int8.onnx"  # GAD's drafter with int8 products, for the CPU


def say(progress: Callable[[str], None] | None, message: str) -> None:
    if progress is not None:
        progress(message)


def isolate_verifier_positions(path: Path, one_head: bool = False) -> None:
    """Rewrite the traced verifier so each block position is computed as it would be alone
    (see export/positions.py; ``one_head``: its attention has one head). What makes IAD/GAD
    equal greedy by construction. A shortlist projection's placeholder becomes its per-position
    product first (export/shortlist_head.py)."""
    import onnx

    from .shortlist_head import per_position_products  # torch: imported when a graph is traced

    model = onnx.load(str(path))
    per_position_products(model)
    isolate_positions(model, one_head)
    onnx.save(model, str(path))


def trace_verifiers(make: Callable[[str], object], args: tuple, tmp: Path, spec: Callable[[str], object], opset: int,
                    after: Callable[[Path], None] | None = None, argmax_graph: bool = True,
                    argmax_head: str = "logits", one_head: bool = False) -> dict:
    """Trace the verifier once per graph of ``VERIFIER_GRAPHS`` (the top-K graph and the argmax
    one), each rewritten so that its block positions compute as alone; returns their specs by
    graph name. ``make(head)``: the verifier module with that head; ``spec(head)``: its IO;
    ``after(path)``: a family's own rewrite of a traced graph, before the isolation.
    ``argmax_graph``: False leaves the argmax graph out (``aggdec export --no-argmax-graph``).
    ``argmax_head``: what the argmax graph returns (graph_specs.ARGMAX_HEADS): the logits, or
    where the graph maps list positions to ids (a shortlist), the best id. ``one_head``: the
    decoder's attention has one head (:func:`~.positions.isolate_positions`)."""
    import torch

    from ..runtime.graph_specs import HEAD_POSITIONS, VERIFIER_GRAPHS

    specs = {}
    for graph, head in VERIFIER_GRAPHS.items():
        if head == "argmax":
            if not argmax_graph:
                continue
            head = argmax_head
        specs[graph] = spec(head)
        path = tmp / specs[graph].file
        traced = args
        if HEAD_POSITIONS in specs[graph].input_names():
            # some of the example's rows x width positions, out of order, their count unlike any other dim's
            positions = args[0].numel()
            traced = (*args, torch.tensor([positions - 1, 0, 2, 3], dtype=torch.int64) % positions)
        trace(make(head).eval(), traced, path, specs[graph], opset)
        if after is not None:
            after(path)
        isolate_verifier_positions(path, one_head)
    return specs


def trace_drafter(drafter, d_model: int, tmp: Path, opset: int, shortlist: bool = False) -> dict:
    """Trace ``drafter`` (and its own encoder layers, if any) into ``tmp``; returns their specs.
    ``shortlist``: its head over each row's ``output_ids`` (DrafterGraph)."""
    import torch

    from .drafter import DrafterGraph, DrafterSourceGraph

    graphs = {"drafter": drafter_spec(d_model, drafter.config.k, shortlist=shortlist)}
    dummy = drafter_dummy(drafter, d_model)
    if shortlist:  # distinct rows and length, -1 padded like the runtime's lists
        dummy = (*dummy, torch.tensor([[0, 4, 7, 9, 11, 12, 13], [0, 3, 5, 6, 8, -1, -1]]))
    trace(DrafterGraph(drafter, shortlist).eval(), dummy, tmp / graphs["drafter"].file, graphs["drafter"], opset)
    if drafter.config.encoder_layers:  # run once per request, so a graph of its own
        graphs["drafter_source"] = drafter_source_spec(d_model)
        trace(DrafterSourceGraph(drafter).eval(), drafter_dummy(drafter, d_model)[4:],
               tmp / graphs["drafter_source"].file, graphs["drafter_source"], opset)
    # before check_drafter: its checks against torch run on the folded graphs, and the int8
    # drafter is quantized from the folded one
    for spec in graphs.values():
        fold_reshapes(tmp / spec.file)
    return graphs


def check_drafter(ort, tmp: Path, graphs: dict, draft_cases: list, atol: float, rtol: float, int8_drafter: bool,
                  progress: Callable[[str], None] | None) -> int:
    """Validate the traced drafter graphs against torch and, with ``int8_drafter``, add its int8
    copy to ``graphs``; returns the number of cases checked."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    cpu = ["CPUExecutionProvider"]
    drafter_session = ort.InferenceSession(str(tmp / graphs["drafter"].file), options, providers=cpu)
    checked = validate_drafter(drafter_session, draft_cases, atol, rtol)
    if "drafter_source" in graphs:
        checked += validate_drafter_source(
            ort.InferenceSession(str(tmp / graphs["drafter_source"].file), options, providers=cpu),
            draft_cases, atol, rtol)
    say(progress, f"      {checked} drafter cases agree with torch")
    if int8_drafter:
        from .quantize import draft_agreement, write_dynamic_int8

        graphs["drafter_int8"] = dataclasses.replace(graphs["drafter"], file=INT8_DRAFTER_FILE)
        write_dynamic_int8(tmp / graphs["drafter"].file, tmp / INT8_DRAFTER_FILE)
        agreement = draft_agreement(
            drafter_session, ort.InferenceSession(str(tmp / INT8_DRAFTER_FILE), options, providers=cpu), draft_cases)
        say(progress, f"      int8 drafter for the CPU: {agreement:.1%} of its drafts equal the fp32 drafter's "
                       "(drafts change speed, never the output)")
    return checked


def load_drafter(drafter_dir: str | Path, vocab: int, d_model: int):
    from .drafter import Drafter

    drafter = Drafter.load(drafter_dir)
    drafter.requires_grad_(False)
    if drafter.config.vocab_size != vocab or drafter.config.d_model != d_model:
        raise ExportError(
            f"the drafter in {str(drafter_dir)!r} was trained for a vocabulary of {drafter.config.vocab_size} and "
            f"d_model {drafter.config.d_model}, but this checkpoint has {vocab} and {d_model}; train a drafter "
            "for this checkpoint with `aggdec train-drafter`."
        )
    return drafter


def drafter_dummy(drafter, d_model: int):
    import torch

    from .drafter import drafter_inputs

    ids, mask, start, offset = drafter_inputs([[0, 5, 6], [0]], drafter.config.k, drafter.config.mask_token_id, 1)
    return (ids, mask, start, offset, torch.randn(2, 5, d_model), torch.ones(2, 5, dtype=torch.int64))


def dummy_ids(vocab: int, *shape: int):
    """Random token ids to trace with: ids 3..9 as ever, kept below ``vocab`` (any vocabulary of at
    least one token; an id past the embedding table ends the trace in an IndexError)."""
    import torch

    low, high = min(3, vocab - 1), min(10, vocab)
    return torch.randint(low, high, shape)


def encoder_dummy(vocab: int, max_source: int | None = None):
    """Sources to trace the encoder with: 2 of 5 tokens, or of ``max_source`` where that is fewer (an
    encoder reads its checkpoint's position table, which may hold fewer than 5)."""
    import torch

    # distinct sizes so the tracer cannot confuse one dim with another
    source = min(5, max_source or 5)
    batch = 3 if source == 2 else 2
    return (dummy_ids(vocab, batch, source), torch.ones(batch, source, dtype=torch.int64))


def cross_dummy(layers: int, heads: int, head_dim: int, batch: int, source: int, cross_key_layout: str):
    """Random cross keys and values in the verifier's input order, keys in ``cross_key_layout``."""
    import torch

    from ..runtime.decoding.cache import cross_dims, cross_names

    return tuple(torch.randn(cross_dims(batch, heads, source, head_dim, name.startswith("cross_key"), cross_key_layout))
                 for name in cross_names(layers))


def verifier_dummy(layers: int, heads: int, head_dim: int, cross_key_layout: str, vocab: int):
    import torch

    # distinct sizes so the tracer cannot confuse one dim with another
    batch, new, capacity, source = 2, 3, 9, 5
    return (
        dummy_ids(vocab, batch, new),
        torch.tensor([4, 3], dtype=torch.int64),
        *(torch.randn(batch, heads, capacity, head_dim) for _ in range(2 * layers)),
        *cross_dummy(layers, heads, head_dim, batch, source, cross_key_layout),
        torch.ones(batch, source, dtype=torch.int64),
    )


def trace(module, args, path: Path, spec, opset: int) -> None:
    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about python-value shapes are expected here
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=list(spec.input_names()),
            output_names=list(spec.output_names()),
            dynamic_axes=dynamic_axes(spec),
            opset_version=opset,
            dynamo=False,
        )
