"""The exporter's side of the graph specs (``runtime/graph_specs.py``): torch.onnx.export's
dynamic axes."""

from __future__ import annotations

from ..runtime.graph_specs import (  # noqa: F401 - the exporter's names for them
    drafter_source_spec,
    drafter_spec,
    encoder_spec,
    verifier_spec,
)
from ..runtime.manifest import GraphSpec


def dynamic_axes(spec: GraphSpec) -> dict[str, dict[int, str]]:
    """torch.onnx.export's dynamic_axes for a spec: every symbolic dim by position."""
    axes: dict[str, dict[int, str]] = {}
    for tensor in (*spec.inputs, *spec.outputs):
        named = {i: d for i, d in enumerate(tensor.dims) if isinstance(d, str)}
        if named:
            axes[tensor.name] = named
    return axes
