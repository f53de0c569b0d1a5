"""The contenders `decoctl bench` runs: decoctl controllers, a raw onnxruntime loop, onnxruntime-genai.

Every contender has the same shape: ``run(prompt_ids, max_new_tokens) -> Outcome`` with the new tokens, the
decode seconds (after the prompt is in the cache) and the target forwards it used.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs
import numpy as np
import onnxruntime as ort

from decoctl.errors import ConfigError
from decoctl.generate import Generator
from decoctl.model.loader import LoadedModel, session_options

__all__ = ["Contender", "ControllerContender", "OrtGenaiContender", "Outcome", "RawOrtContender"]


@attrs.frozen(kw_only=True)
class Outcome:
    tokens: tuple[int, ...]
    decode_seconds: float
    total_seconds: float
    target_forwards: int
    extra: Mapping[str, Any] = attrs.field(factory=dict)


class Contender(Protocol):
    name: str

    def run(self, prompt: str, prompt_ids: list[int], max_new_tokens: int) -> Outcome: ...


class ControllerContender:
    """A decoctl controller (built-in or plugin) through the ordinary Generator."""

    def __init__(self, name: str, generator: Generator) -> None:
        self.name = name
        self.generator = generator

    def run(self, prompt: str, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        del prompt_ids
        started = time.perf_counter()
        result = self.generator.generate(prompt, max_new_tokens=max_new_tokens, seed=0)
        total = time.perf_counter() - started
        stats = result.stats
        return Outcome(
            tokens=result.tokens,
            decode_seconds=stats.decode_seconds,
            total_seconds=total,
            target_forwards=stats.forwards.get("target", 0),
            extra=dict(stats.controller),
        )


class RawOrtContender:
    """A minimal greedy loop written directly on onnxruntime with IOBinding: the floor decoctl's host is
    measured against. Shared-buffer (GroupQueryAttention) models only, as onnxruntime-genai's builder makes
    them; it reuses nothing of the host but the session options."""

    name = "raw-ort"

    def __init__(self, model: LoadedModel, threads: int | None) -> None:
        spec = model.spec
        if not spec.share_buffer:
            raise ConfigError(
                f"contender raw-ort runs shared-buffer (onnxruntime-genai layout) models; {model.name} is "
                f"{spec.layout} with a concat KV cache: leave raw-ort out for it"
            )
        self.spec = spec
        self.eos = set(spec.eos_token_ids)
        self.session = ort.InferenceSession(
            str(spec.onnx_file), session_options(threads), providers=["CPUExecutionProvider"]
        )
        self.names = [n for layer in range(spec.num_layers) for n in (*spec.past_names(layer),)]
        self.present = [n for layer in range(spec.num_layers) for n in (*spec.present_names(layer),)]
        self.kv: list[np.ndarray] = []
        self.capacity = 0
        self.extra_outputs = [o for o in self.session.get_outputs() if o.name not in (spec.logits_name, *self.present)]

    def _allocate(self, capacity: int) -> ort.IOBinding:
        spec = self.spec
        shape = (1, spec.num_kv_heads, capacity, spec.head_size)
        self.kv = [np.zeros(shape, np.float32) for _ in self.names]
        self.capacity = capacity
        binding = self.session.io_binding()
        for past, present, buffer in zip(self.names, self.present, self.kv, strict=True):
            binding.bind_input(past, "cpu", 0, np.float32, list(shape), buffer.ctypes.data)
            binding.bind_output(present, "cpu", 0, np.float32, list(shape), buffer.ctypes.data)
        return binding

    def run(self, prompt: str, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        del prompt
        spec = self.spec
        capacity = len(prompt_ids) + max_new_tokens
        binding = self._allocate(capacity)
        mask = np.ones((1, capacity), np.int64)
        logits = np.zeros((1, len(prompt_ids), spec.vocab_size), np.float32)
        extra = {o.name: np.zeros((1, len(prompt_ids), o.shape[-1]), np.float32) for o in self.extra_outputs}

        def step(ids: np.ndarray, past: int) -> np.ndarray:
            n = ids.shape[1]
            binding.bind_input(spec.input_ids_name, "cpu", 0, np.int64, [1, n], ids.ctypes.data)
            binding.bind_input(spec.attention_mask_name, "cpu", 0, np.int64, [1, past + n], mask.ctypes.data)
            binding.bind_output(spec.logits_name, "cpu", 0, np.float32, [1, n, spec.vocab_size], logits.ctypes.data)
            for name, buffer in extra.items():
                binding.bind_output(name, "cpu", 0, np.float32, [1, n, buffer.shape[-1]], buffer.ctypes.data)
            self.session.run_with_iobinding(binding)
            return logits[0, n - 1]

        started = time.perf_counter()
        ids = np.asarray([prompt_ids], np.int64)
        row = step(ids, 0)
        decode_started = time.perf_counter()
        out: list[int] = []
        token_buffer = np.zeros((1, 1), np.int64)
        forwards = 0
        past = len(prompt_ids)
        while True:
            token = int(row.argmax())
            out.append(token)
            if token in self.eos or len(out) >= max_new_tokens:
                break
            token_buffer[0, 0] = token
            row = step(token_buffer, past)
            past += 1
            forwards += 1
        end = time.perf_counter()
        return Outcome(
            tokens=tuple(out),
            decode_seconds=end - decode_started,
            total_seconds=end - started,
            target_forwards=forwards,
        )


class OrtGenaiContender:
    """onnxruntime-genai's own greedy loop (the optional extra ``decoctl[ort-genai]``), with the intra-op
    thread count forced to the bench's so the comparison is fair."""

    name = "ort-genai"

    def __init__(self, model: LoadedModel, threads: int) -> None:
        try:
            import onnxruntime_genai as og
        except ImportError as exc:
            raise ConfigError(
                "contender ort-genai needs onnxruntime-genai: pip install 'decoctl[ort-genai]' or leave it out"
            ) from exc
        if model.spec.layout != "genai":
            raise ConfigError(f"contender ort-genai runs onnxruntime-genai models; {model.name} is {model.spec.layout}")
        self._folder = tempfile.TemporaryDirectory(prefix="decoctl-genai-")
        folder = Path(self._folder.name)
        for item in model.spec.path.iterdir():
            if item.name != "genai_config.json":
                (folder / item.name).symlink_to(item)
        config = json.loads((model.spec.path / "genai_config.json").read_text())
        options = config["model"]["decoder"].setdefault("session_options", {})
        options["intra_op_num_threads"] = threads
        options["inter_op_num_threads"] = 1
        (folder / "genai_config.json").write_text(json.dumps(config))
        self.og = og
        self.model = og.Model(str(folder))
        self.eos = set(model.spec.eos_token_ids)

    def run(self, prompt: str, prompt_ids: list[int], max_new_tokens: int) -> Outcome:
        del prompt
        og = self.og
        params = og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(prompt_ids) + max_new_tokens)
        started = time.perf_counter()
        generator = og.Generator(self.model, params)
        generator.append_tokens(np.asarray(prompt_ids, np.int32))
        decode_started = time.perf_counter()
        forwards = 0
        while not generator.is_done():
            generator.generate_next_token()
            forwards += 1
        end = time.perf_counter()
        sequence = [int(t) for t in generator.get_sequence(0)][len(prompt_ids) :]
        return Outcome(
            tokens=tuple(sequence[:max_new_tokens]),
            decode_seconds=end - decode_started,
            total_seconds=end - started,
            target_forwards=max(0, forwards - 1),
        )

    def close(self) -> None:
        shutil.rmtree(self._folder.name, ignore_errors=True)
