"""Model-folder rewrites: ``enable_tree`` gives an onnxruntime-genai builder model the inputs tree verification needs.

The builder wires nothing into GroupQueryAttention's optional ``position_ids`` (input 9) and ``attention_bias``
(input 10) when rotary embeddings run inside the op (its default on CPU and CUDA), so the graph can only run
plain chains. ``enable_tree`` adds both as graph inputs, wires them into every GroupQueryAttention node, and
records ``position_ids`` in genai_config.json. Weights are not touched: the graph is read without its external
data and the data files are copied byte for byte.

``disable_tree`` is its inverse, for hosts that feed neither input (onnxruntime-genai, a raw onnxruntime loop): it
empties those two slots, drops the inputs and the config entry, and hard-links the other files instead of copying
them. It edits the graph's bytes with protowire, so it needs no onnx package.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.logs import get_logger
from decoctl.model.graph import _protowire as pw
from decoctl.model.graph._derived import check_new_folder, link, staged_folder
from decoctl.model.graph._nodes import (
    GQA,
    GQA_ATTENTION_BIAS,
    GQA_COS_CACHE,
    GQA_PAST_KEY,
    GQA_POSITION_IDS,
    GRAPH_INPUT,
    GRAPH_NODE,
    GRAPH_OUTPUT,
    GRAPH_VALUE_INFO,
    MODEL_GRAPH,
    MS_DOMAIN,
    NODE_INPUT,
    GraphNode,
    value_name,
)

__all__ = ["ATTENTION_BIAS", "POSITION_IDS", "disable_tree", "enable_tree"]

log = get_logger(__name__)

POSITION_IDS = "position_ids"
ATTENTION_BIAS = "attention_bias"
GENAI_CONFIG = "genai_config.json"
"""The config file of onnxruntime-genai's layout, which the rewrites read and write beside the graph."""

# GroupQueryAttention's input slots in onnxruntime's contrib operator schema (since version 1).


def enable_tree(src: str | Path, dst: str | Path) -> Path:
    """Write a copy of the genai-layout model folder ``src`` to ``dst`` that accepts token trees.

    The copy's graph takes two more inputs, fed to every com.microsoft GroupQueryAttention node:
    ``position_ids`` int64[batch_size, sequence_length] (GroupQueryAttention's rotary positions; it reads only
    the first id of a pass with no past) and ``attention_bias`` float32[batch_size, 1, sequence_length,
    total_sequence_length], added to the attention scores (0 = may attend, -inf = may not; cast to the
    model's compute type when that is not float32). genai_config.json gains ``inputs.position_ids``; every
    other file (tokenizer, external data) is copied unchanged. onnxruntime-genai itself does not feed
    ``attention_bias``, so the copy is for decoctl (and other hosts that feed it).

    :param src: a folder written by onnxruntime-genai's model builder (genai_config.json + its ONNX file).
    :param dst: a new folder (or an empty one); it must not be ``src``.
    :returns: ``dst``.
    :raises ConfigError: onnx is not installed, or ``dst`` is not a new or empty folder.
    :raises ModelLoadError: ``src`` is not a genai-layout folder, or its graph has no GroupQueryAttention node
        to wire (or wires those slots to something else already).
    """
    try:
        import onnx
    except ImportError as exc:
        raise ConfigError("enable-tree rewrites ONNX graphs with the onnx package: pip install onnx") from exc

    source, target = Path(src).expanduser().resolve(), Path(dst).expanduser().resolve()
    config_path = source / GENAI_CONFIG
    if not config_path.is_file():
        raise ModelLoadError(
            f"{source} has no {GENAI_CONFIG}: enable-tree rewrites models exported by onnxruntime-genai's builder"
        )
    check_new_folder(source, target, "enable-tree")

    config, filename, position_ids = _genai_decoder(source)
    inputs = config["model"]["decoder"]["inputs"]
    sized_by = (str(inputs.get("input_ids", "input_ids")), str(inputs.get("attention_mask", "attention_mask")))
    onnx_path = source / filename
    try:
        model = onnx.load_model(str(onnx_path), load_external_data=False)
    except Exception as exc:  # OSError, or protobuf's DecodeError for a file that is not ONNX
        raise ModelLoadError(f"onnx could not read {onnx_path} ({type(exc).__name__}: {exc})") from exc

    if sized_by[0] not in {value.name for value in model.graph.input}:
        # a vision-language decoder (exclude_embeds): its inputs_embeds name the batch and sequence dimensions
        sized_by = (str(inputs.get("inputs_embeds", "inputs_embeds")), sized_by[1])
    wired = _wire_tree_inputs(onnx, model.graph, position_ids, sized_by, onnx_path)
    inputs[POSITION_IDS] = position_ids

    with staged_folder(target, "enable-tree") as staging:
        for entry in source.iterdir():
            if entry.name in (filename, GENAI_CONFIG):
                continue
            if entry.is_dir():
                shutil.copytree(entry, staging / entry.name)
            else:
                shutil.copy2(entry, staging / entry.name)
        # Tensors stay external and unloaded, so save_model writes the graph only; the data files were copied.
        onnx.save_model(model, str(staging / filename))
        (staging / GENAI_CONFIG).write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    log.info("decoctl.tree_enabled", source=str(source), target=str(target), attention_nodes=wired)
    return target


def _wire_tree_inputs(onnx: Any, graph: Any, position_ids: str, sized_by: tuple[str, str], onnx_path: Path) -> int:
    """Add the two graph inputs and wire them into every GroupQueryAttention node; return how many nodes.

    ``sized_by``: the input_ids and attention_mask input names, whose dimensions name the new inputs'.
    """
    nodes = [n for n in graph.node if n.op_type == GQA and n.domain == MS_DOMAIN]
    if not nodes:
        raise ModelLoadError(
            f"{onnx_path} has no com.microsoft GroupQueryAttention node: enable-tree supports models exported "
            "by onnxruntime-genai's builder with GroupQueryAttention (the CPU and CUDA default)"
        )
    graph_inputs = {value.name: value for value in graph.input}
    produced = {name for node in graph.node for name in node.output} | {t.name for t in graph.initializer}
    for name in (position_ids, ATTENTION_BIAS):
        if name in produced:
            raise ModelLoadError(f"{onnx_path} already computes a value named {name!r}; cannot add it as an input")
    had_positions = position_ids in graph_inputs
    rotary_outside = any(_int_attribute(n, "do_rotary") == 0 for n in nodes)
    if rotary_outside and not had_positions and any(n.op_type == "RotaryEmbedding" for n in graph.node):
        raise ModelLoadError(
            f"{onnx_path} applies rotary embeddings outside GroupQueryAttention with positions computed inside "
            "the graph: enable-tree needs rotary inside the op (the builder's CPU/CUDA default) or a position_ids "
            "input"
        )

    compute_type = _compute_type(onnx, graph, nodes[0])
    bias = ATTENTION_BIAS
    new_nodes = []
    if compute_type != onnx.TensorProto.FLOAT:
        bias = f"/model/{ATTENTION_BIAS}/Cast/output_0"
        cast = onnx.helper.make_node("Cast", [ATTENTION_BIAS], [bias], name=f"/model/{ATTENTION_BIAS}/Cast")
        cast.attribute.append(onnx.helper.make_attribute("to", compute_type))
        new_nodes.append(cast)
    for node in nodes:
        slots = list(node.input) + [""] * max(0, GQA_ATTENTION_BIAS + 1 - len(node.input))
        for slot, name in ((GQA_POSITION_IDS, position_ids), (GQA_ATTENTION_BIAS, bias)):
            if slots[slot] not in ("", name):
                raise ModelLoadError(
                    f"{onnx_path}: node {node.name!r} already feeds input {slot} of GroupQueryAttention from "
                    f"{slots[slot]!r}; enable-tree only fills empty slots"
                )
            slots[slot] = name
        del node.input[:]
        node.input.extend(slots)
    for index, extra in enumerate(new_nodes):
        graph.node.insert(index, extra)

    batch, sequence, total = _dims(graph_inputs, sized_by, onnx_path)
    additions = []
    if had_positions:
        _check_input(graph_inputs[position_ids], onnx.TensorProto.INT64, 2, onnx_path)
    else:
        additions.append(onnx.helper.make_tensor_value_info(position_ids, onnx.TensorProto.INT64, [batch, sequence]))
    if ATTENTION_BIAS in graph_inputs:
        _check_input(graph_inputs[ATTENTION_BIAS], onnx.TensorProto.FLOAT, 4, onnx_path)
    else:
        shape = [batch, 1, sequence, total]
        additions.append(onnx.helper.make_tensor_value_info(ATTENTION_BIAS, onnx.TensorProto.FLOAT, shape))
    names = [value.name for value in graph.input]
    at = names.index(sized_by[1]) + 1
    for offset, value in enumerate(additions):
        graph.input.insert(at + offset, value)
    return len(nodes)


def _int_attribute(node: Any, name: str) -> int | None:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(attribute.i)
    return None


def _compute_type(onnx: Any, graph: Any, node: Any) -> int:
    """GroupQueryAttention's T (query and attention_bias type): the cos cache's type, else the past KV's when
    it is a float type, else float32."""
    types = {t.name: t.data_type for t in graph.initializer}
    for value in [*graph.input, *graph.value_info]:
        types[value.name] = value.type.tensor_type.elem_type
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    for slot in (GQA_COS_CACHE, GQA_PAST_KEY):
        if len(node.input) > slot and types.get(node.input[slot]) in floats:
            return int(types[node.input[slot]])
    return int(onnx.TensorProto.FLOAT)


def _dims(graph_inputs: dict[str, Any], sized_by: tuple[str, str], onnx_path: Path) -> tuple[Any, Any, Any]:
    """(batch, sequence, total) dimensions, named as the input_ids (or inputs_embeds) and attention_mask inputs name
    them."""
    missing = [name for name in sized_by if name not in graph_inputs]
    if missing:
        raise ModelLoadError(f"{onnx_path} has no {missing} input: it is not an onnxruntime-genai decoder")
    ids = graph_inputs[sized_by[0]].type.tensor_type.shape.dim
    mask = graph_inputs[sized_by[1]].type.tensor_type.shape.dim
    if len(ids) not in (2, 3) or len(mask) != 2:
        raise ModelLoadError(f"{onnx_path}: {list(sized_by)} must be [batch, length] inputs ([batch, length, hidden])")

    def named(dim: Any, default: str) -> Any:
        return dim.dim_param or (dim.dim_value if dim.HasField("dim_value") else default)

    return named(ids[0], "batch_size"), named(ids[1], "sequence_length"), named(mask[1], "total_sequence_length")


def _check_input(value: Any, elem_type: int, rank: int, onnx_path: Path) -> None:
    tensor = value.type.tensor_type
    if tensor.elem_type != elem_type or len(tensor.shape.dim) != rank:
        raise ModelLoadError(
            f"{onnx_path} already has an input {value.name!r} of another type or rank than tree verification "
            "needs; re-export the model without it"
        )


def disable_tree(src: str | Path, dst: str | Path) -> Path:
    """Write a twin of the genai-layout model folder ``src`` to ``dst`` without the tree inputs (the inverse of
    ``enable_tree``), for hosts that feed neither ``position_ids`` nor ``attention_bias``.

    Every com.microsoft GroupQueryAttention node's slots 9 and 10 are emptied (a Cast that only converted the
    bias goes with them); ``attention_bias`` leaves the graph inputs, and ``position_ids`` too unless another
    node still reads it (then genai_config.json keeps ``inputs.position_ids``, else the entry goes). For a plain
    chain the twin computes what ``src`` computes with consecutive positions and a causal bias. Every other file
    is hard-linked; only where the file system refuses a hard link (another device) is it copied, and that is
    logged: onnxruntime refuses external data reached through a symbolic link out of the model's folder.

    :param src: a genai-layout folder whose graph file holds no weights (the builder keeps them in external data).
    :param dst: a new folder (or an empty one) outside ``src``.
    :returns: ``dst``.
    :raises ConfigError: ``dst`` is not a new or empty folder, or cannot be written.
    :raises ModelLoadError: ``src`` is not a genai-layout folder, its graph is not readable ONNX, has no
        GroupQueryAttention node, or reads the tree inputs elsewhere than those slots.
    """
    source, target = Path(src).expanduser().resolve(), Path(dst).expanduser().resolve()
    config, filename, position_ids = _genai_decoder(source)
    check_new_folder(source, target, "disable-tree")
    onnx_path = source / filename
    try:
        graph_bytes = onnx_path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read {onnx_path} ({exc.strerror}): the model folder is incomplete") from exc
    plain, positions_left = without_tree_inputs(graph_bytes, position_ids, onnx_path)
    if not positions_left:
        config["model"]["decoder"]["inputs"].pop(POSITION_IDS, None)
    with staged_folder(target, "disable-tree") as staging:
        for entry in source.iterdir():
            if entry.name not in (filename, GENAI_CONFIG):
                link(entry, staging / entry.name)
        (staging / filename).write_bytes(plain)
        (staging / GENAI_CONFIG).write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    log.info("decoctl.tree_disabled", source=str(source), target=str(target))
    return target


def _genai_decoder(source: Path) -> tuple[dict[str, Any], str, str]:
    """(genai_config.json, the decoder's graph file name, its position_ids input name) of ``source``; the
    config's decoder always has an ``inputs`` mapping."""
    config_path = source / GENAI_CONFIG
    if not config_path.is_file():
        raise ModelLoadError(f"{source} has no {GENAI_CONFIG}: only onnxruntime-genai builder models have tree inputs")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    try:
        decoder = config["model"]["decoder"]
        filename = str(decoder.get("filename", "model.onnx"))
        inputs = decoder.setdefault("inputs", {})
        position_ids = str(inputs.get(POSITION_IDS, POSITION_IDS))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"{config_path} lacks model.decoder ({exc!r}): re-export the model") from exc
    return config, filename, position_ids


def has_tree_inputs(model: bytes) -> bool:
    """Whether the serialized ModelProto ``model`` takes ``attention_bias`` or wires anything into a
    GroupQueryAttention node's position_ids or attention_bias slot (what ``disable_tree`` would remove)."""
    graph = _single_graph(list(pw.fields(model)), "the model")
    fields = list(pw.fields(graph.payload))
    if ATTENTION_BIAS in {value_name(f) for f in fields if f.number == GRAPH_INPUT}:
        return True
    for field in fields:
        if field.number == GRAPH_NODE:
            node = GraphNode.parse(field)
            if node.is_gqa and any(node.input(s) for s in (GQA_POSITION_IDS, GQA_ATTENTION_BIAS)):
                return True
    return False


def without_tree_inputs(model: bytes, position_ids: str, onnx_path: Path) -> tuple[bytes, bool]:
    """The serialized ModelProto ``model`` without its tree inputs (see ``disable_tree``), and whether the
    ``position_ids`` input stays (another node reads it). Every other field is kept byte for byte."""
    model_fields = list(pw.fields(model))
    graph = _single_graph(model_fields, str(onnx_path))
    fields = list(pw.fields(graph.payload))
    parsed = {i: GraphNode.parse(f, i) for i, f in enumerate(fields) if f.number == GRAPH_NODE}
    attention = [i for i, node in parsed.items() if node.is_gqa]
    if not attention:
        raise ModelLoadError(
            f"{onnx_path} has no com.microsoft GroupQueryAttention node: only onnxruntime-genai builder graphs "
            "with GroupQueryAttention have tree inputs to remove"
        )
    # a Cast of the bias to the model's compute type (enable_tree adds one for half-precision graphs)
    bias_casts = {
        n.outputs[0]: i
        for i, n in parsed.items()
        if n.op_type == "Cast"
        and n.domain in ("", "ai.onnx")
        and n.inputs[:1] == [ATTENTION_BIAS]
        and len(n.outputs) == 1
    }
    for index in attention:
        node = parsed[index]
        for slot, allowed in (
            (GQA_POSITION_IDS, {position_ids}),
            (GQA_ATTENTION_BIAS, {ATTENTION_BIAS, *bias_casts}),
        ):
            if node.input(slot) not in ("", *allowed):
                raise ModelLoadError(
                    f"{onnx_path}: input {slot} of GroupQueryAttention is fed from {node.input(slot)!r}, not from the "
                    f"tree inputs enable-tree adds: give the model as exported, without them"
                )
        emptied = [("" if s in (GQA_POSITION_IDS, GQA_ATTENTION_BIAS) else name) for s, name in enumerate(node.inputs)]
        while emptied and not emptied[-1]:
            emptied.pop()
        node.inputs = emptied
    graph_outputs = {value_name(f) for f in fields if f.number == GRAPH_OUTPUT}

    def read(name: str, skipping: set[int]) -> bool:
        return name in graph_outputs or any(name in n.inputs for i, n in parsed.items() if i not in skipping)

    dropped = {i for name, i in bias_casts.items() if not read(name, {i})}
    if read(ATTENTION_BIAS, dropped):
        raise ModelLoadError(
            f"{onnx_path} reads {ATTENTION_BIAS!r} elsewhere than GroupQueryAttention: a plain graph cannot be "
            "derived from it; give one exported without tree inputs"
        )
    positions_left = read(position_ids, dropped)
    gone = {ATTENTION_BIAS, *(parsed[i].outputs[0] for i in dropped), *(() if positions_left else (position_ids,))}
    kept: list[bytes] = []
    for index, field in enumerate(fields):
        if field.number == GRAPH_NODE:
            if index in dropped:
                continue
            if index in attention:
                kept.append(_with_inputs(field, parsed[index].inputs))
                continue
        elif field.number in (GRAPH_INPUT, GRAPH_VALUE_INFO) and value_name(field) in gone:
            continue
        kept.append(field.raw)
    new_graph = pw.length_delimited(MODEL_GRAPH, kept)
    return b"".join(new_graph if f is graph else f.raw for f in model_fields), positions_left


def _single_graph(model_fields: list[pw.Field], where: str) -> pw.Field:
    graphs = [f for f in model_fields if f.number == MODEL_GRAPH]
    if len(graphs) != 1:
        raise ModelLoadError(f"{where} holds no single ONNX graph: it is not an ONNX model file or is corrupt")
    return graphs[0]


def _with_inputs(field: pw.Field, inputs: list[str]) -> bytes:
    """The NodeProto ``field`` with its inputs replaced (written where its first input was)."""
    parts: list[bytes] = []
    written = False
    for part in pw.fields(field.payload):
        if part.number != NODE_INPUT:
            parts.append(part.raw)
        elif not written:
            parts.extend(pw.length_delimited(NODE_INPUT, name.encode()) for name in inputs)
            written = True
    return pw.length_delimited(GRAPH_NODE, parts)
