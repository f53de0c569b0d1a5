"""What a graph can do, read from its inputs and outputs (never assumed from the config)."""

from __future__ import annotations

from typing import Any

import attrs

from decoctl.errors import ModelLoadError
from decoctl.model._kv_cache import graph_dtype
from decoctl.model._ring_cache import RingLayer
from decoctl.model._spec import ModelSpec, NonAttentionState, non_attention_state
from decoctl.model.graph._fed_lengths import FedLengths
from decoctl.model.graph._logit_rows import LOGITS_FROM
from decoctl.model.graph._window_bias import WindowBias

__all__ = ["Capabilities"]

HIDDEN_STATES = "hidden_states"
AUX_HIDDEN_STATES = "aux_hidden_states"
ATTENTION_BIAS = "attention_bias"
FEATURES = "target_hidden_states"
"""The extra input of a draft head (EAGLE) that takes another model's features: float32[batch, sequence, width]."""
#: the boolean input of Optimum's merged decoder (decoder_model_merged.onnx): False runs the graph traced without a
#: past, True the one with it
USE_CACHE_BRANCH = "use_cache_branch"


@attrs.frozen(kw_only=True)
class Capabilities:
    """Optional features of one graph.

    ``logits_all_positions``: the logits output has one row per fed token (otherwise only the last).
    ``hidden_states`` / ``aux_hidden_states``: output names, or None when the graph has none.
    ``hidden_size`` / ``aux_hidden_size``: the last dimension of those outputs.
    ``position_ids`` / ``attention_bias``: input names, or None. ``tree`` needs both.
    ``feature_input`` / ``feature_size``: the input that takes another model's features (a draft head's
    ``target_hidden_states``, one float32 row per fed token) and its width, or None.
    ``fed_lengths``: the inputs that take GroupQueryAttention's sequence lengths where the loader removed the
    mask subgraph (decoctl.model.graph._fed_lengths); the graph then has no attention mask input. None otherwise.
    ``windows``: the bias inputs of sliding-window layers whose window the loader moved from the kernel into the
    bias (decoctl.model.graph._window_bias), which the runner fills with the tree bias plus the window in positions.
    ``inputs_embeds``: the decoder's embeddings input (it takes embeddings, not token ids), or None.
    ``rings``: the layers whose GroupQueryAttention keeps a window-sized ring cache (decoctl.model._ring_cache).
    ``use_cache_branch``: the input that picks a merged decoder's branch (the runner feeds False on an empty cache,
    True after), or None.
    ``logits_from``: the input that picks the first position whose logits a forward computes (its default 0: all of
    them), which the loader adds in front of the LM head (decoctl.model.graph._logit_rows), or None.
    ``position_axes``: 3 where ``position_ids`` is int64[3, batch, sequence], a temporal, a height and a width
    position per token (multimodal rotary positions, M-RoPE: decoctl.model._qwen_vl); 1 otherwise.
    """

    logits_all_positions: bool
    hidden_states: str | None
    hidden_size: int | None
    aux_hidden_states: str | None
    aux_hidden_size: int | None
    position_ids: str | None
    attention_bias: str | None
    feature_input: str | None
    feature_size: int | None
    fed_lengths: FedLengths | None = None
    windows: tuple[WindowBias, ...] = ()
    use_cache_branch: str | None = None
    rings: tuple[RingLayer, ...] = ()
    inputs_embeds: str | None = None
    logits_from: str | None = None
    position_axes: int = 1

    @property
    def tree(self) -> bool:
        # M-RoPE positions are decoctl's own to compute (decoctl.model._qwen_vl): a caller's tree positions have no
        # place in them
        return self.position_ids is not None and self.attention_bias is not None and self.position_axes == 1

    def names(self) -> tuple[str, ...]:
        """The capability names a controller can require (see ControllerSpec.capabilities)."""
        present = {
            "logits_all_positions": self.logits_all_positions,
            "hidden_states": self.hidden_states is not None,
            "aux_hidden_states": self.aux_hidden_states is not None,
            "position_ids": self.position_ids is not None and self.position_axes == 1,
            "tree": self.tree,
            "features": self.feature_input is not None,
        }
        return tuple(name for name, ok in present.items() if ok)

    @classmethod
    def from_session(
        cls,
        session: Any,
        spec: ModelSpec,
        fed_lengths: FedLengths | None = None,
        windows: tuple[WindowBias, ...] = (),
        rings: tuple[RingLayer, ...] = (),
    ) -> Capabilities:
        """Read a live onnxruntime.InferenceSession's inputs and outputs against the folder's spec
        (``fed_lengths``: the length inputs that replaced its attention mask, when the loader rewrote it)."""
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = {o.name: o for o in session.get_outputs()}
        state = non_attention_state(spec, inputs, outputs)
        if state is not None:
            raise ModelLoadError(_hybrid_message(spec, state))
        lengths = [fed_lengths.seqlens_k, fed_lengths.total_sequence_length] if fed_lengths else []
        fed = spec.inputs_embeds_name or spec.input_ids_name
        # a speech decoder (Whisper) takes no mask: its source is always one whole window
        speech = spec.encoder_decoder is not None and spec.encoder_decoder.speech
        masks = [] if speech else [spec.attention_mask_name]
        required = [fed, *(lengths or masks), *(w.name for w in windows)]
        for layer in range(spec.num_layers):
            required.extend(spec.past_names(layer))
        missing = [name for name in required if name not in inputs]
        if spec.logits_name not in outputs:
            missing.append(spec.logits_name)
        for layer in range(spec.num_layers):
            missing.extend(name for name in spec.present_names(layer) if name not in outputs)
        if missing:
            raise ModelLoadError(
                f"{spec.onnx_file} lacks the inputs/outputs {missing} that its config promises "
                f"({spec.num_layers} layers): the config and the graph do not belong together; re-export both"
            )
        _check_types(
            spec,
            inputs,
            outputs,
            masks if spec.inputs_embeds_name else [spec.input_ids_name, *masks],
        )
        feature_size = _feature_size(inputs.get(FEATURES), spec)
        logits_shape = outputs[spec.logits_name].shape
        seq_dim = logits_shape[1] if len(logits_shape) == 3 else None
        return cls(
            logits_all_positions=seq_dim != 1,
            hidden_states=HIDDEN_STATES if HIDDEN_STATES in outputs else None,
            hidden_size=_last_dim(outputs.get(HIDDEN_STATES)),
            aux_hidden_states=AUX_HIDDEN_STATES if AUX_HIDDEN_STATES in outputs else None,
            aux_hidden_size=_last_dim(outputs.get(AUX_HIDDEN_STATES)),
            position_ids=spec.position_ids_name if spec.position_ids_name in inputs else None,
            attention_bias=ATTENTION_BIAS if ATTENTION_BIAS in inputs else None,
            feature_input=FEATURES if feature_size is not None else None,
            feature_size=feature_size,
            fed_lengths=fed_lengths,
            windows=windows,
            use_cache_branch=USE_CACHE_BRANCH if USE_CACHE_BRANCH in inputs else None,
            rings=rings,
            inputs_embeds=spec.inputs_embeds_name if spec.inputs_embeds_name in inputs else None,
            logits_from=LOGITS_FROM if seq_dim != 1 and LOGITS_FROM in _overridable(session) else None,
            position_axes=_position_axes(inputs.get(spec.position_ids_name)),
        )


def _position_axes(port: Any) -> int:
    """3 for M-RoPE's position_ids, int64[3, batch, sequence]; 1 for the usual [batch, sequence] (or none)."""
    shape = getattr(port, "shape", None) or []
    return 3 if len(shape) == 3 and shape[0] == 3 else 1


def _check_types(spec: ModelSpec, inputs: dict[str, Any], outputs: dict[str, Any], ids: list[str]) -> None:
    """The graph's element types against what the runner binds: int64 token ids, mask and positions; logits and
    KV in float32, float16 or bfloat16, every KV tensor in one type; a boolean ``use_cache_branch``."""
    wrong = [
        f"{name} is {inputs[name].type}, decoctl feeds tensor(int64)"
        for name in (*ids, spec.position_ids_name)
        if name in inputs and inputs[name].type != "tensor(int64)"
    ]
    if USE_CACHE_BRANCH in inputs and inputs[USE_CACHE_BRANCH].type != "tensor(bool)":
        wrong.append(f"{USE_CACHE_BRANCH} is {inputs[USE_CACHE_BRANCH].type}, decoctl feeds tensor(bool)")
    if graph_dtype(outputs[spec.logits_name].type) is None:
        wrong.append(f"{spec.logits_name} is {outputs[spec.logits_name].type}, decoctl binds float32/16 or bfloat16")
    kv = [inputs[n] for layer in range(spec.num_layers) for n in spec.past_names(layer)]
    kv += [outputs[n] for layer in range(spec.num_layers) for n in spec.present_names(layer)]
    if graph_dtype(kv[0].type) is None:
        wrong.append(f"{kv[0].name} is {kv[0].type}, decoctl binds float32/16 or bfloat16")
    wrong.extend(f"{v.name} is {v.type} where {kv[0].name} is {kv[0].type}" for v in kv if v.type != kv[0].type)
    if wrong:
        raise ModelLoadError(
            f"{spec.onnx_file} has inputs/outputs of types decoctl does not bind ({'; '.join(wrong[:4])}): "
            "re-export the model with those types"
        )


def _hybrid_message(spec: ModelSpec, state: NonAttentionState) -> str:
    names = ", ".join(state.names[:4]) + (f" and {len(state.names) - 4} more" if len(state.names) > 4 else "")
    model = f"{spec.onnx_file} ({state.architecture})" if state.architecture else str(spec.onnx_file)
    return (
        f"{model} is a hybrid model: its {state.layer_kind} carry state between steps that is not attention's KV "
        f"cache ({names}). decoctl runs only models whose every layer is attention with a KV cache, so "
        f"{state.layer_kind} are not supported: run this model with onnxruntime-genai, or use an attention-only "
        "model"
    )


def _overridable(session: Any) -> set[str]:
    """The names of the graph's inputs that have a default (an initializer), which get_inputs() leaves out."""
    return {i.name for i in session.get_overridable_initializers()}


def _feature_size(node: Any, spec: ModelSpec) -> int | None:
    """The width of the features input, or None without one; a width the host cannot bind raises."""
    if node is None:
        return None
    width = _last_dim(node)
    if node.type != "tensor(float)" or len(node.shape) != 3 or width is None:
        raise ModelLoadError(
            f"{spec.onnx_file} takes {FEATURES} as {node.type}{node.shape}, but decoctl binds float32[batch, "
            "sequence, width] with a fixed width: re-export the head with that input type"
        )
    return width


def _last_dim(node: Any) -> int | None:
    if node is None:
        return None
    last = node.shape[-1]
    return last if isinstance(last, int) else None
