"""EAGLE-1 draft heads as ONNX folders the host loads as role "eagle", built with onnx.helper (no torch).

The head (Li et al., "EAGLE", ICML 2024): at position i it takes the target's feature f_i (the target's final
hidden state, the lm_head's input) and the embedding of the token after it, x_{i+1}, and computes

    x = fc(concat(embed(x_{i+1}), f_i))                     fc: 2*hidden -> hidden, with a bias
    h = one pre-norm Llama decoder layer over x              (its own KV cache, rotary positions i)
    f_{i+1}' = final_norm(h)                                 output ``hidden_states``: the predicted next feature
    logits = lm_head(f_{i+1}')                               output ``logits``: the token x_{i+2}

``embed_tokens``, ``final_norm`` and ``lm_head`` are the target's own weights (shared, not trained), so the
predicted feature lives in the target's feature space and is fed back as the next position's feature while
drafting. A head may draft from a *draft vocabulary* (EAGLE-3's reduced vocabulary): given ``draft_ids`` (the
target token ids it can propose, int64[n]) its ``lm_head`` holds only those n columns, the n logits are
scattered into a row of -inf over the target's whole vocabulary, and so the output keeps the target's width (a
controller never proposes a token of probability 0). On a CPU the lm_head is most of a head's cost: on the demo
target (hidden 384, vocabulary 4096) one head step took 691 us with every column and 347 us with 1024.

The layout is onnxruntime-genai's (GroupQueryAttention over a shared past/present buffer) plus one input,
``target_hidden_states`` float32[batch_size, sequence_length, hidden], which the host binds through
``Sequence.forward(tokens, features=...)``; genai_config.json says ``"type": "eagle"``. A head can take the tree
inputs too (``tree_inputs``), which EAGLE-2 drafting needs to grow its draft tree level by level.

:func:`build_eagle_head` makes a random head for a target built by :func:`~decoctl.testing.build_genai_model`
(its shared weights read from the target's graph); :func:`write_eagle_head` writes a head from given weights,
which is how ``tools/export_eagle.py`` exports a trained one.

EAGLE-3 heads (Li et al., "EAGLE-3", 2025; :func:`write_eagle3_head`, :func:`build_eagle3_head`) read the target's
*taps* instead, the residual stream entering a low, a middle and a high layer (its ``aux_hidden_states``
output), and feed back their own layer output while drafting. Their ``target_hidden_states`` input is
``[taps | own]``, float32[batch_size, sequence_length, taps_width + hidden]: a row built from the target holds its
taps and zeros, a row built from the head's own output zeros and that output, and the head computes

    g = fc(taps) + own                                           fc: taps_width -> hidden, no bias
    x = concat(input_norm(embed(x_{i+1})), hidden_norm(g))      2 * hidden wide
    h = g + o_proj(attention(q, k, v of x))                     its own KV cache, rotary positions i
    h = h + mlp(post_attention_norm(h))                         output ``hidden_states``: fed back while drafting
    logits = lm_head(final_norm(h))                             over the draft vocabulary, scattered as above

with its own norms and lm_head; only ``embed_tokens`` is the target's. One input of fixed width keeps the host's
features primitive (and the C ABI) as it is; the price is fc over zeros on draft rows.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from decoctl.model.capabilities import FEATURES
from decoctl.testing.models import (
    _FLOAT,
    _decoder_layers,
    _Dims,
    _embed,
    _genai_config,
    _genai_inputs,
    _genai_outputs,
    _gqa_attention,
    _gqa_lengths,
    _Graph,
    _lm_head,
    _mlp,
    _rms_norm,
    _rotary_tables,
    _value,
    _write_json,
)

__all__ = [
    "DRAFT_IDS",
    "EAGLE3_HEAD_WEIGHTS",
    "EAGLE_MODEL_TYPE",
    "HEAD_WEIGHTS",
    "build_eagle3_head",
    "build_eagle_head",
    "eagle3_head_model",
    "eagle_head_model",
    "write_eagle3_head",
    "write_eagle_head",
]

EAGLE_MODEL_TYPE = "eagle"
_LAYER = "layers.0."
#: every weight a head needs, as float32 arrays laid out for MatMul (x @ W, so projections are [in, out])
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
_SHARED = ("embed_tokens", "final_norm", "lm_head")
#: every weight an EAGLE-3 head needs, laid out as HEAD_WEIGHTS' (projections [in, out])
EAGLE3_HEAD_WEIGHTS = (
    "embed_tokens",  # [vocab, hidden], the target's
    "fc",  # [taps_width, hidden]: the target's taps -> hidden
    "hidden_norm",  # [hidden]: the feature's norm
    *(
        _LAYER + name
        for name in (
            "input_norm",  # [hidden]: the embedding's norm
            "q_proj",  # [2 * hidden, heads * head_size]
            "k_proj",  # [2 * hidden, kv_heads * head_size]
            "v_proj",
            "o_proj",  # [heads * head_size, hidden]
            "post_attention_norm",
            "gate_proj",
            "up_proj",
            "down_proj",
        )
    ),
    "final_norm",  # [hidden], the head's own
    "lm_head",  # [hidden, columns], the head's own (columns: the draft vocabulary's size)
)
#: a head whose weights pass this many bytes keeps them in model.onnx.data (protobuf stops at 2 GiB)
_EXTERNAL_DATA_BYTES = 256 << 20
#: optional: int64[n], the target ids of the lm_head's n columns (a draft vocabulary)
DRAFT_IDS = "draft_ids"


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
    decoder = json.loads((target / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
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
    decoctl: Mapping[str, Any] | None = None,
) -> Path:
    """Write an EAGLE-1 head folder from its weights (every name in :data:`HEAD_WEIGHTS`).

    ``target_dir``: the target's genai-layout folder; the head copies its tokenizer files, special token ids
    and context length, so that the loader treats it like any other role of that target. ``decoctl``: a section
    of that name for genai_config.json (what the head is, which target it was trained for).
    :returns: the folder.
    """
    length = _context_length(target_dir, max_length)
    graph = eagle_head_model(
        weights, num_heads=num_heads, num_kv_heads=num_kv_heads, max_length=length, tree_inputs=tree_inputs
    )
    return _write_head(path, graph, weights, target_dir, num_heads, num_kv_heads, length, tree_inputs, decoctl)


def write_eagle3_head(
    path: str | Path,
    weights: Mapping[str, np.ndarray],
    target_dir: str | Path,
    *,
    num_heads: int,
    num_kv_heads: int,
    tree_inputs: bool = False,
    max_length: int | None = None,
    decoctl: Mapping[str, Any] | None = None,
) -> Path:
    """Write an EAGLE-3 head folder from its weights (every name in :data:`EAGLE3_HEAD_WEIGHTS`, and optionally
    :data:`DRAFT_IDS`); as :func:`write_eagle_head` otherwise. :returns: the folder."""
    length = _context_length(target_dir, max_length)
    graph = eagle3_head_model(
        weights, num_heads=num_heads, num_kv_heads=num_kv_heads, max_length=length, tree_inputs=tree_inputs
    )
    return _write_head(path, graph, weights, target_dir, num_heads, num_kv_heads, length, tree_inputs, decoctl)


def _context_length(target_dir: str | Path, max_length: int | None) -> int:
    model = json.loads((Path(target_dir) / "genai_config.json").read_text(encoding="utf-8"))["model"]
    return int(max_length or model["context_length"])


def _write_head(
    path: str | Path,
    graph: onnx.ModelProto,
    weights: Mapping[str, np.ndarray],
    target_dir: str | Path,
    num_heads: int,
    num_kv_heads: int,
    length: int,
    tree_inputs: bool,
    decoctl: Mapping[str, Any] | None,
) -> Path:
    """The head's folder: its graph (weights in model.onnx.data when large), genai_config.json (the target's
    special tokens, ``"type": "eagle"``, the features input, the ``decoctl`` section), the target's tokenizer."""
    target = Path(target_dir)
    model = json.loads((target / "genai_config.json").read_text(encoding="utf-8"))["model"]
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    large = sum(np.asarray(w).nbytes for w in weights.values()) > _EXTERNAL_DATA_BYTES
    for stale in ("model.onnx", "model.onnx.data"):
        (folder / stale).unlink(missing_ok=True)
    if large:
        onnx.save_model(
            graph,
            str(folder / "model.onnx"),
            save_as_external_data=True,
            location="model.onnx.data",
            size_threshold=4096,
        )
    else:
        onnx.save_model(graph, str(folder / "model.onnx"))
    vocab, hidden = weights["embed_tokens"].shape
    dims = _Dims(1, hidden, num_heads, num_kv_heads, vocab, length)
    config = _genai_config(dims, model["eos_token_id"], tree_inputs)
    config["model"] |= {
        "type": EAGLE_MODEL_TYPE,
        "bos_token_id": model.get("bos_token_id"),
        "pad_token_id": model.get("pad_token_id"),
    }
    config["model"]["decoder"]["inputs"] = {"input_ids": "input_ids", FEATURES: FEATURES} | config["model"]["decoder"][
        "inputs"
    ]
    if decoctl is not None:
        config["decoctl"] = dict(decoctl)
    _write_json(folder / "genai_config.json", config)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (target / name).is_file():
            shutil.copyfile(target / name, folder / name)
    return folder


def eagle_head_model(
    weights: Mapping[str, np.ndarray], *, num_heads: int, num_kv_heads: int, max_length: int, tree_inputs: bool = False
) -> onnx.ModelProto:
    """The head's graph (see the module docstring) with the weights as initializers.

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
    seqlens_k, total_length = _gqa_lengths(g)
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
    inputs = _genai_inputs(dims, tree_inputs)
    inputs.insert(1, _value(FEATURES, _FLOAT, ["batch_size", "sequence_length", hidden]))
    return g.model(inputs, _genai_outputs(dims, True, (), False))


def eagle3_head_model(
    weights: Mapping[str, np.ndarray], *, num_heads: int, num_kv_heads: int, max_length: int, tree_inputs: bool = False
) -> onnx.ModelProto:
    """An EAGLE-3 head's graph (see the module docstring) with the weights as initializers.

    Inputs as :func:`eagle_head_model`'s, but ``target_hidden_states`` is float32[batch_size, sequence_length,
    taps_width + hidden] (``[taps | own]``). Outputs: ``logits`` float32[batch_size, sequence_length, vocab],
    ``hidden_states`` float32[batch_size, sequence_length, hidden] (the layer's output, before the final norm:
    the next row's ``own``), ``present.0.key`` / ``.value``.
    """
    missing = [name for name in EAGLE3_HEAD_WEIGHTS if name not in weights]
    if missing:
        raise ValueError(f"an EAGLE-3 head needs the weights {missing}")
    vocab, hidden = weights["embed_tokens"].shape
    taps = weights["fc"].shape[0]
    draft_ids = weights.get(DRAFT_IDS)
    columns = vocab if draft_ids is None else len(draft_ids)
    head_size = hidden // num_heads
    expected = {
        "fc": (taps, hidden),
        "hidden_norm": (hidden,),
        _LAYER + "q_proj": (2 * hidden, num_heads * head_size),
        _LAYER + "k_proj": (2 * hidden, num_kv_heads * head_size),
        _LAYER + "v_proj": (2 * hidden, num_kv_heads * head_size),
        "final_norm": (hidden,),
        "lm_head": (hidden, columns),
    }
    wrong = {name: weights[name].shape for name, shape in expected.items() if weights[name].shape != shape}
    if wrong or taps % hidden:
        raise ValueError(f"EAGLE-3 head weights {wrong} do not fit hidden={hidden}, vocab={vocab}: expected {expected}")
    _check_draft_ids(draft_ids, vocab)
    dims = _Dims(1, hidden, num_heads, num_kv_heads, vocab, max_length)
    dims.check()
    g = _Graph({name: np.asarray(value, np.float32) for name, value in weights.items() if name != DRAFT_IDS})
    seqlens_k, total_length = _gqa_lengths(g)
    cos_table, sin_table = _rotary_tables(dims)
    cos, sin = g.tensor("cos_cache", cos_table), g.tensor("sin_cache", sin_table)
    tree = ("position_ids", "attention_bias") if tree_inputs else ()
    attention = _gqa_attention(g, dims, [seqlens_k, total_length, cos, sin, *tree])
    axis = g.ints(2)
    tapped = g.op("Slice", [FEATURES, g.ints(0), g.ints(taps), axis], "/eagle/taps")
    own = g.op("Slice", [FEATURES, g.ints(taps), g.ints(taps + hidden), axis], "/eagle/own")
    feature = g.op("Add", [g.matmul(tapped, "fc", "/eagle/fc/MatMul"), own], "/eagle/feature")
    embedded = _rms_norm(g, _embed(g), _LAYER + "input_norm", "/eagle/input_layernorm", fused=True)
    normed = _rms_norm(g, feature, "hidden_norm", "/eagle/hidden_norm", fused=True)
    x = g.op("Concat", [embedded, normed], "/eagle/Concat", axis=-1)
    p = "/model/layers.0"
    q = g.matmul(x, _LAYER + "q_proj", f"{p}/attn/q_proj")
    k = g.matmul(x, _LAYER + "k_proj", f"{p}/attn/k_proj")
    v = g.matmul(x, _LAYER + "v_proj", f"{p}/attn/v_proj")
    context = attention(0, q, k, v)
    h = g.op("Add", [feature, g.matmul(context, _LAYER + "o_proj", f"{p}/attn/o_proj")], f"{p}/attn/Residual")
    post = _rms_norm(g, h, _LAYER + "post_attention_norm", f"{p}/post_attention_layernorm", fused=True)
    out = g.op("Add", [h, _mlp(g, post, 0, f"{p}/mlp")], f"{p}/mlp/Residual", output="hidden_states")
    if draft_ids is None:
        final = _rms_norm(g, out, "final_norm", "/model/norm", fused=True)
        g.op("MatMul", [final, g.weight("lm_head")], "/lm_head/MatMul", output="logits")
    else:
        _draft_lm_head(g, out, np.asarray(draft_ids, np.int64), vocab, hidden_output=None)
    inputs = _genai_inputs(dims, tree_inputs)
    inputs.insert(1, _value(FEATURES, _FLOAT, ["batch_size", "sequence_length", taps + hidden]))
    return g.model(inputs, _genai_outputs(dims, True, (), False))


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
    """Write a random-weight EAGLE-3 head for the target folder ``target_dir``, a genai-layout model with an
    ``aux_hidden_states`` output (its width sets fc's); the embedding is the target's, every other weight is
    drawn from ``seed``. ``draft_vocab=n`` keeps n target ids (drawn from ``seed``) as the draft vocabulary.

    :returns: the head's folder.
    """
    target = Path(target_dir)
    decoder = json.loads((target / "genai_config.json").read_text(encoding="utf-8"))["model"]["decoder"]
    model = onnx.load_model(str(target / decoder.get("filename", "model.onnx")))
    aux = next((o for o in model.graph.output if o.name == "aux_hidden_states"), None)
    if aux is None:
        raise ValueError(f"{target} has no aux_hidden_states output for an EAGLE-3 head to read")
    taps = int(aux.type.tensor_type.shape.dim[-1].dim_value)
    embed = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "model.embed_tokens")
    vocab, hidden = embed.shape
    heads = int(num_heads or decoder["num_attention_heads"])
    kv_heads = int(num_kv_heads or decoder.get("num_key_value_heads", heads))
    rng = np.random.default_rng(seed)
    weights = {"embed_tokens": embed} | {
        name: value for name, value in _random_head_weights(hidden, heads, kv_heads, seed).items() if name != "fc"
    }
    width = hidden // heads
    for name, columns in (("q_proj", heads * width), ("k_proj", kv_heads * width), ("v_proj", kv_heads * width)):
        weights[_LAYER + name] = (rng.standard_normal((2 * hidden, columns)) * (2 * hidden) ** -0.5).astype(np.float32)
    weights["fc"] = (rng.standard_normal((taps, hidden)) * taps**-0.5).astype(np.float32)
    weights["hidden_norm"] = (1.0 + rng.standard_normal((hidden,)) * 0.1).astype(np.float32)
    weights["final_norm"] = (1.0 + rng.standard_normal((hidden,)) * 0.1).astype(np.float32)
    weights["lm_head"] = (rng.standard_normal((hidden, vocab)) * 2.5 * hidden**-0.5).astype(np.float32)
    if draft_vocab is not None:
        ids = np.sort(rng.choice(vocab, size=draft_vocab, replace=False)).astype(np.int64)
        weights |= {"lm_head": weights["lm_head"][:, ids], DRAFT_IDS: ids}
    weights.pop("fc_bias")
    return write_eagle3_head(path, weights, target, num_heads=heads, num_kv_heads=kv_heads, tree_inputs=tree_inputs)


def _draft_lm_head(
    g: _Graph, x: str, draft_ids: np.ndarray, vocab: int, hidden_output: str | None = "hidden_states"
) -> None:
    """Final norm (the ``hidden_output`` output, if named), the lm_head over the draft vocabulary, and its n logits
    scattered into -inf rows of the target's width (the ``logits`` output)."""
    h = _rms_norm(g, x, "final_norm", "/model/norm", fused=True, output=hidden_output)
    small = g.op("MatMul", [h, g.weight("lm_head")], "/lm_head/MatMul")
    shape = g.op("Shape", [small], "/lm_head/Shape")
    leading = g.op("Slice", [shape, g.ints(0), g.ints(2), g.ints(0)], "/lm_head/Leading")
    full_shape = g.op("Concat", [leading, g.ints(vocab)], "/lm_head/FullShape", axis=0)
    fill = g.tensor("/lm_head/neg_inf", np.array([-np.inf], np.float32))
    rows = g.op("Expand", [fill, full_shape], "/lm_head/Fill")
    ids = g.tensor("model.draft_ids", draft_ids.reshape(1, 1, -1))
    index = g.op("Expand", [ids, shape], "/lm_head/Index")
    g.op("ScatterElements", [rows, index, small], "/lm_head/Scatter", output="logits", axis=2)


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
