"""The n-gram pool: continuations keyed by their first token, most recent first, a bounded number per key.

Each n-gram is also indexed by the token before its first one, when known (n-grams cut from the context). A
lookup for the pending token ranks first the continuations that followed the same two tokens, then the rest
by recency: a match on two tokens of context predicts the next ones far better than a match on one, as prompt
lookup's longer matches do.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["NGramPool"]


def _remember(grams: OrderedDict[tuple[int, ...], None], gram: tuple[int, ...], limit: int) -> None:
    """Add ``gram`` as the most recent; drop the oldest past ``limit``."""
    if gram in grams:
        grams.move_to_end(gram)
        return
    grams[gram] = None
    if len(grams) > limit:
        grams.popitem(last=False)


class NGramPool:
    """``add(first, rest, before)`` records an n-gram; ``candidates(first, limit, before)`` returns up to ``limit``
    stored continuations of ``first``: those seen after ``before`` first, then the others, most recent first.
    Each key keeps at most ``per_key`` of them."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._grams: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self._after: dict[tuple[int, int], OrderedDict[tuple[int, ...], None]] = {}
        self.size = 0

    def add(self, first: int, rest: Sequence[int], before: int | None = None) -> None:
        gram = tuple(rest)
        grams = self._grams.setdefault(first, OrderedDict())
        had = len(grams)
        _remember(grams, gram, self.per_key)
        self.size += len(grams) - had
        if before is not None:
            _remember(self._after.setdefault((before, first), OrderedDict()), gram, self.per_key)

    def add_sequence(self, tokens: Sequence[int], n: int, start: int = 0) -> None:
        """Record every n-gram of ``tokens`` that starts at ``start`` or later (with the token before it)."""
        for begin in range(start, len(tokens) - n + 1):
            self.add(tokens[begin], tokens[begin + 1 : begin + n], tokens[begin - 1] if begin else None)

    def candidates(self, first: int, limit: int, before: int | None = None) -> list[tuple[int, ...]]:
        picked: list[tuple[int, ...]] = []
        if before is not None:
            picked.extend(reversed(self._after.get((before, first), ())))
            del picked[limit:]
        if len(picked) < limit:
            for gram in reversed(self._grams.get(first, ())):
                if gram not in picked:
                    picked.append(gram)
                    if len(picked) == limit:
                        break
        return picked
