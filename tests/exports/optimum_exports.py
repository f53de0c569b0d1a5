"""Tiny random-weight transformers models exported by optimum-onnx, in the layouts published repositories carry.

Importing this module skips the importing test file (the whole file, with the reason) where optimum-onnx cannot
export: it needs transformers < 4.58 and torch, so it has an extra and an environment of its own (decoctl's
``test-exports`` extra; pyproject.toml says how to set it up).

Architectures: GPT-2 (``n_head``/``n_layer``/``n_embd``/``n_positions``), BLOOM (ALiBi, no context length in its
config), Falcon with multi-query attention (one KV head; the config keeps ``num_kv_heads`` 4, as Falcon-7B's
does) and Llama with grouped-query attention. Variants, each a folder as the exporter leaves it (config.json,
generation_config.json, tokenizer files and):
- ``model``: ``model.onnx``, one graph that takes an empty past (optimum-onnx's layout);
- ``merged``: ``decoder_model.onnx``, ``decoder_with_past_model.onnx`` and ``decoder_model_merged.onnx`` (both
  behind an If on ``use_cache_branch``), optimum 1.x's layout, made here as optimum 1.x made it: the decoder
  traced without a past, the one traced with it, merged by ``optimum.onnx.merge_decoders``;
- ``with_past``: the same without the merged graph (optimum 1.x with ``--no-post-process``);
- ``fp16``: ``model.onnx`` exported with ``dtype="fp16"`` (float16 weights, logits and KV);
- ``bf16``: ``model.onnx`` with bfloat16 logits and KV (optimum-onnx's bf16 export fails on CPU, and
  onnxruntime's CPU kernels barely run bfloat16, so the fp32 graph gets bfloat16 inputs and outputs through
  Cast nodes: what decoctl binds is what a bfloat16 export has).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from graph_edits import narrow_interface

from decoctl.testing._tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, build_tokenizer, write_tokenizer_config


def _why_not() -> str | None:
    """Why optimum-onnx cannot export here, or None."""
    try:
        versions = {name: importlib.metadata.version(name) for name in ("optimum-onnx", "torch", "transformers")}
    except importlib.metadata.PackageNotFoundError as exc:
        return f"{exc.name} is not installed (the test-exports extra brings it: see pyproject.toml)"
    major, minor = (int(part) for part in versions["transformers"].split(".")[:2])
    if (major, minor) >= (4, 58):
        have = versions["transformers"]
        return f"optimum-onnx {versions['optimum-onnx']} needs transformers < 4.58, and {have} is installed"
    return None


REASON = _why_not()
if REASON is not None:
    pytest.skip(f"Optimum export tests: {REASON}", allow_module_level=True)

ARCHITECTURES = ("gpt2", "bloom", "falcon", "llama")
VOCAB = 384
#: the weights' spread: wide enough that greedy's top two logits stay well apart, so a token-for-token comparison
#: with transformers tests the runtime, not rounding
INIT_RANGE = 0.3
MAX_NEW_TOKENS = 16
PROMPT = "def fibonacci(n):"


def hf_config(architecture: str) -> Any:
    """A tiny transformers config of ``architecture`` (two layers, hidden size 32, four heads)."""
    import transformers

    common = {
        "vocab_size": VOCAB,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": PAD_TOKEN_ID,
        "initializer_range": INIT_RANGE,
    }
    if architecture == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64, **common)
    if architecture == "bloom":
        return transformers.BloomConfig(n_layer=2, n_head=4, hidden_size=32, **common)
    if architecture == "falcon":
        return transformers.FalconConfig(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_kv_heads=4,
            hidden_size=32,
            multi_query=True,
            new_decoder_architecture=False,
            parallel_attn=True,
            alibi=False,
            bias=False,
            max_position_embeddings=64,
            **common,
        )
    if architecture == "llama":
        return transformers.LlamaConfig(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=32,
            intermediate_size=64,
            max_position_embeddings=64,
            **common,
        )
    raise ValueError(f"no tiny config for {architecture!r}")


class Exports:
    """The session's exports, each made once on first use, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._folders: dict[tuple[str, str], Path] = {}
        self._models: dict[str, Any] = {}
        self._oracles: dict[tuple[str, tuple[int, ...]], Oracle] = {}

    def source(self, architecture: str) -> Path:
        """The transformers checkpoint (seeded random weights) with the test tokenizer."""
        key = (architecture, "source")
        if key not in self._folders:
            import torch
            import transformers

            torch.manual_seed(ARCHITECTURES.index(architecture))
            folder = self.root / architecture / "source"
            model = transformers.AutoModelForCausalLM.from_config(hf_config(architecture)).eval()
            model.save_pretrained(folder)
            build_tokenizer(folder, vocab_size=VOCAB)
            write_tokenizer_config(folder, model_max_length=64)
            self._models[architecture] = model
            self._folders[key] = folder
        return self._folders[key]

    def folder(self, architecture: str, variant: str) -> Path:
        """The export of ``architecture`` in ``variant`` (see the module's docstring)."""
        key = (architecture, variant)
        if key not in self._folders:
            make = {
                "model": self._model,
                "fp16": self._fp16,
                "merged": self._merged,
                "with_past": self._with_past,
                "bf16": self._bf16,
            }
            self._folders[key] = make[variant](architecture, self.root / architecture / variant)
        return self._folders[key]

    def _export(self, architecture: str, folder: Path, **options: Any) -> Path:
        from optimum.exporters.onnx import main_export

        main_export(
            str(self.source(architecture)),
            output=folder,
            task="text-generation-with-past",
            do_validation=False,
            **options,
        )
        return folder

    def _model(self, architecture: str, folder: Path) -> Path:
        return self._export(architecture, folder)

    def _fp16(self, architecture: str, folder: Path) -> Path:
        return self._export(architecture, folder, dtype="fp16")

    def _with_past(self, architecture: str, folder: Path) -> Path:
        """optimum 1.x's two graphs: the first pass's (no past inputs, present outputs) and the with-past one."""
        from optimum.exporters.onnx import main_export  # registers the architectures' export configs
        from optimum.exporters.tasks import TasksManager
        from transformers import AutoConfig

        del main_export

        config = AutoConfig.from_pretrained(self.source(architecture))
        make_config = TasksManager.get_exporter_config_constructor(
            exporter="onnx", model_type=config.model_type, task="text-generation-with-past", library_name="transformers"
        )
        no_past = make_config(config, task="text-generation", use_past=True, use_past_in_inputs=False)
        first = self._export(architecture, folder / "first", custom_onnx_configs={"model": no_past})
        with_past = self.folder(architecture, "model")
        for path in with_past.iterdir():
            if path.suffix != ".onnx":
                shutil.copy(path, folder / path.name)
        shutil.move(first / "model.onnx", folder / "decoder_model.onnx")
        shutil.rmtree(first)
        shutil.copy(with_past / "model.onnx", folder / "decoder_with_past_model.onnx")
        return folder

    def _merged(self, architecture: str, folder: Path) -> Path:
        from optimum.onnx import merge_decoders

        shutil.copytree(self.folder(architecture, "with_past"), folder)
        merge_decoders(
            decoder=folder / "decoder_model.onnx",
            decoder_with_past=folder / "decoder_with_past_model.onnx",
            save_path=folder / "decoder_model_merged.onnx",
        )
        return folder

    def _bf16(self, architecture: str, folder: Path) -> Path:
        shutil.copytree(self.folder(architecture, "model"), folder)
        narrow_interface(folder / "model.onnx", "bfloat16")
        return folder

    def oracle(self, architecture: str, prompt_ids: Sequence[int]) -> Oracle:
        """transformers' fp32 greedy ``generate()`` after ``prompt_ids`` on the same weights."""
        key = (architecture, tuple(prompt_ids))
        if key not in self._oracles:
            import torch

            self.source(architecture)
            with torch.no_grad():
                out = self._models[architecture].generate(
                    torch.tensor([list(prompt_ids)]),
                    attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                    max_new_tokens=MAX_NEW_TOKENS,
                    do_sample=False,
                    output_logits=True,
                    return_dict_in_generate=True,
                    eos_token_id=EOS_TOKEN_ID,
                    pad_token_id=PAD_TOKEN_ID,
                )
            tokens = [int(t) for t in out.sequences[0, len(prompt_ids) :]]
            logits = np.stack([row[0].float().numpy() for row in out.logits])
            self._oracles[key] = Oracle(tokens=tokens, logits=logits)
        return self._oracles[key]


@dataclasses.dataclass(frozen=True)
class Oracle:
    """transformers' greedy tokens and, per step, the float32 logits row it chose from ([steps, vocab])."""

    tokens: list[int]
    logits: np.ndarray

    @property
    def gaps(self) -> np.ndarray:
        """The top-2 logit gap of each step: how far from a tie greedy's choice was."""
        top2 = np.sort(self.logits, axis=-1)[:, -2:]
        return top2[:, 1] - top2[:, 0]

    def agrees_until_a_near_tie(self, got: Sequence[int], gap: float) -> bool:
        """``got`` equals these tokens, or first differs at or after a step whose gap is below ``gap`` (where a
        lower-precision graph may rightly choose the other token)."""
        for step, (want, token) in enumerate(zip(self.tokens, got, strict=False)):
            if want != token or self.gaps[step] < gap:
                return self.gaps[: step + 1].min() < gap
        return len(got) == len(self.tokens)
