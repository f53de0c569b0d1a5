"""The ``model.decoder`` section of a genai_config.json in the shape onnxruntime-genai's model builder writes for a
CPU decoder with GroupQueryAttention over shared past/present buffers: the one writer for decoctl.testing's targets
and every EAGLE head decoctl exports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def builder_decoder_section(
    *,
    hidden: int,
    head_size: int,
    num_heads: int,
    num_kv_heads: int,
    num_layers: int,
    extra_inputs: Mapping[str, str] | None = None,
    tree_inputs: bool = False,
) -> dict[str, Any]:
    """The decoder section: ``extra_inputs`` (name -> graph input) follow input_ids, then the attention mask,
    position_ids when the graph takes tree inputs, and the KV names."""
    inputs = {"input_ids": "input_ids", **(extra_inputs or {}), "attention_mask": "attention_mask"}
    if tree_inputs:
        inputs["position_ids"] = "position_ids"
    inputs |= {"past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    return {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": "model.onnx",
        "head_size": head_size,
        "hidden_size": hidden,
        "inputs": inputs,
        "outputs": {
            "logits": "logits",
            "present_key_names": "present.%d.key",
            "present_value_names": "present.%d.value",
        },
        "num_attention_heads": num_heads,
        "num_hidden_layers": num_layers,
        "num_key_value_heads": num_kv_heads,
    }
