"""``add_lora_slots``: a copy of an onnxruntime-genai builder model whose chosen projections take LoRA adapters.

The builder names every projection's node ``/model/layers.{i}/{attn|mlp}/{proj}/MatMul`` (``MatMul_Q4``/``_Q8`` for
its MatMulNBits), and on CPU it packs the attention's three input projections into one, ``qkv_proj`` (columns: the
queries' ``heads * head_size``, then the keys' and the values' ``kv_heads * head_size`` each). Each targeted
projection ``Y = X @ W`` becomes ``Y = X @ W + (X @ A) @ B``, with ``A`` float[in, rank] and ``B`` float[rank, out]
graph inputs that are also initializers holding zeros (rank 1), so that the copy run as it is computes what the
source computes (decoctl.model._adapters). A target inside a packed projection (``q_proj`` in ``qkv_proj``) has its
own slot, ``B`` as wide as the target alone; a Pad places its ``(X @ A) @ B`` at the target's columns.

Slots are named after the Hugging Face module a PEFT adapter adapts, so that a PEFT adapter's parameter names map onto
them one to one (decoctl.model._peft): ``model.layers.{i}.self_attn.{proj}.lora_A`` / ``.lora_B`` for the attention
(the builder's ``attn``), ``model.layers.{i}.mlp.{proj}.lora_A`` / ``.lora_B`` for the MLP. Each slot pair has a rank
dimension of its own (``{module}.lora_rank``), so adapters of any rank, or of different ranks per module, fit.

Weights are never decoded: the graph is read without its external data, the new zeros are written inside the graph
file, and every other file is hard-linked (copied where the file system refuses a link).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.logs import get_logger
from decoctl.model.graph._derived import check_new_folder, link, staged_folder
from decoctl.model.graph._transform import GENAI_CONFIG

__all__ = ["LORA_SLOTS_KEY", "ProjectionSlot", "add_lora_slots", "lora_slots", "slot_module"]

log = get_logger(__name__)

#: ONNX metadata: the modules add_lora_slots gave slots, comma separated
LORA_SLOTS_KEY = "decoctl.lora.modules"
#: the builder's projection nodes: layer, block (attn or mlp), projection, MatMul (MatMul_Q4 / MatMul_Q8 for NBits)
_PROJECTION = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+_proj)/MatMul(?:_Q\d+)?$")
#: the builder's block names -> the Hugging Face module names PEFT adapters use
_BLOCKS = {"attn": "self_attn", "mlp": "mlp"}
_PACKED_QKV = "qkv_proj"
_QKV = ("q_proj", "k_proj", "v_proj")
#: onnx element types a slot may take (the model's activations): FLOAT, FLOAT16
_FLOATING = {1: "float32", 10: "float16"}
#: the first opset whose Pad takes ``axes`` (a packed target's columns are padded along the last axis only)
_PAD_AXES_OPSET = 18


@attrs.frozen(kw_only=True)
class ProjectionSlot:
    """One slot: the Hugging Face ``module`` it adapts, its graph inputs ``a`` [fan_in, rank] and ``b`` [rank,
    fan_out], the builder node it adds to, and the columns of that node's output it adds to (``start`` ..
    ``start + fan_out``; the whole output unless the node is packed)."""

    module: str
    a: str
    b: str
    node: str
    fan_in: int
    fan_out: int
    start: int
    width: int


def slot_module(layer: int, block: str, projection: str) -> str:
    """A builder projection's Hugging Face module: (3, "attn", "q_proj") -> model.layers.3.self_attn.q_proj."""
    return f"model.layers.{layer}.{_BLOCKS[block]}.{projection}"


def add_lora_slots(src: str | Path, dst: str | Path, targets: Iterable[str]) -> dict[str, ProjectionSlot]:
    """Write a copy of the builder model folder ``src`` to ``dst`` with a LoRA slot on every projection named in
    ``targets`` (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``, or a
    packed one such as ``qkv_proj``), in every layer; module docstring.

    :returns: module name -> its slot.
    :raises ConfigError: onnx is not installed, ``targets`` is empty or names a projection the graph has not, or
        ``dst`` is not a new or empty folder outside ``src``.
    :raises ModelLoadError: ``src`` is not a builder folder, or its graph has slots already.
    """
    try:
        import onnx
    except ImportError as exc:
        raise ConfigError("add-lora-slots rewrites ONNX graphs with the onnx package: pip install onnx") from exc
    wanted = tuple(dict.fromkeys(t.strip() for t in targets if t.strip()))
    if not wanted:
        raise ConfigError("add-lora-slots --targets: name the projections to adapt, e.g. q_proj,v_proj")
    source, target = Path(src).expanduser().resolve(), Path(dst).expanduser().resolve()
    decoder = _decoder(source)
    filename = str(decoder.get("filename", "model.onnx"))
    check_new_folder(source, target, "add-lora-slots")
    onnx_path = source / filename
    try:
        model = onnx.load_model(str(onnx_path), load_external_data=False)
    except Exception as exc:  # OSError, or protobuf's DecodeError for a file that is not ONNX
        raise ModelLoadError(f"onnx could not read {onnx_path} ({type(exc).__name__}: {exc})") from exc
    slots = _add_slots(onnx, model, wanted, decoder, onnx_path)
    props = {prop.key: prop.value for prop in model.metadata_props}
    onnx.helper.set_model_props(model, {**props, LORA_SLOTS_KEY: ",".join(slots)})
    with staged_folder(target, "add-lora-slots") as staging:
        for entry in source.iterdir():
            if entry.name != filename:
                link(entry, staging / entry.name)
        # tensors stay external and unloaded, so save_model writes the graph (and the slots' zeros) only
        onnx.save_model(model, str(staging / filename))
    log.info("decoctl.lora_slots_added", source=str(source), target=str(target), targets=list(wanted), slots=len(slots))
    return slots


def lora_slots(folder: str | Path) -> dict[str, tuple[str, tuple[int | str, ...]]]:
    """The LoRA slots of a model folder's graph (overridable float initializers: graph inputs that are also
    initializers): slot name -> (numpy type name, declared shape, ints where fixed). The graph is read without its
    weights."""
    try:
        import onnx
    except ImportError as exc:
        raise ConfigError("reading a model's LoRA slots needs the onnx package: pip install onnx") from exc
    source = Path(folder).expanduser()
    onnx_path = source / str(_decoder(source).get("filename", "model.onnx"))
    try:
        graph = onnx.load_model(str(onnx_path), load_external_data=False).graph
    except Exception as exc:  # OSError, or protobuf's DecodeError for a file that is not ONNX
        raise ModelLoadError(f"onnx could not read {onnx_path} ({type(exc).__name__}: {exc})") from exc
    initializers = {t.name for t in graph.initializer}
    slots = {}
    for value in graph.input:
        tensor = value.type.tensor_type
        if value.name in initializers and tensor.elem_type in _FLOATING:
            dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim)
            slots[value.name] = (_FLOATING[tensor.elem_type], dims)
    return slots


def _decoder(source: Path) -> Mapping[str, Any]:
    config_path = source / GENAI_CONFIG
    if not config_path.is_file():
        raise ModelLoadError(
            f"{source} has no {GENAI_CONFIG}: LoRA slots are added to models exported by onnxruntime-genai's builder"
        )
    try:
        decoder = json.loads(config_path.read_text(encoding="utf-8"))["model"]["decoder"]
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{config_path} lacks model.decoder ({exc!r}): re-export the model") from exc
    if not isinstance(decoder, dict):
        raise ModelLoadError(f"{config_path}: model.decoder is not an object: re-export the model")
    return decoder


def _packed_columns(decoder: Mapping[str, Any], width: int, where: Path) -> dict[str, tuple[int, int]]:
    """The columns of q_proj, k_proj and v_proj inside the builder's packed qkv_proj: name -> (start, width)."""
    try:
        heads, kv_heads = int(decoder["num_attention_heads"]), int(decoder["num_key_value_heads"])
        head_size = int(decoder["head_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{where.parent / GENAI_CONFIG} lacks decoder.num_attention_heads, num_key_value_heads or head_size, "
            "which place q_proj, k_proj and v_proj inside qkv_proj: re-export the model"
        ) from exc
    q, kv = heads * head_size, kv_heads * head_size
    if q + 2 * kv != width:
        raise ModelLoadError(
            f"{where}: qkv_proj has {width} outputs where genai_config.json's heads make {q} + 2 x {kv}: the packed "
            "projection cannot be split into q_proj, k_proj and v_proj; target qkv_proj itself"
        )
    return {"q_proj": (0, q), "k_proj": (q, kv), "v_proj": (q + kv, kv)}


def _io_type(graph: Any, where: Path) -> int:
    """The model's activation type: its KV cache's (what the builder calls io_dtype), else its logits'."""
    for value in (*graph.input, *graph.output):
        if value.name.startswith("past_key_values") or value.name == "logits":
            elem = int(value.type.tensor_type.elem_type)
            if elem in _FLOATING:
                return elem
            raise ModelLoadError(f"{where}: activations of onnx type {elem}: LoRA slots are float32 or float16 only")
    raise ModelLoadError(f"{where} has neither a KV cache input nor logits: it is not an onnxruntime-genai decoder")


def _add_slots(
    onnx: Any, model: Any, wanted: tuple[str, ...], decoder: Mapping[str, Any], where: Path
) -> dict[str, ProjectionSlot]:
    graph = model.graph
    if any(value.name.endswith((".lora_A", ".lora_B")) for value in graph.input):
        raise ModelLoadError(f"{where} has LoRA slots already: add slots to the model exported without them")
    io_type = _io_type(graph, where)
    initializers = {t.name: t for t in graph.initializer}
    # a weight stored in another type reaches its MatMul through a Cast (the demo models keep float16 weights)
    for node in graph.node:
        if node.op_type == "Cast" and node.input[0] in initializers:
            initializers.setdefault(node.output[0], initializers[node.input[0]])
    found: dict[str, list[ProjectionSlot]] = {}  # node name -> its slots
    seen: set[str] = set()
    for node in graph.node:
        match = _PROJECTION.match(node.name)
        if not match or node.op_type not in ("MatMul", "MatMulNBits") or node.input[1] not in initializers:
            continue
        layer, block, projection = int(match.group(1)), match.group(2), match.group(3)
        seen.add(projection)
        fan_in, fan_out = _fans(node, initializers[node.input[1]])
        if projection == _PACKED_QKV and any(t in _QKV for t in wanted):
            if _opset(model) < _PAD_AXES_OPSET:
                raise ModelLoadError(
                    f"{where} imports ONNX opset {_opset(model)}: a slot inside the packed qkv_proj needs Pad with "
                    f"axes (opset {_PAD_AXES_OPSET}); target qkv_proj itself, or re-export with a newer builder"
                )
            parts = _packed_columns(decoder, fan_out, where)
            chosen = [(t, *parts[t]) for t in _QKV if t in wanted]
        else:
            chosen = [(projection, 0, fan_out)] if projection in wanted else []
        for name, start, width in chosen:
            module = slot_module(layer, block, name)
            found.setdefault(node.name, []).append(
                ProjectionSlot(
                    module=module,
                    a=f"{module}.lora_A",
                    b=f"{module}.lora_B",
                    node=node.name,
                    fan_in=fan_in,
                    fan_out=fan_out,
                    start=start,
                    width=width,
                )
            )
    known = seen | (set(_QKV) if _PACKED_QKV in seen else set())
    missing = [t for t in wanted if t not in known]
    if missing:
        raise ConfigError(
            f"add-lora-slots --targets {','.join(missing)}: {where} has no such projection (its projections: "
            f"{', '.join(sorted(known)) or 'none named /model/layers.N/attn|mlp/NAME/MatMul'})"
        )
    nodes = []
    for node in graph.node:
        nodes.append(node)
        slots = found.get(node.name)
        if slots:
            nodes += _slot_nodes(onnx, graph, node, slots, io_type)
    del graph.node[:]
    graph.node.extend(nodes)
    return {slot.module: slot for slots in found.values() for slot in slots}


def _opset(model: Any) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _fans(node: Any, weight: Any) -> tuple[int, int]:
    """(in, out) of a projection: a MatMul's weight dims, a MatMulNBits node's K and N."""
    if node.op_type == "MatMul":
        fan_in, fan_out = (int(d) for d in weight.dims)
        return fan_in, fan_out
    attributes = {a.name: a.i for a in node.attribute}
    return int(attributes["K"]), int(attributes["N"])


def _slot_nodes(onnx: Any, graph: Any, node: Any, slots: list[ProjectionSlot], io_type: int) -> list[Any]:
    """The nodes after ``node`` that add each slot's (X @ A) @ B to its output (renamed ``.../base``)."""
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    import numpy as np

    dtype = np.dtype(_FLOATING[io_type])
    result = node.output[0]
    total = f"{result}/lora/base"
    node.output[0] = total
    added = []
    for i, slot in enumerate(slots):
        rank = f"{slot.module}.lora_rank"
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.zeros((slot.fan_in, 1), dtype), slot.a),
                numpy_helper.from_array(np.zeros((1, slot.width), dtype), slot.b),
            ]
        )
        graph.input.extend(
            [
                helper.make_tensor_value_info(slot.a, io_type, [slot.fan_in, rank]),
                helper.make_tensor_value_info(slot.b, io_type, [rank, slot.width]),
            ]
        )
        prefix = f"/decoctl/lora/{slot.module}"
        xa, delta = f"{prefix}/xa", f"{prefix}/xab"
        added += [
            helper.make_node("MatMul", [node.input[0], slot.a], [xa], name=f"{prefix}/MatMul_A"),
            helper.make_node("MatMul", [xa, slot.b], [delta], name=f"{prefix}/MatMul_B"),
        ]
        if slot.width != slot.fan_out:  # a part of a packed projection: its columns placed among the others'
            pads, axes = f"{prefix}/pads", f"{prefix}/axes"
            after = slot.fan_out - slot.start - slot.width
            graph.initializer.extend(
                [
                    numpy_helper.from_array(np.array([slot.start, after], np.int64), pads),
                    numpy_helper.from_array(np.array([-1], np.int64), axes),
                ]
            )
            added.append(helper.make_node("Pad", [delta, pads, "", axes], [f"{prefix}/padded"], name=f"{prefix}/Pad"))
            delta = f"{prefix}/padded"
        out = result if i == len(slots) - 1 else f"{prefix}/sum"
        added.append(helper.make_node("Add", [total, delta], [out], name=f"{prefix}/Add"))
        total = out
    return added
