"""Sliding-window layers that stay exact under tree verification: the window moves from the kernel to the bias.

GroupQueryAttention's ``local_window_size`` (L) counts KV *slots*: the query in slot s sees slots s-L+1..s (L keys,
itself included, as transformers' ``sliding_window``; measured on onnxruntime 1.32's CPU kernel). In a
plain sequence slot and position coincide, so that is the model's sliding window. In a tree forward they do not:
token i of a tree fed after P cached tokens sits in slot P+i but at position P+depth(i), so every sibling fed
before it pushes one more prefix token out of its window (the kernel masks slots <= P+i-L where the model's
window starts after P+depth(i)-L). An additive bias can only hide more, never show what the kernel hid, so no bias
fixes that on the graph as exported.

``rewrite()`` therefore turns the window off in the kernel (``local_window_size = -1``) on every windowed
GroupQueryAttention node that reads the tree's ``attention_bias``, and gives those nodes a bias input of their own
per window size, ``attention_bias_window_{L}``. The runner fills it with the tree (or causal) bias plus the window
counted in positions: the query at position p sees the key at position q iff p - q < L. For a plain sequence
that is the kernel's mask exactly; for a tree it is the plain forward of each token's path, for any prefix
length. Layers without a window keep reading ``attention_bias``.

A node that keeps a ring cache (``sliding_window_cache=1``, decoctl.model._ring_cache) cannot run without a
window: its window is what sizes and evicts the ring. There the kernel window is widened instead, by the ring's
slack S, and the bias carries the model's window: a tree of up to S + 1 tokens then loses nothing to the kernel's
slot-counted window (token i of the tree is cut only at slot P + i - (L + S), which is below every position its
path reads). Weights are never decoded (protowire splices the
graph's bytes), so the onnx package is not needed.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from decoctl.model.graph import _protowire as pw
from decoctl.model.graph._nodes import (
    ATTR_I,
    ATTR_NAME,
    GQA,
    GQA_ATTENTION_BIAS,
    GQA_PAST_KEY,
    GRAPH_INPUT,
    GRAPH_NODE,
    MODEL_GRAPH,
    NODE_ATTRIBUTE,
    NODE_INPUT,
    NODE_OUTPUT,
    VALUE_NAME,
    GraphNode,
    Kept,
    value_name,
)

__all__ = ["Kept", "Rewritten", "WindowBias", "has_window", "rewrite", "ring_windows"]

_WINDOW = "local_window_size"
_RING = "sliding_window_cache"


@attrs.frozen(kw_only=True)
class WindowBias:
    """A graph input that takes the bias of the layers with window ``window`` (GroupQueryAttention's
    local_window_size: a query at position p sees keys at positions p - window + 1 .. p)."""

    name: str
    window: int


@attrs.frozen(kw_only=True)
class Rewritten:
    """The rewritten ModelProto bytes and the window bias inputs it gained. ``widened``: the past-key inputs of
    the ring-cache nodes (``sliding_window_cache=1``) whose kernel window grew by the ``ring_slack`` asked for
    instead of being turned off (a ring needs a window), keyed to their kernel window."""

    model: bytes
    windows: tuple[WindowBias, ...]
    widened: dict[str, int] = attrs.field(factory=dict)


@attrs.define
class _Node(GraphNode):
    """A node with GroupQueryAttention's window attributes read."""

    @property
    def window(self) -> int | None:
        return self.int_attribute(_WINDOW)

    @property
    def ring(self) -> bool:
        return bool(self.int_attribute(_RING))


def _gqa_nodes(model: bytes) -> Iterator[_Node]:
    """Every com.microsoft GroupQueryAttention node of the model's graph."""
    for graph in (f for f in pw.fields(model) if f.number == MODEL_GRAPH):
        for field in pw.fields(graph.payload):
            if field.number == GRAPH_NODE:
                node = _Node.parse(field)
                if node.is_gqa:
                    yield node


def has_window(model: bytes) -> bool:
    """Whether any GroupQueryAttention node of the graph has a sliding window."""
    return any((node.window or 0) > 0 for node in _gqa_nodes(model))


def ring_windows(model: bytes) -> dict[str, int]:
    """The window of every GroupQueryAttention node that keeps a ring cache (``sliding_window_cache=1``), keyed by
    its past-key input."""
    return {
        node.input(GQA_PAST_KEY): node.window
        for node in _gqa_nodes(model)
        if node.ring and node.window is not None and node.window > 0
    }


def rewrite(model: bytes, attention_bias: str, ring_slack: int = 0) -> Rewritten | Kept:
    """Move the window of every windowed GroupQueryAttention node that reads ``attention_bias`` (directly or
    through one Cast to the compute type) into a bias input of its own; see the module docstring. A node with a
    ring cache keeps a kernel window, ``ring_slack`` positions wider than its own (decoctl.model._ring_cache)."""
    model_fields = list(pw.fields(model))
    graphs = [f for f in model_fields if f.number == MODEL_GRAPH]
    if len(graphs) != 1:
        return Kept(reason="the file holds no single graph")
    graph_fields = list(pw.fields(graphs[0].payload))
    bias_info = next((f for f in graph_fields if f.number == GRAPH_INPUT and value_name(f) == attention_bias), None)
    if bias_info is None:
        return Kept(reason=f"the graph has no {attention_bias} input")
    nodes = {id(f): _Node.parse(f) for f in graph_fields if f.number == GRAPH_NODE}
    casts = {
        n.outputs[0]: n
        for n in nodes.values()
        if n.op_type == "Cast" and n.inputs == [attention_bias] and len(n.outputs) == 1
    }
    windowed = [
        n
        for n in nodes.values()
        if n.is_gqa
        and (n.window or 0) > 0
        and (n.input(GQA_ATTENTION_BIAS) == attention_bias or n.input(GQA_ATTENTION_BIAS) in casts)
    ]
    if not windowed:
        return Kept(reason=f"no windowed {GQA} node reads {attention_bias}")
    windows = tuple(
        WindowBias(name=f"{attention_bias}_window_{size}", window=size)
        for size in sorted({n.window for n in windowed if n.window is not None})
    )
    by_size = {w.window: w.name for w in windows}
    new_casts: dict[tuple[str, int], tuple[str, bytes]] = {}
    replaced: dict[int, bytes] = {}
    widened: dict[str, int] = {}
    for node in windowed:
        assert node.window is not None
        kernel = node.window + ring_slack if node.ring else -1
        if node.ring:
            widened[node.input(GQA_PAST_KEY)] = kernel
        source = by_size[node.window]
        read = node.input(GQA_ATTENTION_BIAS)
        if read != attention_bias:  # the bias reaches the node through a Cast: give the window input its own
            key = (read, node.window)
            if key not in new_casts:
                output = f"{read}_window_{node.window}"
                new_casts[key] = (output, _renamed_cast(casts[read], source, output))
            source = new_casts[key][0]
        replaced[id(node.field)] = pw.length_delimited(GRAPH_NODE, _unwindowed(node, source, kernel))
    new_inputs = [pw.length_delimited(GRAPH_INPUT, _renamed_value(bias_info, w.name)) for w in windows]
    kept: list[bytes] = [cast for _, cast in new_casts.values()]  # graph inputs only: topologically first
    kept += [replaced.get(id(f), f.raw) for f in graph_fields]
    new_graph = pw.length_delimited(MODEL_GRAPH, [*kept, *new_inputs])
    rebuilt = b"".join(new_graph if f is graphs[0] else f.raw for f in model_fields)
    return Rewritten(model=rebuilt, windows=windows, widened=widened)


def _unwindowed(node: _Node, bias_input: str, kernel_window: int) -> list[bytes]:
    """The node's fields with local_window_size ``kernel_window`` and its attention-bias slot reading
    ``bias_input``."""
    out: list[bytes] = []
    slot = 0
    for part in node.parts:
        if part.number == NODE_INPUT:
            out.append(pw.length_delimited(NODE_INPUT, bias_input.encode()) if slot == GQA_ATTENTION_BIAS else part.raw)
            slot += 1
        elif part.number == NODE_ATTRIBUTE and any(
            a.number == ATTR_NAME and a.text == _WINDOW for a in pw.fields(part.payload)
        ):
            attribute = [
                pw.varint_field(ATTR_I, kernel_window) if a.number == ATTR_I else a.raw for a in pw.fields(part.payload)
            ]
            out.append(pw.length_delimited(NODE_ATTRIBUTE, attribute))
        else:
            out.append(part.raw)
    return out


def _renamed_cast(cast: _Node, source: str, output: str) -> bytes:
    """A copy of ``cast`` (same attributes) from ``source`` to ``output``, with a name of its own."""
    parts: list[bytes] = []
    for part in cast.parts:
        if part.number == NODE_INPUT:
            parts.append(pw.length_delimited(NODE_INPUT, source.encode()))
        elif part.number == NODE_OUTPUT:
            parts.append(pw.length_delimited(NODE_OUTPUT, output.encode()))
        elif part.number == 3:  # NodeProto.name
            parts.append(pw.length_delimited(3, f"{part.text}_window".encode()))
        else:
            parts.append(part.raw)
    return pw.length_delimited(GRAPH_NODE, parts)


def _renamed_value(value_info: pw.Field, name: str) -> list[bytes]:
    return [
        pw.length_delimited(VALUE_NAME, name.encode()) if f.number == VALUE_NAME else f.raw
        for f in pw.fields(value_info.payload)
    ]
