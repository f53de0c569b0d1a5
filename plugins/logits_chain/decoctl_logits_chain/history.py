"""What the prefix-dependent processors remember between calls: token counts, an n-gram table, and the joint
record a run of fused penalties reads.

The penalties and no_repeat_ngram depend on the tokens before each row. Recounting the whole prefix on every
call costs several numpy passes a step; these records follow the generation instead, through the chain's
``reset`` (the prompt) and ``commit`` (each accepted token), so a call only adds the few drafted tokens of each
row's path. Taking a token in at ``commit`` also runs while the caches still hold this code, rather than after
the next forward has pushed everything out. A ``lazy`` record (a processor whose fused run answers for it) only
counts its commits and takes the tokens in from the context's committed output when it is read (``catch_up``).
A record answers only for the generation it followed (``follows``: the same prompt object and as many committed
tokens as the context shows); a processor called with any other context recounts from the context. Drafted
tokens (``context.paths``) never enter a record: a call adds each row's path on top, so a rejected draft needs no
rewind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from decoctl import ProcessContext

__all__ = ["JointTally", "NGramTable", "TokenTally"]


class _Followed:
    """Follows one generation: the prompt object of the last ``reset`` and the number of tokens committed since
    (``_taken`` of them taken in). ``follower``, when set, is another record driven by this one's reset and
    commit (a JointTally derived from a penalty's tally)."""

    lazy = False

    def __init__(self) -> None:
        self._prompt: np.ndarray | None = None
        self._committed = -1
        self._taken = 0
        self.follower: _Followed | None = None

    def follows(self, context: ProcessContext) -> bool:
        return context.prompt is self._prompt and len(context.output) == self._committed

    def reset(self, prompt: np.ndarray) -> None:
        self._prompt, self._committed, self._taken = prompt, 0, 0
        self._start(prompt.tolist())
        if self.follower is not None:
            self.follower.reset(prompt)

    def commit(self, tokens: Sequence[int]) -> None:
        self._committed += len(tokens)
        if not self.lazy:
            self._add(tokens if type(tokens) is list else [int(t) for t in tokens])  # the host gives a list of ints
            self._taken = self._committed
        if self.follower is not None:
            self.follower.commit(tokens)

    def catch_up(self, context: ProcessContext) -> None:
        """Take in the committed tokens a lazy record has not taken yet (call only when ``follows(context)``)."""
        if self._taken < self._committed:
            self._add(context.output[self._taken : self._committed].tolist())
            self._taken = self._committed

    def _start(self, prompt: list[int]) -> None:
        raise NotImplementedError

    def _add(self, tokens: list[int]) -> None:
        raise NotImplementedError


class TokenTally(_Followed):
    """How often each token occurred: in the committed output, and in the prompt too when ``include_prompt``.

    Kept as arrays that grow in place (distinct tokens in order of first sight, their counts) and an index
    from token to position, so taking in a token costs a dict lookup and a call costs no rebuild.
    """

    def __init__(self, include_prompt: bool) -> None:
        super().__init__()
        self.include_prompt = include_prompt
        self._ids = np.empty(0, np.int64)
        self._counts = np.empty(0, np.float32)
        self._index: dict[int, int] = {}

    def _start(self, prompt: list[int]) -> None:
        self._ids = np.empty(max(64, 2 * len(prompt)), np.int64)
        self._counts = np.zeros(self._ids.size, np.float32)
        self._index = {}
        if self.include_prompt:
            self._add(prompt)

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

    def count(self, token: int) -> int:
        """How often ``token`` occurred in the followed prefix (call after ``catch_up``)."""
        at = self._index.get(token)
        return 0 if at is None else int(self._counts[at])

    def with_path(self, path: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(int64[u] distinct tokens, float32[u] their counts) over the followed prefix plus ``path``: views,
        valid until the next commit or reset (call after ``catch_up``)."""
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

    def _start(self, prompt: list[int]) -> None:
        self._tokens, self._next = [], {}
        self._add(prompt)

    def _add(self, tokens: list[int]) -> None:
        k, start = self.n - 1, len(self._tokens)
        self._tokens.extend(tokens)
        for end in range(max(start, k), len(self._tokens)):
            self._next.setdefault(tuple(self._tokens[end - k : end]), set()).add(self._tokens[end])

    def banned(self, path: Sequence[int]) -> list[int]:
        """The tokens that would complete an n-gram already in the followed prefix plus ``path`` (call after
        ``catch_up``)."""
        k, path = self.n - 1, [int(t) for t in path]
        full_length = len(self._tokens) + len(path)
        if full_length < self.n:
            return []
        tail = (self._tokens + path)[full_length - k :] if path else self._tokens[full_length - k :]
        found = self._next.get(tuple(tail), ())
        if not path:
            return list(found)
        found = set(found)  # n-grams that end inside the path are not in the table
        joined = self._tokens[max(0, len(self._tokens) - k) :] + path
        offset = len(joined) - len(path)
        for end in range(max(offset, k), len(joined)):
            if joined[end - k : end] == tail:
                found.add(joined[end])
        return list(found)


class JointTally(_Followed):
    """What a fused run of tallied penalties applies to the distinct tokens any of them looks at, kept up to date
    so that the run gathers, updates and scatters those logits once a call.

    ``ids`` (int64[u], first sight order) is the union of the penalties' token sets; ``position`` maps a token to
    its place there. Penalty ``i`` is ``(kind, amount, include_prompt)``; ``operand(i)`` is what it applies, aligned
    with ``ids``: for SCALE (repetition) bool[u], whether it touches the token; for ONCE (presence) float32[u],
    ``amount`` where it touches the token and +0.0 elsewhere; for PER_COUNT (frequency) float32[u], ``amount *
    count`` rounded to float32 (what the penalty's float32 product gives) where the count is positive and +0.0
    elsewhere. Subtracting +0.0 leaves every float32 as it is (-0.0, infinities and NaN included), so a run
    subtracts whole operands. Views, valid until the next commit or reset. ``counts[i]`` maps each token penalty
    ``i`` touches to its occurrences (what the argmax bound reads, without numpy).

    A fused processor gets no reset or commit of its own: the run makes this record the ``follower`` of one of
    its penalties' tallies, which passes them on. Taking a token in touches only dicts (``position``, ``counts``)
    and notes the token; the arrays catch up on the noted tokens when ``ids`` or an operand is next read, a few
    numpy calls for all of them, so the steps that never read the arrays (an argmax settled from the
    unprocessed row) pay no numpy call for them at commit.
    """

    SCALE, ONCE, PER_COUNT = "scale", "once", "per_count"

    def __init__(self, penalties: Sequence[tuple[str, np.float32, bool]]) -> None:
        super().__init__()
        self.penalties = tuple(penalties)
        self._prompted = [i for i, (_, _, include_prompt) in enumerate(self.penalties) if include_prompt]
        self._every = range(len(self.penalties))
        self._allocate(64)

    def _allocate(self, size: int) -> None:
        self.position: dict[int, int] = {}
        self.counts: list[dict[int, int]] = [{} for _ in self.penalties]  # per penalty: token -> occurrences
        self._noted: dict[int, None] = {}  # tokens taken in since the arrays last caught up (insertion order)
        self._ids = np.empty(size, np.int64)
        self._operands = [np.zeros(size, bool if kind == self.SCALE else np.float32) for kind, _, _ in self.penalties]

    def _start(self, prompt: list[int]) -> None:
        self._allocate(max(64, 2 * len(prompt)))
        if self._prompted:
            self._take(prompt, self._prompted)

    def _add(self, tokens: list[int]) -> None:
        self._take(tokens, self._every)

    def _take(self, tokens: list[int], which: Sequence[int]) -> None:
        position, counts, noted = self.position, self.counts, self._noted
        for token in tokens:
            if token not in position:
                position[token] = len(position)
            noted[token] = None
            for i in which:
                counts[i][token] = counts[i].get(token, 0) + 1

    def _catch_up(self) -> None:
        """Write the noted tokens' ids and operand values into the arrays (growing them first if needed)."""
        size = len(self.position)
        if size > self._ids.size:
            grown = max(size, 2 * self._ids.size)
            self._ids = np.concatenate((self._ids, np.empty(grown - self._ids.size, np.int64)))
            self._operands = [
                np.concatenate((operand, np.zeros(grown - operand.size, operand.dtype))) for operand in self._operands
            ]
        tokens = list(self._noted)
        self._noted = {}
        at = [self.position[token] for token in tokens]
        self._ids[at] = tokens
        for (kind, amount, _), counts, operand in zip(self.penalties, self.counts, self._operands, strict=True):
            found = [counts.get(token, 0) for token in tokens]
            if kind == self.PER_COUNT:
                # float32 * float32 is exact in a double (48 bits), so the one rounding of the store gives the
                # float32 product the penalty computes; +0.0 where the count is 0
                operand[at] = [float(amount) * count if count else 0.0 for count in found]
            elif kind == self.SCALE:
                operand[at] = [count > 0 for count in found]
            else:
                operand[at] = [amount if count else np.float32(0.0) for count in found]

    @property
    def ids(self) -> np.ndarray:
        if self._noted:
            self._catch_up()
        return self._ids[: len(self.position)]

    def operand(self, penalty: int) -> np.ndarray:
        if self._noted:
            self._catch_up()
        return self._operands[penalty][: len(self.position)]
