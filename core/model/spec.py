"""What a model folder says about itself: layout, sizes, special tokens, input/output names.

Two layouts are read: onnxruntime-genai's (genai_config.json) and Optimum's (config.json). Everything here
comes from the folder's JSON; what the graph itself offers is read later (see capabilities.py), and so are the KV
heads and head size, which the loader takes from the graph's past inputs (kv_cache.kv_shape).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from decoctl.errors import ModelLoadError
from decoctl.logs import get_logger

__all__ = [
    "ALIBI_CONTEXT_LENGTH",
    "OPTIMUM_GRAPHS",
    "ModelSpec",
    "NonAttentionState",
    "detect_layout",
    "non_attention_state",
    "optimum_graph_file",
]

log = get_logger(__name__)

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


#: an Optimum export's decoder graphs in the order decoctl takes them: the one graph that takes an empty past
#: (optimum-onnx's and optimum >= 1.14's layout), the merged decoder (optimum 1.x's two graphs behind an If on
#: ``use_cache_branch``, the layout most published repositories carry), the with-past decoder alone (its first pass
#: gets an empty past). Each is looked for next to config.json, then in an ``onnx/`` folder beside it.
OPTIMUM_GRAPHS = ("model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx")
#: optimum 1.x's first-pass graph: it takes no past key values, so decoctl cannot step it
OPTIMUM_NO_PAST_GRAPH = "decoder_model.onnx"
#: the context length of an ALiBi model whose config gives none: ALiBi (BLOOM, Falcon-RW, MPT) puts no limit on
#: positions in the graph, so this only bounds decoctl's KV cache; 2048 is the length BLOOM and Falcon-RW were
#: trained for. A ``max_position_embeddings`` in config.json replaces it.
ALIBI_CONTEXT_LENGTH = 2048

#: the names an architecture's config.json writes for the common fields, as transformers' ``attribute_map`` of
#: that architecture's config class has them (GPT2Config: ``num_hidden_layers`` is ``n_layer``); tried before the
#: common name
_GPT2_NAMES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("n_layer",),
    "num_attention_heads": ("n_head",),
    "hidden_size": ("n_embd",),
    "max_position_embeddings": ("n_positions",),
}
_ARCHITECTURE_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "gpt2": _GPT2_NAMES,
    "gpt_bigcode": _GPT2_NAMES,
    "gptj": _GPT2_NAMES,
    "codegen": {**_GPT2_NAMES, "max_position_embeddings": ("n_positions", "n_ctx")},
    # BloomConfig and FalconConfig also take the hidden size as ``n_embed`` (BLOOM's and Falcon-RW's own configs)
    "bloom": {"num_hidden_layers": ("n_layer",), "num_attention_heads": ("n_head",), "hidden_size": ("n_embed",)},
    "falcon": {"num_hidden_layers": ("n_layer",), "num_attention_heads": ("n_head",), "hidden_size": ("n_embed",)},
    "gpt_neo": {"num_hidden_layers": ("num_layers",), "num_attention_heads": ("num_heads",)},
    "mpt": {
        "num_hidden_layers": ("n_layers",),
        "num_attention_heads": ("n_heads",),
        "hidden_size": ("d_model",),
        "max_position_embeddings": ("max_seq_len",),
    },
}
#: other names configs give the context length under, tried after the architecture's own
_CONTEXT_NAMES = ("n_positions", "n_ctx", "seq_length", "max_seq_len", "max_sequence_length")
#: the config fields that give the number of KV heads where it differs from the attention heads
_KV_HEAD_NAMES = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")


def optimum_graph_file(folder: Path) -> Path:
    """The decoder graph of an Optimum export (the first of :data:`OPTIMUM_GRAPHS` there), or raise
    ModelLoadError saying what the folder holds instead."""
    places = (folder, folder / "onnx")
    for name in OPTIMUM_GRAPHS:
        for place in places:
            if (place / name).is_file():
                return place / name
    if any((place / OPTIMUM_NO_PAST_GRAPH).is_file() for place in places):
        raise ModelLoadError(
            f"{folder} holds {OPTIMUM_NO_PAST_GRAPH} but none of {', '.join(OPTIMUM_GRAPHS[1:])}: that graph takes "
            "no past key values, so decoctl cannot run it step by step; copy decoder_with_past_model.onnx or "
            "decoder_model_merged.onnx from the same export next to it, or export with optimum-cli export onnx "
            "--task text-generation-with-past"
        )
    raise ModelLoadError(
        f"{folder} has no decoder graph: none of {', '.join(OPTIMUM_GRAPHS)} is there (nor in onnx/); copy the "
        "graph next to config.json, or export the model with optimum-cli export onnx --task "
        "text-generation-with-past"
    )


class _ConfigNames:
    """A config.json read through its architecture's names: ``get("hidden_size")`` is GPT-2's ``n_embd``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.model_type = str(config.get("model_type") or "")

    def find(self, common: str, *more: str) -> Any:
        """The value under the architecture's name for ``common``, else ``common``, else ``more``; or None."""
        names = (*_ARCHITECTURE_NAMES.get(self.model_type, {}).get(common, ()), common, *more)
        return next((self.config[n] for n in names if self.config.get(n) is not None), None)

    def get(self, common: str) -> Any:
        value = self.find(common)
        if value is None:
            aliases = _ARCHITECTURE_NAMES.get(self.model_type, {}).get(common, ())
            raise KeyError(" or ".join((*aliases, common)))
        return value

    @property
    def alibi(self) -> bool:
        """ALiBi attention (no position table, so no position limit in the graph)."""
        if self.model_type == "bloom":
            return True
        if self.model_type == "mpt":
            attention = self.config.get("attn_config")
            return bool(attention.get("alibi", True)) if isinstance(attention, dict) else True
        return bool(self.config.get("alibi"))


def _config_kv_heads(names: _ConfigNames, num_heads: int) -> int:
    """The KV heads the config declares: one for multi-query attention (Falcon without the new decoder
    architecture and GPTBigCode read ``multi_query`` before ``num_kv_heads``, as transformers does)."""
    if names.config.get("multi_query") and not names.config.get("new_decoder_architecture"):
        return 1
    value = names.find(*_KV_HEAD_NAMES)
    return num_heads if value is None else int(value)


def _optimum_context_length(config_path: Path, names: _ConfigNames) -> int:
    """The context length config.json gives under its architecture's names; :data:`ALIBI_CONTEXT_LENGTH` (logged)
    for an ALiBi model that gives none; otherwise ModelLoadError."""
    value = names.find("max_position_embeddings", *_CONTEXT_NAMES)
    if value is not None:
        return int(value)
    if names.alibi:
        log.info(
            "decoctl.context_length_assumed",
            config=str(config_path),
            context_length=ALIBI_CONTEXT_LENGTH,
            reason=f"{names.model_type or 'this'} model uses ALiBi and its config gives no length",
            hint="set max_position_embeddings in config.json to change it",
        )
        return ALIBI_CONTEXT_LENGTH
    tried = ", ".join(dict.fromkeys(("max_position_embeddings", *_CONTEXT_NAMES)))
    raise ModelLoadError(
        f"{config_path} gives no context length (none of {tried}) and the {names.model_type or 'model'} "
        'architecture needs one: add "max_position_embeddings": N to it, with the length the model was trained for'
    )


@attrs.frozen(kw_only=True)
class ModelSpec:
    """A model folder's static description.

    ``max_length`` is the number of positions the KV cache is allocated for; ``share_buffer`` says past and
    present KV are one preallocated buffer (GroupQueryAttention models), otherwise present is past plus the
    new positions (concat models). ``num_kv_heads`` and ``head_size`` are the config's here; a loaded model's
    spec has the graph's (see decoctl.model.loader).
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
        """Read an Optimum folder: config.json + a decoder graph (past_key_values.N.* -> present.N.*): model.onnx,
        else the merged decoder (decoder_model_merged.onnx), else decoder_with_past_model.onnx (see
        :func:`optimum_graph_file`). The config's names are read per architecture (GPT-2's ``n_layer``, ``n_head``,
        ``n_embd``, ``n_positions``, as transformers' ``attribute_map`` has them)."""
        config_path = folder / OPTIMUM_CONFIG
        config = _read_json(config_path)
        onnx_file = optimum_graph_file(folder)
        try:
            names = _ConfigNames(config)
            num_heads = int(names.get("num_attention_heads"))
            hidden = int(names.get("hidden_size"))
            context_length = _optimum_context_length(config_path, names)
            spec = cls(
                path=folder,
                layout="optimum",
                onnx_file=onnx_file,
                tokenizer_file=folder / TOKENIZER_FILE,
                vocab_size=int(config["vocab_size"]),
                num_layers=int(names.get("num_hidden_layers")),
                # what the config says; the loader replaces both with the graph's KV inputs' shapes
                num_kv_heads=_config_kv_heads(names, num_heads),
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
