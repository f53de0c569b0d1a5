"""Candidate runs: neighbouring warpers fused into one pass over each row's surviving tokens.

A dense warper touches the whole vocabulary even after a top_k has left 40 tokens, and on a CPU each numpy call
runs right after a forward has pushed everything out of the caches, so every call counts. A ``CandidateRun``
(what the chain builds, through ``fuse``, from two or more neighbouring ``Narrowing`` processors) enters each row
once (top_k: a selection; otherwise the finite entries), sorts the candidates by logit, carries them through
every later step's ``narrow`` (a truncation is then a slice: top_k, top_p, min_p, greedy), and writes the
survivors back into a row of -inf. This is llama.cpp's sampler-chain idea (samplers shrink a sorted candidate
array) under decoctl's dense contract: the row that comes out equals what the steps give one after another.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from decoctl import ProcessContext, bound_through
from decoctl_logits_chain.base import NEG_INF, Processor

__all__ = ["CandidateRun", "Narrowing", "finite_candidates", "select_top", "sort_candidates", "through_ties"]


def finite_candidates(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row's finite entries, sorted: (ids, logits) by descending logit, ties by ascending id."""
    return sort_candidates(np.flatnonzero(row > NEG_INF), row)


def sort_candidates(ids: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` (ascending) ordered by descending ``row[ids]``; a stable sort keeps tied ids ascending."""
    logits = row[ids]
    order = np.argsort(-logits, kind="stable")
    return ids[order], logits[order]


SAMPLE_STRIDE = 8  # select_top looks at every 8th logit first


def select_top(row: np.ndarray, k: int) -> np.ndarray:
    """int64[>= k] ascending: the ids whose logit is at least the row's k-th largest (all ties at it), finite.

    A partition of the whole row costs ~5 ns a logit; this finds a threshold on a strided sample first (its
    (k/4)-th largest, about 2k logits above it in the row), partitions only what lies above that, and falls back to
    the whole row when fewer than k do. The result is the same either way.
    """
    vocab = row.size
    sample = row[::SAMPLE_STRIDE]
    j = k // 4 + 1
    if k >= vocab or j >= sample.size:
        return _at_least(row, np.partition(row, vocab - min(k, vocab))[vocab - min(k, vocab)])
    guess = np.partition(sample, sample.size - j)[sample.size - j]
    above = np.flatnonzero(row >= guess)
    if above.size < k:
        return _at_least(row, np.partition(row, vocab - k)[vocab - k])
    values = row[above]
    kth = np.partition(values, values.size - k)[values.size - k]
    return above[values >= kth] if kth > NEG_INF else above[values > NEG_INF]


def _at_least(row: np.ndarray, kth: np.float32) -> np.ndarray:
    return np.flatnonzero(row >= kth) if kth > NEG_INF else np.flatnonzero(row > NEG_INF)


def through_ties(logits: np.ndarray, n: int) -> int:
    """How many of the sorted ``logits`` stay when the first ``n`` do and ties with the n-th stay too."""
    if n >= logits.size or logits[n] != logits[n - 1]:
        return n
    return int(np.count_nonzero(logits >= logits[n - 1]))


class Narrowing(Processor):
    """A processor that can also work on a row's candidates and so fuses with its ``Narrowing`` neighbours.

    ``narrow(ids, logits)`` takes the finite entries of one row (at least one), sorted by descending logit with
    ties by ascending id, and returns the ones that stay with their new logits, still sorted that way (a
    truncation is a slice or an order-keeping mask; a transform must be increasing). ``enter(row)`` does the
    same from a dense row.
    """

    def narrow(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def enter(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids, logits = finite_candidates(row)
        return self.narrow(ids, logits) if ids.size else (ids, logits)

    def fuse(self, following: object) -> CandidateRun | None:
        if self.terminal or not isinstance(following, Narrowing):
            return None
        return CandidateRun((self, following))


class CandidateRun(Processor):
    """``steps`` (Narrowing processors, a terminal only last) applied to each row's candidates in one pass."""

    def __init__(self, steps: tuple[Narrowing, ...]) -> None:
        self.steps = steps
        self.terminal = steps[-1].terminal
        bounds = tuple(getattr(step, "bound_argmax", None) for step in steps)
        self._bound = None if None in bounds else partial(bound_through, bounds)

    def fuse(self, following: object) -> CandidateRun | None:
        if self.terminal or not isinstance(following, Narrowing):
            return None
        return CandidateRun((*self.steps, following))

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        first, rest = self.steps[0], self.steps[1:]
        for row in rows:
            ids, logits = first.enter(row)
            if not ids.size:
                continue  # every token masked already: the row stays as it is
            for step in rest:
                ids, logits = step.narrow(ids, logits)
            row.fill(NEG_INF)
            row[ids] = logits
        return rows

    @property
    def bound_argmax(self) -> Callable[[np.float32, np.float32], tuple[np.float32, np.float32] | None] | None:
        """Its steps' bounds in turn, when every step has them (``LogitsProcessor.bound_argmax``)."""
        return self._bound

    def __repr__(self) -> str:
        return f"CandidateRun({', '.join(type(step).__name__ for step in self.steps)})"
