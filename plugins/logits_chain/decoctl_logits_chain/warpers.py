"""Processors that reshape or truncate the distribution: temperature and the top-k family.

Each matches transformers' warper of the same name (``TopPLogitsWarper`` and so on) with ``filter_value=-inf``.
Removed tokens get -inf; a row that every earlier step masked entirely is left as it is.

Every warper also works on a row's candidates (``narrow``: the ids and logits of its finite entries), so that
neighbouring warpers fuse into one ``CandidateRun`` (decoctl_logits_chain.candidates) that, after a top_k, handles
tens of tokens instead of the whole vocabulary. Dense and narrowed forms give the same tokens and logits.
"""

from __future__ import annotations

import numpy as np

from decoctl import ConfigError, ProcessContext
from decoctl_logits_chain.base import NEG_INF, f32, kth_largest, log_normaliser, log_softmax
from decoctl_logits_chain.candidates import Narrowing, select_top, sort_candidates, through_ties

__all__ = ["Epsilon", "Eta", "MinP", "Temperature", "TopK", "TopP", "TypicalP"]


class Temperature(Narrowing):
    """logits / T. T < 1 sharpens the distribution, T > 1 flattens it; T must be > 0."""

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

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

    def narrow(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return ids, logits / self.temperature

    def bound_argmax(self, top: float, second: float) -> tuple[float, float] | None:
        """Dividing by T > 0 keeps the order, but rounding can make two close logits equal: checked in float32
        (``f32``: the float32 quotient without numpy's scalar calls)."""
        divisor = float(self.temperature)
        top, second = f32(float(top) / divisor), f32(float(second) / divisor)
        return (top, second) if second < top else None


class TopK(Narrowing):
    """Keep logit_i >= the k-th largest logit (k = max(top_k, min_tokens_to_keep)); ties at the k-th all stay."""

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __init__(self, top_k: int, min_tokens_to_keep: int = 1) -> None:
        self.k = max(top_k, min_tokens_to_keep)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if self.k < rows.shape[1]:
            rows[rows < kth_largest(rows, self.k)] = NEG_INF
        return rows

    def enter(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return sort_candidates(select_top(row, self.k), row)

    def bound_argmax(self, top: np.float32, second: np.float32) -> tuple[np.float32, np.float32] | None:
        return (top, second) if self.k >= 1 else None  # the top token stays as it was; others only drop out

    def narrow(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = through_ties(logits, self.k)
        return ids[:n], logits[:n]


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


class TopP(Narrowing):
    """Nucleus sampling: sort by probability ascending, cumulative c_j = sum_{i<=j} p_(i); drop tokens with
    c_j <= 1 - top_p, always keeping the min_tokens_to_keep most probable. top_p = 1 keeps everything.

    Computed from the top down: the token of rank r (by descending probability) stays iff the mass above it
    is below top_p, so usually only the head of the distribution is sorted, and the cut is a logit value:
    tokens tied with the last one kept all stay.
    """

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __init__(self, top_p: float, min_tokens_to_keep: int = 1) -> None:
        self.top_p = top_p
        self.min_keep = min_tokens_to_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if self.top_p >= 1.0:
            return rows
        for row in rows:
            alive = np.flatnonzero(row > -np.inf)  # masked tokens carry no mass: work on the rest
            logits = row[alive]
            if logits.size > self.min_keep:
                row[alive[logits < self._cut(logits)]] = NEG_INF
        return rows

    def bound_argmax(self, top: np.float32, second: np.float32) -> tuple[np.float32, np.float32] | None:
        return (top, second) if self.min_keep >= 1 else None  # the top stays as it was; others only go

    def narrow(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.top_p >= 1.0 or logits.size <= self.min_keep:
            return ids, logits
        mass = np.cumsum(np.exp(logits.astype(np.float64) - logits[0]))  # sorted: the head is everything
        n = through_ties(logits, self._nucleus(mass, mass[-1]))
        return ids[:n], logits[:n]

    def _nucleus(self, mass: np.ndarray, total: float) -> int:
        """How many of the head stay, given its cumulative unnormalised ``mass`` from the top down: rank r stays
        iff the mass above it, mass[r - 1] (0 for the top token), is below top_p."""
        above = min(int(np.searchsorted(mass, self.top_p * total)), mass.size - 1)
        return max(above + (self.top_p > 0), self.min_keep)

    def _cut(self, logits: np.ndarray) -> np.float32:
        """The smallest logit that stays, among finite ``logits`` (more than min_keep of them)."""
        top = logits.max()
        head = _largest(logits, max(HEAD, self.min_keep))
        mass = np.cumsum(np.exp(head.astype(np.float64) - top))  # unnormalised, from the top down
        total = mass[-1] if head.size == logits.size else np.exp(logits.astype(np.float64) - top).sum()
        if mass[-1] < self.top_p * total:  # the nucleus is wider than the head: sort everything
            head = _largest(logits, logits.size)
            mass = np.cumsum(np.exp(head.astype(np.float64) - top))
        return head[self._nucleus(mass, total) - 1]


class MinP(Narrowing):
    """Drop tokens with p_i < min_p * max_j p_j (equivalently logit_i < max logit + log min_p), keeping the
    min_tokens_to_keep largest logits."""

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __init__(self, min_p: float, min_tokens_to_keep: int = 1) -> None:
        self.min_p = min_p
        self.min_keep = min_tokens_to_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if self.min_p <= 0:
            return rows
        cut = rows.max(axis=1, keepdims=True) + np.float32(np.log(self.min_p))
        rows[(rows < cut) & (rows < kth_largest(rows, self.min_keep))] = NEG_INF
        return rows

    def bound_argmax(self, top: np.float32, second: np.float32) -> tuple[np.float32, np.float32] | None:
        return (top, second) if self.min_keep >= 1 else None  # the top stays as it was; others only go

    def narrow(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.min_p <= 0 or logits.size <= self.min_keep:
            return ids, logits
        return _keep_above(ids, logits, logits[0] + np.float32(np.log(self.min_p)), self.min_keep)


class TypicalP(Narrowing):
    """Locally typical sampling: with entropy H = -sum p log p, rank tokens by |-log p_i - H| ascending and keep
    the smallest set whose probability reaches ``mass`` (plus min_tokens_to_keep), dropping the rest."""

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __init__(self, mass: float, min_tokens_to_keep: int = 1) -> None:
        self.mass = mass
        self.min_keep = min_tokens_to_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for row in rows:
            alive = np.flatnonzero(row > -np.inf)  # masked tokens have infinite surprise: they always go
            if alive.size > self.min_keep:
                row[alive[self._drop(row[alive])]] = NEG_INF
        return rows

    def narrow(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if logits.size <= self.min_keep:
            return ids, logits
        keep = ~self._drop(logits)
        return ids[keep], logits[keep]

    def _drop(self, logits: np.ndarray) -> np.ndarray:
        """bool[n]: which of the finite ``logits`` (more than min_keep of them) go."""
        logp = log_softmax(logits[None])[0]
        p = np.exp(logp)
        surprise = np.abs(-logp + (p * logp).sum())
        order, cumulative = _ranked_until(surprise, p, self.mass, self.min_keep)
        last = min(int((cumulative < self.mass).sum()), order.size - 1)
        drop = surprise > surprise[order[last]]
        drop[order[: self.min_keep]] = False
        return drop


class Epsilon(Narrowing):
    """Epsilon sampling: drop tokens with p_i < epsilon (logit_i < log Z + log epsilon), keeping the
    min_tokens_to_keep largest logits."""

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __init__(self, epsilon: float, min_tokens_to_keep: int = 1) -> None:
        self.epsilon = epsilon
        self.min_keep = min_tokens_to_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        log_total, _ = log_normaliser(rows)
        cut = log_total + np.log(self.epsilon)
        rows[(rows < cut) & (rows < kth_largest(rows, self.min_keep))] = NEG_INF
        return rows

    def bound_argmax(self, top: np.float32, second: np.float32) -> tuple[np.float32, np.float32] | None:
        return (top, second) if self.min_keep >= 1 else None  # the top stays as it was; others only go

    def narrow(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if logits.size <= self.min_keep:
            return ids, logits
        log_total, _ = log_normaliser(logits[None])
        return _keep_above(ids, logits, log_total[0, 0] + np.log(self.epsilon), self.min_keep)


class Eta(Narrowing):
    """Eta sampling: with entropy H = -sum p log p, eta = min(epsilon, sqrt(epsilon) * exp(-H)); drop tokens
    with p_i < eta, keeping the min_tokens_to_keep largest logits."""

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __init__(self, epsilon: float, min_tokens_to_keep: int = 1) -> None:
        self.epsilon = epsilon
        self.min_keep = min_tokens_to_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        log_total, entropy = log_normaliser(rows)
        eta = np.minimum(self.epsilon, np.sqrt(self.epsilon) * np.exp(-entropy))
        rows[(rows < log_total + np.log(eta)) & (rows < kth_largest(rows, self.min_keep))] = NEG_INF
        return rows

    def bound_argmax(self, top: np.float32, second: np.float32) -> tuple[np.float32, np.float32] | None:
        return (top, second) if self.min_keep >= 1 else None  # the top stays as it was; others only go

    def narrow(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if logits.size <= self.min_keep:
            return ids, logits
        log_total, entropy = log_normaliser(logits[None])
        eta = np.minimum(self.epsilon, np.sqrt(self.epsilon) * np.exp(-entropy[0, 0]))
        return _keep_above(ids, logits, log_total[0, 0] + np.log(eta), self.min_keep)


def _keep_above(ids: np.ndarray, logits: np.ndarray, cut: float, least: int) -> tuple[np.ndarray, np.ndarray]:
    """The sorted candidates with logit >= ``cut``, and always the ``least`` largest (with their ties)."""
    n = max(int(np.count_nonzero(logits >= cut)), through_ties(logits, least))
    return ids[:n], logits[:n]
