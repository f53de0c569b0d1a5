"""What a model folder says about itself: layout, sizes, special tokens, input/output names.

Two layouts are read: onnxruntime-genai's (genai_config.json) and Optimum's (config.json), whose encoder-decoder
exports (encoder_model.onnx beside the decoder graphs) are a third: a composite model (EncoderDecoderParts).
Everything here comes from the folder's JSON and file names; what the graph itself offers is read later (see
capabilities.py), and so are the KV heads and head size, which the loader takes from the graph's past inputs
(kv_cache.kv_shape).
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
    "ENCODER_GRAPH",
    "OPTIMUM_GRAPHS",
    "RELATIVE_CONTEXT_LENGTH",
    "EncoderDecoderParts",
    "ModelSpec",
    "NonAttentionState",
    "detect_layout",
    "non_attention_state",
    "optimum_graph_file",
]

log = get_logger(__name__)

GENAI_CONFIG = "genai_config.json"
"""The config file of onnxruntime-genai's layout."""
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
    """Return "genai", "optimum" or "encoder-decoder" (Optimum's export of a T5, BART or Marian model) for a model
    folder, or raise ModelLoadError naming what is missing."""
    if not path.exists():
        raise ModelLoadError(f"model folder {path} does not exist: pass the folder of an exported model")
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is a file: pass the folder that holds model.onnx and its config")
    if (path / GENAI_CONFIG).is_file():
        return "genai"
    if (path / OPTIMUM_CONFIG).is_file():
        return "encoder-decoder" if _is_encoder_decoder(path) else "optimum"
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

#: an encoder-decoder export's encoder graph (input_ids, attention_mask -> last_hidden_state)
ENCODER_GRAPH = "encoder_model.onnx"
#: its decoder graphs: the merged decoder (the no-past branch on an empty cache, which also writes the
#: cross-attention KV, the with-past branch after), else the pair optimum writes without merging them
SEQ2SEQ_MERGED = "decoder_model_merged.onnx"
SEQ2SEQ_FIRST = "decoder_model.onnx"
SEQ2SEQ_WITH_PAST = "decoder_with_past_model.onnx"
#: how to export one, for the errors that ask for another export
SEQ2SEQ_EXPORT = "optimum-cli export onnx --model MODEL --task text2text-generation-with-past DIR"
#: the context length of a model with relative positions (T5) whose config gives none: the graph puts no limit on
#: positions, so this only bounds the encoder's input and the decoder's KV cache; 512 is what T5 was trained with.
#: tokenizer_config.json's model_max_length or a ``max_position_embeddings`` in config.json replaces it.
RELATIVE_CONTEXT_LENGTH = 512
#: tokenizer_config.json's model_max_length when the tokenizer sets no limit (transformers' VERY_LARGE_INTEGER)
_NO_LIMIT = 10**18
#: what an export of a Marian model holds instead of tokenizer.json: MarianTokenizer reads sentencepiece models only
#: and transformers has no fast (tokenizer.json) version of it, so Optimum's export saves these
MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")

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


def _is_encoder_decoder(folder: Path) -> bool:
    """An Optimum folder holds an encoder-decoder export: an encoder graph is there (or in onnx/), or config.json
    says ``is_encoder_decoder`` (then a missing encoder is an error naming it, not a decoder-only load)."""
    if any((place / ENCODER_GRAPH).is_file() for place in (folder, folder / "onnx")):
        return True
    try:
        config = json.loads((folder / OPTIMUM_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # from_optimum_config reads it again and says what is wrong
    return isinstance(config, dict) and config.get("is_encoder_decoder") is True


def encoder_decoder_files(folder: Path) -> tuple[Path, Path, Path]:
    """(encoder, first-pass decoder, stepping decoder) of an encoder-decoder export: the merged decoder serves as
    both decoders; otherwise decoder_model.onnx runs the first pass (it takes no past and writes the
    cross-attention KV) and decoder_with_past_model.onnx every later one. Each is looked for next to config.json,
    then in onnx/. A missing part raises ModelLoadError naming it and where it comes from."""
    places = (folder, folder / "onnx")

    def find(name: str) -> Path | None:
        return next((place / name for place in places if (place / name).is_file()), None)

    encoder, merged = find(ENCODER_GRAPH), find(SEQ2SEQ_MERGED)
    first, with_past = find(SEQ2SEQ_FIRST), find(SEQ2SEQ_WITH_PAST)
    if encoder is None:
        decoders = [p.name for p in (merged, first, with_past) if p is not None]
        holds = f"holds {', '.join(decoders)} but " if decoders else ""
        raise ModelLoadError(
            f"{folder} is an encoder-decoder export (config.json says is_encoder_decoder) and {holds}its encoder, "
            f"{ENCODER_GRAPH}, is missing (nor in onnx/): copy it from the same export next to config.json, or "
            f"export the model again: {SEQ2SEQ_EXPORT}"
        )
    if merged is not None:
        return encoder, merged, merged
    if first is not None and with_past is not None:
        return encoder, first, with_past
    if first is not None:
        raise ModelLoadError(
            f"{folder} holds {SEQ2SEQ_FIRST} but not {SEQ2SEQ_WITH_PAST} (nor {SEQ2SEQ_MERGED}): that decoder takes "
            "no past key values, so every token would run the whole decoder again; copy "
            f"{SEQ2SEQ_WITH_PAST} (or {SEQ2SEQ_MERGED}) from the same export next to it, or export with "
            f"{SEQ2SEQ_EXPORT}"
        )
    if with_past is not None:
        raise ModelLoadError(
            f"{folder} holds {SEQ2SEQ_WITH_PAST} but not {SEQ2SEQ_FIRST} (nor {SEQ2SEQ_MERGED}): the decoder's first "
            f"pass, which computes the cross-attention KV from the encoder's output, runs {SEQ2SEQ_FIRST}; copy it "
            f"(or {SEQ2SEQ_MERGED}) from the same export next to it, or export with {SEQ2SEQ_EXPORT}"
        )
    raise ModelLoadError(
        f"{folder} has an encoder ({encoder.name}) but no decoder graph: none of {SEQ2SEQ_MERGED}, {SEQ2SEQ_FIRST} "
        f"with {SEQ2SEQ_WITH_PAST} is there (nor in onnx/); copy them from the same export, or export with "
        f"{SEQ2SEQ_EXPORT}"
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
class EncoderDecoderParts:
    """What an encoder-decoder export adds to the decoder a ModelSpec describes (Optimum's names).

    ``encoder_file``: the encoder (``input_ids``, ``attention_mask`` -> ``last_hidden_state``), run once per
    generation over the prompt (the source). ``first_file``: the decoder a pass from an empty cache runs; it takes
    ``encoder_hidden_states`` and writes the cross-attention KV (``present.N.encoder.key/value``) besides the
    self-attention KV. The spec's ``onnx_file`` runs every later pass, with the cross-attention KV bound as
    ``past_key_values.N.encoder.key/value``. A merged decoder is both (``merged``: its ``use_cache_branch`` picks).
    ``decoder_start_token_id``: the decoder's first token. ``source_length``: the most tokens the encoder takes.
    """

    encoder_file: Path
    first_file: Path
    merged: bool
    decoder_start_token_id: int
    source_length: int
    encoder_ids_name: str = "input_ids"
    encoder_mask_name: str = "attention_mask"
    #: a speech encoder (Whisper): it takes log-mel features (``input_features``, float32[1, mel, frames]) from the
    #: folder's preprocessor_config.json (decoctl.model._audio_features) instead of token ids and their mask, and its
    #: output has ``source_length`` positions whatever the audio's length
    speech: bool = False
    encoder_output_name: str = "last_hidden_state"
    #: the decoder's inputs that take the encoder's output and the source's mask
    hidden_input_name: str = "encoder_hidden_states"
    mask_input_name: str = "encoder_attention_mask"
    past_cross_key_pattern: str = "past_key_values.%d.encoder.key"
    past_cross_value_pattern: str = "past_key_values.%d.encoder.value"
    present_cross_key_pattern: str = "present.%d.encoder.key"
    present_cross_value_pattern: str = "present.%d.encoder.value"

    def past_cross_names(self, layer: int) -> tuple[str, str]:
        return self.past_cross_key_pattern % layer, self.past_cross_value_pattern % layer

    def present_cross_names(self, layer: int) -> tuple[str, str]:
        return self.present_cross_key_pattern % layer, self.present_cross_value_pattern % layer


@attrs.frozen(kw_only=True)
class ModelSpec:
    """A model folder's static description.

    ``max_length`` is the number of positions the KV cache is allocated for; ``share_buffer`` says past and
    present KV are one preallocated buffer (GroupQueryAttention models), otherwise present is past plus the
    new positions (concat models). ``num_kv_heads`` and ``head_size`` are the config's here; a loaded model's
    spec has the graph's (see decoctl.model._loader).
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
    #: the decoder's embeddings input where it takes embeddings instead of token ids (a vision-language model's
    #: decoder, exported with the builder's exclude_embeds); None where it takes token ids
    inputs_embeds_name: str | None = None
    #: the token a vision-language prompt holds where an image goes (genai_config.json's image_token_id)
    image_token_id: int | None = None
    attention_mask_name: str = "attention_mask"
    position_ids_name: str = "position_ids"
    logits_name: str = "logits"
    past_key_pattern: str = "past_key_values.%d.key"
    past_value_pattern: str = "past_key_values.%d.value"
    present_key_pattern: str = "present.%d.key"
    present_value_pattern: str = "present.%d.value"
    #: the encoder and first-pass decoder of an encoder-decoder model (layout "encoder-decoder"), else None
    encoder_decoder: EncoderDecoderParts | None = None

    def past_names(self, layer: int) -> tuple[str, str]:
        """Layer ``layer``'s past key and value input names."""
        return self.past_key_pattern % layer, self.past_value_pattern % layer

    def present_names(self, layer: int) -> tuple[str, str]:
        """Layer ``layer``'s present key and value output names."""
        return self.present_key_pattern % layer, self.present_value_pattern % layer

    @classmethod
    def from_folder(cls, path: str | Path) -> ModelSpec:
        """The spec of the model folder ``path``, in whichever layout it is (detect_layout)."""
        folder = Path(path).expanduser().resolve()
        layout = detect_layout(folder)
        if layout == "genai":
            return cls.from_genai_config(folder)
        if layout == "encoder-decoder":
            return cls.from_encoder_decoder_config(folder)
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
                inputs_embeds_name=inputs.get("inputs_embeds"),
                image_token_id=model.get("image_token_id"),
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
        else the merged decoder (decoder_model_merged.onnx), else decoder_with_past_model.onnx, the first found.
        The config's names are read per architecture (GPT-2's ``n_layer``, ``n_head``,
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

    @classmethod
    def from_encoder_decoder_config(cls, folder: Path) -> ModelSpec:
        """Read an Optimum encoder-decoder folder (T5, BART, Marian; Whisper, whose encoder takes audio features):
        config.json, encoder_model.onnx and the decoder graphs (decoder_model.onnx and decoder_with_past_model.onnx,
        or the merged decoder), tokenizer.json. The spec describes the decoder: its self-attention KV
        (``past_key_values.N.decoder.*`` -> ``present.N.decoder.*``) is the cache that rewinds; ``encoder_decoder``
        holds the rest. The decoder starts from config.json's (else generation_config.json's)
        ``decoder_start_token_id``."""
        config_path = folder / OPTIMUM_CONFIG
        config = _read_json(config_path)
        encoder, first, step = encoder_decoder_files(folder)
        try:
            names = _ConfigNames(config)
            hidden = int(config.get("d_model") or names.get("hidden_size"))
            heads = int(
                next(
                    config[n]
                    for n in ("decoder_attention_heads", "num_heads", "num_attention_heads")
                    if config.get(n) is not None
                )
            )
            layers = int(
                next(
                    config[n]
                    for n in ("decoder_layers", "num_decoder_layers", "num_layers", "num_hidden_layers")
                    if config.get(n) is not None
                )
            )
            start = _decoder_start(folder, config_path, config)
            speech = names.model_type == "whisper"
            if speech:  # the decoder's learned positions and the encoder's, which the 30 s window fills
                context_length = int(config["max_target_positions"])
                source_length = int(config["max_source_positions"])
            else:
                context_length = source_length = _encoder_decoder_context_length(folder, config_path, names)
            parts = EncoderDecoderParts(
                encoder_file=encoder,
                first_file=first,
                merged=first == step,
                decoder_start_token_id=start,
                source_length=source_length,
            )
            if speech:
                parts = attrs.evolve(parts, encoder_ids_name="input_features", encoder_mask_name="", speech=True)
            spec = cls(
                path=folder,
                layout="encoder-decoder",
                onnx_file=step,
                tokenizer_file=folder / TOKENIZER_FILE,
                vocab_size=int(config["vocab_size"]),
                num_layers=layers,
                # the config's; the loader replaces both with the graph's KV inputs' shapes
                num_kv_heads=heads,
                head_size=int(config.get("d_kv") or config.get("head_dim") or hidden // heads),
                hidden_size=hidden,
                context_length=context_length,
                max_length=context_length,
                bos_token_id=config.get("bos_token_id"),
                eos_token_ids=_declared_eos(folder, (config_path, config.get("eos_token_id"))),
                pad_token_id=config.get("pad_token_id"),
                add_bos=_add_bos(folder, default=False),
                share_buffer=False,
                attention_mask_name=parts.mask_input_name,
                past_key_pattern="past_key_values.%d.decoder.key",
                past_value_pattern="past_key_values.%d.decoder.value",
                present_key_pattern="present.%d.decoder.key",
                present_value_pattern="present.%d.decoder.value",
                encoder_decoder=parts,
            )
        except (KeyError, StopIteration, TypeError, ValueError) as exc:
            what = "a layer or head count" if isinstance(exc, StopIteration) else repr(exc)
            raise ModelLoadError(
                f"{config_path} lacks or mangles a required field ({what}): re-export the model with {SEQ2SEQ_EXPORT}"
            ) from exc
        spec._check_files()
        return spec

    def _check_files(self) -> None:
        tokenizer_fix = "decoctl reads text through tokenizer.json: save the tokenizer next to it"
        if all((self.path / name).is_file() for name in MARIAN_TOKENIZER_FILES):
            tokenizer_fix = (
                "the folder holds a Marian tokenizer (source.spm, target.spm, vocab.json), which transformers has no "
                "tokenizer.json for, and decoctl reads text through tokenizer.json only: write one from those files "
                "with the script in docs/MODELS.md (Encoder-decoder models, Marian)"
            )
        for needed, fix in (
            (self.onnx_file, "the ONNX graph is missing: copy or re-export it"),
            (self.tokenizer_file, tokenizer_fix),
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


def _decoder_start(folder: Path, config_path: Path, config: dict[str, Any]) -> int:
    """The decoder's first token: config.json's decoder_start_token_id, else generation_config.json's."""
    value = config.get("decoder_start_token_id")
    path = folder / GENERATION_CONFIG
    if value is None and path.is_file():
        value = _read_json(path).get("decoder_start_token_id")
    if value is None:
        raise ModelLoadError(
            f"{config_path} gives no decoder_start_token_id (nor does {GENERATION_CONFIG}): the decoder cannot start "
            'without it; add "decoder_start_token_id": N to config.json (T5: its pad token, 0; BART: </s>, 2; '
            "Marian: its pad token), as the model's original config has it"
        )
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"{config_path}: decoder_start_token_id {value!r} is not a token id: fix the config")
    return value


def _encoder_decoder_context_length(folder: Path, config_path: Path, names: _ConfigNames) -> int:
    """The most positions the encoder and the decoder take: config.json's (BART's and Marian's learned or
    sinusoidal positions), else tokenizer_config.json's model_max_length, else :data:`RELATIVE_CONTEXT_LENGTH`
    (logged) for a model with relative positions (T5), which puts no limit in the graph."""
    value = names.find("max_position_embeddings", *_CONTEXT_NAMES)
    if value is not None:
        return int(value)
    path = folder / "tokenizer_config.json"
    limit = _read_json(path).get("model_max_length") if path.is_file() else None
    if isinstance(limit, int | float) and not isinstance(limit, bool) and 0 < limit < _NO_LIMIT:
        return int(limit)
    log.info(
        "decoctl.context_length_assumed",
        config=str(config_path),
        context_length=RELATIVE_CONTEXT_LENGTH,
        reason=f"{names.model_type or 'this'} model has relative positions and neither its config nor its tokenizer "
        "gives a length",
        hint="set max_position_embeddings in config.json to change it",
    )
    return RELATIVE_CONTEXT_LENGTH


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
    inputs_kv = [spec.past_key_pattern, spec.past_value_pattern]
    outputs_kv = [spec.present_key_pattern, spec.present_value_pattern]
    parts = spec.encoder_decoder
    if parts is not None:  # the cross-attention KV is attention's too
        inputs_kv += [parts.past_cross_key_pattern, parts.past_cross_value_pattern]
        outputs_kv += [parts.present_cross_key_pattern, parts.present_cross_value_pattern]
    kv_inputs = [_layer_pattern(p) for p in inputs_kv]
    kv_outputs = [_layer_pattern(p) for p in outputs_kv]
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
