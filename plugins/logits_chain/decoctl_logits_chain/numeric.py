"""Numeric hygiene: ``normalize`` (log-probabilities) and ``remove_invalid`` (no NaN or infinity), as transformers'
``LogitNormalization`` and ``InfNanRemoveLogitsProcessor`` do."""

from __future__ import annotations

import numpy as np

from decoctl import ProcessContext
from decoctl_logits_chain.base import Processor, log_softmax

__all__ = ["Normalize", "RemoveInvalid"]

_FLOAT32 = np.finfo(np.float32)


class Normalize(Processor):
    """Each row becomes its log-softmax: log p_i = logit_i - log sum_j exp(logit_j) (a masked token stays -inf)."""

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        return log_softmax(rows).astype(np.float32)


class RemoveInvalid(Processor):
    """NaN -> 0, +inf -> the largest float32, -inf -> the most negative float32 (masked tokens become finite:
    put it before any step that masks, as transformers does)."""

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        np.nan_to_num(rows, copy=False, nan=0.0, posinf=_FLOAT32.max, neginf=_FLOAT32.min)
        return rows
