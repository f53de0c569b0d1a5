"""What the prefix-dependent processors remember between calls: token counts and an n-gram table.

The penalties and no_repeat_ngram depend on the tokens before each row. Recounting the whole prefix on every
call costs several numpy passes a step; these records are kept up to date instead by the chain's ``reset``
(the prompt) and ``commit`` (each accepted token), so a call only adds the few drafted tokens of each row's
path. A record answers only for the generation it followed (``follows``: the same prompt object and as many
committed tokens as the context shows); a processor called with any other context recounts from the context.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from decoctl import ProcessContext

__all__ = ["NGramTable", "TokenTally"]


class _Followed:
    def __init__(self) -> None:
        self._prompt: np.ndarray | None = None
        self._committed = -1

    def follows(self, context: ProcessContext) -> bool:
        return context.prompt is self._prompt and len(context.output) == self._committed

    def _start(self, prompt: np.ndarray) -> None:
        self._prompt, self._committed = prompt, 0


class TokenTally(_Followed):
    """How often each token occurred: in the committed output, and in the prompt too when ``include_prompt``.

    Kept as arrays that grow in place (distinct tokens in order of first sight, their counts) and an index
    from token to position, so a commit costs a dict lookup per token and a call costs no rebuild.
    """

    def __init__(self, include_prompt: bool) -> None:
        super().__init__()
        self.include_prompt = include_prompt
        self._ids = np.empty(0, np.int64)
        self._counts = np.empty(0, np.float32)
        self._index: dict[int, int] = {}

    def reset(self, prompt: np.ndarray) -> None:
        self._start(prompt)
        self._ids = np.empty(max(64, 2 * len(prompt)), np.int64)
        self._counts = np.zeros(self._ids.size, np.float32)
        self._index = {}
        if self.include_prompt:
            self._add(prompt.tolist())

    def commit(self, tokens: Sequence[int]) -> None:
        self._add([int(t) for t in tokens])
        self._committed += len(tokens)

    def _add(self, tokens: list[int]) -> None:
        for token in tokens:
            at = self._index.get(token)
            if at is None:
                at = self._index[token] = len(self._index)
                if at == self._ids.size:
                    self._ids = np.concatenate((self._ids, np.empty_like(self._ids)))
                    self._counts = np.concatenate((self._counts, np.zeros_like(self._counts)))
                self._ids[at] = token
            self._counts[at] += 1

    def with_path(self, path: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(int64[u] distinct tokens, float32[u] their counts) over the followed prefix plus ``path``: views,
        valid until the next commit or reset."""
        size = len(self._index)
        ids, counts = self._ids[:size], self._counts[:size]
        if not len(path):
            return ids, counts
        added = Counter(int(t) for t in path)
        new = [t for t in added if t not in self._index]
        old = [t for t in added if t in self._index]
        if old:
            counts = counts.copy()
            counts[[self._index[t] for t in old]] += np.array([added[t] for t in old], np.float32)
        if new:
            ids = np.concatenate((ids, np.array(new, np.int64)))
            counts = np.concatenate((counts, np.array([added[t] for t in new], np.float32)))
        return ids, counts


class NGramTable(_Followed):
    """For n-grams of size ``n`` in the prompt and committed output: their first n-1 tokens -> the last tokens."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self._tokens: list[int] = []
        self._next: dict[tuple[int, ...], set[int]] = {}

    def reset(self, prompt: np.ndarray) -> None:
        self._start(prompt)
        self._tokens, self._next = [], {}
        self._extend(prompt.tolist())

    def commit(self, tokens: Sequence[int]) -> None:
        self._extend([int(t) for t in tokens])
        self._committed += len(tokens)

    def _extend(self, tokens: list[int]) -> None:
        k, start = self.n - 1, len(self._tokens)
        self._tokens.extend(tokens)
        for end in range(max(start, k), len(self._tokens)):
            self._next.setdefault(tuple(self._tokens[end - k : end]), set()).add(self._tokens[end])

    def banned(self, path: Sequence[int]) -> list[int]:
        """The tokens that would complete an n-gram already in the followed prefix plus ``path``."""
        k, path = self.n - 1, [int(t) for t in path]
        full_length = len(self._tokens) + len(path)
        if full_length < self.n:
            return []
        tail = (self._tokens + path)[full_length - k :] if path else self._tokens[full_length - k :]
        found = set(self._next.get(tuple(tail), ()))
        if path:  # n-grams that end inside the path are not in the table
            joined = self._tokens[max(0, len(self._tokens) - k) :] + path
            offset = len(joined) - len(path)
            for end in range(max(offset, k), len(joined)):
                if joined[end - k : end] == tail:
                    found.add(joined[end])
        return list(found)
