"""EAGLE draft heads for the testing targets, as ONNX folders the host loads as role "eagle" (no torch).

EAGLE-1 heads (Li et al., "EAGLE", ICML 2024; :func:`build_eagle_head`, :func:`write_eagle_head`): at position i
the head takes the target's feature f_i (the target's final hidden state, the lm_head's input) and the embedding of
the token after it, x_{i+1}, and computes

    x = fc(concat(embed(x_{i+1}), f_i))                     fc: 2*hidden -> hidden, with a bias
    h = one pre-norm Llama decoder layer over x              (its own KV cache, rotary positions i)
    f_{i+1}' = final_norm(h)                                 output ``hidden_states``: the predicted next feature
    logits = lm_head(f_{i+1}')                               output ``logits``: the token x_{i+2}

``embed_tokens``, ``final_norm`` and ``lm_head`` are the target's own weights (shared, not trained), so the
predicted feature lives in the target's feature space and is fed back as the next position's feature while
drafting. The decoder layer is the testing targets' own (decoctl.testing._models), so ``copy_layer`` can make a head
that imitates its target; this is also the architecture of the demo bundle's head (tools/train_eagle.py), unlike a
published EAGLE-1 head's (no input norm, no final norm; decoctl.model.eagle_graph). A head may draft from a *draft
vocabulary* (EAGLE-3's reduced vocabulary): given ``draft_ids`` (the target token ids it can propose, int64[n]) its
``lm_head`` holds only those n columns, the n logits are scattered into a row of -inf over the target's whole
vocabulary, and so the output keeps the target's width (a controller never proposes a token of probability 0). On
a CPU the lm_head is most of a head's cost: on the demo target (hidden 384, vocabulary 4096) one head step took
691 us with every column and 347 us with 1024.

The layout is onnxruntime-genai's (GroupQueryAttention over a shared past/present buffer) plus one input,
``target_hidden_states`` float32[batch_size, sequence_length, hidden], which the host binds through
``Sequence.forward(tokens, features=...)``; the folder (genai_config.json with ``"type": "eagle"``, the target's
tokenizer) is written by :func:`decoctl.model.eagle_graph.save_head`. A head can take the tree inputs too
(``tree_inputs``), which EAGLE-2 drafting needs to grow its draft tree level by level.

EAGLE-3 heads (Li et al., "EAGLE-3", 2025; :func:`build_eagle3_head`) are random weights written by
:func:`decoctl.model.eagle_graph.write_head`, the writer of imported and trained heads, whose docstring gives their
forward. They read the target's three *taps* (its ``aux_hidden_states``: the residual stream entering three decoder
layers, a target built with ``tap_layers=(low, middle, high)``) and feed back their own layer output while drafting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from decoctl.model._capabilities import FEATURES
from decoctl.model.eagle_graph import EAGLE1, EAGLE3, HeadDims, save_head, write_head
from decoctl.testing._models import (
    LOGIT_STD,
    RMS_EPS,
    ROPE_THETA,
    _decoder_layers,
    _Dims,
    _embed,
    _genai_inputs,
    _genai_outputs,
    _gqa_attention,
    _Graph,
    _lm_head,
    _rms_norm,
    _rotary_tables,
)

__all__ = [
    "DRAFT_IDS",
    "HEAD_WEIGHTS",
    "build_eagle3_head",
    "build_eagle_head",
    "eagle_head_model",
    "write_eagle_head",
]

_LAYER = "layers.0."
HEAD_WEIGHTS = (
    "embed_tokens",  # [vocab, hidden], the target's
    "fc",  # [2 * hidden, hidden]: concat(embedding, feature) -> hidden
    "fc_bias",  # [hidden]
    *(
        _LAYER + name
        for name in (
            "input_norm",
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "post_attention_norm",
            "gate_proj",
            "up_proj",
            "down_proj",
        )
    ),
    "final_norm",  # [hidden], the target's
    "lm_head",  # [hidden, vocab], the target's
)
"""Every weight an EAGLE-1 head needs, as float32 arrays laid out for MatMul (x @ W, so projections are [in, out])."""
_SHARED = ("embed_tokens", "final_norm", "lm_head")
DRAFT_IDS = "draft_ids"
"""Optional: int64[n], the target ids of the lm_head's n columns (a draft vocabulary)."""


def build_eagle_head(
    path: str | Path,
    target_dir: str | Path,
    *,
    seed: int = 0,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    tree_inputs: bool = False,
    copy_layer: int | None = None,
    feature_mix: float = 0.0,
    draft_vocab: int | None = None,
) -> Path:
    """Write a random-weight EAGLE-1 head for the target folder ``target_dir`` (a genai-layout model written by
    :func:`~decoctl.testing.build_genai_model`, whose initializers it reads the shared weights from).

    The head's own weights (fc and the decoder layer) are drawn from ``seed``; heads default to the target's.
    ``copy_layer=j`` instead makes a head that imitates a target: fc passes the token embedding through, and the
    layer is the target's layer j, so for a one-layer target the head computes the target's own next-token
    distribution over its window (all tokens but the first): it agrees with the target most of the time, without
    being exact, which makes acceptance visible in tests. ``feature_mix`` (copy_layer only) adds that much of a
    random projection of the features to fc's output (0: the features are ignored), so that a wrong feature
    shows in the head's output while it still mostly agrees with the target. ``draft_vocab=n`` keeps n target ids
    (drawn from ``seed``) as the head's draft vocabulary.

    :returns: the head's folder (model.onnx, genai_config.json, the target's tokenizer files).
    """
    target = Path(target_dir)
    decoder = _decoder_config(target)
    stored = {
        tensor.name.removeprefix("model."): numpy_helper.to_array(tensor)
        for tensor in onnx.load_model(str(target / decoder.get("filename", "model.onnx"))).graph.initializer
    }
    weights = {name: stored[name] for name in _SHARED}
    hidden = weights["embed_tokens"].shape[1]
    if copy_layer is not None:
        prefix = f"layers.{copy_layer}."
        if prefix + "q_proj" not in stored:
            raise ValueError(f"copy_layer={copy_layer}: the target has no decoder layer {copy_layer}")
        weights |= {_LAYER + key.removeprefix(prefix): value for key, value in stored.items() if key.startswith(prefix)}
        mix = np.random.default_rng(seed).standard_normal((hidden, hidden)) * feature_mix / hidden**0.5
        weights["fc"] = np.concatenate([np.eye(hidden), mix]).astype(np.float32)
        weights["fc_bias"] = np.zeros(hidden, np.float32)
        num_heads, num_kv_heads = decoder["num_attention_heads"], decoder["num_key_value_heads"]
    heads = int(num_heads or decoder["num_attention_heads"])
    kv_heads = int(num_kv_heads or decoder.get("num_key_value_heads", heads))
    if copy_layer is None:
        weights |= _random_head_weights(hidden, heads, kv_heads, seed)
    if draft_vocab is not None:
        vocab = weights["embed_tokens"].shape[0]
        ids = np.sort(np.random.default_rng(seed).choice(vocab, size=draft_vocab, replace=False)).astype(np.int64)
        weights |= {"lm_head": weights["lm_head"][:, ids], DRAFT_IDS: ids}
    return write_eagle_head(path, weights, target, num_heads=heads, num_kv_heads=kv_heads, tree_inputs=tree_inputs)


def write_eagle_head(
    path: str | Path,
    weights: Mapping[str, np.ndarray],
    target_dir: str | Path,
    *,
    num_heads: int,
    num_kv_heads: int,
    tree_inputs: bool = False,
    max_length: int | None = None,
) -> Path:
    """Write an EAGLE-1 head folder from its weights (every name in :data:`HEAD_WEIGHTS`, and optionally
    :data:`DRAFT_IDS`), through :func:`decoctl.model.eagle_graph.save_head`.

    ``target_dir``: the target's genai-layout folder; the head copies its tokenizer files, special token ids
    and context length (``max_length`` overrides it), so that the loader treats it like any other role of that
    target.
    :returns: the folder.
    """
    length = int(max_length or _model_config(Path(target_dir))["context_length"])
    graph = eagle_head_model(
        weights, num_heads=num_heads, num_kv_heads=num_kv_heads, max_length=length, tree_inputs=tree_inputs
    )
    vocab, hidden = weights["embed_tokens"].shape
    dims = HeadDims(
        architecture=EAGLE1,
        hidden=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=hidden // num_heads,
        intermediate=weights[_LAYER + "gate_proj"].shape[1],
        vocab=vocab,
        draft_vocab=weights["lm_head"].shape[1],
        rms_eps=RMS_EPS,
        rope_theta=ROPE_THETA,
    )
    return save_head(path, graph, dims, target_dir=target_dir, max_length=length, tree_inputs=tree_inputs)


def _decoder_config(target: Path) -> dict[str, Any]:
    return dict(_model_config(target)["decoder"])


def _model_config(target: Path) -> dict[str, Any]:
    return dict(json.loads((target / "genai_config.json").read_text(encoding="utf-8"))["model"])


def eagle_head_model(
    weights: Mapping[str, np.ndarray], *, num_heads: int, num_kv_heads: int, max_length: int, tree_inputs: bool = False
) -> onnx.ModelProto:
    """The EAGLE-1 head's graph (see the module docstring) with the weights as initializers.

    Inputs: ``input_ids`` int64[batch_size, sequence_length] (the shifted tokens), ``target_hidden_states``
    float32[batch_size, sequence_length, hidden], ``attention_mask`` int64[batch_size, total_sequence_length],
    ``past_key_values.0.key`` / ``.value`` float32[batch_size, num_kv_heads, past_sequence_length, head_size]
    (with ``tree_inputs`` also ``position_ids`` and ``attention_bias``, as the target's). Outputs: ``logits``
    float32[batch_size, sequence_length, vocab], ``hidden_states`` float32[batch_size, sequence_length, hidden]
    (the predicted next features), ``present.0.key`` / ``.value``.
    """
    missing = [name for name in HEAD_WEIGHTS if name not in weights]
    if missing:
        raise ValueError(f"an EAGLE head needs the weights {missing}")
    vocab, hidden = weights["embed_tokens"].shape
    draft_ids = weights.get(DRAFT_IDS)
    columns = vocab if draft_ids is None else len(draft_ids)
    expected = {"fc": (2 * hidden, hidden), "fc_bias": (hidden,), "final_norm": (hidden,), "lm_head": (hidden, columns)}
    wrong = {name: weights[name].shape for name, shape in expected.items() if weights[name].shape != shape}
    if wrong:
        raise ValueError(f"head weights {wrong} do not fit hidden={hidden}, vocab={vocab}: expected {expected}")
    _check_draft_ids(draft_ids, vocab)
    dims = _Dims(1, hidden, num_heads, num_kv_heads, vocab, max_length)
    dims.check()
    g = _Graph({name: np.asarray(value, np.float32) for name, value in weights.items() if name != DRAFT_IDS})
    seqlens_k, total_length = g.attention_lengths()
    cos_table, sin_table = _rotary_tables(dims)
    cos, sin = g.tensor("cos_cache", cos_table), g.tensor("sin_cache", sin_table)
    tree = ("position_ids", "attention_bias") if tree_inputs else ()
    attention = _gqa_attention(g, dims, [seqlens_k, total_length, cos, sin, *tree])
    joined = g.op("Concat", [_embed(g), FEATURES], "/eagle/Concat", axis=-1)
    x = g.op("Add", [g.matmul(joined, "fc", "/eagle/fc/MatMul"), g.weight("fc_bias")], "/eagle/fc/Add")
    residuals = _decoder_layers(g, dims, x, attention, fused=True)
    if draft_ids is None:
        _lm_head(g, residuals[-1], fused=True, hidden_states=True, last_only=False)
    else:
        _draft_lm_head(g, residuals[-1], np.asarray(draft_ids, np.int64), vocab)
    inputs = _genai_inputs(g, dims, tree_inputs, features=hidden)
    return g.llama(inputs, _genai_outputs(g, dims, True, (), False))


def _check_draft_ids(draft_ids: np.ndarray | None, vocab: int) -> None:
    if draft_ids is None:
        return
    ids = np.asarray(draft_ids)
    if ids.ndim != 1 or len(np.unique(ids)) != ids.size or ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"draft_ids must be distinct target ids below {vocab}, one per lm_head column")


def build_eagle3_head(
    path: str | Path,
    target_dir: str | Path,
    *,
    seed: int = 0,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    tree_inputs: bool = False,
    draft_vocab: int | None = None,
) -> Path:
    """Write a random-weight EAGLE-3 head for the target folder ``target_dir``, a genai-layout model with three
    taps (built with ``tap_layers=(low, middle, high)``, or copied by ``decoctl models enable-taps``). The
    embedding is the target's, every other weight is drawn from ``seed``, scaled as the testing targets' weights;
    heads default to the target's, the MLP is ``2 * hidden`` wide. ``draft_vocab=n`` keeps n target ids (drawn
    from ``seed``) as the draft vocabulary. Written by :func:`decoctl.model.eagle_graph.write_head`.

    :returns: the head's folder.
    :raises ValueError: the target has no ``aux_hidden_states`` output of three taps.
    """
    target = Path(target_dir)
    decoder = _decoder_config(target)
    model = onnx.load_model(str(target / decoder.get("filename", "model.onnx")))
    aux = next((o for o in model.graph.output if o.name == "aux_hidden_states"), None)
    embed = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "model.embed_tokens")
    vocab, hidden = embed.shape
    width = None if aux is None else int(aux.type.tensor_type.shape.dim[-1].dim_value)
    if width != 3 * hidden:
        has = "no aux_hidden_states output" if width is None else f"aux_hidden_states of width {width}"
        raise ValueError(
            f"{target} has {has}; an EAGLE-3 head reads three taps ({3 * hidden} wide): build the target with "
            "tap_layers=(low, middle, high)"
        )
    heads = int(num_heads or decoder["num_attention_heads"])
    kv_heads = int(num_kv_heads or decoder.get("num_key_value_heads", heads))
    _Dims(1, hidden, heads, kv_heads, vocab, 2).check()
    rng = np.random.default_rng(seed)
    ids = np.arange(vocab) if draft_vocab is None else np.sort(rng.choice(vocab, size=draft_vocab, replace=False))
    dims = HeadDims(
        architecture=EAGLE3,
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_size=hidden // heads,
        intermediate=2 * hidden,
        vocab=vocab,
        draft_vocab=len(ids),
        rms_eps=RMS_EPS,
        rope_theta=ROPE_THETA,
    )
    weights: dict[str, np.ndarray] = {"embed_tokens.weight": embed, "d2t": (ids - np.arange(len(ids))).astype(np.int64)}
    for name, shape in dims.shapes().items():
        if name in weights:
            continue
        if len(shape) == 1:  # a norm's scale
            weights[name] = (1.0 + rng.standard_normal(shape) * 0.1).astype(np.float32)
        else:  # [out, in], unit-variance outputs; the lm_head's logits near LOGIT_STD
            scale = LOGIT_STD if name == "lm_head.weight" else 1.0
            weights[name] = (rng.standard_normal(shape) * scale * shape[1] ** -0.5).astype(np.float32)
    return write_head(
        path,
        dims,
        weights,
        target_dir=target,
        target_name=target.name,
        source=f"decoctl.testing.build_eagle3_head(seed={seed})",
        tree_inputs=tree_inputs,
    )


def _draft_lm_head(g: _Graph, x: str, draft_ids: np.ndarray, vocab: int) -> None:
    """Final norm (the ``hidden_states`` output), the lm_head over the draft vocabulary, and its n logits scattered
    into -inf rows of the target's width (the ``logits`` output)."""
    h = _rms_norm(g, x, "final_norm", "/model/norm", fused=True, output="hidden_states")
    g.scattered_logits(g.matmul(h, "lm_head", "/lm_head/MatMul"), draft_ids, vocab, "model.draft_ids")


def _random_head_weights(hidden: int, heads: int, kv_heads: int, seed: int) -> dict[str, np.ndarray]:
    """fc and one decoder layer, scaled as the testing targets' weights (unit-variance activations)."""
    rng = np.random.default_rng(seed)
    head_size = hidden // heads
    q_width, kv_width, inner = heads * head_size, kv_heads * head_size, 2 * hidden

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    return {
        "fc": normal((2 * hidden, hidden), (2 * hidden) ** -0.5),
        "fc_bias": normal((hidden,), 0.02),
        _LAYER + "input_norm": 1.0 + normal((hidden,), 0.1),
        _LAYER + "q_proj": normal((hidden, q_width), hidden**-0.5),
        _LAYER + "k_proj": normal((hidden, kv_width), hidden**-0.5),
        _LAYER + "v_proj": normal((hidden, kv_width), hidden**-0.5),
        _LAYER + "o_proj": normal((q_width, hidden), q_width**-0.5),
        _LAYER + "post_attention_norm": 1.0 + normal((hidden,), 0.1),
        _LAYER + "gate_proj": normal((hidden, inner), hidden**-0.5),
        _LAYER + "up_proj": normal((hidden, inner), hidden**-0.5),
        _LAYER + "down_proj": normal((inner, hidden), inner**-0.5),
    }
