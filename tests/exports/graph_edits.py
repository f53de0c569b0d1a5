"""Edits of exported graphs that tests need: a merged decoder, a narrower interface, symbolic KV dimensions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["merge_branches", "narrow_interface", "symbolic_kv_dims"]

_TYPES = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def _is_interface(name: str) -> bool:
    return name == "logits" or name.startswith(("past_key_values.", "present."))


def narrow_interface(path: Path, dtype: str) -> None:
    """Give the graph at ``path`` float16 or bfloat16 logits and KV (inputs and outputs): a Cast after each such
    input and before each such output, everything between unchanged. What decoctl binds is then what a float16 or
    bfloat16 export has, and onnxruntime's CPU kernels, which barely run bfloat16, compute in float32."""
    model = onnx.load(path)
    graph, to = model.graph, _TYPES[dtype]
    first, last = [], []
    for value in graph.input:
        if _is_interface(value.name) and value.type.tensor_type.elem_type == TensorProto.FLOAT:
            inner = f"{value.name}.float32"
            _rename_inputs(graph, value.name, inner)
            first.append(helper.make_node("Cast", [value.name], [inner], to=TensorProto.FLOAT))
            value.type.tensor_type.elem_type = to
    for value in graph.output:
        if _is_interface(value.name) and value.type.tensor_type.elem_type == TensorProto.FLOAT:
            inner = f"{value.name}.float32"
            _rename_inputs(graph, value.name, inner)
            for node in graph.node:
                node.output[:] = [inner if o == value.name else o for o in node.output]
            last.append(helper.make_node("Cast", [inner], [value.name], to=to))
            value.type.tensor_type.elem_type = to
    nodes = [*first, *graph.node, *last]  # topological order: the inputs' Casts before every reader
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, path)


def symbolic_kv_dims(path: Path) -> None:
    """Make the KV inputs' and outputs' heads and head size symbolic (``kv_heads``, ``head_size``), as an export
    without fixed KV dimensions has them: decoctl then takes the config's."""
    model = onnx.load(path)
    for value in (*model.graph.input, *model.graph.output):
        if value.name.startswith(("past_key_values.", "present.")):
            dims = value.type.tensor_type.shape.dim
            dims[1].dim_param, dims[3].dim_param = "kv_heads", "head_size"
    onnx.save(model, path)


def merge_branches(path: Path, target: Path) -> None:
    """Write to ``target`` an Optimum 1.x style merged decoder made from the graph at ``path`` (one that takes a
    past): a new boolean input ``use_cache_branch`` and one If node whose then-branch is that graph and whose
    else-branch is the same graph fed an empty past, both reading the weights from the outer graph, as
    ``optimum.onnx.merge_decoders`` lays them out. The else-branch adds 1 to every logit, so a test sees which
    branch ran (batch size 1 only: its empty past has batch 1)."""
    model = onnx.load(path)
    graph = model.graph
    outer = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    past = {v.name: v for v in graph.input if v.name.startswith("past_key_values.")}

    def branch(prefix: str, shared: set[str]) -> list[Any]:
        nodes = []
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [i if i in shared or not i else prefix + i for i in node.input]
            copy.output[:] = [prefix + o for o in node.output]
            copy.name = prefix + node.name
            nodes.append(copy)
        return nodes

    then_nodes = branch("then/", outer)
    else_nodes = []
    for name, value in past.items():
        heads, size = (d.dim_value for d in value.type.tensor_type.shape.dim[1::2])
        empty = numpy_helper.from_array(np.zeros((1, heads, 0, size), np.float32), f"else/{name}")
        else_nodes.append(helper.make_node("Constant", [], [f"else/{name}"], value=empty))
    else_nodes += branch("else/", outer - set(past))
    one = numpy_helper.from_array(np.ones((), np.float32), "else/one")
    else_nodes += [
        helper.make_node("Constant", [], ["else/one"], value=one),
        helper.make_node("Add", ["else/logits", "else/one"], ["else/logits.marked"]),
    ]

    def outputs(prefix: str, logits: str) -> list[Any]:
        return [
            helper.make_tensor_value_info(logits if o.name == "logits" else prefix + o.name, TensorProto.FLOAT, None)
            for o in graph.output
        ]

    merged = helper.make_node(
        "If",
        ["use_cache_branch"],
        [o.name for o in graph.output],
        then_branch=helper.make_graph(then_nodes, "with_past", [], outputs("then/", "then/logits")),
        else_branch=helper.make_graph(else_nodes, "without_past", [], outputs("else/", "else/logits.marked")),
    )
    graph.input.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    del graph.node[:]
    graph.node.append(merged)
    del graph.value_info[:]
    onnx.save(model, target)


def _rename_inputs(graph: Any, old: str, new: str) -> None:
    """Every node (and subgraph node) that reads ``old`` reads ``new``."""
    for node in graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _rename_inputs(attribute.g, old, new)
