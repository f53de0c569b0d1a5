"""The one ONNX graph builder: every graph decoctl writes from weights (decoctl.model.eagle_graph's EAGLE heads,
decoctl.testing's tiny models and heads) is built and saved here.

``GraphBuilder`` collects nodes and initializers (each op returns its output's name) and makes the model, in the
layout onnxruntime-genai's model builder writes: opset 21 with com.microsoft's GroupQueryAttention, its lengths
derived from the attention mask node for node as the builder writes them (decoctl.model.graph._fed_lengths then
feeds them directly), rotary embeddings in the op, SimplifiedLayerNormalization for RMSNorm, and the inputs and
outputs of a decoder over a shared past/present buffer. A draft vocabulary's logits are scattered into a row of
-inf over the target's vocabulary, so a head's output keeps the target's width. onnx is imported when a builder is
made, never when this module is.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from decoctl.model._capabilities import FEATURES

__all__ = [
    "FEATURES",
    "IR_VERSION",
    "MS_DOMAIN",
    "OPSET",
    "GraphBuilder",
    "inverse_frequencies",
    "rotary_tables",
    "save_model",
]

IR_VERSION = 10  # onnxruntime 1.31 rejects the IR version onnx.helper writes by default
OPSET = 21
MS_DOMAIN = "com.microsoft"
#: above this many bytes of weights a model keeps them in a .data file beside it (protobuf stops at 2 GiB)
EXTERNAL_DATA_BYTES = 1 << 30


class GraphBuilder:
    """Nodes, initializers and value infos of one graph; each op returns the name of its (first) output."""

    def __init__(self) -> None:
        from onnx import TensorProto, helper, numpy_helper

        self._helper, self._numpy_helper, self._types = helper, numpy_helper, TensorProto
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._stored: set[str] = set()

    # -- initializers ---------------------------------------------------------------------------------------
    def tensor(self, name: str, array: np.ndarray) -> str:
        """Store an initializer once (a second call with the name stores nothing); return its name."""
        if name not in self._stored:
            self._stored.add(name)
            self.initializers.append(self._numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, *values: int) -> str:
        """An int64[len(values)] constant."""
        return self.tensor(f"/const/int64/{list(values)}", np.array(values, dtype=np.int64))

    def scalar_int(self, value: int) -> str:
        return self.tensor(f"/const/int64/{value}", np.array(value, dtype=np.int64))

    def scalar_float(self, value: float) -> str:
        return self.tensor(f"/const/float/{value}", np.array(value, dtype=np.float32))

    # -- nodes ----------------------------------------------------------------------------------------------
    def ops(
        self,
        op_type: str,
        inputs: Sequence[str],
        name: str,
        *,
        outputs: Sequence[str] | int = 1,
        domain: str = "",
        **attributes: Any,
    ) -> list[str]:
        """Add one node; ``outputs`` is a count (names derived from ``name``) or the explicit names."""
        names = [f"{name}/output_{k}" for k in range(outputs)] if isinstance(outputs, int) else list(outputs)
        node = self._helper.make_node(op_type, list(inputs), names, name=name, domain=domain, **attributes)
        self.nodes.append(node)
        return names

    def op(
        self, op_type: str, inputs: Sequence[str], name: str, *, output: str | None = None, **attributes: Any
    ) -> str:
        """Add a one-output node; return its output's name (``output``, or one derived from ``name``)."""
        return self.ops(op_type, inputs, name, outputs=[output] if output else 1, **attributes)[0]

    def rms_norm(self, x: str, scale: str, eps: float, name: str, *, output: str | None = None) -> str:
        """RMSNorm over the last axis as the model builder writes it (SimplifiedLayerNormalization); ``scale``: the
        name of its weight's initializer."""
        return self.op(
            "SimplifiedLayerNormalization", [x, scale], name, output=output, axis=-1, epsilon=float(eps), stash_type=1
        )

    def gated(self, gate: str, up: str, name: str) -> str:
        """The SiLU-gated MLP's inner product, silu(gate) * up (nodes ``name``/Sigmoid, /SiLU, /GateMul)."""
        silu = self.op("Mul", [gate, self.op("Sigmoid", [gate], f"{name}/Sigmoid")], f"{name}/SiLU")
        return self.op("Mul", [silu, up], f"{name}/GateMul")

    def attention_lengths(self) -> tuple[str, str]:
        """GroupQueryAttention's lengths from ``attention_mask``, node for node as onnxruntime-genai's builder writes
        them: seqlens_k int32[batch] = ReduceSum(mask, axis 1) - 1, total_sequence_length int32 (the mask's width)."""
        name = "/model/attn_mask_reformat"
        summed = self.op("ReduceSum", ["attention_mask", self.ints(1)], f"{name}/ReduceSum", keepdims=0)
        seqlens = self.op("Sub", [summed, self.scalar_int(1)], f"{name}/Sub")
        seqlens_k = self.op("Cast", [seqlens], f"{name}/Sub/Cast", to=self._types.INT32)
        shape = self.op("Shape", ["attention_mask"], f"{name}/Shape")
        width = self.op("Gather", [shape, self.scalar_int(1)], f"{name}/Gather", axis=0)
        total_length = self.op("Cast", [width], f"{name}/Gather/Cast", to=self._types.INT32)
        return seqlens_k, total_length

    def group_query_attention(
        self,
        layer: int,
        q: str,
        k: str,
        v: str,
        shared: Sequence[str],
        *,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        **window: int,
    ) -> str:
        """Layer ``layer``'s com.microsoft GroupQueryAttention over its past and present KV (``past_key_values.i.*``
        in, ``present.i.*`` out) with rotary embeddings in the op; ``shared``: the inputs after the past KV that
        every layer takes (the lengths, the cos and sin caches, and the tree inputs where the graph has them);
        ``window``: ``local_window_size`` (and ``sliding_window_cache``) of a sliding-window layer."""
        name = f"/model/layers.{layer}/attn/GroupQueryAttention"
        inputs = [q, k, v, f"past_key_values.{layer}.key", f"past_key_values.{layer}.value", *shared]
        return self.ops(
            "GroupQueryAttention",
            inputs,
            name,
            outputs=[f"{name}/output_0", f"present.{layer}.key", f"present.{layer}.value"],
            domain=MS_DOMAIN,
            num_heads=num_heads,
            kv_num_heads=num_kv_heads,
            do_rotary=1,
            rotary_interleaved=0,
            scale=float(head_size**-0.5),
            **window,
        )[0]

    def scattered_logits(self, small: str, draft_ids: np.ndarray, vocab: int, ids_name: str) -> str:
        """The ``logits`` output from a draft vocabulary's logits ``small`` [B, S, n]: a row of -inf over the
        target's ``vocab`` with column ``draft_ids[j]`` (int64[n], stored as ``ids_name``) set to small[..., j]."""
        shape = self.op("Shape", [small], "/lm_head/Shape")
        leading = self.op("Slice", [shape, self.ints(0), self.ints(2), self.ints(0)], "/lm_head/Leading")
        full_shape = self.op("Concat", [leading, self.ints(vocab)], "/lm_head/FullShape", axis=0)
        fill = self.tensor("/lm_head/neg_inf", np.array([-np.inf], np.float32))
        rows = self.op("Expand", [fill, full_shape], "/lm_head/Fill")
        ids = self.tensor(ids_name, np.asarray(draft_ids, np.int64).reshape(1, 1, -1))
        index = self.op("Expand", [ids, shape], "/lm_head/Index")
        return self.op("ScatterElements", [rows, index, small], "/lm_head/Scatter", output="logits", axis=2)

    # -- inputs, outputs, the model ---------------------------------------------------------------------------
    def value(self, name: str, elem_type: int, shape: Sequence[int | str]) -> Any:
        """A graph input's or output's onnx.ValueInfoProto (``elem_type``: an onnx.TensorProto element type)."""
        return self._helper.make_tensor_value_info(name, elem_type, list(shape))

    def kv_values(self, num_layers: int, num_kv_heads: int, head_size: int, pattern: str, length: str) -> list[Any]:
        """Every layer's key and value cache: float32[batch_size, num_kv_heads, ``length``, head_size], named by
        ``pattern`` % (layer, "key" or "value")."""
        shape: list[int | str] = ["batch_size", num_kv_heads, length, head_size]
        names = [pattern % (i, kind) for i in range(num_layers) for kind in ("key", "value")]
        return [self.value(name, self._types.FLOAT, shape) for name in names]

    def decoder_inputs(
        self, *, num_layers: int, num_kv_heads: int, head_size: int, tree_inputs: bool, features: int | None = None
    ) -> list[Any]:
        """A builder-layout decoder's inputs: ``input_ids``, a draft head's ``target_hidden_states`` (``features``
        wide), ``attention_mask``, with ``tree_inputs`` ``position_ids`` and ``attention_bias``, and the past KV."""
        int64, float32 = self._types.INT64, self._types.FLOAT
        inputs = [self.value("input_ids", int64, ["batch_size", "sequence_length"])]
        if features is not None:
            inputs.append(self.value(FEATURES, float32, ["batch_size", "sequence_length", features]))
        inputs.append(self.value("attention_mask", int64, ["batch_size", "total_sequence_length"]))
        if tree_inputs:
            inputs.append(self.value("position_ids", int64, ["batch_size", "sequence_length"]))
            inputs.append(
                self.value("attention_bias", float32, ["batch_size", 1, "sequence_length", "total_sequence_length"])
            )
        return inputs + self.kv_values(
            num_layers, num_kv_heads, head_size, "past_key_values.%d.%s", "past_sequence_length"
        )

    def decoder_outputs(
        self,
        *,
        vocab: int,
        num_layers: int,
        num_kv_heads: int,
        head_size: int,
        hidden_states: int | None = None,
        aux_hidden_states: int | None = None,
        last_only: bool = False,
    ) -> list[Any]:
        """A builder-layout decoder's outputs: ``logits`` (one row per position, or the last only), the present KV,
        and ``hidden_states`` / ``aux_hidden_states`` of the widths given."""
        float32 = self._types.FLOAT
        outputs = [self.value("logits", float32, ["batch_size", 1 if last_only else "sequence_length", vocab])]
        outputs += self.kv_values(num_layers, num_kv_heads, head_size, "present.%d.%s", "total_sequence_length")
        if hidden_states is not None:
            outputs.append(self.value("hidden_states", float32, ["batch_size", "sequence_length", hidden_states]))
        if aux_hidden_states is not None:
            aux_shape: list[int | str] = ["batch_size", "sequence_length", aux_hidden_states]
            outputs.append(self.value("aux_hidden_states", float32, aux_shape))
        return outputs

    def model(self, inputs: list[Any], outputs: list[Any], *, name: str, producer: str) -> Any:
        """The onnx.ModelProto of the nodes and initializers so far (opset 21 and com.microsoft 1, IR 10)."""
        helper = self._helper
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
        return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name=producer)


def inverse_frequencies(head_size: int, theta: float) -> np.ndarray:
    """Rotary embeddings' inverse frequencies, float64[head_size / 2]: theta^(-2i / head_size)."""
    return theta ** (-np.arange(0, head_size, 2, dtype=np.float64) / head_size)


def rotary_tables(inverse: np.ndarray, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """GroupQueryAttention's cos and sin caches for positions 0..max_length - 1: float32[max_length, len(inverse)]
    each (``inverse``: the inverse frequencies, float64[head_size / 2])."""
    angles = np.outer(np.arange(max_length, dtype=np.float64), inverse)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def save_model(model: Any, path: str | Path) -> Path:
    """Write ``model`` (an onnx.ModelProto) to ``path``, its weights in ``path``.data beside it when they pass
    1 GiB; a model and data file of an earlier save there are replaced."""
    import onnx

    file = Path(path)
    data = file.with_name(file.name + ".data")
    for stale in (file, data):
        stale.unlink(missing_ok=True)
    large = sum(t.ByteSize() for t in model.graph.initializer) > EXTERNAL_DATA_BYTES
    onnx.save_model(model, str(file), save_as_external_data=large, all_tensors_to_one_file=True, location=data.name)
    return file
