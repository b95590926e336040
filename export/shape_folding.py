"""Reshapes whose target shape the tracer computes at run time, made constant where ONNX's own
Reshape semantics say the same thing: fewer small nodes per call.

Why: ``x.reshape(x.shape[0], x.shape[1], heads, head_dim)`` traces into Shape, two Gathers, two
Unsqueezes and a Concat feeding the Reshape, run at every call; a Marian verifier call at batch
1 is about 200 such small nodes after onnxruntime's optimizations, so their per-node cost is
most of it (decision 029, "What remains"). ONNX's Reshape already has the two meanings needed:
0 copies the input's dim at the same position, -1 is whatever the other dims leave. An entry is
replaced only where that is provably the same number: a Gather of dim ``i`` of the Reshape's
own input's Shape at position ``i`` (or of the Transpose's input, through its permutation)
becomes 0; if exactly one entry is still computed (e.g. ``heads * head_dim``) and none is -1,
it becomes -1 (the element count fixes it). Anything else is left as traced. The nodes that
only fed the replaced shapes are removed. The values a graph computes do not change (same
Reshape, same data, same output shape), which the export's checks prove again on every bundle.
"""

from __future__ import annotations

import numpy as np


def _constants(graph) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def graphs_within(graph):
    """``graph`` and every subgraph in it (an If's branches, a Scan's body), outermost first. A
    graph's subgraphs are looked up after the caller has had it, so a caller that rewrites a
    graph's nodes (copying those it keeps, their subgraphs with them) walks the new ones."""
    stack = [graph]
    while stack:
        current = stack.pop()
        yield current
        for node in current.node:
            stack.extend(attribute.g for attribute in node.attribute if attribute.g.node)
            stack.extend(g for attribute in node.attribute for g in attribute.graphs)


def _used_names(graph) -> set[str]:
    """Every name a node of ``graph`` or of any of its subgraphs reads, and the graph's outputs."""
    used = {output.name for output in graph.output}
    for current in graphs_within(graph):
        for node in current.node:
            used.update(node.input)
    return used


def remove_dead_nodes(graph) -> int:
    """Drop nodes none of whose outputs is read (by a node, a subgraph or a graph output)."""
    removed = 0
    while True:
        used = _used_names(graph)
        kept = [node for node in graph.node if any(output in used for output in node.output)]
        if len(kept) == len(graph.node):
            return removed
        removed += len(graph.node) - len(kept)
        del graph.node[:]
        graph.node.extend(kept)


def constant_reshapes(model) -> int:
    """Make the target shape of each Reshape in ``model`` (an onnx ModelProto, top-level graph)
    constant where the module docstring's rules allow; returns how many were made constant."""
    from onnx import helper, numpy_helper

    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    constants = _constants(graph)
    names = {name for node in graph.node for name in (*node.input, *node.output)} | set(constants)

    def scalar(name: str) -> int | None:
        value = constants.get(name)
        return int(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    def copied_dim(part: str) -> tuple[str, int] | None:
        """(tensor, i) when ``part`` is Unsqueeze(Gather(Shape(tensor), i)), a 1-element vector."""
        unsqueeze = producers.get(part)
        if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
            return None
        axes = scalar(unsqueeze.input[1]) if len(unsqueeze.input) > 1 else None
        gather = producers.get(unsqueeze.input[0])
        if axes != 0 or gather is None or gather.op_type != "Gather" or any(
                a.name == "axis" and a.i != 0 for a in gather.attribute):
            return None
        shape = producers.get(gather.input[0])
        index = scalar(gather.input[1])
        if shape is None or shape.op_type != "Shape" or shape.attribute or index is None or index < 0:
            return None
        return shape.input[0], index

    def same_dim(data: str, tensor: str, index: int, position: int) -> bool:
        """Whether dim ``index`` of ``tensor`` is dim ``position`` of ``data``."""
        if tensor == data:
            return index == position
        transpose = producers.get(data)
        if transpose is None or transpose.op_type != "Transpose" or transpose.input[0] != tensor:
            return False
        perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)
        return perm is not None and position < len(perm) and perm[position] == index

    count = 0
    shapes = []
    for node in graph.node:
        if node.op_type != "Reshape" or any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        concat = producers.get(node.input[1])
        if concat is None or concat.op_type != "Concat":
            continue
        entries: list[int | None] = []
        for part in concat.input:
            value = constants.get(part)
            if value is not None:
                if value.ndim != 1:
                    break
                entries.extend(int(v) for v in value)
                continue
            dim = copied_dim(part)
            if dim is not None and same_dim(node.input[0], *dim, len(entries)):
                entries.append(0)
                continue
            if producers.get(part) is None or producers[part].op_type != "Unsqueeze":
                break  # an entry of unknown length: the positions after it are unknown
            entries.append(None)
        else:
            unknown = [i for i, entry in enumerate(entries) if entry is None]
            if len(unknown) > 1 or (unknown and -1 in entries):
                continue
            # a 0 among the traced constants would mean "copy" once written, not an empty dim
            if any(constants.get(part) is not None and 0 in constants[part] for part in concat.input):
                continue
            if unknown:
                entries[unknown[0]] = -1
            name, index = "constant_reshape", 0
            while name in names:
                index += 1
                name = f"constant_reshape_{index}"
            names.add(name)
            # a Constant node, not an initializer: a graph saved with its weights as external
            # data keeps node attributes inline, and onnxruntime must read a Reshape's target
            # while it resolves the graph, before external initializers are in
            shapes.append(helper.make_node("Constant", [], [name], name=f"{name}_value",
                                           value=numpy_helper.from_array(np.array(entries, dtype=np.int64), name)))
            node.input[1] = name
            count += 1
    for constant in shapes:  # no inputs: first in the graph is a valid topological place
        graph.node.insert(0, constant)
    if count:
        remove_dead_nodes(graph)
    return count


def fold_reshapes(path) -> None:
    """:func:`constant_reshapes` on the ONNX file at ``path``, rewritten in place: a traced
    encoder, verifier or drafter, before its positions are isolated and before the export's
    checks, which then prove the values unchanged on every bundle (against torch, and each
    block position bitwise equal to the same position alone). Why: fewer small nodes per call,
    where per-node cost is most of a small model's call (benchmarks/results/beam-host-cpu)."""
    import onnx

    model = onnx.load(str(path))
    constant_reshapes(model)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
