"""What a model folder says about itself: layout, sizes, special tokens, input/output names.

Two layouts are read: onnxruntime-genai's (genai_config.json) and Optimum's (config.json). Everything here
comes from the folder's JSON; what the graph itself offers is read later (see capabilities.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from decoctl.errors import ModelLoadError

__all__ = ["ModelSpec", "NonAttentionState", "detect_layout", "non_attention_state"]

GENAI_CONFIG = "genai_config.json"
OPTIMUM_CONFIG = "config.json"
TOKENIZER_FILE = "tokenizer.json"
GENERATION_CONFIG = "generation_config.json"


def _eos_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelLoadError(f"model file {path} is missing: the model folder is incomplete") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"model file {path} is not valid JSON ({exc}): re-export or re-download the model"
        ) from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"model file {path} must hold a JSON object: re-export the model")
    return data


def detect_layout(path: Path) -> str:
    """Return "genai" or "optimum" for a model folder, or raise ModelLoadError naming what is missing."""
    if not path.exists():
        raise ModelLoadError(f"model folder {path} does not exist: pass the folder of an exported model")
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is a file: pass the folder that holds model.onnx and its config")
    if (path / GENAI_CONFIG).is_file():
        return "genai"
    if (path / OPTIMUM_CONFIG).is_file():
        return "optimum"
    raise ModelLoadError(
        f"model folder {path} has neither {GENAI_CONFIG} (onnxruntime-genai layout) nor {OPTIMUM_CONFIG} "
        "(Optimum layout): export the model with onnxruntime-genai's builder or optimum-cli"
    )


@attrs.frozen(kw_only=True)
class ModelSpec:
    """A model folder's static description.

    ``max_length`` is the number of positions the KV cache is allocated for; ``share_buffer`` says past and
    present KV are one preallocated buffer (GroupQueryAttention models), otherwise present is past plus the
    new positions (concat models).
    """

    path: Path
    layout: str
    onnx_file: Path
    tokenizer_file: Path
    vocab_size: int
    num_layers: int
    num_kv_heads: int
    head_size: int
    hidden_size: int
    context_length: int
    max_length: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    add_bos: bool
    share_buffer: bool
    input_ids_name: str = "input_ids"
    attention_mask_name: str = "attention_mask"
    position_ids_name: str = "position_ids"
    logits_name: str = "logits"
    past_key_pattern: str = "past_key_values.%d.key"
    past_value_pattern: str = "past_key_values.%d.value"
    present_key_pattern: str = "present.%d.key"
    present_value_pattern: str = "present.%d.value"

    def past_names(self, layer: int) -> tuple[str, str]:
        return self.past_key_pattern % layer, self.past_value_pattern % layer

    def present_names(self, layer: int) -> tuple[str, str]:
        return self.present_key_pattern % layer, self.present_value_pattern % layer

    @classmethod
    def from_folder(cls, path: str | Path) -> ModelSpec:
        folder = Path(path).expanduser().resolve()
        layout = detect_layout(folder)
        if layout == "genai":
            return cls.from_genai_config(folder)
        return cls.from_optimum_config(folder)

    @classmethod
    def from_genai_config(cls, folder: Path) -> ModelSpec:
        """Read an onnxruntime-genai folder: genai_config.json + model.onnx (+ .data) + tokenizer.json."""
        config_path = folder / GENAI_CONFIG
        config = _read_json(config_path)
        try:
            model = config["model"]
            decoder = model["decoder"]
            inputs = decoder.get("inputs", {})
            outputs = decoder.get("outputs", {})
            search = config.get("search", {})
            context_length = int(model["context_length"])
            num_heads = int(decoder["num_attention_heads"])
            spec = cls(
                path=folder,
                layout="genai",
                onnx_file=folder / decoder.get("filename", "model.onnx"),
                tokenizer_file=folder / TOKENIZER_FILE,
                vocab_size=int(model["vocab_size"]),
                num_layers=int(decoder["num_hidden_layers"]),
                num_kv_heads=int(decoder.get("num_key_value_heads", num_heads)),
                head_size=int(decoder["head_size"]),
                hidden_size=int(decoder["hidden_size"]),
                context_length=context_length,
                max_length=int(search.get("max_length", context_length)),
                bos_token_id=model.get("bos_token_id"),
                eos_token_ids=_declared_eos(folder, (config_path, model.get("eos_token_id"))),
                pad_token_id=model.get("pad_token_id"),
                add_bos=_add_bos(folder, default=False),
                share_buffer=bool(search.get("past_present_share_buffer", True)),
                input_ids_name=inputs.get("input_ids", "input_ids"),
                attention_mask_name=inputs.get("attention_mask", "attention_mask"),
                position_ids_name=inputs.get("position_ids", "position_ids"),
                logits_name=outputs.get("logits", "logits"),
                past_key_pattern=inputs.get("past_key_names", "past_key_values.%d.key"),
                past_value_pattern=inputs.get("past_value_names", "past_key_values.%d.value"),
                present_key_pattern=outputs.get("present_key_names", "present.%d.key"),
                present_value_pattern=outputs.get("present_value_names", "present.%d.value"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(
                f"{config_path} lacks or mangles a required field ({exc!r}): re-export the model with "
                "onnxruntime-genai's builder"
            ) from exc
        spec._check_files()
        return spec

    @classmethod
    def from_optimum_config(cls, folder: Path) -> ModelSpec:
        """Read an Optimum folder: config.json + model.onnx (past_key_values.N.* -> present.N.*)."""
        config_path = folder / OPTIMUM_CONFIG
        config = _read_json(config_path)
        try:
            num_heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            context_length = int(config.get("max_position_embeddings", 2048))
            spec = cls(
                path=folder,
                layout="optimum",
                onnx_file=folder / "model.onnx",
                tokenizer_file=folder / TOKENIZER_FILE,
                vocab_size=int(config["vocab_size"]),
                num_layers=int(config["num_hidden_layers"]),
                num_kv_heads=int(config.get("num_key_value_heads", num_heads)),
                head_size=int(config.get("head_dim") or hidden // num_heads),
                hidden_size=hidden,
                context_length=context_length,
                max_length=context_length,
                bos_token_id=config.get("bos_token_id"),
                eos_token_ids=_declared_eos(folder, (config_path, config.get("eos_token_id"))),
                pad_token_id=config.get("pad_token_id"),
                add_bos=_add_bos(folder, default=False),
                share_buffer=False,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(
                f"{config_path} lacks or mangles a required field ({exc!r}): re-export the model with "
                "optimum-cli export onnx"
            ) from exc
        spec._check_files()
        return spec

    def _check_files(self) -> None:
        for needed, fix in (
            (self.onnx_file, "the ONNX graph is missing: copy or re-export it"),
            (self.tokenizer_file, "decoctl reads text through tokenizer.json: save the tokenizer next to it"),
        ):
            if not needed.is_file():
                raise ModelLoadError(f"model file {needed} is missing: {fix}")


def _declared_eos(folder: Path, first: tuple[Path, Any]) -> tuple[int, ...]:
    """Every EOS the model declares, each once: ``first`` (the layout's own config and its eos_token_id), then
    generation_config.json's and config.json's. Generation stops at any of them, as it does in transformers and
    onnxruntime-genai (Llama 3 Instruct lists its end-of-turn token only in generation_config.json)."""
    declared = [first]
    for name in (GENERATION_CONFIG, OPTIMUM_CONFIG):
        path = folder / name
        if path != first[0] and path.is_file():
            declared.append((path, _read_json(path).get("eos_token_id")))
    ids: dict[int, None] = {}
    for path, value in declared:
        try:
            ids.update(dict.fromkeys(_eos_tuple(value)))
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(
                f"{path}: eos_token_id {value!r} is not a token id or a list of them: fix the config"
            ) from exc
    return tuple(ids)


def _add_bos(folder: Path, *, default: bool) -> bool:
    """Whether prompts start with BOS: tokenizer_config.json's add_bos_token, else ``default``."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return default
    value = _read_json(path).get("add_bos_token", default)
    return bool(value)


@attrs.frozen(kw_only=True)
class NonAttentionState:
    """State a graph carries between steps that is not attention's KV cache (a hybrid model's other layers).

    ``names``: the graph's inputs and outputs that hold it (``past.0.conv`` / ``present.0.conv``);
    ``layer_kind``: what those layers are, in words; ``architecture``: the config's model type, or None.
    """

    names: tuple[str, ...]
    layer_kind: str
    architecture: str | None


#: words in a state input's name -> the layers that keep it
_STATE_KINDS = (
    ("conv", "convolution layers"),
    ("ssm", "state-space layers"),
    ("mamba", "state-space layers"),
    ("recurrent", "recurrent layers"),
    ("rnn", "recurrent layers"),
)


def non_attention_state(spec: ModelSpec, inputs: Iterable[str], outputs: Iterable[str]) -> NonAttentionState | None:
    """The state among a graph's ``inputs`` (``past...``) and ``outputs`` (``present...``) that the spec's KV
    names do not match, or None where every past and present is attention's KV cache.

    onnxruntime-genai's builder exports LFM2's convolution layers with ``past.N.conv`` -> ``present.N.conv``
    next to the attention layers' KV; such a graph has no KV for those layers, which would otherwise read as a
    config that does not fit its graph."""
    kv_inputs = [_layer_pattern(p) for p in (spec.past_key_pattern, spec.past_value_pattern)]
    kv_outputs = [_layer_pattern(p) for p in (spec.present_key_pattern, spec.present_value_pattern)]
    names = [
        *(n for n in inputs if n.lower().startswith("past") and not any(k.fullmatch(n) for k in kv_inputs)),
        *(n for n in outputs if n.lower().startswith("present") and not any(k.fullmatch(n) for k in kv_outputs)),
    ]
    if not names:
        return None
    text = " ".join(names).lower()
    kind = next((kind for word, kind in _STATE_KINDS if word in text), "layers that are not attention")
    return NonAttentionState(names=tuple(names), layer_kind=kind, architecture=_architecture(spec))


def _layer_pattern(pattern: str) -> re.Pattern[str]:
    """A KV name pattern (``past_key_values.%d.key``) as a regular expression matching any layer."""
    return re.compile(r"\d+".join(re.escape(part) for part in pattern.split("%d")))


def _architecture(spec: ModelSpec) -> str | None:
    """The model type the folder's config names (genai_config.json's model.type, config.json's model_type)."""
    try:
        if spec.layout == "genai":
            value = _read_json(spec.path / GENAI_CONFIG).get("model", {}).get("type")
        else:
            value = _read_json(spec.path / OPTIMUM_CONFIG).get("model_type")
    except (ModelLoadError, AttributeError):
        return None
    return value if isinstance(value, str) else None
