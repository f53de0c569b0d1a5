"""Terminal steps: what a chain ends in. They must come last (the chain parser refuses anything after them)."""

from __future__ import annotations

import numpy as np

from decoctl import ProcessContext
from decoctl_logits_chain.base import NEG_INF
from decoctl_logits_chain.candidates import Narrowing

__all__ = ["GreedyTerminal", "SampleTerminal"]


class GreedyTerminal(Narrowing):
    """Keep each row's argmax only (the first on ties): logit_t <- -inf for t != argmax_j logit_j.

    Any controller that samples from processed rows then decodes greedily (a speculative verifier accepts a
    drafted token exactly when it is the argmax); the chain controller takes the argmax without a draw.
    """

    terminal = True

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        best = rows.argmax(axis=1)[:, None]
        kept = np.take_along_axis(rows, best, axis=1)
        rows.fill(NEG_INF)
        np.put_along_axis(rows, best, kept, axis=1)
        return rows

    def narrow(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return ids[:1], logits[:1]  # sorted, tied ids ascending: the dense argmax (the first maximum)

    def bound_argmax(self, top: np.float32, second: np.float32) -> tuple[np.float32, np.float32]:
        return top, second


class SampleTerminal(Narrowing):
    """The identity: the chain ends in a draw from softmax(processed logits) with the generation's rng (the
    chain controller's default; written out, it documents the intent and forbids steps after it)."""

    terminal = True
    sample_only = True  # it shapes the distribution a draw is made from: beam search refuses it

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        return rows

    def narrow(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return ids, logits

    def bound_argmax(self, top: np.float32, second: np.float32) -> tuple[np.float32, np.float32]:
        return top, second
