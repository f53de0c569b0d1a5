"""Processors that reshape or truncate the distribution: temperature and the top-k family.

Each matches transformers' warper of the same name (``TopPLogitsWarper`` and so on) with ``filter_value=-inf``.
Removed tokens get -inf; a row that every earlier step masked entirely is left as it is.
"""

from __future__ import annotations

import numpy as np

from decoctl import ConfigError, ProcessContext
from decoctl_logits_chain.base import NEG_INF, Processor, kth_largest, log_normaliser, log_softmax

__all__ = ["Epsilon", "Eta", "MinP", "Temperature", "TopK", "TopP", "TypicalP"]


class Temperature(Processor):
    """logits / T. T < 1 sharpens the distribution, T > 1 flattens it; T must be > 0."""

    def __init__(self, temperature: float) -> None:
        if not temperature > 0:
            raise ConfigError(
                f"logits processor 'temperature': temperature={temperature} must be > 0 (for greedy decoding end "
                "the chain with 'greedy' instead)"
            )
        self.temperature = np.float32(temperature)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        rows /= self.temperature
        return rows


class TopK(Processor):
    """Keep logit_i >= the k-th largest logit (k = max(top_k, min_tokens_to_keep)); ties at the k-th all stay."""

    def __init__(self, top_k: int, min_tokens_to_keep: int = 1) -> None:
        self.k = max(top_k, min_tokens_to_keep)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if self.k < rows.shape[1]:
            rows[rows < kth_largest(rows, self.k)] = NEG_INF
        return rows


HEAD = 64  # the first partial sort: enough for the head of a peaked distribution or the rest of a top_k


def _ranked_until(key: np.ndarray, probs: np.ndarray, mass: float, least: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices of the smallest ``key`` values in ascending order, their cumulative probability), long enough
    that the cumulative reaches ``mass`` (or covers the row) and holds at least ``least`` entries.

    Tries a partial sort of the first max(HEAD, least) first: O(vocab) when the answer is short, as it is after
    a top_k or on a peaked distribution; sorts everything otherwise.
    """
    k = max(HEAD, least)
    if k < key.size:
        top = np.argpartition(key, k - 1)[:k]
        order = top[np.argsort(key[top])]
        cumulative = np.cumsum(probs[order])
        if cumulative[-1] >= mass:
            return order, cumulative
    order = np.argsort(key)
    return order, np.cumsum(probs[order])


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """The k largest of ``values`` in descending order (all of them when k >= their number)."""
    if k < values.size:
        values = np.partition(values, values.size - k)[values.size - k :]
    return np.sort(values)[::-1]


class TopP(Processor):
    """Nucleus sampling: sort by probability ascending, cumulative c_j = sum_{i<=j} p_(i); drop tokens with
    c_j <= 1 - top_p, always keeping the min_tokens_to_keep most probable. top_p = 1 keeps everything.

    Computed from the top down: the token of rank r (by descending probability) stays iff the mass above it
    is below top_p, so usually only the head of the distribution is sorted, and the cut is a logit value:
    tokens tied with the last one kept all stay.
    """

    def __init__(self, top_p: float, min_tokens_to_keep: int = 1) -> None:
        self.top_p = top_p
        self.min_keep = min_tokens_to_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if self.top_p >= 1.0:
            return rows
        for row in rows:
            alive = np.flatnonzero(row > -np.inf)  # masked tokens carry no mass: work on the rest
            logits = row[alive]
            if logits.size <= self.min_keep:
                continue
            top = logits.max()
            head = _largest(logits, max(HEAD, self.min_keep))
            mass = np.cumsum(np.exp(head.astype(np.float64) - top))  # unnormalised, from the top down
            total = mass[-1] if head.size == logits.size else np.exp(logits.astype(np.float64) - top).sum()
            if mass[-1] < self.top_p * total:  # the nucleus is wider than the head: sort everything
                head = _largest(logits, logits.size)
                mass = np.cumsum(np.exp(head.astype(np.float64) - top))
            # rank r stays iff the mass above it, mass[r - 1] (0 for the top token), is below top_p
            above = min(int(np.searchsorted(mass, self.top_p * total)), head.size - 1)
            row[alive[logits < head[max(above + (self.top_p > 0), self.min_keep) - 1]]] = NEG_INF
        return rows


class MinP(Processor):
    """Drop tokens with p_i < min_p * max_j p_j (equivalently logit_i < max logit + log min_p), keeping the
    min_tokens_to_keep largest logits."""

    def __init__(self, min_p: float, min_tokens_to_keep: int = 1) -> None:
        self.min_p = min_p
        self.min_keep = min_tokens_to_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if self.min_p <= 0:
            return rows
        cut = rows.max(axis=1, keepdims=True) + np.float32(np.log(self.min_p))
        rows[(rows < cut) & (rows < kth_largest(rows, self.min_keep))] = NEG_INF
        return rows


class TypicalP(Processor):
    """Locally typical sampling: with entropy H = -sum p log p, rank tokens by |-log p_i - H| ascending and keep
    the smallest set whose probability reaches ``mass`` (plus min_tokens_to_keep), dropping the rest."""

    def __init__(self, mass: float, min_tokens_to_keep: int = 1) -> None:
        self.mass = mass
        self.min_keep = min_tokens_to_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for row in rows:
            alive = np.flatnonzero(row > -np.inf)  # masked tokens have infinite surprise: they always go
            if alive.size <= self.min_keep:
                continue
            logp = log_softmax(row[None, alive])[0]
            p = np.exp(logp)
            surprise = np.abs(-logp + (p * logp).sum())
            order, cumulative = _ranked_until(surprise, p, self.mass, self.min_keep)
            last = min(int((cumulative < self.mass).sum()), order.size - 1)
            drop = surprise > surprise[order[last]]
            drop[order[: self.min_keep]] = False
            row[alive[drop]] = NEG_INF
        return rows


class Epsilon(Processor):
    """Epsilon sampling: drop tokens with p_i < epsilon (logit_i < log Z + log epsilon), keeping the
    min_tokens_to_keep largest logits."""

    def __init__(self, epsilon: float, min_tokens_to_keep: int = 1) -> None:
        self.epsilon = epsilon
        self.min_keep = min_tokens_to_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        log_total, _ = log_normaliser(rows)
        cut = log_total + np.log(self.epsilon)
        rows[(rows < cut) & (rows < kth_largest(rows, self.min_keep))] = NEG_INF
        return rows


class Eta(Processor):
    """Eta sampling: with entropy H = -sum p log p, eta = min(epsilon, sqrt(epsilon) * exp(-H)); drop tokens
    with p_i < eta, keeping the min_tokens_to_keep largest logits."""

    def __init__(self, epsilon: float, min_tokens_to_keep: int = 1) -> None:
        self.epsilon = epsilon
        self.min_keep = min_tokens_to_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        log_total, entropy = log_normaliser(rows)
        eta = np.minimum(self.epsilon, np.sqrt(self.epsilon) * np.exp(-entropy))
        rows[(rows < log_total + np.log(eta)) & (rows < kth_largest(rows, self.min_keep))] = NEG_INF
        return rows
