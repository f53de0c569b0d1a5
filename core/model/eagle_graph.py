"""EAGLE draft heads as ONNX folders the eagle controller runs as role "eagle": one writer from a head's weights.

Every EAGLE-3 head decoctl writes comes from here: the published heads ``decoctl eagle import`` converts, the heads
``decoctl eagle train`` exports, and the random heads of ``decoctl.testing`` (``build_eagle3_head``). Weights are
numpy arrays named and laid out as the torch module's state dict (``fc.weight`` [out, in]); the decoder layer is
``layers.0.`` (EAGLE-3's ``midlayer.`` is renamed before it gets here). :func:`write_head` writes a head's folder
from its weights; :func:`save_head` writes the folder of a graph built elsewhere (``decoctl.testing``'s EAGLE-1
heads, whose layer is the testing targets' own).

The interface the controller drives. Head position i is fed the token x_{i+1} and a feature row; it returns the
logits of x_{i+2} and, as ``hidden_states``, the feature the next drafted position is fed. Both architectures take
the features through one input, ``target_hidden_states``:

* ``eagle-1`` (EAGLE-1 and EAGLE-2 heads; Li et al. 2024): feature width H, the target's final hidden state (its
  lm_head input) while synced, the head's own output while drafting::

      x = fc(concat(embed(x_{i+1}), f_i)) + fc.bias
      h = x + attn(x); h = h + mlp(post_attention_layernorm(h))   (a Llama layer without input_layernorm)
      hidden_states = h; logits = lm_head(h)                      (the target's lm_head; no norm)

* ``eagle-3`` (Li et al., EAGLE-3, 2025): feature width 4H, laid out [taps (3H), own (H)]. The taps are the
  target's ``aux_hidden_states``: the residual stream entering three decoder layers, low, middle and high
  (decoctl.model.graph). While synced the taps are the target's and own is zero; while drafting the taps are zero
  and own is the head's previous ``hidden_states``. fc has no bias, so one graph computes both cases exactly::

      x = fc(taps) + own
      a = x + attn(concat(input_layernorm(embed(x_{i+1})), hidden_norm(x)))     (q, k, v over 2H)
      h = a + mlp(post_attention_layernorm(a))
      hidden_states = h; logits = scatter(lm_head(norm(h)))

  ``lm_head`` [Vd, H] covers the draft vocabulary; draft token d is target token d + d2t[d], and the Vd logits are
  scattered into a row of -inf over the target's vocabulary (the controller never proposes a token it cannot).

The layout is onnxruntime-genai's (GroupQueryAttention over a shared past/present buffer, rotary embeddings in
the op), with the tree inputs ``position_ids`` and ``attention_bias`` that EAGLE-2 tree drafting needs.
genai_config.json says ``"type": "eagle"`` and carries a ``"decoctl"`` section (architecture, sizes, and for
imported or trained heads the target and the source) that ``decoctl eagle info`` reads. onnx is imported only
when a graph is built (the decoctl[testing] extra, or the eagle plugin's dependencies).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl.errors import ConfigError
from decoctl.model._capabilities import FEATURES
from decoctl.model._genai_layout import builder_decoder_section
from decoctl.model._graph_builder import GraphBuilder, rotary_tables, save_model
from decoctl.model._graph_builder import inverse_frequencies as _base_frequencies

__all__ = [
    "ARCHITECTURES",
    "EAGLE1",
    "EAGLE3",
    "FEATURES",
    "LAYER",
    "MODEL_TYPE",
    "HeadDims",
    "draft_ids",
    "head_graph",
    "inverse_frequencies",
    "layer_weight_names",
    "save_head",
    "write_head",
]

EAGLE1 = "eagle-1"
"""EAGLE-1 and EAGLE-2 heads: fed the target's final hidden states (width H)."""
EAGLE3 = "eagle-3"
"""EAGLE-3 heads: fed three taps of the target's residual stream and their own feature (width 4H)."""
ARCHITECTURES = (EAGLE1, EAGLE3)
"""Every architecture the writer knows."""
MODEL_TYPE = "eagle"
"""genai_config.json's model type of a head folder."""
LAYER = "layers.0."
"""The prefix of the decoder layer's weights (EAGLE-3's ``midlayer.`` is renamed to it before a head is written)."""


@attrs.frozen(kw_only=True)
class HeadDims:
    """A head's sizes. ``vocab``: the target's vocabulary; ``draft_vocab``: the lm_head's rows (== vocab for an
    eagle-1 head of :func:`head_graph`, whose lm_head is the target's). ``rope_scaling``: the config's table (None,
    "linear", "llama3")."""

    architecture: str = attrs.field(validator=attrs.validators.in_(ARCHITECTURES))
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate: int
    vocab: int
    draft_vocab: int
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None

    @property
    def feature_size(self) -> int:
        """The width of the features input: H (eagle-1), or three taps and the head's own feature (eagle-3)."""
        return self.hidden if self.architecture == EAGLE1 else 4 * self.hidden

    @property
    def attention_input(self) -> int:
        """The width q, k and v project from: H (eagle-1) or 2H (eagle-3's [embedding; feature])."""
        return self.hidden if self.architecture == EAGLE1 else 2 * self.hidden

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the graph takes, by name, with its shape (torch layout); optional ones are not listed."""
        h, width = self.hidden, self.attention_input
        q, kv = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        shapes: dict[str, tuple[int, ...]] = {
            "embed_tokens.weight": (self.vocab, h),
            "fc.weight": (h, 2 * h if self.architecture == EAGLE1 else 3 * h),
            LAYER + "self_attn.q_proj.weight": (q, width),
            LAYER + "self_attn.k_proj.weight": (kv, width),
            LAYER + "self_attn.v_proj.weight": (kv, width),
            LAYER + "self_attn.o_proj.weight": (h, q),
            LAYER + "post_attention_layernorm.weight": (h,),
            LAYER + "mlp.gate_proj.weight": (self.intermediate, h),
            LAYER + "mlp.up_proj.weight": (self.intermediate, h),
            LAYER + "mlp.down_proj.weight": (h, self.intermediate),
            "lm_head.weight": (self.draft_vocab, h),
        }
        if self.architecture == EAGLE1:
            shapes["fc.bias"] = (h,)
        else:
            shapes |= {
                LAYER + "hidden_norm.weight": (h,),
                LAYER + "input_layernorm.weight": (h,),
                "norm.weight": (h,),
                "d2t": (self.draft_vocab,),
            }
        return shapes

    def optional_shapes(self) -> dict[str, tuple[int, ...]]:
        """Weights a head may have: attention biases (Qwen-style heads)."""
        q, kv = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        return {
            LAYER + "self_attn.q_proj.bias": (q,),
            LAYER + "self_attn.k_proj.bias": (kv,),
            LAYER + "self_attn.v_proj.bias": (kv,),
        }

    def to_json(self) -> dict[str, Any]:
        """The sizes as a head folder's genai_config.json records them (its ``decoctl`` section)."""
        return {
            "architecture": self.architecture,
            "hidden_size": self.hidden,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_size": self.head_size,
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
            "draft_vocab_size": self.draft_vocab,
            "rms_norm_eps": self.rms_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
        }


def layer_weight_names() -> tuple[str, ...]:
    """The decoder layer's weight names (without the ``layers.0.`` prefix) any architecture may hold."""
    names = set()
    for architecture in ARCHITECTURES:
        dims = HeadDims(
            architecture=architecture,
            hidden=2,
            num_heads=1,
            num_kv_heads=1,
            head_size=2,
            intermediate=2,
            vocab=2,
            draft_vocab=2,
        )
        names |= {n.removeprefix(LAYER) for n in (*dims.shapes(), *dims.optional_shapes()) if n.startswith(LAYER)}
    return tuple(sorted(names))


# ------------------------------------------------------------------------------------------------ rotary tables


def inverse_frequencies(dims: HeadDims) -> np.ndarray:
    """float64[head_size / 2], with the config's rope_scaling applied ("linear" and Llama 3.1's "llama3")."""
    inv = _base_frequencies(dims.head_size, dims.rope_theta)
    scaling = dict(dims.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", None):
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        original = float(scaling["original_max_position_embeddings"])
        wavelength = 2 * math.pi / inv
        low_wavelength, high_wavelength = original / low, original / high
        smooth = (original / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * inv / factor + smooth * inv
        scaled = np.where(wavelength > low_wavelength, inv / factor, inv)
        between = (wavelength <= low_wavelength) & (wavelength >= high_wavelength)
        return np.where(between, smoothed, scaled)
    raise ConfigError(
        f"rope_scaling type {kind!r} is not supported by the EAGLE head writer (supported: default, linear, "
        "llama3): the head cannot be converted exactly"
    )


# ------------------------------------------------------------------------------------------------ the graph


def _linear(g: GraphBuilder, x: str, weights: Mapping[str, np.ndarray], key: str, name: str) -> str:
    """x @ W.T (+ bias when the weights hold ``key``'s bias): torch's layout, stored as MatMul takes it."""
    y = g.op("MatMul", [x, g.tensor(key, _f32(weights[key]).T)], f"{name}/MatMul")
    bias = key.removesuffix(".weight") + ".bias"
    if bias in weights:
        y = g.op("Add", [y, g.tensor(bias, _f32(weights[bias]))], f"{name}/Add")
    return y


def _norm(g: GraphBuilder, x: str, weights: Mapping[str, np.ndarray], key: str, eps: float, name: str) -> str:
    return g.rms_norm(x, g.tensor(key, _f32(weights[key])), eps, name)


def _f32(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float32)


def draft_ids(dims: HeadDims, weights: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """int64[Vd], the target token of each lm_head row (d + d2t[d]); None when the rows are the whole vocabulary in
    order. ConfigError when they are not distinct ids of the target's vocabulary."""
    if dims.architecture == EAGLE1:
        return None
    d2t = np.asarray(weights["d2t"]).astype(np.int64)
    ids = np.arange(dims.draft_vocab, dtype=np.int64) + d2t
    if ids.min() < 0 or ids.max() >= dims.vocab or len(np.unique(ids)) != ids.size:
        raise ConfigError(
            f"tensor d2t maps the {dims.draft_vocab} draft tokens to target ids that are not distinct ids below the "
            f"target's vocabulary {dims.vocab} (draft token d is target token d + d2t[d]): the head was made for "
            "another target"
        )
    if dims.draft_vocab == dims.vocab and (ids == np.arange(dims.vocab)).all():
        return None
    return ids


def head_graph(dims: HeadDims, weights: Mapping[str, np.ndarray], *, max_length: int, tree_inputs: bool = True) -> Any:
    """The head's onnx.ModelProto (see the module docstring). ``weights``: every name of ``dims.shapes()``."""
    g = GraphBuilder()
    h = dims.hidden
    seqlens_k, total_length = g.attention_lengths()
    embedded = g.op(
        "Gather", [g.tensor("embed_tokens.weight", _f32(weights["embed_tokens.weight"])), "input_ids"], "/embed"
    )
    if dims.architecture == EAGLE1:
        joined = g.op("Concat", [embedded, FEATURES], "/eagle/Concat", axis=-1)
        attention_in = residual = _linear(g, joined, weights, "fc.weight", "/eagle/fc")  # with fc.bias
    else:
        taps = g.op("Slice", [FEATURES, g.ints(0), g.ints(3 * h), g.ints(-1)], "/eagle/Taps")
        own = g.op("Slice", [FEATURES, g.ints(3 * h), g.ints(4 * h), g.ints(-1)], "/eagle/Own")
        x = g.op("Add", [_linear(g, taps, weights, "fc.weight", "/eagle/fc"), own], "/eagle/Feature")
        normed_embedding = _norm(g, embedded, weights, LAYER + "input_layernorm.weight", dims.rms_eps, "/eagle/in")
        normed_feature = _norm(g, x, weights, LAYER + "hidden_norm.weight", dims.rms_eps, "/eagle/hidden_norm")
        attention_in = g.op("Concat", [normed_embedding, normed_feature], "/eagle/Joined", axis=-1)
        residual = x

    p = "/model/layers.0"
    q = _linear(g, attention_in, weights, LAYER + "self_attn.q_proj.weight", f"{p}/attn/q_proj")
    k = _linear(g, attention_in, weights, LAYER + "self_attn.k_proj.weight", f"{p}/attn/k_proj")
    v = _linear(g, attention_in, weights, LAYER + "self_attn.v_proj.weight", f"{p}/attn/v_proj")
    cos_table, sin_table = rotary_tables(inverse_frequencies(dims), max_length)
    tree = ["position_ids", "attention_bias"] if tree_inputs else []
    shared = [seqlens_k, total_length, g.tensor("cos_cache", cos_table), g.tensor("sin_cache", sin_table), *tree]
    context = g.group_query_attention(
        0, q, k, v, shared, num_heads=dims.num_heads, num_kv_heads=dims.num_kv_heads, head_size=dims.head_size
    )
    out = _linear(g, context, weights, LAYER + "self_attn.o_proj.weight", f"{p}/attn/o_proj")
    x = g.op("Add", [residual, out], f"{p}/attn/Residual")
    normed = _norm(g, x, weights, LAYER + "post_attention_layernorm.weight", dims.rms_eps, f"{p}/post_norm")
    gate = _linear(g, normed, weights, LAYER + "mlp.gate_proj.weight", f"{p}/mlp/gate_proj")
    up = _linear(g, normed, weights, LAYER + "mlp.up_proj.weight", f"{p}/mlp/up_proj")
    down = _linear(g, g.gated(gate, up, f"{p}/mlp"), weights, LAYER + "mlp.down_proj.weight", f"{p}/mlp")
    x = g.op("Add", [x, down], f"{p}/mlp/Residual")
    g.op("Identity", [x], "/eagle/hidden_states", output="hidden_states")

    head_in = x if dims.architecture == EAGLE1 else _norm(g, x, weights, "norm.weight", dims.rms_eps, "/model/norm")
    lm_head = g.tensor("lm_head.weight", _f32(weights["lm_head.weight"]).T)
    ids = draft_ids(dims, weights)
    if ids is None:
        g.op("MatMul", [head_in, lm_head], "/lm_head/MatMul", output="logits")
    else:
        g.scattered_logits(g.op("MatMul", [head_in, lm_head], "/lm_head/MatMul"), ids, dims.vocab, "draft_ids")
    sizes = {"num_layers": 1, "num_kv_heads": dims.num_kv_heads, "head_size": dims.head_size}
    inputs = g.decoder_inputs(**sizes, tree_inputs=tree_inputs, features=dims.feature_size)
    outputs = g.decoder_outputs(**sizes, vocab=dims.vocab, hidden_states=h)
    return g.model(inputs, outputs, name=f"decoctl_{dims.architecture}_head", producer="decoctl-eagle")


def write_head(
    folder: str | Path,
    dims: HeadDims,
    weights: Mapping[str, np.ndarray],
    *,
    target_dir: str | Path,
    target_name: str,
    source: str = "",
    tree_inputs: bool = True,
) -> Path:
    """Write the head's folder from its weights (every name of ``dims.shapes()``): :func:`head_graph` at the
    target's context length, saved by :func:`save_head` with the target and the source recorded.

    :param target_dir: the target's onnxruntime-genai folder (genai_config.json, tokenizer files).
    :param target_name: how the target was named (recorded in the config, shown by ``decoctl eagle info``).
    :param source: where the weights came from, in words (recorded too).
    :returns: the folder.
    """
    target = Path(target_dir)
    max_length = int(_target_model(target)["context_length"])
    model = head_graph(dims, weights, max_length=max_length, tree_inputs=tree_inputs)
    record = {"target": target_name, "target_path": str(target.resolve()), "source": source}
    return save_head(
        folder, model, dims, target_dir=target, max_length=max_length, tree_inputs=tree_inputs, record=record
    )


def save_head(
    folder: str | Path,
    model: Any,
    dims: HeadDims,
    *,
    target_dir: str | Path,
    max_length: int,
    tree_inputs: bool,
    record: Mapping[str, Any] | None = None,
) -> Path:
    """Write a head's folder around its graph ``model`` (an onnx.ModelProto whose rotary tables cover
    ``max_length`` positions): model.onnx (+ model.onnx.data for a large head), genai_config.json with the target's
    special tokens, the context length ``max_length``, ``"type": "eagle"`` and a ``decoctl`` section (``dims`` and
    ``record``), and the target's tokenizer files. Files of an earlier head in ``folder`` are replaced.

    :param target_dir: the target's onnxruntime-genai folder (genai_config.json, tokenizer files).
    :returns: the folder.
    """
    target = Path(target_dir)
    target_model = _target_model(target)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    save_model(model, out / "model.onnx")
    config = _genai_config(dims, target_model, max_length, tree_inputs)
    config["decoctl"] = {**dims.to_json(), **(record or {})}
    (out / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (target / name).is_file():
            shutil.copyfile(target / name, out / name)
    return out


def _target_model(target: Path) -> dict[str, Any]:
    """The ``model`` table of the target's genai_config.json."""
    return dict(json.loads((target / "genai_config.json").read_text(encoding="utf-8"))["model"])


def _genai_config(
    dims: HeadDims, target_model: Mapping[str, Any], max_length: int, tree_inputs: bool
) -> dict[str, Any]:
    """genai_config.json in the builder's shape: one layer, the features input, the target's tokens."""
    decoder = builder_decoder_section(
        hidden=dims.hidden,
        head_size=dims.head_size,
        num_heads=dims.num_heads,
        num_kv_heads=dims.num_kv_heads,
        num_layers=1,
        extra_inputs={FEATURES: FEATURES},
        tree_inputs=tree_inputs,
    )
    search = {"do_sample": False, "max_length": max_length, "past_present_share_buffer": True}
    model = {
        "bos_token_id": target_model.get("bos_token_id"),
        "context_length": max_length,
        "decoder": decoder,
        "eos_token_id": target_model.get("eos_token_id"),
        "pad_token_id": target_model.get("pad_token_id"),
        "type": MODEL_TYPE,
        "vocab_size": dims.vocab,
    }
    return {"model": model, "search": search}
