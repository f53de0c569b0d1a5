"""LoRA slots as stacked tables with a per-row index: rows of different adapters in one Run.

A base model with LoRA slots computes ``(X @ A) @ B`` beside each adapted ``X @ W``, with ``A`` float[in, rank] and
``B`` float[rank, out] overridable initializers (decoctl.model._adapters). Those are inputs of the whole Run, shared by
its rows. ``rewrite()`` makes every slot a stacked table instead, ``A`` float[adapters, in, rank] and ``B``
float[adapters, rank, out] (table 0 zeros: the base model), and adds one input ``lora_index`` int64[batch] naming each
row's table; a Gather before each use picks each row's ``A`` and ``B``, so the two MatMuls become batched ones over
``X`` float[batch, sequence, in] and every row computes ``(X[r] @ A[i_r]) @ B[i_r]``. Ranks smaller than the table's
are zero-padded, which adds exact zeros.

That holds where ``X`` keeps its rows apart (rank 3: [batch, sequence, in]). A graph whose slot reads ``X`` flattened
into tokens ([batch * sequence, in]), or whose rank the walk cannot tell, is refused with the slot named: a per-row
table cannot be picked there. Weights are never decoded (protowire splices the graph's bytes).
"""

from __future__ import annotations

import attrs

from decoctl.errors import ModelLoadError
from decoctl.model.graph import _protowire as pw
from decoctl.model.graph._nodes import (
    ATTR_T,
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
    TENSOR_DIMS,
    TENSOR_ELEM_TYPE,
    TENSOR_NAME,
    TENSOR_SHAPE,
    TYPE_TENSOR,
    VALUE_NAME,
    VALUE_TYPE,
    GraphNode,
    value_name,
)

__all__ = ["LORA_INDEX", "SlotShape", "Stacked", "rewrite"]

#: the graph input naming each row's table (int64[batch]; 0: the base model)
LORA_INDEX = "lora_index"
#: the leading dimension every stacked slot takes
ADAPTERS_DIM = "lora_adapters"
_DIM_PARAM = 2
#: onnx element types a slot may hold: FLOAT, FLOAT16
_FLOATING = {1: "float32", 10: "float16"}
#: ops whose output has the rank of their widest input (elementwise, with broadcasting)
_ELEMENTWISE = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Cast", "Identity", "Sigmoid", "Tanh", "Relu", "Erf",
        "Gelu", "FastGelu", "QuickGelu", "BiasGelu", "Silu", "Softmax", "Where",
    }
)  # fmt: skip
#: ops whose outputs have the rank of their first input (normalisations, attention over [batch, sequence, hidden],
#: quantized projections, a packed projection's Split, the Pad that places its LoRA columns: graph._lora_slots; a
#: tied embedding's Transpose of the lm_head weight, Slice)
_LIKE_FIRST = frozenset(
    {
        "MatMulNBits", "Pad", "Split", "Transpose", "Slice", "SimplifiedLayerNormalization",
        "SkipSimplifiedLayerNormalization", "LayerNormalization", "SkipLayerNormalization", "RMSNormalization",
        "GroupQueryAttention", "MultiHeadAttention", "Attention",
    }
)  # fmt: skip


@attrs.frozen(kw_only=True)
class SlotShape:
    """One LoRA slot as the base graph declares it: its numpy type name and 2-D shape (ints where fixed)."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]


@attrs.frozen(kw_only=True)
class Stacked:
    """The rewritten ModelProto bytes, its slots (as the base graph had them) and the index input's name."""

    model: bytes
    slots: tuple[SlotShape, ...]
    index: str = LORA_INDEX


def rewrite(model: bytes, where: str) -> Stacked:
    """The graph with its LoRA slots stacked and a ``lora_index`` input (module docstring); ModelLoadError naming
    ``where`` and the slot where a graph has no slots or uses one in a way a per-row table cannot follow."""
    if not model:  # the loader reads graph files up to its in-memory limit only
        raise ModelLoadError(
            f"{where} is too large to rewrite in memory (its weights inside the graph file), so its LoRA slots cannot "
            "be stacked: export it with its weights in an external data file, as onnxruntime-genai's builder does"
        )
    model_fields = list(pw.fields(model))
    graphs = [f for f in model_fields if f.number == MODEL_GRAPH]
    if len(graphs) != 1:
        raise ModelLoadError(f"{where} holds no single graph: its LoRA slots cannot be stacked")
    graph_fields = list(pw.fields(graphs[0].payload))
    initializers = {_tensor_name(f): f for f in graph_fields if f.number == GRAPH_INITIALIZER}
    inputs = {value_name(f): f for f in graph_fields if f.number == GRAPH_INPUT}
    if LORA_INDEX in inputs:
        raise ModelLoadError(f"{where} already has a {LORA_INDEX} input: load it as it is, without stacking")
    slots = {}
    for name, field in inputs.items():
        if name in initializers:
            declared = _declared(field)
            if declared is not None and declared[0] in _FLOATING and len(declared[1]) == 2:
                slots[name] = SlotShape(name=name, dtype=_FLOATING[declared[0]], shape=declared[1])
    if not slots:
        raise ModelLoadError(
            f"{where} has no LoRA slots (overridable float initializers of rank 2): export the base model with "
            "them (docs/ADAPTERS.md)"
        )
    nodes = [GraphNode.parse(f, i) for i, f in enumerate(f for f in graph_fields if f.number == GRAPH_NODE)]
    readers: dict[str, list[GraphNode]] = {}
    for node in nodes:
        for name in node.inputs:
            readers.setdefault(name, []).append(node)
    ranks = _ranks(nodes, inputs, initializers)
    gathers: dict[int, list[bytes]] = {}  # node index -> Gathers to place before it
    renamed: dict[int, dict[int, str]] = {}  # node index -> input slot -> new name
    paired: set[str] = set()
    for name in slots:
        uses = readers.get(name, [])
        if len(uses) != 1 or uses[0].op_type != "MatMul" or uses[0].input(1) != name:
            continue  # a B (read by the second MatMul), or a slot this walk does not pair: checked below
        first = uses[0]
        after = readers.get(first.outputs[0], [])
        second = after[0] if len(after) == 1 and after[0].op_type == "MatMul" else None
        b = second.input(1) if second is not None and second.input(0) == first.outputs[0] else ""
        if second is None or b not in slots or b == name:
            continue  # a B (its MatMul's output is added to X @ W), or a slot of another form: checked below
        if readers.get(b, []) != [second]:
            raise ModelLoadError(
                f"{where}: LoRA slot {b} is read by more than the MatMul after {name}: decoctl stacks slots read once, "
                "as X @ W + (X @ A) @ B"
            )
        rank = ranks.get(first.input(0))
        if rank != 3:
            shape = "flattened into tokens (rank 2)" if rank == 2 else "of a rank the graph does not tell"
            raise ModelLoadError(
                f"{where}: LoRA slot {name} reads {first.input(0)}, {shape}, where rows of different adapters need "
                "[batch, sequence, in] to pick each row's table: export the model with its projections over "
                "[batch, sequence, hidden], or serve one adapter per model (merge its weights)"
            )
        for node, slot in ((first, name), (second, b)):
            picked = f"{slot}/{LORA_INDEX}"
            gathers.setdefault(node.index, []).append(_gather(slot, picked))
            renamed.setdefault(node.index, {})[1] = picked
        paired.update((name, b))
    unpaired = sorted(set(slots) - paired)
    if unpaired:
        raise ModelLoadError(
            f"{where}: LoRA slot(s) {unpaired[:4]} are not read as (X @ A) @ B: decoctl stacks slots of that form "
            "only; export the adapted projections as X @ W + (X @ A) @ B"
        )
    kept: list[bytes] = []
    node_index = 0
    for field in graph_fields:
        if field.number == GRAPH_NODE:
            kept += gathers.get(node_index, [])
            changed = renamed.get(node_index)
            kept.append(field.raw if changed is None else _with_inputs(nodes[node_index], changed))
            node_index += 1
        elif field.number == GRAPH_INITIALIZER and _tensor_name(field) in slots:
            continue  # the slot's zeros: the stacked input has no default
        elif field.number == GRAPH_INPUT and value_name(field) in slots:
            kept.append(pw.length_delimited(GRAPH_INPUT, _stacked_input(field)))
        else:
            kept.append(field.raw)
    kept.append(pw.length_delimited(GRAPH_INPUT, _index_input()))
    new_graph = pw.length_delimited(MODEL_GRAPH, kept)
    rewritten = b"".join(new_graph if f is graphs[0] else f.raw for f in model_fields)
    return Stacked(model=rewritten, slots=tuple(slots[name] for name in slots))


def _ranks(nodes: list[GraphNode], inputs: dict[str, pw.Field], initializers: dict[str, pw.Field]) -> dict[str, int]:
    """The rank of every value the walk can tell, in one pass over the (topologically ordered) nodes."""
    ranks: dict[str, int] = {}
    sizes: dict[str, int] = {}  # a 1-D Constant's one size (a Reshape's shape: the rank it gives)
    for name, field in inputs.items():
        declared = _declared(field)
        if declared is not None:
            ranks[name] = len(declared[1])
    for name, field in initializers.items():
        ranks[name] = _packed_dims(field)
    for node in nodes:
        known = [ranks.get(name) for name in node.inputs if name]
        rank: int | None = None
        if node.op_type in _ELEMENTWISE or node.op_type in ("MatMul", "FusedMatMul"):
            rank = None if not known or None in known else max(r for r in known if r is not None)
        elif node.op_type in _LIKE_FIRST:
            rank = known[0] if known else None
        elif node.op_type == "Gather" and len(known) == 2 and None not in known:
            data, indices = known
            rank = None if data is None or indices is None else data - 1 + indices
        elif node.op_type == "Reshape" and node.input(1) in initializers:
            rank = _packed_dims(initializers[node.input(1)], values=True)
        elif node.op_type == "Reshape" and node.input(1) in sizes:
            rank = sizes[node.input(1)]
        elif node.op_type == "Constant":  # the builder's scalars and shapes (Gemma's embedding scale, q_norm's
            rank = _constant_rank(node)  # Reshapes) are Constant nodes
            tensor = [f for f in node.attributes.get("value", ()) if f.number == ATTR_T]
            if rank == 1 and tensor:
                sizes[node.outputs[0]] = _packed_dims(tensor[0], values=True)
        if rank is not None:
            ranks[node.outputs[0]] = rank
            if node.op_type in _LIKE_FIRST:  # a skip norm's residual sum, a Split's every part: the same rank
                ranks.update({out: rank for out in node.outputs[1:] if out})
    return ranks


def _constant_rank(node: GraphNode) -> int | None:
    """A Constant node's output rank: its ``value`` tensor's dims, 0 for a scalar attribute, 1 for a list."""
    tensor = [f for f in node.attributes.get("value", ()) if f.number == ATTR_T]
    if tensor:
        return _packed_dims(tensor[0])
    if any(name in node.attributes for name in ("value_float", "value_int", "value_string")):
        return 0
    if any(name in node.attributes for name in ("value_floats", "value_ints", "value_strings")):
        return 1
    return None


def _packed_dims(field: pw.Field, *, values: bool = False) -> int:
    """A TensorProto's rank (its dims, packed or not), or with ``values`` its one dim's size (a Reshape's shape)."""
    dims = [d for f in pw.fields(field.payload) if f.number == TENSOR_DIMS for d in pw.packed_varints(f)]
    if not values:
        return len(dims)
    return dims[0] if len(dims) == 1 else -1


def _declared(field: pw.Field) -> tuple[int, tuple[int | str | None, ...]] | None:
    """A ValueInfoProto's (element type, dims), or None where it declares no tensor shape."""
    for part in pw.fields(field.payload):
        if part.number != VALUE_TYPE:
            continue
        for kind in pw.fields(part.payload):
            if kind.number != TYPE_TENSOR:
                continue
            elem, dims, shaped = 0, [], False
            for item in pw.fields(kind.payload):
                if item.number == TENSOR_ELEM_TYPE:
                    elem = item.number_value
                elif item.number == TENSOR_SHAPE:
                    shaped = True
                    for dim in pw.fields(item.payload):
                        if dim.number == SHAPE_DIM:
                            dims.append(_dim(dim))
            return (elem, tuple(dims)) if shaped else None
    return None


def _dim(field: pw.Field) -> int | str | None:
    for part in pw.fields(field.payload):
        if part.number == DIM_VALUE:
            return part.number_value
        if part.number == _DIM_PARAM:
            return part.text
    return None


def _stacked_input(field: pw.Field) -> list[bytes]:
    """A slot's ValueInfoProto with a leading ``lora_adapters`` dimension."""
    out: list[bytes] = []
    for part in pw.fields(field.payload):
        if part.number != VALUE_TYPE:
            out.append(part.raw)
            continue
        kinds = []
        for kind in pw.fields(part.payload):
            if kind.number != TYPE_TENSOR:
                kinds.append(kind.raw)
                continue
            items = []
            for item in pw.fields(kind.payload):
                if item.number == TENSOR_SHAPE:
                    leading = pw.length_delimited(SHAPE_DIM, pw.length_delimited(_DIM_PARAM, ADAPTERS_DIM.encode()))
                    items.append(pw.length_delimited(TENSOR_SHAPE, leading + item.payload))
                else:
                    items.append(item.raw)
            kinds.append(pw.length_delimited(TYPE_TENSOR, items))
        out.append(pw.length_delimited(VALUE_TYPE, kinds))
    return out


def _index_input() -> list[bytes]:
    """The ValueInfoProto of ``lora_index``: int64[batch_size]."""
    dim = pw.length_delimited(SHAPE_DIM, pw.length_delimited(_DIM_PARAM, b"batch_size"))
    tensor = [pw.varint_field(TENSOR_ELEM_TYPE, INT64), pw.length_delimited(TENSOR_SHAPE, dim)]
    return [
        pw.length_delimited(VALUE_NAME, LORA_INDEX.encode()),
        pw.length_delimited(VALUE_TYPE, pw.length_delimited(TYPE_TENSOR, tensor)),
    ]


def _gather(slot: str, output: str) -> bytes:
    """Gather(slot, lora_index) along axis 0 (the default): each row's table."""
    return pw.length_delimited(
        GRAPH_NODE,
        [
            pw.length_delimited(NODE_INPUT, slot.encode()),
            pw.length_delimited(NODE_INPUT, LORA_INDEX.encode()),
            pw.length_delimited(NODE_OUTPUT, output.encode()),
            pw.length_delimited(NODE_NAME, f"/decoctl/lora/{slot}/Gather".encode()),
            pw.length_delimited(NODE_OP_TYPE, b"Gather"),
        ],
    )


def _with_inputs(node: GraphNode, changed: dict[int, str]) -> bytes:
    """``node`` with the inputs at the slots ``changed`` names reading the new names."""
    out: list[bytes] = []
    slot = 0
    for part in node.parts:
        if part.number == NODE_INPUT:
            name = changed.get(slot)
            out.append(part.raw if name is None else pw.length_delimited(NODE_INPUT, name.encode()))
            slot += 1
        else:
            out.append(part.raw)
    return pw.length_delimited(GRAPH_NODE, out)


def _tensor_name(field: pw.Field) -> str:
    return next((f.text for f in pw.fields(field.payload) if f.number == TENSOR_NAME), "")
