"""Tiny random-weight transformers models exported by onnxruntime-genai's model builder.

Each model saves a Hugging Face folder (weights, config.json, generation_config.json, a tokenizer made with the
``tokenizers`` library and saved by transformers) and runs the builder on it as a user would (``python -m
onnxruntime_genai.models.builder -i HF -o OUT -p fp32 -e cpu``), in its own process. Without the builder's
packages (onnxruntime-genai, onnx-ir, torch, transformers: ``make setup-test``) every test that needs an
export is skipped (conftest.py caches one export per model and session), saying which are missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from tokenizers import Tokenizer, processors

from decoctl.testing import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, SPECIAL_TOKENS, build_tokenizer

#: what ``import onnxruntime_genai.models.builder`` needs
BUILDER_PACKAGES = ("onnxruntime_genai", "onnx_ir", "torch", "transformers")
PROMPT = "def fibonacci(n):"
VOCAB = 384
#: hidden sizes of every model here; initializer_range 0.2 keeps the argmax gaps far above float32 rounding
DIMS: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "initializer_range": 0.2,
    "bos_token_id": BOS_TOKEN_ID,
    "eos_token_id": EOS_TOKEN_ID,
    "pad_token_id": PAD_TOKEN_ID,
}


@attrs.frozen(kw_only=True)
class Export:
    """A Hugging Face folder and the builder's export of it. ``eos``: every EOS the model declares."""

    hf: Path
    onnx: Path
    eos: tuple[int, ...]


def require_builder() -> None:
    missing = [name for name in BUILDER_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(
            f"onnxruntime-genai's model builder cannot run here: {', '.join(missing)} not installed "
            "(make setup-test installs them)"
        )


def save_tokenizer(folder: Path, *, bos_post_processor: bool = False, tokenizer_class: str | None = None) -> None:
    """The tests' byte-level BPE saved by transformers. ``bos_post_processor``: BOS added by tokenizer.json's
    post-processor, as Llama 3's tokenizer does (tokenizer_config.json says nothing about BOS).
    ``tokenizer_class``: the class tokenizer_config.json names (the builder re-saves the tokenizer through it)."""
    from transformers import PreTrainedTokenizerFast

    inner = Tokenizer.from_file(str(build_tokenizer(folder / "bpe")))
    if bos_post_processor:
        bos = SPECIAL_TOKENS[BOS_TOKEN_ID]
        inner.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, BOS_TOKEN_ID)]
                ),
            ]
        )
    bos, eos, pad = (SPECIAL_TOKENS[i] for i in (BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID))
    PreTrainedTokenizerFast(tokenizer_object=inner, bos_token=bos, eos_token=eos, pad_token=pad).save_pretrained(folder)
    if tokenizer_class:
        path = folder / "tokenizer_config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        config["tokenizer_class"] = tokenizer_class
        path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def greedy_continuation(model: Any, ids: list[int], steps: int) -> list[int]:
    """transformers' greedy tokens after ``ids`` with no EOS at all (argmax of a full forward per step)."""
    import torch

    out = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids) :]


def run_builder(hf: Path, out: Path) -> Path:
    """Export ``hf`` with onnxruntime-genai's builder (fp32, CPU); a failure fails the test with the log's end."""
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
    command += ["-p", "fp32", "-e", "cpu", "-c", str(out.parent / "builder-cache")]
    # a local folder needs no hub: offline, so a lookup can never reach the network
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0 or not (out / "genai_config.json").is_file():
        pytest.fail(f"the builder failed on {hf.name} (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return out


def export(
    root: Path,
    model: Any,
    *,
    eos: tuple[int, ...],
    config_for_builder: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    **tokenizer: Any,
) -> Export:
    """Save ``model`` and export it; ``config_for_builder``: config.json as the builder must read it, where the
    builder reads transformers' own config otherwise than transformers writes it."""
    from transformers import GenerationConfig

    hf = root / "hf"
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_TOKEN_ID, eos_token_id=list(eos) if len(eos) > 1 else eos[0], pad_token_id=PAD_TOKEN_ID
    )
    model.save_pretrained(hf)
    if config_for_builder is not None:
        path = hf / "config.json"
        path.write_text(json.dumps(config_for_builder(json.loads(path.read_text(encoding="utf-8")))), encoding="utf-8")
    save_tokenizer(hf, **tokenizer)
    return Export(hf=hf, onnx=run_builder(hf, root / "onnx"), eos=eos)


def llama(root: Path) -> Export:
    """Llama 3 style: BOS from the tokenizer's post-processor, an EOS list in generation_config.json only (the
    config's EOS and a token the greedy path reaches after a few steps, as Llama 3 Instruct lists <|eot_id|>)."""
    require_builder()
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    save_tokenizer(root / "tokenizer", bos_post_processor=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, tie_word_embeddings=False, **DIMS)).eval()
    prompt = AutoTokenizer.from_pretrained(root / "tokenizer")(PROMPT).input_ids
    greedy = greedy_continuation(model, prompt, 12)
    stop = next(t for i, t in enumerate(greedy) if i >= 4 and t not in greedy[:i] and t not in (BOS_TOKEN_ID,))
    return export(root, model, eos=(EOS_TOKEN_ID, stop), bos_post_processor=True)


def qwen2(root: Path) -> Export:
    """Qwen2 whose tokenizer the builder re-saves through Qwen2Tokenizer, which adds <|endoftext|> as one more
    special token than the model's vocabulary has rows (id 384 of a 384-row model)."""
    require_builder()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=2, tie_word_embeddings=True, **DIMS)).eval()
    return export(root, model, eos=(EOS_TOKEN_ID,), tokenizer_class="Qwen2Tokenizer")


def lfm2(root: Path) -> Export:
    """LFM2: attention layers between short-convolution layers, whose state onnxruntime-genai carries as
    past.N.conv / present.N.conv."""
    require_builder()
    import torch
    import transformers

    if not hasattr(transformers, "Lfm2ForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no LFM2")
    torch.manual_seed(2)
    config = transformers.Lfm2Config(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"], **DIMS)
    model = transformers.Lfm2ForCausalLM(config).eval()
    return export(root, model, eos=(EOS_TOKEN_ID,))


#: the sliding window of the windowed exports: small, so that short prompts run past it
WINDOW = 16


def gemma2(root: Path, window: int = WINDOW) -> Export:
    """Gemma 2: sliding-window layers (0 and 2) between full ones, which the builder exports by default with
    window-sized ring caches (GroupQueryAttention's sliding_window_cache=1)."""
    require_builder()
    import torch
    import transformers

    torch.manual_seed(4)
    config = transformers.Gemma2Config(num_hidden_layers=3, sliding_window=window, head_dim=16, **DIMS)
    return export(root, transformers.Gemma2ForCausalLM(config).eval(), eos=(EOS_TOKEN_ID,))


def gpt_oss(root: Path, window: int = WINDOW) -> Export:
    """gpt-oss: alternating sliding-window and full layers, attention sinks and a mixture of experts; the
    builder's default export keeps ring caches on the windowed layers."""
    require_builder()
    import torch
    import transformers

    if not hasattr(transformers, "GptOssForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no gpt-oss")
    torch.manual_seed(5)
    config = transformers.GptOssConfig(
        num_hidden_layers=2, sliding_window=window, head_dim=16, num_local_experts=4, num_experts_per_tok=2, **DIMS
    )
    return export(root, transformers.GptOssForCausalLM(config).eval(), eos=(EOS_TOKEN_ID,))


def mistral(root: Path, window: int = WINDOW, *, layer_types: bool = False) -> Export:
    """Mistral: a sliding window on every layer. Its config names no layer_types, and the builder writes a window
    only on the layers layer_types marks "sliding_attention": the default export declares the window in
    genai_config.json and applies it nowhere. ``layer_types``: the config lists every layer as sliding (the fix
    decoctl's refusal names), and the builder exports each with a ring cache."""
    require_builder()
    import torch
    import transformers

    torch.manual_seed(6)
    types = {"layer_types": ["sliding_attention"] * 2} if layer_types else {}
    config = transformers.MistralConfig(num_hidden_layers=2, sliding_window=window, **types, **DIMS)
    return export(root, transformers.MistralForCausalLM(config).eval(), eos=(EOS_TOKEN_ID,))


def gemma3(root: Path, window: int = WINDOW) -> Export:
    """Gemma 3 (text): two sliding-window layers, then a full one, with per-kind rotary bases; config.json is
    flattened for the builder as decoctl's Gemma 3 importer does (transformers 5 nests rope_parameters by kind)."""
    require_builder()
    import torch
    import transformers

    from decoctl.importers._gemma3 import builder_config

    torch.manual_seed(7)
    kinds = ["sliding_attention", "sliding_attention", "full_attention"]
    config = transformers.Gemma3TextConfig(
        num_hidden_layers=3, sliding_window=window, head_dim=16, layer_types=kinds, **DIMS
    )
    model = transformers.Gemma3ForCausalLM(config).eval()
    return export(root, model, eos=(EOS_TOKEN_ID,), config_for_builder=builder_config)


def qwen2_windowed(root: Path, window: int = WINDOW) -> Export:
    """Qwen2 with use_sliding_window: the layers from max_window_layers (1) on are windowed."""
    require_builder()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(8)
    config = Qwen2Config(
        num_hidden_layers=3, use_sliding_window=True, sliding_window=window, max_window_layers=1, **DIMS
    )
    return export(root, Qwen2ForCausalLM(config).eval(), eos=(EOS_TOKEN_ID,), tokenizer_class="Qwen2Tokenizer")


def qwen3(root: Path, window: int = WINDOW) -> Export:
    """Qwen3 (q/k norms) with use_sliding_window: the layers from max_window_layers (1) on are windowed."""
    require_builder()
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(9)
    config = Qwen3Config(
        num_hidden_layers=3, use_sliding_window=True, sliding_window=window, max_window_layers=1, head_dim=16, **DIMS
    )
    return export(root, Qwen3ForCausalLM(config).eval(), eos=(EOS_TOKEN_ID,), tokenizer_class="Qwen2Tokenizer")
