"""fp16 graphs, for CUDA: an fp32 bundle's graphs with float16 weights and activations.

The conversion is onnxruntime's own (``onnxruntime.transformers.float16``): every float
initializer and activation becomes float16, and a Cast pair is put around each operator kept
in float32. Kept in float32 (:data:`FP32_OPS`):

- ``LogSoftmax`` and ``TopK``: the candidates' log-probs are what GAD++ compares and the
  bundle returns; their sum over 8k-50k logits loses digits in float16.
- ``Softmax``: the attention weights. Masked scores are the most negative finite float16
  (-65504, or -inf where a padding and a causal mask add up); float32 normalizes them.
- ``LayerNormalization`` and the pieces of T5's RMS norm (``Pow``, ``ReduceMean``, ``Sqrt``,
  ``Reciprocal``): a sum of squares over d_model overflows float16 where an activation passes 256.

What stays float16 is what the GPU's tensor cores are for: the matrix products (weights, the
attention's Q.K^T and weights.V, the vocabulary projection) and the per-element passes
between them. The graphs exchange float16 (encoder output, cross K/V, the self-attention
buffers written in place): the runtime allocates its buffers in the bundle's activation type
(``ACTIVATION_DTYPES``). ``top_logprobs`` alone stays a float32 output.

Lossless at fp16 means what it means for int8: IAD, GAD and GAD++ at beta 1 equal the same
bundle's greedy on the same device. The block-vs-alone check (``positions.py``) proves it for
onnxruntime's CPU provider when the bundle is written; on CUDA it fails (an H100 moved fp16
log-probs by up to 6.8e-3 between a block and a position alone: cuBLAS picks its kernel by
shape) except when every call has one shape (decision 034). Where float16 overflows (T5
checkpoints are known to, past their feed-forward layers), the conversion refuses the bundle
(``quantize._figures``).
"""

from __future__ import annotations

import numpy as np

from ..runtime.errors import ExportError
from ..runtime.graph_specs import HEAD_POSITIONS, LOGITS_OUTPUT

# ArgMax and GatherElements: the heads (export/graphs.py candidates) choose on the float32 logits
# and read float32 log-probs, as the fp32 graphs do
FP32_OPS = ("LogSoftmax", "TopK", "ArgMax", "GatherElements", "Softmax", "LayerNormalization", "Pow", "ReduceMean",
            "Sqrt", "Reciprocal")
# graph outputs that stay float32 whatever the precision (graph_specs: top_logprobs, LOGITS_OUTPUT)
FP32_OUTPUTS = ("top_logprobs", LOGITS_OUTPUT)


def _drop_repeated_casts(graph) -> None:
    """The converter puts a Cast back to float32 before each kept-in-float32 operator, named
    after the tensor it reads; where one tensor feeds two such operators, onnxruntime 1.30's
    and 1.31's converters write the same Cast twice (seen on a torch 2.11 export, whose logits
    feed both TopK and LogSoftmax through one Cast; 1.32's does not), and onnxruntime refuses a
    graph with two nodes of one name. The copies are the same node: keep the first. Two
    different nodes of one name or output would be the converter's error, not ours to guess."""
    seen: dict[str, bytes] = {}
    produced: set[str] = set()
    kept = []
    for node in graph.node:
        key = node.SerializeToString(deterministic=True)
        if node.name and node.name in seen:
            if seen[node.name] != key:
                raise ExportError(f"the float16 conversion wrote two different nodes named {node.name!r}")
            continue
        clash = produced.intersection(node.output)
        if clash:
            raise ExportError(f"the float16 conversion wrote {sorted(clash)[0]!r} twice")
        if node.name:
            seen[node.name] = key
        produced.update(node.output)
        kept.append(node)
    if len(kept) != len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)


def every_position_head(model, vocab_size: int) -> bool:
    """``model``'s argmax graph back to the logits of every block position (in place): without
    the gather of the positions asked for (graph_specs.HEAD_POSITIONS, decision 050), the head
    reads the decoder's output [batch, T, d] as the top-K graph's does. Returns whether it took
    them. For float16: with the gather, the check against the top-K graph found a tiny T5's
    two graphs choosing different ids at one position on the CPU (float32 and int8 agree);
    without it the head's product has the top-K graph's shape again. float16 is for the GPU,
    where this graph's logits are not read (graph_specs.argmax_graph_runs_on)."""
    graph = model.graph
    if HEAD_POSITIONS not in {graph_input.name for graph_input in graph.input}:
        return False
    gather = next(node for node in graph.node if node.op_type == "Gather" and HEAD_POSITIONS in node.input)
    flatten = next(node for node in graph.node if gather.input[0] in node.output)
    if flatten.op_type != "Reshape" or any(flatten.output[0] in node.input for node in graph.node if node is not gather):
        raise ExportError("the argmax graph's head_positions gather is not as aggdec's export writes it; "
                          "export the bundle again with this aggdec")
    for node in graph.node:
        node.input[:] = [flatten.input[0] if name == gather.output[0] else name for name in node.input]
    graph.node.remove(gather)
    graph.node.remove(flatten)
    graph.input.remove(next(graph_input for graph_input in graph.input if graph_input.name == HEAD_POSITIONS))
    logits = next(output for output in graph.output if output.name == LOGITS_OUTPUT).type.tensor_type.shape
    del logits.dim[:]
    for dim in ("batch", "new_len", vocab_size):
        setattr(logits.dim.add(), "dim_value" if isinstance(dim, int) else "dim_param", dim)
    return True


def half_model(model, vocab_size: int, output_projection: bool = True):
    """``model`` (an fp32 onnx ModelProto) converted to float16; returns the new model and the
    number of float16 matrix products by a weight. ``output_projection=False`` keeps the
    [d_model, vocab] projection in float32 (its products then go through a Cast pair)."""
    from onnx import numpy_helper
    from onnxruntime.transformers.float16 import convert_float_to_float16

    inits = {init.name: init for init in model.graph.initializer}

    def projection(node) -> bool:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) > 1 else None
        return weight is not None and len(weight.dims) == 2 and weight.dims[1] == vocab_size

    kept_nodes = [] if output_projection else [node.name for node in model.graph.node if projection(node)]
    if not all(kept_nodes):
        raise ExportError("the output projection has no node name, so it cannot be kept in float32; "
                          "export the bundle again with this aggdec")
    outputs = [o.name for o in model.graph.output if o.name in FP32_OUTPUTS]
    half = convert_float_to_float16(model, keep_io_types=outputs, op_block_list=list(FP32_OPS),
                                    node_block_list=kept_nodes)
    _drop_repeated_casts(half.graph)
    half_inits = {init.name: init for init in half.graph.initializer}
    products = 0
    for node in half.graph.node:
        if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in half_inits:
            products += numpy_helper.to_array(half_inits[node.input[1]]).dtype == np.float16
    return half, int(products)
