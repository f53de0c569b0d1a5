"""Truncation and shaping beyond the top-k family: top-n-sigma, dynamic temperature and XTC (llama.cpp's sampler
chain), top-h (transformers' ``TopHLogitsWarper``).

Each works on whole rows (float32[n, vocab]); tokens already at -inf stay there and carry no probability. Every one
is a deterministic function of a row, so speculative verification sees exactly what plain decoding sees: XTC's
coin flip is folded into the distribution it samples from (see ``ExcludeTopChoices``).
"""

from __future__ import annotations

import numpy as np

from decoctl import ConfigError, ProcessContext
from decoctl_logits_chain.base import NEG_INF, Processor, log_normaliser, log_softmax

__all__ = ["DynamicTemperature", "ExcludeTopChoices", "TopH", "TopNSigma"]


class TopNSigma(Processor):
    """Top-n-sigma (Tang et al. 2024, llama.cpp's ``top_n_sigma``): keep logit_i >= max - n * sigma, sigma the
    standard deviation of the row's finite logits. Works on raw logits, so it does not depend on a temperature
    applied after it; n = 0 keeps only the maximum (and its ties)."""

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __init__(self, n: float) -> None:
        if not n >= 0:
            raise ConfigError(f"logits processor 'top_n_sigma': n={n} must be >= 0")
        self.n = n

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for row in rows:
            finite = row[row > -np.inf]
            if finite.size > 1:
                row[row < finite.max() - np.float32(self.n) * finite.std()] = NEG_INF
        return rows

    def bound_argmax(self, top: np.float32, second: np.float32) -> tuple[np.float32, np.float32] | None:
        return (top, second)  # the maximum always stays as it is; others only drop out


class DynamicTemperature(Processor):
    """Entropy-scaled temperature (llama.cpp's ``temp_ext``, "dynatemp"): with H the entropy of softmax(row) and
    H_max = log(number of finite logits), T = (t - delta) + 2 * delta * (H / H_max)^exponent and the row is
    divided by T: a confident row is sharpened towards t - delta, an unsure one flattened towards t + delta.
    delta = 0 is plain temperature t. A row with one finite logit is left alone."""

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __init__(self, temperature: float, delta: float, exponent: float) -> None:
        if not 0 <= delta < temperature:
            raise ConfigError(
                f"logits processor 'dynamic_temperature': delta={delta} must be >= 0 and below "
                f"temperature={temperature}, so every temperature it picks stays > 0"
            )
        if not exponent > 0:
            raise ConfigError(f"logits processor 'dynamic_temperature': exponent={exponent} must be > 0")
        self.low, self.high = temperature - delta, temperature + delta
        self.exponent = exponent

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        alive = (rows > -np.inf).sum(axis=1, keepdims=True)
        _, entropy = log_normaliser(rows)
        most = np.log(np.maximum(alive, 2))
        scaled = np.clip(entropy / most, 0.0, 1.0) ** self.exponent
        temperature = (self.low + (self.high - self.low) * scaled).astype(np.float32)
        temperature[alive <= 1] = 1.0
        rows /= temperature
        return rows


class ExcludeTopChoices(Processor):
    """XTC (llama.cpp's ``xtc``): with probability ``probability``, the tokens whose probability is at least
    ``threshold`` are removed, all but the least probable of them, when there are two or more and at least
    ``min_keep`` tokens would remain. llama.cpp flips that coin at every step; here the row becomes the
    distribution the coin and the draw give together, (1 - probability) * p + probability * p_xtc, returned as
    log-probabilities. Sampling from it is sampling llama.cpp's way, and it is a function of the row, so
    speculative verification stays exact; greedy decoding takes that mixture's argmax.
    """

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __init__(self, probability: float, threshold: float, min_keep: int) -> None:
        if not 0 <= probability <= 1:
            raise ConfigError(f"logits processor 'xtc': probability={probability} must be between 0 and 1")
        if not 0 < threshold <= 0.5:
            raise ConfigError(
                f"logits processor 'xtc': threshold={threshold} must be > 0 and <= 0.5 (above 0.5 no two tokens "
                "can both pass it, so XTC would never act)"
            )
        self.probability = probability
        self.threshold = threshold
        self.min_keep = min_keep

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if self.probability == 0:
            return rows
        log_p = log_softmax(rows)
        p = np.exp(log_p)
        out = np.empty_like(rows)
        for index in range(len(rows)):
            probs = p[index]
            above = np.flatnonzero(probs >= self.threshold)
            alive = int((rows[index] > -np.inf).sum())  # llama.cpp counts its candidates, however improbable
            if above.size < 2 or alive - (above.size - 1) < self.min_keep:
                out[index] = log_p[index]
                continue
            keep = above[np.argmin(probs[above])]  # the least probable of the top choices stays
            removed = above[above != keep]
            excluded = probs.copy()
            excluded[removed] = 0.0
            excluded /= excluded.sum()
            mixture = (1.0 - self.probability) * probs + self.probability * excluded
            with np.errstate(divide="ignore"):
                out[index] = np.log(mixture)
        return out


class TopH(Processor):
    """Top-H (Potraghloo et al. 2025, transformers' ``TopHLogitsWarper``): over the row's ``candidates`` (100) largest
    logits, p = their softmax and H its entropy; tokens are kept in order of probability while the running sum of
    -p log p stays <= top_h * H (the most probable always stays), the rest of the row is dropped."""

    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __init__(self, top_h: float, candidates: int = 100) -> None:
        if not 0 < top_h <= 1:
            raise ConfigError(f"logits processor 'top_h': top_h={top_h} must be > 0 and <= 1")
        self.top_h = top_h
        self.candidates = candidates

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        vocab = rows.shape[1]
        n = min(self.candidates, vocab)
        for row in rows:
            top = np.argpartition(row, vocab - n)[vocab - n :] if n < vocab else np.arange(vocab)
            top = top[np.argsort(-row[top], kind="stable")]
            logits = row[top].astype(np.float64)
            finite = logits > -np.inf
            if not finite.any():
                continue
            weights = np.exp(logits - logits[0])
            p = weights / weights.sum()
            with np.errstate(divide="ignore", invalid="ignore"):
                terms = np.where(p > 0, -p * np.log(p), 0.0)
            keep = np.cumsum(terms) <= self.top_h * terms.sum()
            keep[0] = True
            keep &= finite
            dropped = np.ones(vocab, bool)
            dropped[top[keep]] = False
            row[dropped] = NEG_INF
        return rows

    def bound_argmax(self, top: np.float32, second: np.float32) -> tuple[np.float32, np.float32] | None:
        return (top, second)  # the most probable always stays; others only drop out
