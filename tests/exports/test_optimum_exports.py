"""Optimum's exports load as they are and decode as transformers does (issue 20, item 2).

Every model here was made by optimum-onnx from a tiny random-weight transformers model (optimum_exports.py); the
oracle is transformers' own greedy ``generate()`` on the same weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from optimum_exports import ARCHITECTURES, MAX_NEW_TOKENS, PROMPT

from decoctl.cli import main
from decoctl.generation import Generator
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.plugins import PluginRegistry

pytestmark = [
    # the exporter's own noise (torch's TorchScript exporter tracing transformers' Python branches)
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
    pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The feature will be removed:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Exporting aten.*index operator:UserWarning"),
]

#: the graph decoctl picks from each variant's folder
GRAPH = {
    "model": "model.onnx",
    "merged": "decoder_model_merged.onnx",
    "with_past": "decoder_with_past_model.onnx",
    "fp16": "model.onnx",
    "bf16": "model.onnx",
}
#: the largest |logit - transformers' fp32 logit| a lower-precision export may show here (measured: 0.024 for
#: float16, 0.10 for bfloat16 KV and logits), and the top-2 gap under which its greedy choice may differ
TOLERANCE = {"fp16": 0.05, "bf16": 0.2}
#: optimum-onnx 0.1's float16 export of GPT-2 is a graph onnxruntime refuses (a LayerNormalization with float32
#: and float16 inputs): the exporter's bug, so GPT-2 has no float16 case here
HALF = [(a, v) for a in ARCHITECTURES for v in ("fp16", "bf16") if (a, v) != ("gpt2", "fp16")]


def greedy(folder: Path, max_new_tokens: int = MAX_NEW_TOKENS) -> tuple[list[int], list[int]]:
    """decoctl's greedy generation on ``folder``: the prompt's ids and the new tokens."""
    generator = Generator({"target": str(folder)}, "greedy", registry=PluginRegistry(autoload=False), threads=1)
    result = generator.generate(PROMPT, max_new_tokens=max_new_tokens)
    return list(generator.tokenizer.encode(PROMPT)), list(result.tokens)


@pytest.mark.parametrize("variant", ["model", "merged", "with_past"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_greedy_equals_transformers_token_for_token(exports: Any, architecture: str, variant: str) -> None:
    folder = exports.folder(architecture, variant)
    model = load_model(folder, threads=1)
    assert model.spec.onnx_file.name == GRAPH[variant]
    assert (model.capabilities.use_cache_branch is not None) == (variant == "merged")
    prompt_ids, tokens = greedy(folder)
    oracle = exports.oracle(architecture, prompt_ids)
    assert tokens == oracle.tokens
    assert oracle.gaps.min() > 1e-3  # no near-tie: the equality is the runtime's, not rounding's luck


@pytest.mark.parametrize(("architecture", "variant"), HALF)
def test_half_precision_logits_are_float32_and_follow_transformers(
    exports: Any, architecture: str, variant: str
) -> None:
    """Fed transformers' greedy tokens (prefill, then one step per token), every logits row decoctl gives is
    float32 and within the precision's tolerance of transformers' fp32 row; greedy generation agrees with
    transformers' up to the first step whose choice was closer than that."""
    folder = exports.folder(architecture, variant)
    model = load_model(folder, threads=1)
    prompt_ids = list(model.tokenizer.encode(PROMPT))
    oracle = exports.oracle(architecture, prompt_ids)
    sequence = Sequence("target", model, max_length=64)
    rows = [sequence.prefill(prompt_ids)[0].copy()]
    rows.extend(sequence.forward([token])[0].copy() for token in oracle.tokens[:-1])
    assert {row.dtype for row in rows} == {np.dtype(np.float32)}
    assert np.abs(np.stack(rows) - oracle.logits).max() < TOLERANCE[variant]
    _, tokens = greedy(folder)
    assert oracle.agrees_until_a_near_tie(tokens, 2 * TOLERANCE[variant])


def test_falcon_multi_query_binds_the_graphs_one_kv_head(exports: Any, tmp_path: Path) -> None:
    """Falcon's config keeps num_kv_heads 4 next to multi_query; the graph has one KV head, and so does the cache,
    even where the config no longer says multi_query at all: the graph's past inputs decide."""
    folder = exports.folder("falcon", "model")
    assert load_model(folder, threads=1).spec.num_kv_heads == 1
    edited = shutil.copytree(folder, tmp_path / "falcon")
    config = json.loads((edited / "config.json").read_text())
    assert config["num_kv_heads"] == 4
    del config["multi_query"]
    (edited / "config.json").write_text(json.dumps(config))
    model = load_model(edited, threads=1)
    assert (model.spec.num_kv_heads, model.spec.head_size) == (1, 8)
    prompt_ids, tokens = greedy(edited)
    assert tokens == exports.oracle("falcon", prompt_ids).tokens


def test_config_names_follow_the_architecture(exports: Any) -> None:
    gpt2 = load_model(exports.folder("gpt2", "model"), threads=1).spec
    assert (gpt2.num_layers, gpt2.hidden_size, gpt2.num_kv_heads, gpt2.context_length) == (2, 32, 4, 64)
    bloom = load_model(exports.folder("bloom", "model"), threads=1).spec
    assert (bloom.num_layers, bloom.hidden_size, bloom.num_kv_heads, bloom.head_size) == (2, 32, 4, 8)


@pytest.mark.parametrize(
    ("architecture", "variant", "line"),
    [
        ("gpt2", "model", "logits float32, KV float32 [4 heads x 8]"),
        ("bloom", "merged", "logits float32, KV float32 [4 heads x 8]"),
        ("falcon", "with_past", "logits float32, KV float32 [1 heads x 8]"),
        ("llama", "fp16", "logits float16 (widened to float32 once per forward), KV float16 [2 heads x 8]"),
        ("llama", "bf16", "logits bfloat16 (widened to float32 once per forward), KV bfloat16 [2 heads x 8]"),
    ],
)
def test_models_info_runs_a_dry_forward(
    exports: Any, architecture: str, variant: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "info", str(exports.folder(architecture, variant))]) == 0
    out = capsys.readouterr().out
    assert f"graph: {GRAPH[variant]}" in out
    assert f"dry forward ok: 2 tokens, then one step on their cache; {line}" in out
