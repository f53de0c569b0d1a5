"""The pairs an EAGLE head is fed at its next catch-up: the target's true feature rows and the token after each.

Kept in preallocated arrays, so that a plain step (where drafting does not pay and the head stands still) writes one
row in place instead of allocating; with ``most`` > 0 only the latest ``most`` pairs are kept, which is all a
catch-up feeds.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Backlog"]


class Backlog:
    """Pairs of feature rows (float32[width]) and tokens, oldest first. ``most``: how many of the latest a catch-up
    feeds (0: all of them)."""

    def __init__(self, width: int, most: int) -> None:
        self.most = most
        capacity = max(2 * most, 64)
        self._tokens = np.zeros(capacity, np.int64)
        self._features = np.zeros((capacity, width), np.float32)
        self._start = self._end = 0

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def capacity(self) -> int:
        """The pairs the arrays hold before they are compacted or grown."""
        return len(self._tokens)

    @property
    def rows(self) -> int:
        """The pairs a catch-up feeds: all of them, or the latest ``most``."""
        return min(len(self), self.most) if self.most else len(self)

    def add(self, tokens: np.ndarray, features: np.ndarray) -> None:
        """Append pairs: int64[n] tokens and float32[n, width] the feature rows before them."""
        if self.most and len(tokens) >= self.most:  # these alone are what a catch-up feeds
            tokens, features = tokens[-self.most :], features[-self.most :]
            self.clear()
        count = len(tokens)
        self._make_room(count)
        end = self._end
        self._tokens[end : end + count] = tokens
        self._features[end : end + count] = features
        self._end = end + count

    def add_one(self, token: int) -> np.ndarray:
        """Append one pair and return its feature row (float32[width], holding what it held before: the caller
        fills all of it)."""
        self._make_room(1)
        end = self._end
        self._tokens[end] = token
        row = self._features[end]
        self._end = end + 1
        return row

    def latest(self) -> tuple[np.ndarray, np.ndarray]:
        """The pairs a catch-up feeds (views, valid until the next add or clear)."""
        begin = self._end - self.rows
        return self._tokens[begin : self._end], self._features[begin : self._end]

    def clear(self) -> None:
        self._start = self._end = 0

    def _make_room(self, count: int) -> None:
        if self._end + count <= len(self._tokens):
            return
        keep = self.rows  # older pairs than a catch-up feeds are dropped here
        begin = self._end - keep
        needed = keep + count
        if needed > len(self._tokens):  # grow (an unbounded backlog, or a long run of pairs at once)
            tokens = np.zeros(2 * needed, np.int64)
            features = np.zeros((2 * needed, self._features.shape[1]), np.float32)
            tokens[:keep], features[:keep] = self._tokens[begin : self._end], self._features[begin : self._end]
            self._tokens, self._features = tokens, features
        else:  # move the kept pairs to the front
            self._tokens[:keep] = self._tokens[begin : self._end]
            self._features[:keep] = self._features[begin : self._end]
        self._start, self._end = 0, keep
