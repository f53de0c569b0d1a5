"""A PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) converted to onnxruntime's adapter format for
a base model with LoRA slots (decoctl.model.graph._lora_slots).

PEFT keeps each adapted module's ``lora_A.weight`` float[r, in] and ``lora_B.weight`` float[out, r] and computes
``x @ W.T + scaling * (x @ lora_A.T) @ lora_B.T`` with ``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with
``use_rslora``; ``alpha_pattern`` overriding the alpha per module). decoctl's slot takes ``A`` = ``lora_A.T``
[in, r] and ``B`` = ``scaling * lora_B.T`` [r, out], so the scaling is folded into ``B``. A parameter's module path
(``base_model.model.model.layers.3.self_attn.q_proj``, or with ``language_model`` in it) maps to the slot of the
decoder layer's projection, ``model.layers.3.self_attn.q_proj.lora_A`` / ``.lora_B``.

What a slot cannot hold is refused by name, as is a module the base model has no slot for or a shape that does not fit
its slot: DoRA, LoRA biases, modules saved whole (``modules_to_save``), trainable tokens, embedding LoRA.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.logs import get_logger
from decoctl.model._adapters import Adapter, Slot, check_adapter, write_adapter

__all__ = ["convert_peft_adapter", "peft_parameters", "read_safetensors"]

log = get_logger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: a PEFT parameter: the adapted module's path, A or B, an optional adapter name, ``.weight``
_PARAMETER = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")
#: a decoder layer's projection inside a module path (model.layers.3.self_attn.q_proj, ...language_model.layers...)
_PROJECTION = re.compile(r"(?:^|\.)layers\.(\d+)\.(self_attn|mlp)\.(\w+)$")
#: adapter_config.json keys that ask for what a LoRA slot cannot compute -> why
_UNSUPPORTED = {
    "use_dora": "DoRA rescales the merged weight's columns",
    "lora_bias": "LoRA biases add a term a slot has no input for",
    "modules_to_save": "modules saved whole replace the base model's weights",
    "trainable_token_indices": "trainable tokens replace rows of the embedding",
    "target_parameters": "LoRA on parameters (not modules) adapts weights the builder fuses",
    "layer_replication": "replicated layers change the model's depth",
    "alora_invocation_tokens": "activated LoRA applies only after its invocation tokens",
}
#: safetensors' dtype names -> numpy (BF16 is widened to float32 by hand: numpy has no bfloat16)
_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a ``.safetensors`` file (an 8-byte little-endian header length, a JSON header naming each
    tensor's dtype, shape and byte span, then the bytes); BF16 is returned as float32."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read {file} ({exc.strerror}): give a PEFT adapter folder") from exc
    try:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{file} is not a safetensors file (its header does not read: {exc})") from exc
    body = memoryview(data)[8 + size :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = body[begin:end]
        if entry["dtype"] == "BF16":
            value = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif entry["dtype"] in _SAFETENSORS_DTYPES:
            value = np.frombuffer(raw, _SAFETENSORS_DTYPES[entry["dtype"]])
        else:
            raise ModelLoadError(f"{file}: tensor {name} is {entry['dtype']}, a type a LoRA adapter does not hold")
        tensors[name] = value.reshape(entry["shape"]).copy()
    return tensors


def _alpha(config: Mapping[str, Any], module: str) -> float:
    """The module's lora_alpha: the first alpha_pattern key naming it (PEFT's own matching), else lora_alpha."""
    for pattern, alpha in (config.get("alpha_pattern") or {}).items():
        if pattern == module or re.match(rf"(.*\.)?({pattern})$", module):
            return float(alpha)
    return float(config.get("lora_alpha", 8))


def peft_parameters(folder: str | Path) -> dict[str, np.ndarray]:
    """A PEFT LoRA adapter folder as decoctl's slot values (module docstring): slot name -> float32 array, the
    scaling folded into each B. ModelLoadError naming what a slot cannot hold."""
    source = Path(folder).expanduser()
    config_path, weights_path = source / ADAPTER_CONFIG, source / ADAPTER_WEIGHTS
    if not config_path.is_file() or not weights_path.is_file():
        raise ModelLoadError(
            f"{source} is not a PEFT adapter folder: it needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} (what "
            "PeftModel.save_pretrained writes)"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{config_path} is not JSON ({exc})") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise ModelLoadError(f"{config_path}: peft_type {config.get('peft_type')!r}: only LoRA adapters convert")
    for key, why in _UNSUPPORTED.items():
        if config.get(key):
            raise ModelLoadError(
                f"{config_path}: {key} is set, and {why}, which decoctl's LoRA slots (X @ A) @ B cannot compute: "
                "merge this adapter into the base model and export that instead"
            )
    pairs: dict[str, dict[str, np.ndarray]] = {}
    names: dict[str, str] = {}
    for key, value in read_safetensors(weights_path).items():
        match = _PARAMETER.match(key)
        projection = _PROJECTION.search(match.group("module")) if match else None
        if match is None or projection is None or value.ndim != 2:
            raise ModelLoadError(
                f"{weights_path}: parameter {key} is not the lora_A or lora_B weight of a decoder layer's projection "
                "(layers.N.self_attn.* or layers.N.mlp.*), so no LoRA slot can hold it"
            )
        layer, block, name = projection.groups()
        module = f"model.layers.{layer}.{block}.{name}"
        names[module] = match.group("module").removeprefix("base_model.model.")
        pairs.setdefault(module, {})[match.group("which")] = value.astype(np.float32)
    parameters = {}
    for module, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise ModelLoadError(
                f"{weights_path}: module {names[module]} has lora_{''.join(pair)} only: the file is cut"
            )
        lora_a, lora_b = pair["A"], pair["B"]
        rank = lora_a.shape[0]
        if lora_b.shape[1] != rank:
            raise ModelLoadError(
                f"{weights_path}: module {names[module]} has lora_A of rank {rank} but lora_B {list(lora_b.shape)}"
            )
        alpha = _alpha(config, names[module])
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        parameters[f"{module}.lora_A"] = np.ascontiguousarray(lora_a.T)
        parameters[f"{module}.lora_B"] = np.ascontiguousarray((lora_b * np.float32(scaling)).T)
    if not parameters:
        raise ModelLoadError(f"{weights_path} holds no LoRA weights")
    return parameters


def convert_peft_adapter(folder: str | Path, base: str | Path, out: str | Path) -> Path:
    """Convert the PEFT LoRA adapter ``folder`` for the base model folder ``base`` (with LoRA slots:
    ``decoctl models add-lora-slots``) and write it to ``out`` in onnxruntime's adapter format.

    :raises ModelLoadError: what a slot cannot hold (peft_parameters), a module ``base`` has no slot for, or a shape
        that does not fit its slot (an adapter made for another base model).
    :raises ConfigError: ``out`` does not end in ``.onnx_adapter``.
    """
    from decoctl.model.graph._lora_slots import lora_slots

    target = Path(out).expanduser()
    if target.suffix != ".onnx_adapter":
        raise ConfigError(f"convert-adapter --out {target}: name the file NAME.onnx_adapter")
    parameters = peft_parameters(folder)
    declared = lora_slots(base)
    slots = {name: Slot(name=name, dtype=np.dtype(dtype), shape=shape) for name, (dtype, shape) in declared.items()}
    modules = sorted({name.removesuffix(".lora_A") for name in slots if name.endswith(".lora_A")})
    missing = sorted({name.rsplit(".", 1)[0] for name in parameters if name not in slots})
    if missing:
        projections = sorted({m.rsplit(".", 1)[1] for m in missing})
        raise ModelLoadError(
            f"adapter {folder} adapts {missing[:4]}{' ...' if len(missing) > 4 else ''}, which base model {base} has "
            f"no LoRA slot for (its slots: {modules[:4]}{' ...' if len(modules) > 4 else ''}): add them with "
            f"decoctl models add-lora-slots --targets {','.join(projections)} (with the other targets) from the "
            "export without slots"
        )
    typed = {name: value.astype(slots[name].dtype) for name, value in parameters.items()}
    check_adapter(Adapter(name=target.name, path=Path(folder), parameters=typed), slots, str(base))
    target.parent.mkdir(parents=True, exist_ok=True)
    write_adapter(target, typed)
    log.info(
        "decoctl.peft_adapter_converted", source=str(folder), base=str(base), out=str(target), modules=len(typed) // 2
    )
    return target
