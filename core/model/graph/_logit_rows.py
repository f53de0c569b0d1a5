"""Logits for the rows a forward needs: the LM head fed the hidden rows from a position chosen at run time.

A forward over n tokens computes n rows of logits, and on a model with a large vocabulary the LM head is much of
that work (Gemma 3 270M: a 262,144-token head, about 63% of a token's FLOPs), although a prompt's forward needs the
last row only. ``rewrite()`` puts a Slice between the LM head's MatMul and the hidden rows it reads, from the
position a new graph input ``logits_from`` (int64[1]) gives to the end. Its default is an initializer holding 0, so a
Run that does not bind it (the batched step, a tree verification) gets every row, exactly as before; the runner binds
n - 1 where only the last row is wanted, and the logits then have one row. Everything between the hidden rows and
the logits (a Cast, a soft-cap) works row by row, so each row is the one the whole forward gives.

The LM head is found from the logits output back through such row-wise nodes to a MatMul-like node; a graph
where that walk finds none is kept as it is. Weights are never decoded (protowire splices the graph's bytes).
"""

from __future__ import annotations

import struct

import attrs

from decoctl.model.graph import _protowire as pw
from decoctl.model.graph._nodes import (
    DIM_VALUE,
    GRAPH_INITIALIZER,
    GRAPH_INPUT,
    GRAPH_NODE,
    INT64,
    MODEL_GRAPH,
    NODE_INPUT,
    NODE_NAME,
    NODE_OP_TYPE,
    NODE_OUTPUT,
    SHAPE_DIM,
    TENSOR_DATA_TYPE,
    TENSOR_DIMS,
    TENSOR_ELEM_TYPE,
    TENSOR_NAME,
    TENSOR_RAW_DATA,
    TENSOR_SHAPE,
    TYPE_TENSOR,
    VALUE_NAME,
    VALUE_TYPE,
    GraphNode,
    Kept,
)

__all__ = ["LOGITS_FROM", "Kept", "Rewritten", "rewrite"]

#: the graph input the rewritten graph takes: the first position whose logits a Run computes
LOGITS_FROM = "logits_from"


#: nodes between the LM head and the logits output that work row by row (their first input the data)
_ROW_WISE = frozenset({"Cast", "Tanh", "Div", "Mul", "Add", "Sub"})
#: the LM head's op types (their first input the hidden rows)
_MATMULS = frozenset({"MatMul", "MatMulNBits", "FusedMatMul", "MatMulIntegerToFloat", "DynamicQuantizeMatMul"})
_ENDS, _AXES = f"{LOGITS_FROM}_ends", f"{LOGITS_FROM}_axes"
_SLICED = f"{LOGITS_FROM}_rows"


@attrs.frozen(kw_only=True)
class Rewritten:
    """The rewritten ModelProto bytes; ``input``: the graph input that picks the first row (``LOGITS_FROM``)."""

    model: bytes
    input: str = LOGITS_FROM


def rewrite(model: bytes, logits: str) -> Rewritten | Kept:
    """The graph with a ``logits_from`` input choosing the first row the LM head computes (module docstring)."""
    model_fields = list(pw.fields(model))
    graphs = [f for f in model_fields if f.number == MODEL_GRAPH]
    if len(graphs) != 1:
        return Kept(reason="the file holds no single graph")
    graph_fields = list(pw.fields(graphs[0].payload))
    names = {_name(f) for f in graph_fields if f.number in (GRAPH_INPUT, GRAPH_INITIALIZER)}
    if LOGITS_FROM in names:
        return Kept(reason=f"the graph already has a {LOGITS_FROM} input")
    producers: dict[str, GraphNode] = {}
    for field in graph_fields:
        if field.number == GRAPH_NODE:
            parsed = GraphNode.parse(field)
            for output in parsed.outputs:
                producers[output] = parsed
    node = producers.get(logits)
    while node is not None and node.op_type in _ROW_WISE:
        node = producers.get(node.inputs[0]) if node.inputs else None
    if node is None or node.op_type not in _MATMULS or not node.inputs:
        return Kept(reason=f"no MatMul found behind the {logits} output")
    head = node
    hidden = head.inputs[0]
    slice_node = pw.length_delimited(
        GRAPH_NODE,
        [
            *(pw.length_delimited(NODE_INPUT, name.encode()) for name in (hidden, LOGITS_FROM, _ENDS, _AXES)),
            pw.length_delimited(NODE_OUTPUT, _SLICED.encode()),
            pw.length_delimited(NODE_NAME, b"/decoctl/logits_from/Slice"),
            pw.length_delimited(NODE_OP_TYPE, b"Slice"),
        ],
    )
    new_head = pw.length_delimited(GRAPH_NODE, _reading(head.field, _SLICED))
    kept: list[bytes] = []
    for field in graph_fields:
        if field is head.field:
            kept += [slice_node, new_head]
        else:
            kept.append(field.raw)
    kept += [
        pw.length_delimited(GRAPH_INITIALIZER, _int64s(LOGITS_FROM, [0])),
        pw.length_delimited(GRAPH_INITIALIZER, _int64s(_ENDS, [(1 << 63) - 1])),
        pw.length_delimited(GRAPH_INITIALIZER, _int64s(_AXES, [1])),
        pw.length_delimited(GRAPH_INPUT, _int64_input(LOGITS_FROM)),
    ]
    new_graph = pw.length_delimited(MODEL_GRAPH, kept)
    return Rewritten(model=b"".join(new_graph if f is graphs[0] else f.raw for f in model_fields))


def _reading(node: pw.Field, source: str) -> list[bytes]:
    """The node's fields with its first input reading ``source``."""
    out: list[bytes] = []
    first = True
    for part in pw.fields(node.payload):
        if part.number == NODE_INPUT and first:
            out.append(pw.length_delimited(NODE_INPUT, source.encode()))
            first = False
        else:
            out.append(part.raw)
    return out


def _int64s(name: str, values: list[int]) -> list[bytes]:
    """A TensorProto: int64[len(values)] named ``name``."""
    return [
        pw.varint_field(TENSOR_DIMS, len(values)),
        pw.varint_field(TENSOR_DATA_TYPE, INT64),
        pw.length_delimited(TENSOR_NAME, name.encode()),
        pw.length_delimited(TENSOR_RAW_DATA, struct.pack(f"<{len(values)}q", *values)),
    ]


def _int64_input(name: str) -> list[bytes]:
    """A ValueInfoProto: ``name``, int64[1]."""
    dim = pw.length_delimited(SHAPE_DIM, pw.varint_field(DIM_VALUE, 1))
    tensor = [pw.varint_field(TENSOR_ELEM_TYPE, INT64), pw.length_delimited(TENSOR_SHAPE, dim)]
    return [
        pw.length_delimited(VALUE_NAME, name.encode()),
        pw.length_delimited(VALUE_TYPE, pw.length_delimited(TYPE_TENSOR, tensor)),
    ]


def _name(field: pw.Field) -> str:
    number = VALUE_NAME if field.number == GRAPH_INPUT else TENSOR_NAME
    return next((f.text for f in pw.fields(field.payload) if f.number == number), "")
