"""What every processor here shares: the stateless base and whole-row helpers (never a loop over the vocabulary)."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np

from decoctl import ConfigError, ProcessContext

__all__ = ["NEG_INF", "Processor", "check_vocab", "f32", "kth_largest", "log_normaliser", "log_softmax"]

NEG_INF = np.float32(-np.inf)
_FLOAT32 = struct.Struct("f")


def f32(value: float) -> float:
    """``value`` rounded to the nearest float32 (ties to even; beyond the largest float32, an infinity), as a
    Python float. One of +, -, *, / on two float32 values done in a double and then rounded by this gives exactly
    the float32 operation's result (a double has more than 2 * 24 + 2 bits, so the double rounding is harmless):
    how the argmax bounds do numpy's float32 arithmetic on single values without numpy's scalar calls."""
    try:
        return float(_FLOAT32.unpack(_FLOAT32.pack(value))[0])
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


class Processor:
    """A stateless processor: ``__call__`` only; ``commit`` and ``reset`` have nothing to do.

    ``terminal`` processors pick the token (greedy, sample) and must come last in a chain.
    """

    terminal = False

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        raise NotImplementedError

    def commit(self, tokens: Sequence[int]) -> None:
        del tokens

    def reset(self, prompt: np.ndarray) -> None:
        del prompt

    @property
    def stateless(self) -> bool:
        """Whether ``commit`` and ``reset`` are this base's (doing nothing): the chain then skips them."""
        return type(self).commit is Processor.commit and type(self).reset is Processor.reset


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """float64[n, vocab]: log softmax of each row; -inf logits give -inf, a fully masked row gives all -inf."""
    shifted, total = _shifted(rows)
    return shifted - np.log(total)


def _shifted(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64[n, vocab] rows minus their max, float64[n, 1] sum of exp of that); a fully masked row gives
    -inf and 1, so nothing downstream turns into NaN."""
    wide = rows.astype(np.float64)
    top = wide.max(axis=1, keepdims=True)
    top[top == -np.inf] = 0.0
    wide -= top
    total = np.exp(wide).sum(axis=1, keepdims=True)
    total[total == 0] = 1.0
    return wide, total


def log_normaliser(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64[n, 1] log Z = log sum_j exp(logit_j), float64[n, 1] entropy H of softmax(row)); log p_i is
    logit_i - log Z. A fully masked row gives log Z = -inf and H = 0."""
    shifted, total = _shifted(rows)
    probs = np.exp(shifted) / total
    shifted[shifted == -np.inf] = 0.0  # masked tokens have p = 0 and add nothing to the entropy
    log_total = np.log(total)
    entropy = log_total - (probs * shifted).sum(axis=1, keepdims=True)
    top = rows.max(axis=1, keepdims=True).astype(np.float64)
    return top + log_total, entropy


def kth_largest(rows: np.ndarray, k: int) -> np.ndarray:
    """float32[n, 1]: each row's k-th largest value (k counts from 1, ties counted)."""
    vocab = rows.shape[1]
    k = min(k, vocab)
    if k == 1:
        return rows.max(axis=1, keepdims=True)
    return np.partition(rows, vocab - k, axis=1)[:, vocab - k, None]


def check_vocab(ids: Iterable[int], vocab: int, owner: str) -> None:
    """Raise ConfigError naming the ids a model of ``vocab`` tokens does not have."""
    outside = sorted({int(t) for t in ids if t >= vocab})
    if outside:
        raise ConfigError(
            f"{owner}: token id(s) {outside[:5]} are outside the model's vocabulary of {vocab}: use ids below {vocab}"
        )
