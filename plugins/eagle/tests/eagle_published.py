"""Random published-style EAGLE heads and a from-scratch torch reference of their forwards (tests only; needs torch).

The reference follows the authors' code (SafeAILab EAGLE cnets.py for EAGLE-1/2 and EAGLE-3) written out with
plain tensor ops, one sequence from position 0, no cache: RMSNorm, rotary embeddings in the half-split
convention (with Llama 3.1's rope scaling), grouped-query causal attention, a SiLU-gated MLP.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

HIDDEN, HEADS, KV_HEADS, INTERMEDIATE = 64, 4, 2, 96
EPS = 1e-5
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def config(vocab: int, *, draft_vocab: int | None = None, rope_scaling: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json as the authors write it (a LlamaConfig of one layer)."""
    table: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3" if draft_vocab else "LlamaForCausalLM"],
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "rms_norm_eps": EPS,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
    }
    if draft_vocab:
        table["draft_vocab_size"] = draft_vocab
    if rope_scaling:
        table["rope_scaling"] = rope_scaling
    return table


def random_weights(
    architecture: str, vocab: int, *, draft_vocab: int = 0, embeddings: bool = True, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A state dict in the authors' names (``layers.0.`` for the layer; EAGLE-3's own spelling is ``midlayer.``)."""
    generator = torch.Generator().manual_seed(seed)
    h, q, kv = HIDDEN, HEADS * (HIDDEN // HEADS), KV_HEADS * (HIDDEN // HEADS)

    def normal(*shape: int, std: float | None = None) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * (shape[-1] ** -0.5 if std is None else std)

    width = h if architecture == "eagle-1" else 2 * h
    layer = {
        "self_attn.q_proj.weight": normal(q, width),
        "self_attn.k_proj.weight": normal(kv, width),
        "self_attn.v_proj.weight": normal(kv, width),
        "self_attn.o_proj.weight": normal(h, q),
        "post_attention_layernorm.weight": 1 + normal(h, std=0.1),
        "mlp.gate_proj.weight": normal(INTERMEDIATE, h),
        "mlp.up_proj.weight": normal(INTERMEDIATE, h),
        "mlp.down_proj.weight": normal(h, INTERMEDIATE),
    }
    weights: dict[str, torch.Tensor] = {}
    if embeddings:
        weights["embed_tokens.weight"] = normal(vocab, h, std=1.0)
    if architecture == "eagle-1":
        weights |= {"fc.weight": normal(h, 2 * h), "fc.bias": normal(h, std=0.02)}
    else:
        layer |= {"hidden_norm.weight": 1 + normal(h, std=0.1), "input_layernorm.weight": 1 + normal(h, std=0.1)}
        ids = torch.sort(torch.randperm(vocab, generator=generator)[:draft_vocab]).values
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids] = True
        weights |= {
            "fc.weight": normal(h, 3 * h),
            "norm.weight": 1 + normal(h, std=0.1),
            "lm_head.weight": normal(draft_vocab, h, std=2.5 * h**-0.5),
            "d2t": ids - torch.arange(draft_vocab),
            "t2d": t2d,
        }
    return weights | {"layers.0." + name: value for name, value in layer.items()}


def save_checkpoint(
    folder: Path, weights: dict[str, torch.Tensor], table: dict[str, Any], *, spelling: str, file_format: str
) -> Path:
    """Write config.json and the weights as model.safetensors or pytorch_model.bin, the layer spelled
    ``spelling`` ("layers.0" or "midlayer")."""
    folder.mkdir(parents=True, exist_ok=True)
    named = {_spelled(name, spelling): tensor.contiguous() for name, tensor in weights.items()}
    if file_format == "safetensors":
        from safetensors.torch import save_file

        save_file(named, str(folder / "model.safetensors"))
    else:
        torch.save(named, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(table), encoding="utf-8")
    return folder


def _spelled(name: str, spelling: str) -> str:
    return spelling + name.removeprefix("layers.0") if name.startswith("layers.0.") else name


# ------------------------------------------------------------------------------------------------ the reference


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def _inverse_frequencies(head_size: int, scaling: dict[str, Any] | None) -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_size, 2, dtype=torch.float64) / head_size))
    if not scaling:
        return inv
    # transformers' _compute_llama3_parameters
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    low_wavelength, high_wavelength = old / low, old / high
    out = []
    for freq in inv.tolist():
        wavelength = 2 * math.pi / freq
        if wavelength < high_wavelength:
            out.append(freq)
        elif wavelength > low_wavelength:
            out.append(freq / factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(out, dtype=torch.float64)


def _rotate(x: torch.Tensor, scaling: dict[str, Any] | None) -> torch.Tensor:
    """x [heads, S, head_size] rotated by position (rotate_half convention)."""
    head_size = x.shape[-1]
    angles = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * _inverse_frequencies(head_size, scaling)[None]
    cos = torch.cat([angles.cos(), angles.cos()], -1).float()
    sin = torch.cat([angles.sin(), angles.sin()], -1).float()
    half = head_size // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def _attention(x: torch.Tensor, w: dict[str, torch.Tensor], scaling: dict[str, Any] | None) -> torch.Tensor:
    n, head_size = x.shape[0], HIDDEN // HEADS

    def heads(name: str, count: int) -> torch.Tensor:
        return (x @ w[f"layers.0.self_attn.{name}.weight"].T).view(n, count, head_size).transpose(0, 1)

    q, k, v = (
        _rotate(heads("q_proj", HEADS), scaling),
        _rotate(heads("k_proj", KV_HEADS), scaling),
        heads("v_proj", KV_HEADS),
    )
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 0), v.repeat_interleave(HEADS // KV_HEADS, 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(head_size)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    context = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, HEADS * head_size)
    return context @ w["layers.0.self_attn.o_proj.weight"].T


def _mlp(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    gate, up = x @ w["layers.0.mlp.gate_proj.weight"].T, x @ w["layers.0.mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w["layers.0.mlp.down_proj.weight"].T


def eagle1_forward(
    w: dict[str, torch.Tensor], lm_head: torch.Tensor, tokens: list[int], features: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """EAGLE-1 (cnets.py): fc over [embedding; feature], a layer without input_layernorm, the target's lm_head on
    the layer's output. Returns (logits float32[n, vocab], hidden float32[n, H])."""
    with torch.no_grad():
        x = torch.cat([w["embed_tokens.weight"][tokens], torch.from_numpy(features)], -1)
        x = x @ w["fc.weight"].T + w["fc.bias"]
        h = x + _attention(x, w, None)
        h = h + _mlp(_rms(h, w["layers.0.post_attention_layernorm.weight"]), w)
        return (h @ lm_head.T).numpy(), h.numpy()


def eagle3_forward(
    w: dict[str, torch.Tensor],
    embeddings: torch.Tensor,
    tokens: list[int],
    taps: np.ndarray,
    own: np.ndarray,
    from_taps: np.ndarray,
    scaling: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """EAGLE-3 (cnets.py): rows with ``from_taps`` take fc(taps), the others the head's own feature; the layer reads
    [input_layernorm(embedding); hidden_norm(feature)]. Returns (draft logits float32[n, Vd], hidden float32[n, H])."""
    with torch.no_grad():
        fed = torch.from_numpy(taps) @ w["fc.weight"].T
        x = torch.where(torch.from_numpy(from_taps)[:, None], fed, torch.from_numpy(own))
        joined = torch.cat(
            [_rms(embeddings[tokens], w["layers.0.input_layernorm.weight"]), _rms(x, w["layers.0.hidden_norm.weight"])],
            -1,
        )
        h = x + _attention(joined, w, scaling)
        h = h + _mlp(_rms(h, w["layers.0.post_attention_layernorm.weight"]), w)
        return (_rms(h, w["norm.weight"]) @ w["lm_head.weight"].T).numpy(), h.numpy()
