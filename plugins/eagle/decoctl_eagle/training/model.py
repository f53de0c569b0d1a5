"""The head in torch: the same function as the ONNX graph decoctl.model.eagle_graph writes, plus the unrolled
forward EAGLE-3 trains with.

Parameter names are eagle_graph's (torch layout, ``layers.0.`` for the decoder layer), so ``state_dict()`` plus the
target's shared weights is what ``write_head`` takes. Sizes are a ``HeadDims``; RMSNorm and rotary embeddings
(half-split, positions counted from 0) are computed as onnxruntime's SimplifiedLayerNormalization and
GroupQueryAttention compute them.

Training-time test (EAGLE-3, Li et al. 2025). Step 0 is teacher forcing: the head at position p is fed the target's
feature at p and the token p + 1, and learns the target's distribution for token p + 2. Step j > 0 feeds the head,
at position p + j, its own output of step j - 1 and the token p + 1 + j, exactly as drafting does: there it sees the
step-0 keys of positions 0..p (the rows synced from the target) and its own keys of steps 1..j at that anchor p.
All anchors of a window run each step together; the step-j query of anchor p attends to the step-0 keys up to p
and to the step-1..j keys of p alone (EAGLE-3's diagonal terms).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from decoctl.model.eagle_graph import EAGLE1, EAGLE3, HeadDims

__all__ = ["Head", "StepOutput", "parameter_count"]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dims: HeadDims) -> None:
        super().__init__()
        width = dims.attention_input
        self.q_proj = nn.Linear(width, dims.num_heads * dims.head_size, bias=False)
        self.k_proj = nn.Linear(width, dims.num_kv_heads * dims.head_size, bias=False)
        self.v_proj = nn.Linear(width, dims.num_kv_heads * dims.head_size, bias=False)
        self.o_proj = nn.Linear(dims.num_heads * dims.head_size, dims.hidden, bias=False)


class MLP(nn.Module):
    def __init__(self, dims: HeadDims) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dims.hidden, dims.intermediate, bias=False)
        self.up_proj = nn.Linear(dims.hidden, dims.intermediate, bias=False)
        self.down_proj = nn.Linear(dims.intermediate, dims.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """The decoder layer: EAGLE-3's (norms of the embedding and the feature, q/k/v over both) or EAGLE-1's (a
    Llama layer without input norm over fc's output)."""

    def __init__(self, dims: HeadDims) -> None:
        super().__init__()
        if dims.architecture == EAGLE3:
            self.hidden_norm = RMSNorm(dims.hidden, dims.rms_eps)
            self.input_layernorm = RMSNorm(dims.hidden, dims.rms_eps)
        self.self_attn = Attention(dims)
        self.post_attention_layernorm = RMSNorm(dims.hidden, dims.rms_eps)
        self.mlp = MLP(dims)


class StepOutput:
    """One unrolled step: draft logits float[B, L, Vd] (Vd: the draft vocabulary) and the head's output features
    float[B, L, H] (what the next step is fed)."""

    __slots__ = ("features", "logits")

    def __init__(self, logits: torch.Tensor, features: torch.Tensor) -> None:
        self.logits = logits
        self.features = features


class Head(nn.Module):
    """An EAGLE head. ``embed``: the target's token embedding, float32[vocab, H] (frozen, not saved);
    ``target_lm_head``: the target's lm_head, float32[vocab, H] (EAGLE-1 drafts through it; frozen, not saved);
    ``draft_ids``: the target ids of an EAGLE-3 head's lm_head rows (ascending)."""

    def __init__(
        self,
        dims: HeadDims,
        embed: np.ndarray,
        *,
        draft_ids: np.ndarray | None = None,
        target_lm_head: np.ndarray | None = None,
    ) -> None:
        super().__init__()
        self.dims = dims
        h = dims.hidden
        self.register_buffer("embed", torch.from_numpy(np.array(embed, np.float32)), persistent=False)
        if dims.architecture == EAGLE3:
            self.fc = nn.Linear(3 * h, h, bias=False)
        else:
            self.fc = nn.Linear(2 * h, h, bias=True)
        self.layers = nn.ModuleList([Layer(dims)])
        if dims.architecture == EAGLE3:
            ids = np.arange(dims.vocab) if draft_ids is None else np.asarray(draft_ids, np.int64)
            if len(ids) != dims.draft_vocab:
                raise ValueError(f"{len(ids)} draft ids for a draft vocabulary of {dims.draft_vocab}")
            self.norm = RMSNorm(h, dims.rms_eps)
            self.lm_head = nn.Linear(h, dims.draft_vocab, bias=False)
            # EAGLE-3's spelling: draft token d is target token d + d2t[d]; t2d marks the target ids drafted
            self.register_buffer("d2t", torch.from_numpy(ids - np.arange(len(ids))), persistent=True)
            t2d = np.zeros(dims.vocab, bool)
            t2d[ids] = True
            self.register_buffer("t2d", torch.from_numpy(t2d), persistent=True)
            if target_lm_head is not None:  # start from the target's rows: the head learns to read them first
                with torch.no_grad():
                    self.lm_head.weight.copy_(torch.from_numpy(np.asarray(target_lm_head, np.float32)[ids]))
        else:
            if target_lm_head is None:
                raise ValueError("an EAGLE-1 head drafts through the target's lm_head: give target_lm_head")
            self.register_buffer(
                "target_lm_head", torch.from_numpy(np.array(target_lm_head, np.float32)), persistent=False
            )
        inverse = dims.rope_theta ** (-np.arange(0, dims.head_size, 2, dtype=np.float64) / dims.head_size)
        self.register_buffer("inverse_frequencies", torch.from_numpy(inverse), persistent=False)

    # -- the vocabulary -------------------------------------------------------------------------------------------
    def draft_ids(self) -> torch.Tensor:
        """int64[Vd]: the target id of each draft logit."""
        if self.dims.architecture == EAGLE1:
            return torch.arange(self.dims.vocab, device=self.embed.device)
        return torch.arange(self.dims.draft_vocab, device=self.d2t.device) + self.d2t

    def draft_index(self) -> torch.Tensor:
        """int64[vocab]: each target id's draft index, -1 for ids outside the draft vocabulary."""
        ids = self.draft_ids()
        index = torch.full((self.dims.vocab,), -1, dtype=torch.long, device=ids.device)
        index[ids] = torch.arange(len(ids), device=ids.device)
        return index

    # -- pieces ---------------------------------------------------------------------------------------------------
    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of x [B, heads, L, head_size] at positions int[L] (half-split, as GroupQueryAttention
        with rotary_interleaved=0; angles in float64, cos and sin rounded to float32 as eagle_graph's tables)."""
        angles = positions.to(torch.float64)[:, None] * self.inverse_frequencies[None, :]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        half = x.shape[-1] // 2
        first, second = x[..., :half], x[..., half:]
        return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)

    def _inputs(
        self, tokens: torch.Tensor, feature: torch.Tensor, from_taps: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the attention's input, the residual) for tokens [B, L] and features: EAGLE-3's taps [B, L, 3H]
        (``from_taps``) or own features [B, L, H]; EAGLE-1's features [B, L, H]."""
        layer = self.layers[0]
        embedded = self.embed[tokens]
        if self.dims.architecture == EAGLE1:
            x = self.fc(torch.cat([embedded, feature], dim=-1))
            return x, x
        g = self.fc(feature) if from_taps else feature
        return torch.cat([layer.input_layernorm(embedded), layer.hidden_norm(g)], dim=-1), g

    def _project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, heads, L, d], and k, v [B, heads, L, d] (KV heads repeated), rotated at ``positions``."""
        attention = self.layers[0].self_attn
        b, length, _ = x.shape
        d = self.dims
        q = attention.q_proj(x).view(b, length, d.num_heads, d.head_size).transpose(1, 2)
        k = attention.k_proj(x).view(b, length, d.num_kv_heads, d.head_size).transpose(1, 2)
        v = attention.v_proj(x).view(b, length, d.num_kv_heads, d.head_size).transpose(1, 2)
        repeat = d.num_heads // d.num_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        return self._rotate(q, positions), self._rotate(k, positions), v

    def _finish(self, residual: torch.Tensor, context: torch.Tensor) -> StepOutput:
        """The layer's output from the attention's context [B, heads, L, d], and the draft logits."""
        layer = self.layers[0]
        b, _, length, _ = context.shape
        h = residual + layer.self_attn.o_proj(context.transpose(1, 2).reshape(b, length, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        if self.dims.architecture == EAGLE1:
            return StepOutput(h @ self.target_lm_head.T, h)
        return StepOutput(self.lm_head(self.norm(h)), h)

    # -- forwards -------------------------------------------------------------------------------------------------
    def unrolled(self, ids: torch.Tensor, features: torch.Tensor, steps: int) -> list[StepOutput]:
        """The training-time test over windows: ids int64[B, L], the target's features at each position (EAGLE-3:
        taps [B, L, 3H]; EAGLE-1: [B, L, H]). Step j's row p is the head at position p + j, fed token p + 1 + j
        (0 past the window's end; those rows are masked out of the loss)."""
        length = ids.shape[1]
        positions = torch.arange(length, device=ids.device)
        scale = self.dims.head_size**-0.5
        outputs: list[StepOutput] = []
        cached: list[tuple[torch.Tensor, torch.Tensor]] = []
        causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        feature = features
        for step in range(steps):
            shifted = torch.zeros_like(ids)
            shifted[:, : max(0, length - 1 - step)] = ids[:, 1 + step :]
            x, residual = self._inputs(shifted, feature, from_taps=step == 0)
            q, k, v = self._project(x, positions + step)
            if step == 0:
                context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q @ cached[0][0].transpose(-1, -2)) * scale
                scores = scores.masked_fill(~causal, float("-inf"))
                diagonal = [(q * key).sum(-1, keepdim=True) * scale for key, _ in cached[1:]]
                diagonal.append((q * k).sum(-1, keepdim=True) * scale)
                weights = torch.softmax(torch.cat([scores, *diagonal], dim=-1), dim=-1)
                context = weights[..., :length] @ cached[0][1]
                for index, (_, value) in enumerate([*cached[1:], (k, v)]):
                    context = context + weights[..., length + index : length + index + 1] * value
            cached.append((k, v))
            out = self._finish(residual, context)
            outputs.append(out)
            feature = out.features
        return outputs

    def reference(self, ids: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the ONNX head computes in one pass from an empty cache: ids int64[n], features float[n, W] as the
        controller feeds them (EAGLE-3: ``[taps | own]``, g = fc(taps) + own). Returns logits float[n, vocab] (-inf
        outside the draft vocabulary) and hidden_states float[n, H]."""
        h = self.dims.hidden
        if self.dims.architecture == EAGLE3:
            feature = self.fc(features[:, : 3 * h]) + features[:, 3 * h :]
            x, residual = self._inputs(ids[None], feature[None], from_taps=False)
        else:
            x, residual = self._inputs(ids[None], features[None], from_taps=True)
        q, k, v = self._project(x, torch.arange(len(ids)))
        out = self._finish(residual, F.scaled_dot_product_attention(q, k, v, is_causal=True))
        logits = torch.full((len(ids), self.dims.vocab), float("-inf"))
        logits[:, self.draft_ids()] = out.logits[0]
        return logits, out.features[0]

    def onnx_weights(self) -> dict[str, np.ndarray]:
        """Every weight ``write_head`` takes, torch layout, float32 (the shared ones from the target)."""
        weights = {
            name: value.detach().cpu().numpy()
            for name, value in self.state_dict().items()
            if name != "t2d" and not name.startswith("inverse")
        }
        weights["embed_tokens.weight"] = self.embed.cpu().numpy()
        if self.dims.architecture == EAGLE1:
            weights["lm_head.weight"] = self.target_lm_head.cpu().numpy()
        else:
            weights["d2t"] = self.d2t.cpu().numpy()
        return {name: np.asarray(value, np.float32) if name != "d2t" else value for name, value in weights.items()}


def parameter_count(module: Any) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
