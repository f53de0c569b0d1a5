"""Acceptance rules of speculative decoding. Each keeps the target's distribution exactly.

Given K drafted tokens d1..dK and K+1 processed target rows (row i conditioned on d1..di), each rule returns
how many drafts it accepts and the token that follows them (a correction on rejection, or a bonus token
drawn from the last row when every draft was accepted).

- ``accept_greedy``: accept while the target's argmax equals the draft; the next token is the argmax.
- ``accept_deterministic``: the draft is a point mass (prompt lookup, a greedy draft model): accept d with
  probability p(d); on rejection draw from p with d removed, renormalised. This is the speculative-sampling
  rule with q = one-hot(d): min(1, p/q) = p(d) and norm(max(0, p - q)) = p without d.
- ``accept_sampled``: the draft was sampled from q: accept with min(1, p(d)/q(d)); on rejection draw from
  norm(max(0, p - q)) (Leviathan et al. 2023, Chen et al. 2023).
"""

from __future__ import annotations

import numpy as np

__all__ = ["accept_deterministic", "accept_greedy", "accept_sampled", "draw", "probabilities"]


def probabilities(rows: np.ndarray, temperature: float) -> np.ndarray:
    """float64[n, vocab] softmax(rows / temperature); rows of -inf (masked tokens) get probability 0."""
    scaled = rows.astype(np.float64) / temperature
    scaled -= scaled.max(axis=-1, keepdims=True)
    weights = np.exp(scaled)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights


def draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    """One token from unnormalised non-negative float64[vocab] weights, by inverting the CDF at one uniform."""
    cumulative = np.cumsum(weights)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, len(weights) - 1)


def accept_greedy(rows: np.ndarray, drafts: list[int]) -> tuple[int, int]:
    """rows: float32[k+1, vocab] processed target logits. Returns (accepted, next token)."""
    choices = rows.argmax(axis=-1)
    accepted = 0
    for draft, choice in zip(drafts, choices, strict=False):
        if int(choice) != draft:
            break
        accepted += 1
    return accepted, int(choices[accepted])


def accept_deterministic(p: np.ndarray, drafts: list[int], rng: np.random.Generator) -> tuple[int, int]:
    """p: float64[k+1, vocab] target probabilities; the drafts were proposed with probability 1."""
    for index, draft in enumerate(drafts):
        if rng.random() < p[index, draft]:
            continue
        residual = p[index].copy()
        residual[draft] = 0.0
        return index, draw(residual, rng)
    return len(drafts), draw(p[len(drafts)], rng)


def accept_sampled(p: np.ndarray, q: np.ndarray, drafts: list[int], rng: np.random.Generator) -> tuple[int, int]:
    """p: float64[k+1, vocab] target probabilities; q: float64[k, vocab] the draft distributions the drafts
    were sampled from."""
    for index, draft in enumerate(drafts):
        target, proposal = p[index, draft], q[index, draft]
        if proposal > 0.0 and rng.random() * proposal < target:  # probability min(1, p/q)
            continue
        residual = np.maximum(p[index] - q[index], 0.0)
        if residual.sum() <= 0.0:  # p == q exactly: rejection has probability 0, so draw from p itself
            residual = p[index]
        return index, draw(residual, rng)
    return len(drafts), draw(p[len(drafts)], rng)
