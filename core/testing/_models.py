"""Tiny random-weight Llama-style causal LMs in the two ONNX layouts decoctl loads, built without torch by
decoctl.model's graph builder (decoctl.model._graph_builder, which writes every EAGLE head too).

Both builders draw the same weights from the same seed and sizes, so a genai model and an Optimum model built
with equal arguments (and equal ``num_kv_heads``) compute the same function: that cross-checks the
GroupQueryAttention graph against the plain-op one.

The architecture: token embedding, ``num_layers`` pre-norm blocks (RMSNorm, attention with rotary
embeddings in the half-split convention, residual, RMSNorm, SiLU-gated MLP of width ``2 * hidden``,
residual), a final RMSNorm and an untied ``lm_head``. The lm_head is scaled so logits have a standard
deviation near 2.5: rows have clear winners (top-2 gaps are rarely below 1e-3) yet sampling stays varied.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from decoctl.model._capabilities import FEATURES
from decoctl.model._genai_layout import builder_decoder_section
from decoctl.model._graph_builder import GraphBuilder, inverse_frequencies, rotary_tables, save_model
from decoctl.model.graph import TAP_LAYERS_KEY
from decoctl.testing._tokenizer import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    build_tokenizer,
    write_tokenizer_config,
)

__all__ = [
    "build_genai_model",
    "build_optimum_model",
    "reference_logits",
    "reference_outputs",
    "top2_gap",
]

ROPE_THETA = 10000.0
RMS_EPS = 1e-5
LOGIT_STD = 2.5

_FLOAT = TensorProto.FLOAT
_INT64 = TensorProto.INT64
_INT64_MAX = np.iinfo(np.int64).max
_MASK_VALUE = -1e9

# An attention core: (layer, q [B,S,nh*hd], k [B,S,kv*hd], v [B,S,kv*hd]) -> context [B,S,nh*hd].
_Attention = Callable[[int, str, str, str], str]


@dataclass(frozen=True)
class _Dims:
    """The sizes of one model."""

    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    vocab: int
    max_length: int

    @property
    def head_size(self) -> int:
        return self.hidden // self.num_heads

    @property
    def intermediate(self) -> int:
        return 2 * self.hidden

    def check(self) -> None:
        """Raise ValueError when the sizes cannot form a model."""
        if self.num_layers < 1 or self.max_length < 2:
            raise ValueError("num_layers must be >= 1 and max_length >= 2")
        if self.hidden % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden={self.hidden} must be a multiple of num_heads={self.num_heads}, "
                f"which must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_size % 2:
            raise ValueError(f"head size {self.head_size} must be even for rotary embeddings")


def build_genai_model(
    path: str | Path,
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab: int | None = None,
    max_length: int = 256,
    hidden_states: bool = False,
    tap_layers: Sequence[int] = (),
    logits_all_positions: bool = True,
    tree_inputs: bool = False,
    eos_token_id: int | Sequence[int] = EOS_TOKEN_ID,
    local_window_size: int | None = None,
    ring_cache: bool = False,
) -> Path:
    """Write a model folder in onnxruntime-genai's model-builder layout for a Llama model.

    Files: ``model.onnx``, ``genai_config.json``, ``tokenizer.json``, ``tokenizer_config.json``.

    Graph inputs: ``input_ids`` int64[batch_size, sequence_length], ``attention_mask``
    int64[batch_size, total_sequence_length], ``past_key_values.{i}.key`` / ``.value``
    float32[batch_size, num_kv_heads, past_sequence_length, head_size]; with ``tree_inputs`` also
    ``position_ids`` int64[batch_size, sequence_length] and ``attention_bias``
    float32[batch_size, 1, sequence_length, total_sequence_length] (0 = may attend, a large negative = may
    not), fed to GroupQueryAttention's optional inputs of the same names. GroupQueryAttention reads only
    the first position id of a first prompt (no past), so a tree forward needs at least one cached token.

    Graph outputs: ``logits`` float32[batch_size, sequence_length, vocab] (float32[batch_size, 1, vocab],
    the last position only, when ``logits_all_positions`` is false); ``present.{i}.key`` / ``.value``
    float32[batch_size, num_kv_heads, total_sequence_length, head_size]; with ``hidden_states``,
    ``hidden_states`` float32[batch_size, sequence_length, hidden], the final norm's OUTPUT (the lm_head
    input), as the model builder's ``include_hidden_states`` writes it; with ``tap_layers``,
    ``aux_hidden_states`` float32[batch_size, sequence_length, hidden * len(tap_layers)], the residual stream
    entering each listed decoder layer (0: the token embeddings), concatenated in the order given: the taps an
    EAGLE-3 head reads, as the builder's ``aux_hidden_state_layers`` and ``decoctl models enable-taps --layers``
    write them (decoctl.model.graph). The layers are also recorded in the ONNX metadata under enable-taps' key, so
    ``decoctl.tap_layers(folder)`` reads them.

    Attention is com.microsoft GroupQueryAttention with rotary embeddings inside the op, so the model runs
    with past and present bound to one preallocated buffer [1, num_kv_heads, max_length, head_size]
    (``search.past_present_share_buffer`` is true) or with growing concatenated buffers.

    :param local_window_size: a sliding window on every layer but the last (Gemma 2/3 and Mistral style, as
        the builder writes it: GroupQueryAttention's ``local_window_size``, the query at position p sees keys at
        p - local_window_size + 1 .. p); None: every layer attends to the whole sequence.
    :param ring_cache: the windowed layers keep window-sized ring caches (``sliding_window_cache=1``, the builder's
        default export of windowed models; decoctl.model._ring_cache).
    :param vocab: the model's vocabulary; defaults to the tokenizer's (384). The tokenizer is trained with
        ``min(vocab, 384)`` entries, so a larger ``vocab`` leaves ids no text encodes to, as padded
        vocabularies of real models do.
    :returns: the model folder.
    """
    folder, vocab_size = _prepare_folder(path, vocab, max_length)
    dims = _Dims(num_layers, hidden, num_heads, num_kv_heads, vocab_size, max_length)
    dims.check()
    taps = _check_taps(tap_layers, num_layers)
    weights = _random_weights(dims, seed)
    if ring_cache and local_window_size is None:
        raise ValueError("ring_cache needs a local_window_size: a ring cache is a windowed layer's")
    model = _genai_graph(
        weights, dims, hidden_states, taps, logits_all_positions, tree_inputs, local_window_size, ring_cache
    )
    if taps:
        helper.set_model_props(model, {TAP_LAYERS_KEY: ",".join(map(str, taps))})
    save_model(model, folder / "model.onnx")
    _write_json(folder / "genai_config.json", _genai_config(dims, eos_token_id, tree_inputs))
    return folder


def build_optimum_model(
    path: str | Path,
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 4,
    vocab: int | None = None,
    max_length: int = 256,
    position_ids: bool = True,
    eos_token_id: int | Sequence[int] = EOS_TOKEN_ID,
) -> Path:
    """Write a model folder in Optimum's ONNX export layout for a Llama model, built from plain ONNX ops.

    Files: ``model.onnx``, ``config.json`` (Hugging Face style), ``generation_config.json``,
    ``tokenizer.json``, ``tokenizer_config.json``.

    Graph inputs: ``input_ids`` int64[batch_size, sequence_length], ``attention_mask``
    int64[batch_size, past_sequence_length + sequence_length] (1 = real token, 0 = padding), optionally
    ``position_ids`` int64[batch_size, sequence_length] (without it positions are past_sequence_length + i),
    ``past_key_values.{i}.key`` / ``.value`` float32[batch_size, num_kv_heads, past_sequence_length,
    head_size].

    Graph outputs: ``logits`` float32[batch_size, sequence_length, vocab], ``present.{i}.key`` / ``.value``
    float32[batch_size, num_kv_heads, past_sequence_length + sequence_length, head_size] (past concatenated
    with the new rows). The causal mask is built in the graph from the shapes and ``attention_mask``.

    :param vocab: as for :func:`build_genai_model`.
    :returns: the model folder.
    """
    folder, vocab_size = _prepare_folder(path, vocab, max_length)
    dims = _Dims(num_layers, hidden, num_heads, num_kv_heads, vocab_size, max_length)
    dims.check()
    model = _optimum_graph(_random_weights(dims, seed), dims, position_ids)
    onnx.checker.check_model(model)
    save_model(model, folder / "model.onnx")
    _write_json(folder / "config.json", _hf_config(dims, eos_token_id))
    _write_json(
        folder / "generation_config.json",
        {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": eos_token_id, "pad_token_id": PAD_TOKEN_ID},
    )
    return folder


def reference_logits(model_dir: str | Path, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Compute logits for a whole token sequence from scratch: a test oracle for incremental decoding.

    Runs the folder's ONNX model on CPU with an empty past (past length 0), the full sequence as one prompt,
    an all-ones attention mask and, where the graph takes them, ``position_ids`` 0..n-1 and a zero
    ``attention_bias``. A model that emits only the last position's logits is run once per prefix.

    :param token_ids: int[n], n >= 1.
    :returns: float32[n, vocab]; row i predicts the token after ``token_ids[i]``.
    """
    folder = Path(model_dir)
    session = ort.InferenceSession(str(folder / _model_filename(folder)), providers=["CPUExecutionProvider"])
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise ValueError("reference_logits needs at least one token")
    logits_dims = next(o.shape for o in session.get_outputs() if o.name == "logits")
    if logits_dims[1] == 1:
        return np.stack([_single_pass(session, ids[: n + 1])[-1] for n in range(ids.size)])
    return _single_pass(session, ids)


def reference_outputs(
    model_dir: str | Path, token_ids: Sequence[int] | np.ndarray, *, features: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Every per-token output of one from-scratch pass over a token sequence (``logits``, ``hidden_states``, ...).

    Fed as :func:`reference_logits` feeds it; ``features`` (float32[n, width]) goes to a draft head's
    ``target_hidden_states`` input. The model must return logits for every position.

    :returns: output name -> float32[n, ...] (the batch axis dropped); KV outputs are left out.
    """
    folder = Path(model_dir)
    session = ort.InferenceSession(str(folder / _model_filename(folder)), providers=["CPUExecutionProvider"])
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise ValueError("reference_outputs needs at least one token")
    feeds = {v.name: _reference_feed(v.name, v.shape, ids, ids.size, features) for v in session.get_inputs()}
    names = [o.name for o in session.get_outputs() if not o.name.startswith("present")]
    return {
        name: np.asarray(value[0], np.float32) for name, value in zip(names, session.run(names, feeds), strict=True)
    }


def top2_gap(logits: np.ndarray) -> np.ndarray:
    """The gap between the largest and second largest logit of each row.

    :param logits: float32[..., vocab].
    :returns: float32[...]; a gap near 0 marks a row whose greedy choice is fragile to rounding.
    """
    top2 = np.partition(np.asarray(logits, dtype=np.float32), -2, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


# ---------------------------------------------------------------------------------------------- folders


def _prepare_folder(path: str | Path, vocab: int | None, max_length: int) -> tuple[Path, int]:
    """Create the folder, write the tokenizer files; return the folder and the model's vocabulary size."""
    from tokenizers import Tokenizer

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer_vocab = 384 if vocab is None else min(vocab, 384)
    tokenizer = Tokenizer.from_file(str(build_tokenizer(folder, tokenizer_vocab)))
    write_tokenizer_config(folder, model_max_length=max_length)
    return folder, tokenizer.get_vocab_size() if vocab is None else vocab


def _model_filename(folder: Path) -> str:
    """The ONNX file of a model folder: genai_config.json's decoder filename, else model.onnx."""
    config = folder / "genai_config.json"
    if config.exists():
        return str(json.loads(config.read_text())["model"]["decoder"].get("filename", "model.onnx"))
    return "model.onnx"


def _write_json(path: Path, content: dict[str, object]) -> None:
    path.write_text(json.dumps(content, indent=4) + "\n", encoding="utf-8")


def _check_taps(layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
    taps = tuple(int(layer) for layer in layers)
    if any(not 0 <= layer < num_layers for layer in taps):
        raise ValueError(
            f"tap_layers={taps}: each is a decoder layer whose entering residual stream is tapped, in [0, {num_layers})"
        )
    return taps


def _genai_config(dims: _Dims, eos_token_id: int | Sequence[int], tree_inputs: bool) -> dict[str, object]:
    """genai_config.json as onnxruntime-genai's model builder writes it for a CPU Llama model."""
    decoder = builder_decoder_section(
        hidden=dims.hidden,
        head_size=dims.head_size,
        num_heads=dims.num_heads,
        num_kv_heads=dims.num_kv_heads,
        num_layers=dims.num_layers,
        tree_inputs=tree_inputs,
    )
    search = {
        "diversity_penalty": 0.0,
        "do_sample": False,
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": dims.max_length,
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        "past_present_share_buffer": True,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 1.0,
    }
    model = {
        "bos_token_id": BOS_TOKEN_ID,
        "context_length": dims.max_length,
        "decoder": decoder,
        "eos_token_id": _token_ids(eos_token_id),
        "pad_token_id": PAD_TOKEN_ID,
        "type": "llama",
        "vocab_size": dims.vocab,
    }
    return {"model": model, "search": search}


def _hf_config(dims: _Dims, eos_token_id: int | Sequence[int]) -> dict[str, object]:
    """config.json as Hugging Face writes it for LlamaForCausalLM."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": _token_ids(eos_token_id),
        "pad_token_id": PAD_TOKEN_ID,
        "hidden_act": "silu",
        "hidden_size": dims.hidden,
        "head_dim": dims.head_size,
        "intermediate_size": dims.intermediate,
        "max_position_embeddings": dims.max_length,
        "num_attention_heads": dims.num_heads,
        "num_hidden_layers": dims.num_layers,
        "num_key_value_heads": dims.num_kv_heads,
        "rms_norm_eps": RMS_EPS,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": dims.vocab,
    }


def _token_ids(ids: int | Sequence[int]) -> int | list[int]:
    return int(ids) if isinstance(ids, int | np.integer) else [int(i) for i in ids]


# ---------------------------------------------------------------------------------------------- weights


def _random_weights(dims: _Dims, seed: int) -> dict[str, np.ndarray]:
    """Draw every weight from one seeded generator, in a fixed order (equal seeds, equal weights).

    Projections are scaled by 1/sqrt(fan_in) so activations stay near unit variance; the lm_head by
    LOGIT_STD/sqrt(hidden), so logits have a standard deviation near LOGIT_STD.
    """
    rng = np.random.default_rng(seed)
    h, q_width, kv_width = dims.hidden, dims.num_heads * dims.head_size, dims.num_kv_heads * dims.head_size

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    weights = {"embed_tokens": normal((dims.vocab, h), 1.0)}
    for i in range(dims.num_layers):
        p = f"layers.{i}."
        weights[p + "input_norm"] = 1.0 + normal((h,), 0.1)
        weights[p + "q_proj"] = normal((h, q_width), h**-0.5)
        weights[p + "k_proj"] = normal((h, kv_width), h**-0.5)
        weights[p + "v_proj"] = normal((h, kv_width), h**-0.5)
        weights[p + "o_proj"] = normal((q_width, h), q_width**-0.5)
        weights[p + "post_attention_norm"] = 1.0 + normal((h,), 0.1)
        weights[p + "gate_proj"] = normal((h, dims.intermediate), h**-0.5)
        weights[p + "up_proj"] = normal((h, dims.intermediate), h**-0.5)
        weights[p + "down_proj"] = normal((dims.intermediate, h), dims.intermediate**-0.5)
    weights["final_norm"] = 1.0 + normal((h,), 0.1)
    weights["lm_head"] = normal((h, dims.vocab), LOGIT_STD * h**-0.5)
    return weights


def _rotary_tables(dims: _Dims) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position * inverse frequency: float32[max_length, head_size / 2] each."""
    return rotary_tables(inverse_frequencies(dims.head_size, ROPE_THETA), dims.max_length)


# ---------------------------------------------------------------------------------------------- graph kit


class _Graph(GraphBuilder):
    """decoctl.model's graph builder over a model's weights (float32, laid out as MatMul takes them), each stored as
    ``model.<key>`` when first used."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.weights = weights

    def weight(self, key: str) -> str:
        return self.tensor(f"model.{key}", self.weights[key])

    def matmul(self, x: str, key: str, name: str) -> str:
        return self.op("MatMul", [x, self.weight(key)], name)

    def llama(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        return self.model(inputs, outputs, name="decoctl_tiny_llama", producer="decoctl.testing")


# ---------------------------------------------------------------------------------------------- shared body


def _rms_norm(g: _Graph, x: str, key: str, name: str, *, fused: bool, output: str | None = None) -> str:
    """RMSNorm over the last axis: SimplifiedLayerNormalization (as the model builder) or plain ops."""
    if fused:
        return g.rms_norm(x, g.weight(key), RMS_EPS, name, output=output)
    mean_square = g.op("ReduceMean", [g.op("Mul", [x, x], f"{name}/Square"), g.ints(-1)], f"{name}/Mean")
    variance = g.op("Add", [mean_square, g.scalar_float(RMS_EPS)], f"{name}/AddEps")
    rms = g.op("Sqrt", [variance], f"{name}/Sqrt")
    normed = g.op("Div", [x, rms], f"{name}/Div")
    return g.op("Mul", [normed, g.weight(key)], f"{name}/Scale", output=output)


def _mlp(g: _Graph, x: str, layer: int, name: str) -> str:
    """down(silu(gate(x)) * up(x)): [B, S, hidden] -> [B, S, hidden]."""
    p = f"layers.{layer}."
    gate = g.matmul(x, p + "gate_proj", f"{name}/gate_proj")
    up = g.matmul(x, p + "up_proj", f"{name}/up_proj")
    return g.matmul(g.gated(gate, up, name), p + "down_proj", f"{name}/down_proj")


def _decoder_layers(g: _Graph, dims: _Dims, x: str, attention: _Attention, *, fused: bool) -> list[str]:
    """Run every decoder block on x [B, S, hidden]; return the residual stream after each block."""
    residuals = []
    for i in range(dims.num_layers):
        p, w = f"/model/layers.{i}", f"layers.{i}."
        h = _rms_norm(g, x, w + "input_norm", f"{p}/input_layernorm", fused=fused)
        q = g.matmul(h, w + "q_proj", f"{p}/attn/q_proj")
        k = g.matmul(h, w + "k_proj", f"{p}/attn/k_proj")
        v = g.matmul(h, w + "v_proj", f"{p}/attn/v_proj")
        context = attention(i, q, k, v)
        x = g.op("Add", [x, g.matmul(context, w + "o_proj", f"{p}/attn/o_proj")], f"{p}/attn/Residual")
        h = _rms_norm(g, x, w + "post_attention_norm", f"{p}/post_attention_layernorm", fused=fused)
        x = g.op("Add", [x, _mlp(g, h, i, f"{p}/mlp")], f"{p}/mlp/Residual")
        residuals.append(x)
    return residuals


def _lm_head(g: _Graph, x: str, *, fused: bool, hidden_states: bool, last_only: bool) -> None:
    """Final norm (optionally exposed as ``hidden_states``) and lm_head into the ``logits`` output."""
    output = "hidden_states" if hidden_states else None
    h = _rms_norm(g, x, "final_norm", "/model/norm", fused=fused, output=output)
    if last_only:
        h = g.op("Slice", [h, g.ints(-1), g.ints(_INT64_MAX), g.ints(1)], "/model/LastPosition")
    g.op("MatMul", [h, g.weight("lm_head")], "/lm_head/MatMul", output="logits")


def _embed(g: _Graph) -> str:
    return g.op("Gather", [g.weight("embed_tokens"), "input_ids"], "/model/embed_tokens/Gather")


# ---------------------------------------------------------------------------------------------- genai graph


def _genai_graph(
    weights: dict[str, np.ndarray],
    dims: _Dims,
    hidden_states: bool,
    taps: tuple[int, ...],
    logits_all_positions: bool,
    tree_inputs: bool,
    local_window_size: int | None = None,
    ring_cache: bool = False,
) -> onnx.ModelProto:
    g = _Graph(weights)
    seqlens_k, total_length = g.attention_lengths()
    cos_table, sin_table = _rotary_tables(dims)
    cos, sin = g.tensor("cos_cache", cos_table), g.tensor("sin_cache", sin_table)
    tree = ("position_ids", "attention_bias") if tree_inputs else ()
    attention = _gqa_attention(g, dims, [seqlens_k, total_length, cos, sin, *tree], local_window_size, ring_cache)
    embedded = _embed(g)
    residuals = _decoder_layers(g, dims, embedded, attention, fused=True)
    last_only = not logits_all_positions
    _lm_head(g, residuals[-1], fused=True, hidden_states=hidden_states, last_only=last_only)
    if taps:
        entering = [embedded, *residuals]  # entry i: the residual stream entering decoder layer i
        tapped = [entering[t] for t in taps]
        g.op("Concat", tapped, "/model/aux_hidden_states", output="aux_hidden_states", axis=-1)
    return g.llama(_genai_inputs(g, dims, tree_inputs), _genai_outputs(g, dims, hidden_states, taps, last_only))


def _gqa_attention(
    g: _Graph, dims: _Dims, shared_inputs: list[str], local_window_size: int | None = None, ring_cache: bool = False
) -> _Attention:
    """Attention through com.microsoft GroupQueryAttention, which writes present.{i}.key/value itself (with
    ``local_window_size`` on every layer but the last, and ``sliding_window_cache`` there with ``ring_cache``)."""

    def attend(layer: int, q: str, k: str, v: str) -> str:
        window: dict[str, int] = {}
        if local_window_size is not None and layer < dims.num_layers - 1:
            window["local_window_size"] = local_window_size
            if ring_cache:
                window["sliding_window_cache"] = 1
        sizes = {"num_heads": dims.num_heads, "num_kv_heads": dims.num_kv_heads, "head_size": dims.head_size}
        return g.group_query_attention(layer, q, k, v, shared_inputs, **sizes, **window)

    return attend


def _genai_inputs(g: _Graph, dims: _Dims, tree_inputs: bool, features: int | None = None) -> list[onnx.ValueInfoProto]:
    return g.decoder_inputs(
        num_layers=dims.num_layers,
        num_kv_heads=dims.num_kv_heads,
        head_size=dims.head_size,
        tree_inputs=tree_inputs,
        features=features,
    )


def _genai_outputs(
    g: _Graph, dims: _Dims, hidden_states: bool, taps: tuple[int, ...], last_only: bool
) -> list[onnx.ValueInfoProto]:
    return g.decoder_outputs(
        vocab=dims.vocab,
        num_layers=dims.num_layers,
        num_kv_heads=dims.num_kv_heads,
        head_size=dims.head_size,
        hidden_states=dims.hidden if hidden_states else None,
        aux_hidden_states=dims.hidden * len(taps) if taps else None,
        last_only=last_only,
    )


# ---------------------------------------------------------------------------------------------- optimum graph


def _optimum_graph(weights: dict[str, np.ndarray], dims: _Dims, position_ids: bool) -> onnx.ModelProto:
    g = _Graph(weights)
    past_length, total_length = _plain_lengths(g)
    positions = "position_ids" if position_ids else _default_positions(g, past_length, total_length)
    cos, sin = _plain_rotary(g, dims, positions)
    mask = _attention_bias(g, past_length, total_length)
    attention = _plain_attention(g, dims, cos, sin, mask)
    residuals = _decoder_layers(g, dims, _embed(g), attention, fused=False)
    _lm_head(g, residuals[-1], fused=False, hidden_states=False, last_only=False)
    inputs = [
        g.value("input_ids", _INT64, ["batch_size", "sequence_length"]),
        g.value("attention_mask", _INT64, ["batch_size", "past_sequence_length + sequence_length"]),
    ]
    if position_ids:
        inputs.append(g.value("position_ids", _INT64, ["batch_size", "sequence_length"]))
    kv = (dims.num_layers, dims.num_kv_heads, dims.head_size)
    inputs += g.kv_values(*kv, "past_key_values.%d.%s", "past_sequence_length")
    outputs = [g.value("logits", _FLOAT, ["batch_size", "sequence_length", dims.vocab])]
    outputs += g.kv_values(*kv, "present.%d.%s", "past_sequence_length + sequence_length")
    return g.llama(inputs, outputs)


def _plain_lengths(g: _Graph) -> tuple[str, str]:
    """Past and total lengths as int64 scalars, from attention_mask's and input_ids' widths."""
    name = "/model/lengths"
    total = g.op("Shape", ["attention_mask"], f"{name}/TotalShape", start=1, end=2)
    new = g.op("Shape", ["input_ids"], f"{name}/NewShape", start=1, end=2)
    past = g.op("Sub", [total, new], f"{name}/Past")
    as_scalar = [g.ints(0)]
    return (
        g.op("Squeeze", [past, *as_scalar], f"{name}/PastScalar"),
        g.op("Squeeze", [total, *as_scalar], f"{name}/TotalScalar"),
    )


def _default_positions(g: _Graph, past_length: str, total_length: str) -> str:
    """positions int64[1, S] = past_length .. total_length - 1."""
    name = "/model/positions"
    positions = g.op("Range", [past_length, total_length, g.scalar_int(1)], f"{name}/Range")
    return g.op("Unsqueeze", [positions, g.ints(0)], f"{name}/Unsqueeze")


def _plain_rotary(g: _Graph, dims: _Dims, positions: str) -> tuple[str, str]:
    """cos and sin for each position, float32[B, 1, S, head_size] (each half-table repeated twice)."""
    tables = []
    for kind, table in zip(("cos", "sin"), _rotary_tables(dims), strict=True):
        full = g.tensor(f"model.rotary.{kind}", np.concatenate([table, table], axis=1))
        gathered = g.op("Gather", [full, positions], f"/model/rotary/{kind}/Gather")
        tables.append(g.op("Unsqueeze", [gathered, g.ints(1)], f"/model/rotary/{kind}/Unsqueeze"))
    return tables[0], tables[1]


def _attention_bias(g: _Graph, past_length: str, total_length: str) -> str:
    """Additive mask float32[B, 1, S, T]: 0 where query i may see key j (j <= past + i and j not padding)."""
    name = "/model/attention_bias"
    query_positions = g.op("Range", [past_length, total_length, g.scalar_int(1)], f"{name}/QueryRange")
    query_positions = g.op("Unsqueeze", [query_positions, g.ints(1)], f"{name}/QueryColumn")
    key_positions = g.op("Range", [g.scalar_int(0), total_length, g.scalar_int(1)], f"{name}/KeyRange")
    causal = g.op("LessOrEqual", [key_positions, query_positions], f"{name}/Causal")
    real = g.op("Cast", ["attention_mask"], f"{name}/MaskBool", to=TensorProto.BOOL)
    real = g.op("Unsqueeze", [real, g.ints(1, 2)], f"{name}/MaskUnsqueeze")
    allowed = g.op("And", [causal, real], f"{name}/Allowed")
    zero, blocked = g.scalar_float(0.0), g.scalar_float(_MASK_VALUE)
    return g.op("Where", [allowed, zero, blocked], f"{name}/Where")


def _plain_attention(g: _Graph, dims: _Dims, cos: str, sin: str, mask: str) -> _Attention:
    """Attention from MatMul and Softmax; present.{i}.* = Concat(past, new rows) along the sequence axis."""

    def attend(layer: int, q: str, k: str, v: str) -> str:
        p = f"/model/layers.{layer}/attn"
        q = _rotate(g, _split_heads(g, q, dims.num_heads, dims.head_size, f"{p}/q"), cos, sin, f"{p}/q_rope")
        k = _rotate(g, _split_heads(g, k, dims.num_kv_heads, dims.head_size, f"{p}/k"), cos, sin, f"{p}/k_rope")
        v = _split_heads(g, v, dims.num_kv_heads, dims.head_size, f"{p}/v")
        keys = _append_past(g, layer, "key", k, p)
        values = _append_past(g, layer, "value", v, p)
        keys = _repeat_kv(g, keys, dims, f"{p}/k_repeat")
        values = _repeat_kv(g, values, dims, f"{p}/v_repeat")
        scores = g.op("MatMul", [q, g.op("Transpose", [keys], f"{p}/KeyT", perm=[0, 1, 3, 2])], f"{p}/QK")
        scores = g.op("Mul", [scores, g.scalar_float(dims.head_size**-0.5)], f"{p}/Scale")
        probs = g.op("Softmax", [g.op("Add", [scores, mask], f"{p}/Mask")], f"{p}/Softmax", axis=-1)
        context = g.op("MatMul", [probs, values], f"{p}/PV")
        context = g.op("Transpose", [context], f"{p}/ContextT", perm=[0, 2, 1, 3])
        return g.op("Reshape", [context, g.ints(0, 0, -1)], f"{p}/Merge")

    return attend


def _append_past(g: _Graph, layer: int, kind: str, new: str, name: str) -> str:
    """present.{layer}.{kind} = Concat(past, new rows) along the sequence axis: [B, kv, past + S, D]."""
    past = f"past_key_values.{layer}.{kind}"
    return g.op("Concat", [past, new], f"{name}/{kind}_concat", output=f"present.{layer}.{kind}", axis=2)


def _split_heads(g: _Graph, x: str, heads: int, head_size: int, name: str) -> str:
    """[B, S, heads * head_size] -> [B, heads, S, head_size]."""
    split = g.op("Reshape", [x, g.ints(0, 0, heads, head_size)], f"{name}/Reshape")
    return g.op("Transpose", [split], f"{name}/Transpose", perm=[0, 2, 1, 3])


def _rotate(g: _Graph, x: str, cos: str, sin: str, name: str) -> str:
    """Rotary embedding, half-split convention: x * cos + rotate_half(x) * sin, x [B, H, S, head_size]."""
    first, second = g.ops("Split", [x], f"{name}/Split", outputs=2, axis=-1, num_outputs=2)
    rotated = g.op("Concat", [g.op("Neg", [second], f"{name}/Neg"), first], f"{name}/RotateHalf", axis=-1)
    return g.op(
        "Add",
        [g.op("Mul", [x, cos], f"{name}/MulCos"), g.op("Mul", [rotated, sin], f"{name}/MulSin")],
        f"{name}/Add",
    )


def _repeat_kv(g: _Graph, x: str, dims: _Dims, name: str) -> str:
    """[B, kv, T, D] -> [B, heads, T, D]; query head h reads kv head h // (heads / kv), as GQA does."""
    repeats = dims.num_heads // dims.num_kv_heads
    if repeats == 1:
        return x
    expanded = g.op("Unsqueeze", [x, g.ints(2)], f"{name}/Unsqueeze")
    expanded = g.op("Expand", [expanded, g.ints(1, 1, repeats, 1, 1)], f"{name}/Expand")
    return g.op("Reshape", [expanded, g.ints(0, dims.num_heads, -1, dims.head_size)], f"{name}/Reshape")


# ---------------------------------------------------------------------------------------------- reference


def _single_pass(session: ort.InferenceSession, ids: np.ndarray) -> np.ndarray:
    """Run ids int64[n] as one prompt with an empty past; return logits float32[rows, vocab]."""
    n = ids.size
    feeds: dict[str, np.ndarray] = {}
    for value in session.get_inputs():
        feeds[value.name] = _reference_feed(value.name, value.shape, ids, n)
    (logits,) = session.run(["logits"], feeds)
    return np.asarray(logits[0], dtype=np.float32)


def _reference_feed(
    name: str, shape: Sequence[int | str | None], ids: np.ndarray, n: int, features: np.ndarray | None = None
) -> np.ndarray:
    """The value of one graph input for a from-scratch pass over n tokens."""
    if name == FEATURES:
        if features is None:
            raise ValueError(f"graph input {name!r} needs features: pass float32[{n}, width]")
        return np.asarray(features, dtype=np.float32).reshape(1, n, -1)
    if name == "input_ids":
        return ids[None, :]
    if name == "attention_mask":
        return np.ones((1, n), dtype=np.int64)
    if name == "position_ids":
        return np.arange(n, dtype=np.int64)[None, :]
    if name == "attention_bias":
        return np.zeros((1, 1, n, n), dtype=np.float32)
    if name.startswith("past_key_values."):
        kv_heads, head_size = shape[1], shape[3]
        if not (isinstance(kv_heads, int) and isinstance(head_size, int)):
            raise ValueError(f"graph input {name!r} needs fixed kv-head and head-size dimensions, got {shape}")
        return np.zeros((1, kv_heads, 0, head_size), dtype=np.float32)
    raise ValueError(f"reference_logits does not know how to feed graph input {name!r}")
