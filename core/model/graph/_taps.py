"""``enable_taps``: an onnxruntime-genai builder model gains the outputs an EAGLE head is trained and run on.

EAGLE-3 reads three *taps*: the residual stream entering chosen decoder layers, low, middle and high (EAGLE-3's
own choice for N layers: 2, N/2 and N-3). onnxruntime-genai's builder writes them as the ``aux_hidden_states``
output when asked (``--extra_options include_hidden_states=1 aux_hidden_state_layers=2,8,13``; its entry i is the
residual stream entering decoder layer i). A model exported without them gets them here, without a new export:
the builder names every node of layer i ``/model/layers.{i}/...``, and the input of layer i's first norm
(``/model/layers.{i}/input_layernorm/...``) is the residual stream entering layer i. For a plain
(Simplified)LayerNormalization that is its first input; a Skip(Simplified)LayerNormalization adds the residual and
the previous layer's output itself, and its fourth output (``input_skip_bias_sum``) is the sum, which the builder
already wires to the next layer (one is added where it is missing). The taps are concatenated in the order given
into ``aux_hidden_states`` float[batch_size, sequence_length, hidden * len(layers)], and ``hidden_states``, the
final norm's output (the lm_head's input), is added too when the graph lacks it.

Weights are not touched: the graph is read without its external data and every other file is copied byte for
byte. The layers are recorded in the ONNX metadata under :data:`TAP_LAYERS_KEY`.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.logs import get_logger
from decoctl.model.graph._derived import check_new_folder, staged_folder
from decoctl.model.graph._transform import GENAI_CONFIG

__all__ = [
    "AUX_HIDDEN_STATES",
    "HIDDEN_STATES",
    "TAP_LAYERS_KEY",
    "default_tap_layers",
    "enable_taps",
    "lm_head_and_final_norm",
    "tap_layers",
]

log = get_logger(__name__)

HIDDEN_STATES = "hidden_states"
AUX_HIDDEN_STATES = "aux_hidden_states"
TAP_LAYERS_KEY = "decoctl.taps.entering_layers"
"""ONNX metadata: the layers whose entering residual stream ``aux_hidden_states`` holds, comma separated (written by
enable_taps and by decoctl.testing's build_genai_model(tap_layers=...))."""
_INPUT_NORM = re.compile(r"^/model/layers\.(\d+)/input_layernorm(/|$)")
# walking back from the logits to the lm_head and the final norm passes these (a last-position slice, a cast,
# Gemma 2's soft-capping)
_PASS_THROUGH = {"Cast", "Slice", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Mul", "Div", "Tanh", "Gather"}


def default_tap_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's three taps for a model of ``num_layers`` decoder layers: the residual stream entering layers 2, N/2
    and N-3, each clamped to 1..N-1, ascending. Where those coincide (a shallow model) the highest free layers stand
    in, so six layers tap 2, 3 and 5; a model of fewer than four layers repeats its last."""
    if num_layers < 2:
        raise ConfigError(f"a model of {num_layers} decoder layer has no residual stream between layers to tap")
    picked = {min(max(1, layer), num_layers - 1) for layer in (2, num_layers // 2, num_layers - 3)}
    free = [layer for layer in range(num_layers - 1, 0, -1) if layer not in picked]
    while len(picked) < 3 and free:
        picked.add(free.pop(0))
    chosen = sorted(picked)
    return tuple(chosen + chosen[-1:] * (3 - len(chosen)))


def tap_layers(folder: str | Path) -> tuple[int, ...] | None:
    """The layers an ``enable_taps`` copy taps (from its ONNX metadata), or None when the folder's graph does not
    say (a builder export with aux_hidden_state_layers, or no taps at all)."""
    import onnx

    source = Path(folder)
    filename = _decoder_filename(source)
    model = onnx.load_model(str(source / filename), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == TAP_LAYERS_KEY:
            return tuple(int(part) for part in prop.value.split(",") if part)
    return None


def enable_taps(src: str | Path, dst: str | Path, layers: Sequence[int] | None = None) -> Path:
    """Write a copy of the genai-layout model folder ``src`` to ``dst`` whose graph also returns
    ``aux_hidden_states`` (the residual stream entering each of ``layers``, concatenated) and ``hidden_states``.

    :param layers: decoder layer indices, 0..N-1 (0: the embeddings as layer 0 reads them); None takes
        :func:`default_tap_layers`.
    :returns: ``dst``.
    :raises ConfigError: onnx is not installed, ``dst`` is not a new or empty folder, or a layer is out of range.
    :raises ModelLoadError: ``src`` is not a genai-layout folder, its graph already has ``aux_hidden_states``, or
        a tapped layer's first norm (``/model/layers.{i}/input_layernorm``) or the final norm cannot be found.
    """
    try:
        import onnx
    except ImportError as exc:
        raise ConfigError("enable-taps rewrites ONNX graphs with the onnx package: pip install onnx") from exc

    source, target = Path(src).expanduser().resolve(), Path(dst).expanduser().resolve()
    filename = _decoder_filename(source)
    check_new_folder(source, target, "enable-taps")
    onnx_path = source / filename
    try:
        model = onnx.load_model(str(onnx_path), load_external_data=False)
    except Exception as exc:  # OSError, or protobuf's DecodeError for a file that is not ONNX
        raise ModelLoadError(f"onnx could not read {onnx_path} ({type(exc).__name__}: {exc})") from exc
    num_layers, hidden = _sizes(source)
    chosen = tuple(default_tap_layers(num_layers) if layers is None else (int(layer) for layer in layers))
    if not chosen or any(not 0 <= layer < num_layers for layer in chosen):
        raise ConfigError(
            f"enable-taps --layers {','.join(map(str, chosen)) or '(none)'}: give decoder layers in 0..{num_layers - 1}"
            f" (the residual stream entering each; EAGLE-3 taps {','.join(map(str, default_tap_layers(num_layers)))})"
        )
    added = _add_tap_outputs(onnx, model, chosen, hidden, onnx_path)
    props = {prop.key: prop.value for prop in model.metadata_props}
    onnx.helper.set_model_props(model, {**props, TAP_LAYERS_KEY: ",".join(map(str, chosen))})
    with staged_folder(target, "enable-taps") as staging:
        # copied, not hard-linked: onnx refuses to read external data from a file with several links, which would
        # lock the source model out of onnx's tools as well as the copy
        for entry in source.iterdir():
            if entry.name == filename:
                continue
            if entry.is_dir():
                shutil.copytree(entry, staging / entry.name)
            else:
                shutil.copy2(entry, staging / entry.name)
        # tensors stay external and unloaded, so save_model writes the graph only; the data files were copied
        onnx.save_model(model, str(staging / filename))
    log.info("decoctl.taps_enabled", source=str(source), target=str(target), layers=list(chosen), outputs=added)
    return target


def _decoder_filename(source: Path) -> str:
    config_path = source / GENAI_CONFIG
    if not config_path.is_file():
        raise ModelLoadError(
            f"{source} has no {GENAI_CONFIG}: enable-taps rewrites models exported by onnxruntime-genai's builder"
        )
    try:
        return str(
            json.loads(config_path.read_text(encoding="utf-8"))["model"]["decoder"].get("filename", "model.onnx")
        )
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{config_path} lacks model.decoder ({exc!r}): re-export the model") from exc


def _sizes(source: Path) -> tuple[int, int]:
    """(decoder layers, hidden size) from genai_config.json."""
    decoder = json.loads((source / GENAI_CONFIG).read_text(encoding="utf-8"))["model"]["decoder"]
    try:
        return int(decoder["num_hidden_layers"]), int(decoder["hidden_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{source / GENAI_CONFIG} lacks decoder.num_hidden_layers or hidden_size: re-export the model"
        ) from exc


def _add_tap_outputs(onnx: Any, model: Any, layers: tuple[int, ...], hidden: int, onnx_path: Path) -> list[str]:
    """Wire the taps (and the final norm's output where missing) to new graph outputs; return their names."""
    graph = model.graph
    outputs = {value.name: value for value in graph.output}
    if AUX_HIDDEN_STATES in outputs:
        raise ModelLoadError(
            f"{onnx_path} already has an {AUX_HIDDEN_STATES} output: it needs no enable-taps (to tap other layers, "
            "start from an export without it)"
        )
    logits = outputs.get("logits")
    if logits is None:
        raise ModelLoadError(f"{onnx_path} has no logits output: it is not an onnxruntime-genai decoder")
    dims = logits.type.tensor_type.shape.dim
    io_type = logits.type.tensor_type.elem_type
    batch = dims[0].dim_param or "batch_size"
    sequence = (dims[1].dim_param if dims[1].dim_param else "") or "sequence_length"
    norms: dict[int, Any] = {}
    for node in graph.node:
        match = _INPUT_NORM.match(node.name)
        if match and node.op_type.endswith("LayerNormalization") and int(match.group(1)) not in norms:
            norms[int(match.group(1))] = node
    missing = [layer for layer in layers if layer not in norms]
    if missing:
        raise ModelLoadError(
            f"{onnx_path} has no first norm for decoder layer(s) {missing} (nodes named "
            "/model/layers.{i}/input_layernorm/...): enable-taps reads graphs written by onnxruntime-genai's builder; "
            "export the model with --extra_options include_hidden_states=1 aux_hidden_state_layers=... instead"
        )
    final_norm = str(lm_head_and_final_norm(graph)[1].output[0])
    nodes: list[Any] = []
    taps = []
    for index, layer in enumerate(layers):
        node = norms[layer]
        if node.op_type.startswith("Skip"):
            # output 3 of a Skip*LayerNormalization: input + skip (+ bias), the residual stream entering the layer
            slots = list(node.output) + [""] * max(0, 4 - len(node.output))
            if not slots[3]:
                slots[3] = f"/model/layers.{layer}/input_layernorm/residual_tap"
                del node.output[:]
                node.output.extend(slots)
            stream = slots[3]
        else:
            stream = node.input[0]
        cast = f"/model/{AUX_HIDDEN_STATES}/{index}/Cast"
        nodes.append(onnx.helper.make_node("Cast", [stream], [f"{cast}/output_0"], name=cast, to=io_type))
        taps.append(f"{cast}/output_0")
    concat = onnx.helper.make_node(
        "Concat", taps, [AUX_HIDDEN_STATES], name=f"/model/{AUX_HIDDEN_STATES}/Concat", axis=-1
    )
    nodes.append(concat)
    added = [AUX_HIDDEN_STATES]
    new_outputs = [
        onnx.helper.make_tensor_value_info(AUX_HIDDEN_STATES, io_type, [batch, sequence, hidden * len(layers)])
    ]
    if HIDDEN_STATES not in outputs:
        nodes.append(onnx.helper.make_node("Identity", [final_norm], [HIDDEN_STATES], name=f"/model/{HIDDEN_STATES}"))
        new_outputs.append(onnx.helper.make_tensor_value_info(HIDDEN_STATES, io_type, [batch, sequence, hidden]))
        added.append(HIDDEN_STATES)
    graph.node.extend(nodes)
    graph.output.extend(new_outputs)
    return added


def lm_head_and_final_norm(graph: Any) -> tuple[Any, Any]:
    """The lm_head node (MatMul, Gemm or MatMulNBits) and the final norm node (a *LayerNormalization) of a decoder
    graph (an onnx GraphProto): walk back from the ``logits`` output past casts, slices and soft-capping to the first
    matrix product, then from its activation input to the first norm.

    :raises ModelLoadError: the graph's logits do not come from such a pair.
    """
    producers = {name: node for node in graph.node for name in node.output if name}
    initializers = {t.name for t in graph.initializer}
    name, head = "logits", None
    for _ in range(8):
        node = producers.get(name)
        if node is None:
            break
        if node.op_type in ("MatMul", "Gemm", "MatMulNBits"):
            head = node
            break
        if node.op_type not in _PASS_THROUGH:
            break
        name = next((i for i in node.input if i and i not in initializers), "")
    if head is None:
        raise ModelLoadError(
            "the graph's logits do not come from an lm_head MatMul, so its final norm cannot be found: export the "
            "model with --extra_options include_hidden_states=1 aux_hidden_state_layers=..."
        )
    name = head.input[0]
    for _ in range(8):
        node = producers.get(name)
        if node is None:
            break
        if node.op_type.endswith("LayerNormalization"):
            return head, node
        if node.op_type not in _PASS_THROUGH:
            break
        name = node.input[0]
    raise ModelLoadError(
        "the lm_head's input does not come from a norm, so the final hidden states cannot be found: export the "
        "model with --extra_options include_hidden_states=1 aux_hidden_state_layers=..."
    )
