"""What an EAGLE head needs to know of its target: sizes, feature outputs, and the weights it shares.

The target is an onnxruntime-genai folder (genai_config.json and its graph). Sizes come from the config, the
feature outputs (``hidden_states``, ``aux_hidden_states``) from the graph's outputs, and the shared weights (the
token embedding, the lm_head) are found by following the graph: the Gather that reads ``input_ids`` and the
MatMul that writes ``logits``. Only those tensors are read, so a large target's external data is not loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl import ConfigError, ModelLoadError, tap_layers
from decoctl_eagle.fit import TargetShape

__all__ = ["Target", "read_target"]

_PASS_THROUGH = ("Cast", "Identity", "Reshape", "Slice", "Squeeze", "Unsqueeze")


@attrs.frozen(kw_only=True)
class Target:
    """A target model folder as a head sees it. ``hidden_states`` / ``aux_hidden_states``: the widths of those
    outputs, None when the graph has none; ``tap_layers``: the layers whose entering residual stream the taps are,
    when the graph records them (decoctl.tap_layers)."""

    name: str
    folder: Path
    onnx_file: Path
    hidden_size: int
    vocab_size: int
    num_layers: int
    context_length: int
    hidden_states: int | None
    aux_hidden_states: int | None
    tap_layers: tuple[int, ...] = ()
    input_ids: str = "input_ids"

    @property
    def shape(self) -> TargetShape:
        """What a head needs of this target (decoctl_eagle.fit)."""
        return TargetShape(
            name=self.name,
            hidden_size=self.hidden_size,
            vocab_size=self.vocab_size,
            hidden_states=self.hidden_states,
            aux_hidden_states=self.aux_hidden_states,
            folder=str(self.folder),
        )

    def describe(self) -> str:
        taps = f"aux_hidden_states width {self.aux_hidden_states}" if self.aux_hidden_states else "no aux_hidden_states"
        if self.tap_layers:
            taps += f" (layers {', '.join(map(str, self.tap_layers))})"
        hidden = f"hidden_states width {self.hidden_states}" if self.hidden_states else "no hidden_states"
        return (
            f"{self.name}: hidden {self.hidden_size}, vocabulary {self.vocab_size}, {self.num_layers} layers, "
            f"{hidden}, {taps}"
        )

    def embeddings(self) -> np.ndarray:
        """float32[vocab, hidden]: the table the Gather over ``input_ids`` reads."""
        graph = _graph(self.onnx_file)
        for node in graph.node:
            if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == self.input_ids:
                table = self._initializer(graph, node.input[0], "the token embedding")
                return self._checked(table, (self.vocab_size, self.hidden_size), "the token embedding")
        raise ModelLoadError(
            f"{self.onnx_file} has no Gather over {self.input_ids} with a float table (a quantized embedding?): the "
            "head needs the target's token embedding; export the target in float32 or float16, or use a head that "
            "has its own embed_tokens"
        )

    def lm_head(self) -> np.ndarray:
        """float32[vocab, hidden] (torch layout): the weight of the MatMul (or Gemm) that writes ``logits``."""
        graph = _graph(self.onnx_file)
        producers = {output: node for node in graph.node for output in node.output}
        name = "logits"
        node = producers.get(name)
        while node is not None and node.op_type in _PASS_THROUGH:
            node = producers.get(node.input[0])
        what = "the lm_head"
        if node is not None and node.op_type == "MatMul":
            weight = node.input[1]
            transposed = producers.get(weight)
            if transposed is not None and transposed.op_type == "Transpose":  # tied: MatMul(x, Transpose(embedding))
                table = self._initializer(graph, transposed.input[0], what)
                return self._checked(table, (self.vocab_size, self.hidden_size), what)
            table = self._initializer(graph, weight, what)
            return self._checked(table.T, (self.vocab_size, self.hidden_size), what)
        if node is not None and node.op_type == "Gemm":
            table = self._initializer(graph, node.input[1], what)
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            return self._checked(table if trans_b else table.T, (self.vocab_size, self.hidden_size), what)
        kind = node.op_type if node is not None else "no node"
        raise ModelLoadError(
            f"{self.onnx_file}: logits come from {kind}, not a float MatMul, so the target's lm_head cannot be read "
            "(a quantized lm_head?): export the target with a float32 or float16 lm_head to use an EAGLE-1 head, "
            "which drafts through it"
        )

    def _initializer(self, graph: Any, name: str, what: str) -> np.ndarray:
        from onnx import TensorProto, numpy_helper

        # a weight stored in float16 and cast in the graph (decoctl's bundled models), or one table read transposed
        # (a tied embedding: Gather over Transpose(lm_head), as decoctl's Gemma import writes it) reads as its source
        producers = {output: n for n in graph.node for output in n.output}
        transposed = False
        node = producers.get(name)
        while node is not None and (node.op_type == "Cast" or _is_2d_transpose(node)):
            transposed ^= node.op_type == "Transpose"
            name = node.input[0]
            node = producers.get(name)
        for tensor in graph.initializer:
            if tensor.name == name:
                if tensor.data_location == TensorProto.EXTERNAL:
                    table = _external(tensor, self.folder)
                else:
                    table = np.asarray(numpy_helper.to_array(tensor), dtype=np.float32)
                return np.ascontiguousarray(table.T) if transposed else table
        raise ModelLoadError(
            f"{self.onnx_file}: {what} ({name}) is computed, not stored as a float initializer (a quantized model?): "
            "export the target in float32 or float16"
        )

    def _checked(self, table: np.ndarray, shape: tuple[int, int], what: str) -> np.ndarray:
        if table.shape != shape:
            raise ModelLoadError(
                f"{self.onnx_file}: {what} has shape {list(table.shape)}, but genai_config.json says vocabulary "
                f"{shape[0]} and hidden size {shape[1]}"
            )
        return np.ascontiguousarray(table)


def _is_2d_transpose(node: Any) -> bool:
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
    return node.op_type == "Transpose" and perm == [1, 0]


def _external(tensor: Any, folder: Path) -> np.ndarray:
    """An initializer kept in an external data file, read straight from it as float32. onnx's own reader refuses
    a data file with several hard links, which is how decoctl's plain twin (decoctl.model.graph) shares a
    model's weights without copying them."""
    from onnx import helper

    where = {entry.key: entry.value for entry in tensor.external_data}
    path = folder / where["location"]
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    data = np.fromfile(path, dtype=dtype, count=count, offset=int(where.get("offset", 0)))
    if data.size != count:
        raise ModelLoadError(f"{path} ends before tensor {tensor.name} does: the model's data file is truncated")
    return data.reshape(tuple(tensor.dims)).astype(np.float32)


def _graph(onnx_file: Path) -> Any:
    import onnx

    return onnx.load_model(str(onnx_file), load_external_data=False).graph


def read_target(folder: str | Path, *, name: str | None = None) -> Target:
    """The target in ``folder`` (onnxruntime-genai layout); ConfigError for another layout."""
    path = Path(folder)
    config_path = path / "genai_config.json"
    if not config_path.is_file():
        raise ConfigError(
            f"target {path} has no genai_config.json: an EAGLE head runs beside an onnxruntime-genai layout target "
            "exported with its hidden states (the model builder's include_hidden_states=1)"
        )
    try:
        model = json.loads(config_path.read_text(encoding="utf-8"))["model"]
        decoder = model["decoder"]
        onnx_file = path / decoder.get("filename", "model.onnx")
        hidden, vocab = int(decoder["hidden_size"]), int(model["vocab_size"])
        layers, context = int(decoder["num_hidden_layers"]), int(model["context_length"])
        input_ids = str(decoder.get("inputs", {}).get("input_ids", "input_ids"))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{config_path} cannot be read as an onnxruntime-genai config ({exc!r})") from exc
    if not onnx_file.is_file():
        raise ModelLoadError(f"target {path}: its graph {onnx_file.name} is missing")
    import onnx

    model_proto = onnx.load_model(str(onnx_file), load_external_data=False)
    widths = {output.name: _last_dim(output) for output in model_proto.graph.output}
    return Target(
        name=name or path.name,
        folder=path,
        onnx_file=onnx_file,
        hidden_size=hidden,
        vocab_size=vocab,
        num_layers=layers,
        context_length=context,
        hidden_states=widths.get("hidden_states"),
        aux_hidden_states=widths.get("aux_hidden_states"),
        tap_layers=tap_layers(path) or (),
        input_ids=input_ids,
    )


def _last_dim(value: Any) -> int | None:
    dims = value.type.tensor_type.shape.dim
    if not dims or not dims[-1].HasField("dim_value"):
        return None
    return int(dims[-1].dim_value)
