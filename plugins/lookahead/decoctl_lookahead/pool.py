"""The n-gram pool: continuations keyed by their first token, most recent first, a bounded number per key."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["NGramPool"]


class NGramPool:
    """``add(first, rest)`` records an n-gram; ``candidates(first, limit)`` returns up to ``limit`` stored
    continuations of ``first``, the most recently added first. Each key keeps at most ``per_key`` of them."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._grams: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self.size = 0

    def add(self, first: int, rest: Sequence[int]) -> None:
        grams = self._grams.setdefault(first, OrderedDict())
        key = tuple(rest)
        if key in grams:
            grams.move_to_end(key)
            return
        grams[key] = None
        self.size += 1
        if len(grams) > self.per_key:
            grams.popitem(last=False)
            self.size -= 1

    def add_sequence(self, tokens: Sequence[int], n: int, start: int = 0) -> None:
        """Record every n-gram of ``tokens`` that starts at ``start`` or later."""
        for begin in range(start, len(tokens) - n + 1):
            self.add(tokens[begin], tokens[begin + 1 : begin + n])

    def candidates(self, first: int, limit: int) -> list[tuple[int, ...]]:
        grams = self._grams.get(first)
        if not grams:
            return []
        return list(reversed(grams))[:limit]
