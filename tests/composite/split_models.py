"""Split prefill/decode exports of decoctl.testing's genai-layout models: the one graph, and beside it a prefill
graph that takes a fixed chunk of tokens and a ``query_seqlens`` input wired to every GroupQueryAttention node
(onnxruntime's right-padded query chunks), described by a pipeline.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
from onnx import TensorProto, helper

#: GroupQueryAttention's query_seqlens input slot (onnxruntime 1.32's schema)
QUERY_SEQLENS_SLOT = 16


def split_export(one_graph: Path, folder: Path, chunk: int) -> Path:
    """A copy of ``one_graph`` (a genai-layout folder) with ``prefill.onnx`` (fixed chunk ``chunk``) beside its
    decode graph and a pipeline.json naming both."""
    shutil.copytree(one_graph, folder)
    model = onnx.load(folder / "model.onnx")
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            inputs = list(node.input) + [""] * (QUERY_SEQLENS_SLOT + 1 - len(node.input))
            inputs[QUERY_SEQLENS_SLOT] = "query_seqlens"
            del node.input[:]
            node.input.extend(inputs)
    model.graph.input.append(helper.make_tensor_value_info("query_seqlens", TensorProto.INT32, [1]))
    for value in model.graph.input:
        if value.name == "input_ids":
            value.type.tensor_type.shape.dim[0].dim_value = 1
            value.type.tensor_type.shape.dim[1].dim_value = chunk
    onnx.save(model, folder / "prefill.onnx")
    pipeline = {
        "sessions": {
            "prefill": {"file": "prefill.onnx", "phase": "chunk", "host_inputs": ["*"], "shares_kv": True},
            "decoder": {"file": "model.onnx", "phase": "step", "host_inputs": ["*"]},
        },
        "edges": [],
    }
    (folder / "pipeline.json").write_text(json.dumps(pipeline, indent=2), encoding="utf-8")
    return folder
