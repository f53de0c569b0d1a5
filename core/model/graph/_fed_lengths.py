"""Feed GroupQueryAttention its sequence lengths instead of deriving them from the attention mask in the graph.

onnxruntime-genai's builder computes GroupQueryAttention's ``seqlens_k`` (int32[batch] = sum(attention_mask) -
1) and ``total_sequence_length`` (int32 scalar = attention_mask's width) with six small nodes (Shape, Gather,
Cast, ReduceSum, Sub, Cast) that run on every step. decoctl knows both numbers before a step (it owns the KV
cache), so ``rewrite()`` removes that subgraph and turns its two results into graph inputs, which the runner binds
once and refreshes with two integer stores a step. On small models a step is mostly per-node overhead, so this is
a visible share of it: one thread, a step was 9% faster on a 4-layer random Llama and 13% on the demo draft model
(docs/BENCHMARKS.md, "Session 7: the host against onnxruntime-genai across fresh processes").

The rewrite is exact: it only fires on the builder's pattern, node for node (attribute and constant values
checked), where the removed nodes compute exactly the values decoctl feeds for an unpadded sequence of one
batch row. Anything else (another pattern, an attention mask that also feeds other nodes, a graph without
GroupQueryAttention) keeps the graph as it is and says why. Weights are never decoded: the graph's bytes are
spliced with protowire, so the onnx package is not needed.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Sequence

import attrs

from decoctl.model.graph import _protowire as pw
from decoctl.model.graph._nodes import (
    ATTR_INTS,
    ATTR_T,
    GQA_SEQLENS_K,
    GQA_TOTAL_LENGTH,
    GRAPH_INITIALIZER,
    GRAPH_INPUT,
    GRAPH_NODE,
    GRAPH_OUTPUT,
    INT32,
    INT64,
    MODEL_GRAPH,
    SHAPE_DIM,
    TENSOR_ELEM_TYPE,
    TENSOR_SHAPE,
    TYPE_TENSOR,
    VALUE_NAME,
    VALUE_TYPE,
    GraphNode,
    Kept,
    signed,
    value_name,
)

__all__ = ["FedLengths", "Kept", "Rewritten", "rewrite"]


_BUILDER = "onnxruntime-genai's builder"

#: a small int64 constant: a list for a 1-D tensor, ((), value) for a scalar
_Constant = list[int] | tuple[tuple[()], int]


@attrs.frozen(kw_only=True)
class FedLengths:
    """The two graph inputs that replace the mask subgraph: ``seqlens_k`` int32[batch] (the sequence length
    minus one) and ``total_sequence_length`` int32 scalar (the sequence length)."""

    seqlens_k: str
    total_sequence_length: str


@attrs.frozen(kw_only=True)
class Rewritten:
    """The rewritten ModelProto bytes, its new inputs, and how many nodes went."""

    model: bytes
    inputs: FedLengths
    removed_nodes: int


def rewrite(model: bytes, attention_mask: str) -> Rewritten | Kept:
    """Remove the builder's mask subgraph from the serialized ModelProto ``model`` (see the module docstring).

    :param attention_mask: the graph input the subgraph reads (the config's ``inputs.attention_mask``).
    """
    model_fields = list(pw.fields(model))
    graphs = [f for f in model_fields if f.number == MODEL_GRAPH]
    if len(graphs) != 1:
        return Kept(reason="the file holds no single graph")
    graph_fields = list(pw.fields(graphs[0].payload))
    nodes = [GraphNode.parse(f, i) for i, f in enumerate(f for f in graph_fields if f.number == GRAPH_NODE)]
    found = _match(nodes, graph_fields, attention_mask)
    if isinstance(found, Kept):
        return found
    lengths, removed = found
    mask_info = next(f for f in graph_fields if f.number == GRAPH_INPUT and value_name(f) == attention_mask)
    new_inputs = [
        pw.length_delimited(GRAPH_INPUT, _tensor_value(lengths.seqlens_k, INT32, [_first_dim(mask_info)])),
        pw.length_delimited(GRAPH_INPUT, _tensor_value(lengths.total_sequence_length, INT32, [])),
    ]
    kept: list[bytes] = []
    node_index = 0
    for field in graph_fields:
        if field.number == GRAPH_NODE:
            node_index += 1
            if node_index - 1 in removed:
                continue
        elif field is mask_info:
            continue
        kept.append(field.raw)
    new_graph = pw.length_delimited(MODEL_GRAPH, [*kept, *new_inputs])
    rebuilt = b"".join(new_graph if f is graphs[0] else f.raw for f in model_fields)
    return Rewritten(model=rebuilt, inputs=lengths, removed_nodes=len(removed))


def _match(
    nodes: Sequence[GraphNode], graph_fields: Sequence[pw.Field], mask: str
) -> tuple[FedLengths, set[int]] | Kept:
    attention = [n for n in nodes if n.is_gqa]
    if not attention:
        return Kept(reason="no com.microsoft GroupQueryAttention node")
    slots = {(n.input(GQA_SEQLENS_K), n.input(GQA_TOTAL_LENGTH)) for n in attention}
    if len(slots) != 1 or "" in next(iter(slots)):
        return Kept(reason="the GroupQueryAttention nodes do not share one seqlens_k and total_sequence_length")
    seqlens_k, total = next(iter(slots))
    producer = {name: node for node in nodes for name in node.outputs}
    constants = _constants(nodes, graph_fields)
    consumers: dict[str, list[tuple[GraphNode, int]]] = defaultdict(list)
    for node in nodes:
        for slot, name in enumerate(node.inputs):
            consumers[name].append((node, slot))
    graph_outputs = {value_name(f) for f in graph_fields if f.number == GRAPH_OUTPUT}
    if mask not in {value_name(f) for f in graph_fields if f.number == GRAPH_INPUT}:
        return Kept(reason=f"the graph has no {mask!r} input")

    def made_by(name: str, op_type: str, arity: int) -> GraphNode | None:
        node = producer.get(name)
        if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx") or len(node.inputs) != arity:
            return None
        return node

    # seqlens_k = Cast<int32>(Sub(ReduceSum<keepdims=0, axis 1>(mask), 1))
    cast_k = made_by(seqlens_k, "Cast", 1)
    sub = made_by(cast_k.inputs[0], "Sub", 2) if cast_k else None
    reduce = None
    if sub is not None and constants.get(sub.inputs[1]) in ([1], ((), 1)):
        reduce = made_by(sub.inputs[0], "ReduceSum", 2) or made_by(sub.inputs[0], "ReduceSum", 1)
    # total_sequence_length = Cast<int32>(Gather<axis 0>(Shape(mask), scalar 1))
    cast_t = made_by(total, "Cast", 1)
    gather = made_by(cast_t.inputs[0], "Gather", 2) if cast_t else None
    shape = made_by(gather.inputs[0], "Shape", 1) if gather else None
    if not (cast_k and sub and reduce and cast_t and gather and shape):
        return Kept(reason=f"seqlens_k and total_sequence_length are not computed the way {_BUILDER} does")
    checks = [
        cast_k.int_attribute("to") == INT32 and cast_t.int_attribute("to") == INT32,
        reduce.inputs[0] == mask
        and reduce.int_attribute("keepdims") == 0
        and _reduced_axes(reduce, constants) in ([1], [-1]),
        reduce.int_attribute("noop_with_empty_axes") in (None, 0),
        gather.int_attribute("axis") in (None, 0) and constants.get(gather.inputs[1]) == ((), 1),
        shape.inputs[0] == mask and not shape.attributes,
    ]
    if not all(checks):
        return Kept(reason=f"the mask subgraph differs from {_BUILDER}'s in an attribute or constant")
    subgraph = [cast_k, sub, reduce, cast_t, gather, shape]
    removed = {node.index for node in subgraph}
    for name, wanted in ((seqlens_k, GQA_SEQLENS_K), (total, GQA_TOTAL_LENGTH)):
        if any(not n.is_gqa or slot != wanted for n, slot in consumers[name]):
            return Kept(reason=f"{name!r} feeds more than GroupQueryAttention's length inputs")
    for node in subgraph:
        if node in (cast_k, cast_t):
            continue
        for name in node.outputs:
            if name in graph_outputs or any(n.index not in removed for n, _ in consumers[name]):
                return Kept(reason=f"{name!r} of the mask subgraph is used elsewhere")
    if seqlens_k in graph_outputs or total in graph_outputs:
        return Kept(reason="the sequence lengths are graph outputs")
    if any(n.index not in removed for n, _ in consumers[mask]):
        return Kept(reason=f"{mask!r} feeds other nodes than the length subgraph")
    # Constant nodes left with no consumer go too (an unused Constant would be dead weight, not an error)
    for node in nodes:
        if node.op_type == "Constant" and node.index not in removed:
            users = [n for name in node.outputs for n, _ in consumers[name]]
            if users and all(n.index in removed for n in users) and not set(node.outputs) & graph_outputs:
                removed.add(node.index)
    return FedLengths(seqlens_k=seqlens_k, total_sequence_length=total), removed


def _reduced_axes(node: GraphNode, constants: dict[str, _Constant]) -> list[int] | None:
    if len(node.inputs) == 2:
        axes = constants.get(node.inputs[1])
        return axes if isinstance(axes, list) else None
    fields = node.attributes.get("axes", [])
    return [signed(v) for f in fields if f.number == ATTR_INTS for v in pw.packed_varints(f)] or None


def _constants(nodes: Sequence[GraphNode], graph_fields: Sequence[pw.Field]) -> dict[str, _Constant]:
    """Small int64 constants by name, from initializers and Constant nodes: a list for a 1-D tensor, ((), v)
    for a scalar. Anything else (another type, rank or size) is left out."""
    found: dict[str, _Constant] = {}
    for field in graph_fields:
        if field.number == GRAPH_INITIALIZER:
            name, value = _int64_tensor(field.payload)
            if name and value is not None:
                found[name] = value
    for node in nodes:
        if node.op_type != "Constant" or len(node.outputs) != 1:
            continue
        tensor = [f for f in node.attributes.get("value", []) if f.number == ATTR_T]
        if tensor:
            _, value = _int64_tensor(tensor[0].payload)
            if value is not None:
                found[node.outputs[0]] = value
    return found


def _int64_tensor(payload: bytes) -> tuple[str, _Constant | None]:
    read = pw.tensor(payload)
    values: list[int] | None = list(read.int64s) or None
    if read.raw is not None and len(read.raw) % 8 == 0:
        values = list(struct.unpack(f"<{len(read.raw) // 8}q", read.raw))
    if read.data_type != INT64 or values is None or len(read.dims) > 1 or len(values) > 8:
        return read.name, None
    if not read.dims:
        return read.name, (((), values[0]) if len(values) == 1 else None)
    return read.name, (values if read.dims[0] == len(values) else None)


def _first_dim(value_info: pw.Field) -> bytes:
    """The first Dimension of a tensor ValueInfoProto, as encoded (a dim_param such as 'batch_size')."""
    for part in pw.fields(value_info.payload):
        if part.number != VALUE_TYPE:
            continue
        for tensor in pw.fields(part.payload):
            if tensor.number != TYPE_TENSOR:
                continue
            for shape in pw.fields(tensor.payload):
                if shape.number == TENSOR_SHAPE:
                    for dim in pw.fields(shape.payload):
                        if dim.number == SHAPE_DIM:
                            return dim.payload
    return pw.length_delimited(2, b"batch_size")  # Dimension.dim_param


def _tensor_value(name: str, elem_type: int, dims: list[bytes]) -> bytes:
    """A ValueInfoProto for a tensor input; no dims encodes a scalar (an empty shape, not an unknown one)."""
    shape = pw.length_delimited(TENSOR_SHAPE, [pw.length_delimited(SHAPE_DIM, d) for d in dims])
    tensor = pw.length_delimited(TYPE_TENSOR, [pw.varint_field(TENSOR_ELEM_TYPE, elem_type), shape])
    return pw.length_delimited(VALUE_NAME, name.encode()) + pw.length_delimited(VALUE_TYPE, tensor)
