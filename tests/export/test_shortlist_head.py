"""export/shortlist_head.py: the output projection over each row's shortlist, on its own.

The Marian tests check it inside a verifier (export's block-versus-alone check, greedy against
a reference restricted to each sentence's list); these check the function a drafter head may
reuse: its two products agree, padding never wins, and the traced per-position product gives
each position bitwise what it gives alone, at batch 1 too (where onnxruntime folds a product
whose right side has no batch into one GEMM of T rows, decision 026), and the same bits
whether each row's matrix is gathered in the graph or fed already gathered (``output_rows``,
as a bundle's encoder makes it and the runtime keeps it per slot)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggdec.export.shortlist_head import DOMAIN, ids_at, per_position_products, shortlist_logits

VOCAB, DIM = 300, 64


def _weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(VOCAB, DIM, generator=generator), torch.randn(VOCAB, generator=generator)


def _lists(rows: int, seed: int = 1) -> torch.Tensor:
    """Per-row sorted id lists of different lengths, -1 padded, as the runtime feeds them."""
    rng = np.random.default_rng(seed)
    lists = [np.sort(rng.choice(VOCAB, size=40 + 17 * row, replace=False)) for row in range(rows)]
    ids = np.full((rows, max(map(len, lists))), -1, dtype=np.int64)
    for row, allowed in enumerate(lists):
        ids[row, : len(allowed)] = allowed
    return torch.from_numpy(ids)


def test_both_products_score_each_rows_list_and_padding_never_wins():
    weight, bias = _weights()
    hidden = torch.randn(3, 5, DIM, generator=torch.Generator().manual_seed(2))
    output_ids = _lists(3)
    exact, allowed = shortlist_logits(hidden, output_ids, weight, bias)
    plain, allowed_plain = shortlist_logits(hidden, output_ids, weight, bias, per_position=False)
    assert torch.equal(allowed, allowed_plain) and torch.equal(allowed, output_ids)  # each row's ids, [B, L]
    finite = output_ids.unsqueeze(1).expand_as(exact) >= 0
    assert torch.isneginf(exact[~finite]).all() and torch.isfinite(exact[finite]).all()
    torch.testing.assert_close(exact[finite], plain[finite], rtol=1e-5, atol=1e-5)
    full = hidden @ weight.T + bias  # [B, T, V]: the whole vocabulary, then each row's ids
    for row in range(3):
        ids = output_ids[row][output_ids[row] >= 0]
        torch.testing.assert_close(exact[row, :, : len(ids)], full[row][:, ids], rtol=1e-5, atol=1e-5)
        best = ids_at(allowed, exact.argmax(-1))[row]  # [T]: each position's best id
        assert (best >= 0).all()  # a padding slot is never the best
        assert torch.equal(best, output_ids[row][exact[row].argmax(-1)])


class _Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        weight, bias = _weights()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = torch.nn.Parameter(bias, requires_grad=False)

    def forward(self, hidden: torch.Tensor, output_ids: torch.Tensor, output_rows: torch.Tensor) -> torch.Tensor:
        return shortlist_logits(hidden, output_ids, self.weight, self.bias, rows=output_rows)[0]


def _rows(output_ids: np.ndarray) -> np.ndarray:
    """Each row's gathered matrix, as the encoder of a shortlist bundle returns it."""
    return np.ascontiguousarray(_weights()[0].numpy()[np.maximum(output_ids, 0)])


EMPTY = np.zeros((1, 0, DIM), np.float32)  # no rows fed: the graph gathers them


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The head traced to ONNX with its placeholder replaced, as the export does."""
    import warnings

    import onnx

    path = tmp_path_factory.mktemp("head") / "head.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Head().eval(), (torch.randn(2, 3, DIM), _lists(2), torch.randn(2, 57, DIM)), str(path),
                          input_names=["hidden", "output_ids", "output_rows"], output_names=["logits"],
                          opset_version=17,
                          dynamic_axes={"hidden": {0: "b", 1: "t"}, "output_ids": {0: "b", 1: "l"},
                                        "output_rows": {0: "r", 1: "m"}, "logits": {0: "b", 1: "t", 2: "l"}},
                          dynamo=False)
    model = onnx.load(str(path))
    assert any(node.domain == DOMAIN for node in model.graph.node)
    assert per_position_products(model) == 1
    assert not any(node.domain == DOMAIN for node in model.graph.node)
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.mark.parametrize("kept", [False, True], ids=["gathered", "kept"])
@pytest.mark.parametrize("rows", [1, 3])
def test_each_position_of_a_block_is_bitwise_the_position_alone(traced, rows, kept):
    from aggdec.runtime.session import ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(traced, options, providers=["CPUExecutionProvider"])
    hidden = np.random.default_rng(rows).standard_normal((rows, 33, DIM)).astype(np.float32)
    output_ids = _lists(rows).numpy()
    matrices = _rows(output_ids) if kept else EMPTY
    block = session.run(None, {"hidden": hidden, "output_ids": output_ids, "output_rows": matrices})[0]
    reference = _Head()(torch.from_numpy(hidden), torch.from_numpy(output_ids), torch.from_numpy(EMPTY)).numpy()
    np.testing.assert_allclose(block, reference, rtol=1e-5, atol=1e-5)  # the graph computes the head
    other = session.run(None, {"hidden": hidden, "output_ids": output_ids,
                               "output_rows": EMPTY if kept else _rows(output_ids)})[0]
    assert np.array_equal(block, other)  # kept or gathered: the same products on the same numbers
    for width in (1, 2, 7):
        for start in range(0, 33 - width + 1, 5):
            part = session.run(None, {"hidden": np.ascontiguousarray(hidden[:, start : start + width]),
                                      "output_ids": output_ids, "output_rows": matrices})[0]
            assert np.array_equal(part, block[:, start : start + width]), (rows, width, start)
