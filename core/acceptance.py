"""The lossless verification rules controllers share: each keeps the target's distribution exactly.

Given drafted tokens and the processed target rows that verify them (row i conditioned on the drafts before it),
a rule returns how many drafts it accepts and the token that follows them (a correction on rejection, or a bonus
token drawn from the row after the last accepted draft).

- ``accept_greedy``: accept while the target's argmax equals the draft; the next token is the argmax.
- ``accept_deterministic``: each draft is a point mass (prompt lookup, a greedy draft model): accept d with
  probability p(d); on rejection draw from p with d removed, renormalised. This is the speculative-sampling rule
  with q = one-hot(d): min(1, p/q) = p(d) and norm(max(0, p - q)) = p without d.
- ``accept_sampled``: the drafts were sampled from q: accept with min(1, p(d)/q(d)); on rejection draw from
  norm(max(0, p - q)) (Leviathan et al. 2023; Chen et al. 2023).
- ``choose_child``: one node of a draft tree whose children are point masses (a lookahead trie, a top-k tree):
  the children are tried in turn, each accepted with the probability the residual gives it (p with the children
  refused so far removed, renormalised); when all are refused the token is drawn from that residual. The result is
  distributed as p whatever the children are.

Randomness comes from the generation's seeded ``rng``, one uniform per decision, so a seed reproduces a run.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "accept_deterministic",
    "accept_greedy",
    "accept_sampled",
    "choose_child",
    "draw",
    "log_probabilities",
    "probabilities",
]


def probabilities(rows: np.ndarray, temperature: float) -> np.ndarray:
    """float64[..., vocab] softmax(rows / temperature) over the last axis; -inf entries (masked tokens) get 0."""
    scaled = rows.astype(np.float64) / temperature
    scaled -= scaled.max(axis=-1, keepdims=True)
    weights = np.exp(scaled)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights


def log_probabilities(rows: np.ndarray, temperature: float) -> np.ndarray:
    """float64[..., vocab] log softmax(rows / temperature) (-inf for masked tokens): every entry is <= 0."""
    scaled = rows.astype(np.float64) / temperature
    scaled -= scaled.max(axis=-1, keepdims=True)
    return scaled - np.log(np.exp(scaled).sum(axis=-1, keepdims=True))


def draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    """One token from non-negative float64[vocab] weights (not all zero, not necessarily normalised), by
    inverting the CDF at one uniform."""
    cumulative = np.cumsum(weights)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, len(weights) - 1)


def accept_greedy(choices: np.ndarray, drafts: list[int]) -> tuple[int, int]:
    """choices: int64[k+1] the target's processed argmax (``host.argmax``), row i after drafts[:i].
    Returns (accepted, next)."""
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
    """p: float64[k+1, vocab] target probabilities; q: float64[k, vocab] the distributions the drafts were drawn
    from. Returns (accepted, next)."""
    for index, draft in enumerate(drafts):
        target, proposal = p[index, draft], q[index, draft]
        if proposal > 0.0 and rng.random() * proposal < target:  # probability min(1, p/q)
            continue
        residual = np.maximum(p[index] - q[index], 0.0)
        if residual.sum() <= 0.0:  # p == q exactly: rejection has probability 0, so draw from p itself
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
        # rest <= 0: the residual is a point mass on this token, so it is taken (exactly; 1 - chance is rounding)
        if rng.random() < chance or rest <= 0.0:
            return place, token
        residual[token] = 0.0
        residual /= rest
    return None, draw(residual, rng)
