"""Acceptance rules: each returns a path of drafted tokens and the token after it, distributed exactly as the target.

- ``accept_chain_greedy``: accept while the target's argmax equals the draft; the next token is the argmax.
- ``accept_chain_sampled``: the drafts were sampled from q (the head's processed distribution): accept d with
  probability min(1, p(d)/q(d)); on rejection draw from norm(max(0, p - q)) (Leviathan et al. 2023; Chen et al.
  2023).
- ``choose_child``: one node of a deterministic draft tree (its children chosen by the head's top-k, no randomness):
  every child is a point-mass proposal, so the children are tried in turn, each accepted with the probability the
  residual gives it (p, with the children refused so far removed and renormalised); when all are refused the
  token is drawn from that residual. The result is distributed as p whatever the children are.
"""

from __future__ import annotations

import numpy as np

__all__ = ["accept_chain_greedy", "accept_chain_sampled", "choose_child", "draw", "log_probabilities", "probabilities"]


def probabilities(rows: np.ndarray, temperature: float) -> np.ndarray:
    """float64[n, vocab] softmax(rows / temperature); -inf entries (masked tokens) get probability 0."""
    scaled = rows.astype(np.float64) / temperature
    scaled -= scaled.max(axis=-1, keepdims=True)
    weights = np.exp(scaled)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights


def log_probabilities(rows: np.ndarray, temperature: float) -> np.ndarray:
    """float64[n, vocab] log softmax(rows / temperature) (-inf for masked tokens): every entry is <= 0."""
    scaled = rows.astype(np.float64) / temperature
    scaled -= scaled.max(axis=-1, keepdims=True)
    return scaled - np.log(np.exp(scaled).sum(axis=-1, keepdims=True))


def draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    """One token from non-negative float64[vocab] weights (not all zero), by inverting the CDF at one uniform."""
    cumulative = np.cumsum(weights)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, len(weights) - 1)


def accept_chain_greedy(rows: np.ndarray, drafts: list[int]) -> tuple[int, int]:
    """rows: float32[k+1, vocab] processed target logits, row i after drafts[:i]. Returns (accepted, next)."""
    choices = rows.argmax(axis=-1)
    accepted = 0
    for draft, choice in zip(drafts, choices, strict=False):
        if int(choice) != draft:
            break
        accepted += 1
    return accepted, int(choices[accepted])


def accept_chain_sampled(p: np.ndarray, q: np.ndarray, drafts: list[int], rng: np.random.Generator) -> tuple[int, int]:
    """p: float64[k+1, vocab] target probabilities; q: float64[k, vocab] the distributions the drafts were drawn
    from. Returns (accepted, next)."""
    for index, draft in enumerate(drafts):
        target, proposal = p[index, draft], q[index, draft]
        if proposal > 0.0 and rng.random() * proposal < target:  # probability min(1, p/q)
            continue
        residual = np.maximum(p[index] - q[index], 0.0)
        if residual.sum() <= 0.0:  # p == q: a rejection has probability 0, so p itself is the residual
            residual = p[index]
        return index, draw(residual, rng)
    return len(drafts), draw(p[len(drafts)], rng)


def choose_child(p: np.ndarray, children: list[int], rng: np.random.Generator) -> tuple[int | None, int]:
    """p: float64[vocab] the target's distribution at a node; children: its children's distinct tokens, in the
    order to try them. Returns (the index in children of the accepted child, or None, and the token taken)."""
    residual = p.copy()
    for place, token in enumerate(children):
        chance = residual[token]
        rest = residual.sum() - chance
        # rest <= 0: the residual is a point mass on this token, so it is taken (exactly, 1 - chance is rounding)
        if rng.random() < chance or rest <= 0.0:
            return place, token
        residual[token] = 0.0
        residual /= rest
    return None, draw(residual, rng)
