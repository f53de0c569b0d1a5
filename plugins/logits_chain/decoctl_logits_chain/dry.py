"""DRY, "don't repeat yourself" (p-e-w's sampler in text-generation-webui, KoboldCpp and llama.cpp's ``dry``).

A token that would extend a repetition of earlier text is penalised by how long that repetition already is:
for every earlier place where the prefix's last m tokens also occur (m >= 1), the token that followed them there
would make the repetition m + 1 long. With m the longest such match for a token t:

    logit_t <- logit_t - multiplier * base^(m - allowed_length)    when m >= allowed_length

Matches stop at sequence breakers (a repetition may not run across one: newlines, punctuation), and only the last
``window`` tokens of the prefix are searched (0: all of it). The exponent is capped where the penalty would
overflow float32, as llama.cpp caps it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from decoctl import ConfigError, ProcessContext
from decoctl_logits_chain.base import Processor

__all__ = ["DEFAULT_BREAKERS", "Dry", "breaker_ids"]

#: llama.cpp's default sequence breakers
DEFAULT_BREAKERS = ("\n", ":", '"', "*")


def breaker_ids(tokenizer: object, breakers: Iterable[str]) -> frozenset[int]:
    """Every token whose text contains one of ``breakers``."""
    decode = getattr(tokenizer, "decode", None)
    size = getattr(tokenizer, "vocab_size", None)
    if decode is None or size is None:
        raise ConfigError(
            "logits processor 'dry': breakers given as text need the model's tokenizer; outside a host give "
            "breaker_ids (token ids) instead"
        )
    wanted = tuple(b for b in breakers if b)
    found = set()
    for token in range(int(size)):
        text = decode([token])
        if any(b in text for b in wanted):
            found.add(token)
    return frozenset(found)


class Dry(Processor):
    """The DRY penalty (module docstring). ``breakers``: texts, resolved to every token containing one through the
    target's tokenizer on first use; ``breaker_ids``: token ids, used as given."""

    def __init__(
        self,
        multiplier: float,
        base: float,
        allowed_length: int,
        window: int,
        breakers: Sequence[str] = DEFAULT_BREAKERS,
        breaker_ids: Sequence[int] = (),
    ) -> None:
        if not multiplier >= 0:
            raise ConfigError(f"logits processor 'dry': multiplier={multiplier} must be >= 0 (0 turns DRY off)")
        if not base > 1:
            raise ConfigError(f"logits processor 'dry': base={base} must be > 1 (llama.cpp's default is 1.75)")
        if allowed_length < 1:
            raise ConfigError(f"logits processor 'dry': allowed_length={allowed_length} must be >= 1")
        self.multiplier = multiplier
        self.base = base
        self.allowed = allowed_length
        self.window = window
        self._texts = tuple(breakers)
        self._given = frozenset(int(t) for t in breaker_ids)
        self._breakers: np.ndarray | None = None if self._texts else np.array(sorted(self._given), np.int64)
        # the largest exponent whose penalty stays finite in float32
        largest = math.log(float(np.finfo(np.float32).max)) - math.log(max(multiplier, 1e-30))
        self._max_exponent = largest / math.log(base) - 1
        # matches longer than this all get the capped penalty: no need to measure them further
        self._cap = allowed_length + int(self._max_exponent) + 1

    def _breaker_array(self, context: ProcessContext) -> np.ndarray:
        if self._breakers is None:
            ids = self._given | breaker_ids(context.tokenizer, self._texts)
            self._breakers = np.array(sorted(ids), np.int64)
        return self._breakers

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if self.multiplier == 0:
            return rows
        breakers = self._breaker_array(context)
        for index, row in enumerate(rows):
            prefix = context.prefix(index)
            if self.window:
                prefix = prefix[-self.window :]
            tokens, lengths = self.matches(prefix, breakers, self._cap)
            keep = lengths >= self.allowed
            if not keep.any():
                continue
            tokens, lengths = tokens[keep], lengths[keep]
            exponent = np.minimum(lengths - self.allowed, self._max_exponent)
            penalty = (self.multiplier * np.power(self.base, exponent)).astype(np.float32)
            longest = np.zeros(row.shape[0], np.float32)
            np.maximum.at(longest, tokens, penalty)
            touched = np.unique(tokens)
            row[touched] -= longest[touched]
        return rows

    @staticmethod
    def matches(prefix: np.ndarray, breakers: np.ndarray, cap: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, lengths): for every earlier end p of the prefix's last token (prefix[p] == prefix[-1]), the token
        prefix[p + 1] and the length m of the longest common run of tokens ending at p and at the end, with no
        breaker in it; lengths stop growing at ``cap`` + 1 (None: no cap)."""
        size = prefix.size
        cap = size if cap is None else cap
        if size < 2 or np.isin(prefix[-1], breakers):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        ends = np.flatnonzero(prefix[:-1] == prefix[-1])
        lengths = np.ones(ends.size, np.int64)
        live = np.ones(ends.size, bool)
        step = 1
        while live.any() and step <= cap:
            back = ends - step
            ok = live & (back >= 0)
            candidates = np.flatnonzero(ok)
            if candidates.size == 0:
                break
            there = prefix[back[candidates]]
            here = prefix[size - 1 - step]
            extend = (there == here) & ~np.isin(there, breakers)
            live[:] = False
            live[candidates[extend]] = True
            lengths[candidates[extend]] += 1
            step += 1
        return prefix[ends + 1], lengths
