"""What genai_config.json says about the KV cache against what the graph computes, checked at load.

onnxruntime-genai sizes and slides its caches from the config (``model.decoder.sliding_window``: ``window_size``,
``layers``, ``slide_key_value_cache``, ``slide_inputs``; ``search.past_present_share_buffer``, ``max_length``;
``model.context_length``); the graph computes with its GroupQueryAttention nodes' attributes (``local_window_size``,
``sliding_window_cache``), its past inputs' shapes and its rotary tables. decoctl binds what the graph computes, so
where the two disagree the export runs as neither says: onnxruntime-genai fails on it, or it runs and its tokens
are not the model's. ``check()`` refuses such an export by name, with the builder option or config edit that fixes
it, before any session runs. Where the graph says more than the config (a window the config does not declare),
the graph is what runs and nothing is refused. Whether this onnxruntime's kernel keeps a ring cache as the graph
asks is what no file tells: decoctl.model._ring_probe runs the kernel to see.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from decoctl.errors import ModelLoadError
from decoctl.model._spec import GENAI_CONFIG, ModelSpec
from decoctl.model.graph import _protowire as pw
from decoctl.model.graph._nodes import (
    GQA_COS_CACHE,
    GQA_PAST_KEY,
    GRAPH_INITIALIZER,
    GRAPH_NODE,
    MODEL_GRAPH,
    GraphNode,
)

__all__ = ["Attention", "DeclaredWindow", "check", "declared_window", "graph_attention"]

#: the builder option that exports windowed layers with full-length caches instead of ring caches
_NO_RING = "--extra_options windowed_kv_cache=false"


@attrs.frozen(kw_only=True)
class DeclaredWindow:
    """genai_config.json's ``model.decoder.sliding_window``: the window in positions, the layers it lists (the
    builder lists the layers it exported with a window), and the two flags that ask the runtime to slide the KV
    cache or the inputs itself (static-shape exports)."""

    window: int
    layers: tuple[int, ...]
    slide_key_value_cache: bool
    slide_inputs: bool


@attrs.frozen(kw_only=True)
class Attention:
    """One GroupQueryAttention node as the graph runs it: ``window`` its local_window_size (None or <= 0: the whole
    sequence), ``ring`` whether it keeps a window-sized cache (sliding_window_cache=1), ``rotary_positions`` the rows
    of its rotary table (None where the table is not an initializer the graph holds); ``num_heads`` /
    ``kv_num_heads`` its query and KV heads."""

    window: int | None
    ring: bool
    rotary_positions: int | None
    num_heads: int | None = None
    kv_num_heads: int | None = None

    @property
    def windowed(self) -> bool:
        return self.window is not None and self.window > 0


def declared_window(config_file: Path) -> DeclaredWindow | None:
    """The config's sliding_window section, or None where it declares none (or a window of 0 or less). A section
    decoctl cannot read raises ModelLoadError naming the field."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        section = config["model"]["decoder"].get("sliding_window")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # ModelSpec.from_genai_config has read this file already and said what it lacks
    if section is None:
        return None
    try:
        window = int(section["window_size"])
        layers = tuple(int(layer) for layer in section.get("layers") or ())
        slide_kv, slide_inputs = bool(section.get("slide_key_value_cache")), bool(section.get("slide_inputs"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{config_file}: model.decoder.sliding_window is {section!r}, which decoctl cannot read ({exc!r}): it "
            "needs window_size (an integer) and optionally layers (a list of layer numbers); re-export the model"
        ) from exc
    if window <= 0:
        return None
    return DeclaredWindow(window=window, layers=layers, slide_key_value_cache=slide_kv, slide_inputs=slide_inputs)


def graph_attention(model: bytes) -> dict[str, Attention]:
    """Every GroupQueryAttention node of the graph, keyed by its past-key input."""
    found: dict[str, GraphNode] = {}
    rows: dict[str, int] = {}
    for graph in (f for f in pw.fields(model) if f.number == MODEL_GRAPH):
        for field in pw.fields(graph.payload):
            if field.number == GRAPH_NODE:
                node = GraphNode.parse(field)
                if node.is_gqa and node.input(GQA_PAST_KEY):
                    found[node.input(GQA_PAST_KEY)] = node
            elif field.number == GRAPH_INITIALIZER:
                tensor = pw.tensor(field.payload)
                if len(tensor.dims) == 2:  # only a 2-D initializer can be a rotary table
                    rows[tensor.name] = tensor.dims[0]
    return {
        past: Attention(
            window=node.int_attribute("local_window_size"),
            ring=bool(node.int_attribute("sliding_window_cache")),
            rotary_positions=rows.get(node.input(GQA_COS_CACHE)) if node.int_attribute("do_rotary") else None,
            num_heads=node.int_attribute("num_heads"),
            kv_num_heads=node.int_attribute("kv_num_heads"),
        )
        for past, node in found.items()
    }


def check(spec: ModelSpec, graph: bytes | None, past_shapes: Mapping[str, list[Any]]) -> dict[int, Attention]:
    """Refuse (ModelLoadError) an onnxruntime-genai export whose config and graph describe different KV caches;
    see the module docstring. ``graph``: the graph's bytes as exported (None where it is too large to read here:
    only the config and the shapes are checked); ``past_shapes``: each past input's shape as the session reports
    it. Returns the graph's GroupQueryAttention nodes by layer (empty where it has none, or was not read)."""
    if spec.layout != "genai":
        return {}
    config_file = spec.path / GENAI_CONFIG
    declared = declared_window(config_file)
    _check_static_lengths(spec, config_file, declared, past_shapes)
    if graph is None:
        return {}
    try:
        nodes = graph_attention(graph)
    except ModelLoadError:
        return {}  # not a readable graph: onnxruntime's own load reports it
    layers = {past: layer for layer in range(spec.num_layers) for past in spec.past_names(layer)[:1]}
    attention = {layers[past]: node for past, node in nodes.items() if past in layers}
    # a layer the config names and the graph lacks is Capabilities.from_session's to report
    present = [layer for layer in range(spec.num_layers) if spec.past_names(layer)[0] in past_shapes]
    _check_shared_buffer(spec, config_file, attention, present)
    _check_rotary(spec, config_file, attention)
    if declared is not None:
        _check_window(spec, config_file, declared, attention)
    return attention


def _check_static_lengths(
    spec: ModelSpec, config_file: Path, declared: DeclaredWindow | None, past_shapes: Mapping[str, list[Any]]
) -> None:
    """A config that asks the runtime to slide the cache or the inputs (a static-shape export), or past inputs
    with a fixed sequence length: decoctl sizes each sequence's cache itself and slides nothing."""
    if declared is not None and (declared.slide_key_value_cache or declared.slide_inputs):
        flags = [n for n in ("slide_key_value_cache", "slide_inputs") if getattr(declared, n)]
        raise ModelLoadError(
            f"{config_file}: sliding_window sets {' and '.join(flags)}, which asks the runtime to slide a "
            f"fixed-size {'KV cache' if declared.slide_key_value_cache else 'input'} itself (a static-shape export "
            "for an NPU); decoctl sizes each sequence's cache and slides nothing, so it cannot run this export as "
            "its config says: export the model for the CPU (onnxruntime-genai's builder with -e cpu)"
        )
    fixed = {
        name: shape[2]
        for name, shape in past_shapes.items()
        if len(shape) == 4 and isinstance(shape[2], int) and shape[2] > 0
    }
    if fixed:
        name, length = next(iter(fixed.items()))
        raise ModelLoadError(
            f"{spec.onnx_file}: the past input {name} has a fixed length of {length} positions (and "
            f"{len(fixed) - 1} more like it), a static-shape export; decoctl sizes each sequence's KV cache itself "
            "and binds past inputs of any length: export the model with dynamic shapes (onnxruntime-genai's builder "
            "with -e cpu)"
        )


def _check_shared_buffer(
    spec: ModelSpec, config_file: Path, attention: Mapping[int, Attention], present: list[int]
) -> None:
    """past_present_share_buffer on needs every layer's past read by a GroupQueryAttention node, the one operator
    that writes its present into the past buffer; a ring cache needs the shared buffer."""
    if spec.share_buffer:
        other = [layer for layer in present if layer not in attention]
        if other and attention:  # a graph with no GroupQueryAttention at all is bound as its own layout says
            raise ModelLoadError(
                f"{config_file} sets past_present_share_buffer, but the past KV of layers {other} is not read by a "
                "GroupQueryAttention node, so their present is not written into the past buffer: set "
                "search.past_present_share_buffer to false, or export every layer with GroupQueryAttention"
            )
    else:
        rings = sorted(layer for layer, node in attention.items() if node.ring)
        if rings:
            raise ModelLoadError(
                f"{spec.onnx_file} keeps ring caches on layers {rings} (sliding_window_cache=1) but {config_file} "
                "turns past_present_share_buffer off: a ring cache is written in place; set "
                f"search.past_present_share_buffer to true, or export without ring caches ({_NO_RING})"
            )


def _check_rotary(spec: ModelSpec, config_file: Path, attention: Mapping[int, Attention]) -> None:
    """The positions decoctl runs to (the config's max_length, at most its context_length) against the rows of the
    rotary tables GroupQueryAttention reads: a position past them fails in the kernel."""
    length = min(spec.max_length, spec.context_length)
    short = {layer: node.rotary_positions for layer, node in attention.items() if node.rotary_positions is not None}
    rows = min(short.values(), default=None)
    if rows is not None and rows < length:
        raise ModelLoadError(
            f"{spec.onnx_file}: the rotary tables GroupQueryAttention reads hold {rows} positions but {config_file} "
            f"lets a sequence run to {length} (search.max_length {spec.max_length}, model.context_length "
            f"{spec.context_length}): set both to {rows} or less, or export again with the model's real "
            "max_position_embeddings"
        )


def _check_window(
    spec: ModelSpec, config_file: Path, declared: DeclaredWindow, attention: Mapping[int, Attention]
) -> None:
    """The declared window and its layers against the windows the graph's attention applies."""
    applied = {layer: node.window for layer, node in attention.items() if node.windowed}
    listed = set(declared.layers)
    if not applied:
        if declared.window >= min(spec.max_length, spec.context_length):
            return  # the window never cuts: attending to everything is the same
        raise ModelLoadError(_window_dropped(spec, config_file, declared))
    wrong = {layer: window for layer, window in applied.items() if window != declared.window}
    if wrong or (listed and listed != set(applied)):
        graph = ", ".join(f"{layer}: {window}" for layer, window in sorted(applied.items()))
        raise ModelLoadError(
            f"{config_file} declares a sliding window of {declared.window} on layers {sorted(listed) or 'unnamed'}, "
            f"but {spec.onnx_file}'s attention applies windows on layers {{{graph}}}: the config and the graph do "
            "not belong together (onnxruntime-genai sizes its caches from the config, decoctl from the graph); "
            "export both again in one builder run"
        )


def _window_dropped(spec: ModelSpec, config_file: Path, declared: DeclaredWindow) -> str:
    listed = f"layers {list(declared.layers)}" if declared.layers else "no layers listed"
    return (
        f"{config_file} declares a sliding window of {declared.window} positions ({listed}), but no "
        f"GroupQueryAttention node of {spec.onnx_file} applies one: the graph attends to every past position, so "
        f"past {declared.window} tokens its output is not the model's, and onnxruntime-genai cannot run it as its "
        "config says either. onnxruntime-genai's builder writes a window only on the layers that the Hugging Face "
        "config.json's layer_types marks \"sliding_attention\", and a config without layer_types (Mistral's) gets "
        f'none: add "layer_types": ["sliding_attention", ...] ({spec.num_layers} entries, one per layer) to the '
        "model's config.json and export it again (a model without a sliding window is exported with "
        f'"sliding_window": null); or, to run this export only as far as its window, where it is exact, set '
        f"search.max_length in genai_config.json to {declared.window}"
    )
