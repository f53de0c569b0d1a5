"""ONNX's graph pieces as the rewrites read them from the wire (decoctl.model.graph._protowire): the field numbers
from onnx.proto they use (ModelProto, GraphProto, NodeProto, AttributeProto, ValueInfoProto, TypeProto,
TensorShapeProto, TensorProto; element types INT32 and INT64), a node parsed once (inputs, outputs, op type,
domain and attributes by name), and ``Kept``, what a rewrite answers when it leaves a graph as it is."""

from __future__ import annotations

import attrs

from decoctl.model.graph import _protowire as pw

__all__ = [
    "ATTR_I",
    "ATTR_INTS",
    "ATTR_NAME",
    "ATTR_T",
    "DIM_VALUE",
    "GQA",
    "GQA_ATTENTION_BIAS",
    "GQA_COS_CACHE",
    "GQA_PAST_KEY",
    "GQA_POSITION_IDS",
    "GQA_SEQLENS_K",
    "GQA_TOTAL_LENGTH",
    "GRAPH_INITIALIZER",
    "GRAPH_INPUT",
    "GRAPH_NODE",
    "GRAPH_OUTPUT",
    "GRAPH_VALUE_INFO",
    "INT32",
    "INT64",
    "MODEL_GRAPH",
    "MS_DOMAIN",
    "NODE_ATTRIBUTE",
    "NODE_DOMAIN",
    "NODE_INPUT",
    "NODE_NAME",
    "NODE_OP_TYPE",
    "NODE_OUTPUT",
    "SHAPE_DIM",
    "TENSOR_DATA_TYPE",
    "TENSOR_DIMS",
    "TENSOR_ELEM_TYPE",
    "TENSOR_INT64_DATA",
    "TENSOR_NAME",
    "TENSOR_RAW_DATA",
    "TENSOR_SHAPE",
    "TYPE_TENSOR",
    "VALUE_NAME",
    "VALUE_TYPE",
    "GraphNode",
    "Kept",
    "signed",
    "value_name",
]

MODEL_GRAPH = 7
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT, GRAPH_VALUE_INFO = 1, 5, 11, 12, 13
NODE_INPUT, NODE_OUTPUT, NODE_NAME, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN = 1, 2, 3, 4, 5, 7
ATTR_NAME, ATTR_I, ATTR_T, ATTR_INTS = 1, 3, 5, 8
VALUE_NAME, VALUE_TYPE = 1, 2
TYPE_TENSOR, TENSOR_ELEM_TYPE, TENSOR_SHAPE, SHAPE_DIM, DIM_VALUE = 1, 1, 2, 1, 1
TENSOR_DIMS, TENSOR_DATA_TYPE, TENSOR_INT64_DATA, TENSOR_NAME, TENSOR_RAW_DATA = 1, 2, 7, 8, 9
INT32, INT64 = 6, 7
#: onnxruntime's GroupQueryAttention, and the input slots the rewrites read or wire
GQA, MS_DOMAIN = "GroupQueryAttention", "com.microsoft"
GQA_PAST_KEY, GQA_SEQLENS_K, GQA_TOTAL_LENGTH, GQA_COS_CACHE, GQA_POSITION_IDS, GQA_ATTENTION_BIAS = 3, 5, 6, 7, 9, 10


@attrs.frozen(kw_only=True)
class Kept:
    """The graph stays as it is; ``reason`` says why."""

    reason: str


@attrs.define
class GraphNode:
    """One NodeProto: ``field`` as read, ``parts`` its fields in order (for writing it again), ``index`` its place
    among the graph's nodes, ``attributes`` each attribute's fields by name."""

    field: pw.Field
    index: int = 0
    parts: list[pw.Field] = attrs.Factory(list)
    op_type: str = ""
    domain: str = ""
    inputs: list[str] = attrs.Factory(list)
    outputs: list[str] = attrs.Factory(list)
    attributes: dict[str, list[pw.Field]] = attrs.Factory(dict)

    @classmethod
    def parse(cls, field: pw.Field, index: int = 0) -> GraphNode:
        node = cls(field=field, index=index, parts=list(pw.fields(field.payload)))
        for part in node.parts:
            if part.number == NODE_INPUT:
                node.inputs.append(part.text)
            elif part.number == NODE_OUTPUT:
                node.outputs.append(part.text)
            elif part.number == NODE_OP_TYPE:
                node.op_type = part.text
            elif part.number == NODE_DOMAIN:
                node.domain = part.text
            elif part.number == NODE_ATTRIBUTE:
                attribute = list(pw.fields(part.payload))
                name = next((a.text for a in attribute if a.number == ATTR_NAME), "")
                node.attributes[name] = attribute
        return node

    @property
    def is_gqa(self) -> bool:
        """Whether the node is onnxruntime's (com.microsoft) GroupQueryAttention."""
        return self.op_type == GQA and self.domain == MS_DOMAIN

    def input(self, slot: int) -> str:
        """The name fed to input ``slot`` ("" where none is)."""
        return self.inputs[slot] if len(self.inputs) > slot else ""

    def int_attribute(self, name: str) -> int | None:
        """An int attribute's value (None where the node has none)."""
        values = [f.number_value for f in self.attributes.get(name, ()) if f.number == ATTR_I]
        return signed(values[0]) if values else None


def signed(value: int) -> int:
    """A varint read as int64."""
    return value - (1 << 64) if value >= 1 << 63 else value


def value_name(field: pw.Field) -> str:
    """A ValueInfoProto's name (a graph input, output or value_info)."""
    return next((f.text for f in pw.fields(field.payload) if f.number == VALUE_NAME), "")
