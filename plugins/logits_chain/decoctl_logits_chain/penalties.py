"""Processors that look at the prefix or at fixed token ids: penalties, bans, biases and length rules.

Every row is processed with its own prefix (``context.prefix(row)``: prompt, committed output, then the tokens
drafted before that row), so a verifier sees what plain decoding would have seen at that position. Loops run
over rows and prefix tokens, never over the vocabulary. Prefix tokens are ids below the vocabulary size (the host
checks every token it feeds), so they index rows directly. The penalties and no_repeat_ngram keep their counts
up to date through ``reset``/``commit`` (decoctl_logits_chain.history) and recount only for a context they did
not follow.

Neighbouring processors of this module that depend only on the prefix (the three penalties, no_repeat_ngram,
min_new_tokens, min_length) fuse into a ``PrefixRun``: when no row has a drafted path (greedy decoding, a
sampler's step) it gathers the logits of every token the penalties touch once, applies each member's update to
them in the configured order, and scatters them back: a handful of numpy calls a step where the members one by
one take several each. Every other call runs the members one by one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from decoctl import ProcessContext
from decoctl_logits_chain.base import NEG_INF, Processor, check_vocab, f32
from decoctl_logits_chain.history import JointTally, NGramTable, TokenTally

__all__ = [
    "BadWords",
    "ExponentialDecayLengthPenalty",
    "FrequencyPenalty",
    "LogitBias",
    "MinLength",
    "MinNewTokens",
    "NoRepeatNGram",
    "PrefixRun",
    "PresencePenalty",
    "RepetitionPenalty",
    "SuppressTokens",
]


def _eos(context: ProcessContext, vocab: int) -> np.ndarray:
    return np.fromiter((t for t in context.eos_token_ids if t < vocab), np.int64)


def _mask_eos_where(rows: np.ndarray, context: ProcessContext, short: list[int]) -> np.ndarray:
    """logit_eos <- -inf in the rows listed in ``short`` (usually none once a generation is under way)."""
    if short and context.eos_token_ids:
        rows[np.ix_(np.array(short, np.int64), _eos(context, rows.shape[1]))] = NEG_INF
    return rows


class _Prefixed(Processor):
    """A processor that depends only on the prefix and so joins its ``_Prefixed`` neighbours in a PrefixRun.

    ``record`` (decoctl_logits_chain.history, or None) follows the generation through reset/commit. A tallied
    penalty has ``tallied``, its ``(kind, amount, include_prompt)`` for a JointTally; any other member has
    ``masked(context)``, the tokens it sets to -inf when no row has a drafted path and its record (if any)
    follows the context, and ``holds_back(context, row, token)``, whether it sets ``token`` to -inf in a row.
    """

    record: TokenTally | NGramTable | None = None
    tallied: tuple[str, np.float32, bool] | None = None

    @property
    def stateless(self) -> bool:
        return self.record is None

    def reset(self, prompt: np.ndarray) -> None:
        if self.record is not None:
            self.record.reset(prompt)

    def commit(self, tokens: Sequence[int]) -> None:
        if self.record is not None:
            self.record.commit(tokens)

    def clone(self) -> _Prefixed:
        """``LogitsProcessor.clone``: the same processor for another sequence, with a record of its own. The record
        is all its state, so a deep copy is the clone; a chain built over clones fuses them again, so a run's joint
        record is new too."""
        return copy.deepcopy(self)

    def masked(self, context: ProcessContext) -> Sequence[int]:
        raise NotImplementedError

    def holds_back(self, context: ProcessContext, row: int, token: int) -> bool:
        """Whether a masking member sets ``token`` to -inf in row ``row`` (its record, if any, follows)."""
        raise NotImplementedError

    def bound_argmax_at(
        self, context: ProcessContext, row: int, token: int, top: float, second: float
    ) -> tuple[float, float] | None:
        """``LogitsProcessor.bound_argmax_at``: what this processor does to ``token``'s logit, computed on that one
        value, when the processor only ever lowers logits (so ``second`` still bounds the others). A masking member
        leaves ``token`` as it is unless it holds it back; a tallied penalty computes its one value."""
        return None if self.holds_back(context, row, token) else (top, second)

    def fuse(self, following: object) -> PrefixRun | None:
        return PrefixRun((self, following)) if isinstance(following, _Prefixed) else None


class _Tallied(_Prefixed):
    """A penalty over the distinct tokens before each row (with their counts), kept in a TokenTally."""

    def __init__(self, include_prompt: bool) -> None:
        self.include_prompt = include_prompt
        self.record = self.tally = TokenTally(include_prompt)

    #: whether the penalty never raises a logit (a factor >= 1, an amount >= 0): what its argmax bound needs
    lowers_only = False

    def lower(self, value: float, count: int) -> float:
        """float32[] -> float32[]: the penalty applied to one logit ``value`` of a token seen ``count`` > 0 times,
        with the arithmetic the rows get (``f32``)."""
        raise NotImplementedError

    def bound_argmax_at(
        self, context: ProcessContext, row: int, token: int, top: float, second: float
    ) -> tuple[float, float] | None:
        if not self.lowers_only or not self.tally.follows(context):
            return None
        self.tally.catch_up(context)
        count = self.tally.count(token) + _occurrences(context.paths[row], token)
        return (self.lower(top, count) if count else top), second

    def _seen(self, context: ProcessContext, row: int) -> tuple[np.ndarray, np.ndarray]:
        """(int64[u] the distinct tokens before ``row``, float32[u] how often each occurred)."""
        if self.tally.follows(context):
            self.tally.catch_up(context)
            return self.tally.with_path(context.paths[row])
        seen = context.prefix(row) if self.include_prompt else context.generated(row)
        ids, counts = np.unique(seen, return_counts=True)
        return ids, counts.astype(np.float32)


class RepetitionPenalty(_Tallied):
    """For every token t already in the prefix (the prompt too unless include_prompt=false):
    logit_t <- logit_t / penalty if logit_t > 0, else logit_t * penalty. Once per token, however often it occurs."""

    def __init__(self, penalty: float, include_prompt: bool = True) -> None:
        super().__init__(include_prompt)
        self.penalty = np.float32(penalty)
        self.tallied = (JointTally.SCALE, self.penalty, include_prompt)
        self.lowers_only = bool(self.penalty >= 1)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for index, row in enumerate(rows):
            seen, _ = self._seen(context, index)
            row[seen] = _scaled(row[seen], self.penalty)
        return rows

    def lower(self, value: float, count: int) -> float:
        factor = float(self.penalty)
        return f32(value * factor) if value < 0 else f32(value / factor)


def _occurrences(path: Sequence[int], token: int) -> int:
    return sum(1 for t in path if t == token) if len(path) else 0


def _scaled(values: np.ndarray, factor: np.float32) -> np.ndarray:
    """The repetition penalty's update: negative logits times ``factor``, the others divided by it (a new array;
    three numpy calls where np.where takes four)."""
    scaled = values / factor
    np.multiply(values, factor, out=scaled, where=values < 0)
    return scaled


class _CountPenalty(_Tallied):
    kind = JointTally.ONCE

    def __init__(self, amount: float, include_prompt: bool = False) -> None:
        super().__init__(include_prompt)
        self.amount = np.float32(amount)
        self.tallied = (self.kind, self.amount, include_prompt)
        self.lowers_only = bool(self.amount >= 0)


class PresencePenalty(_CountPenalty):
    """logit_t <- logit_t - presence_penalty * [count_t > 0], count_t the occurrences of t among the generated
    tokens (the prompt's too with include_prompt=true). Negative values encourage repetition."""

    def lower(self, value: float, count: int) -> float:
        return f32(value - float(self.amount))

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for index, row in enumerate(rows):
            seen, _ = self._seen(context, index)
            row[seen] -= self.amount
        return rows


class FrequencyPenalty(_CountPenalty):
    """logit_t <- logit_t - frequency_penalty * count_t, count_t the occurrences of t among the generated tokens
    (the prompt's too with include_prompt=true). Negative values encourage repetition."""

    kind = JointTally.PER_COUNT

    def lower(self, value: float, count: int) -> float:
        return f32(value - f32(float(self.amount) * count))

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for index, row in enumerate(rows):
            seen, counts = self._seen(context, index)
            row[seen] -= self.amount * counts
        return rows


class NoRepeatNGram(_Prefixed):
    """With n = ngram_size and the prefix's last n-1 tokens s: logit_t <- -inf for every t such that s + (t,)
    already occurs in the prefix (an n-gram never repeats). n = 1 bans every token seen."""

    def __init__(self, ngram_size: int) -> None:
        self.n = ngram_size
        self.record = self.table = NGramTable(ngram_size)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        follows = self.table.follows(context)
        if follows:
            self.table.catch_up(context)
        for index, row in enumerate(rows):
            banned = self.table.banned(context.paths[index]) if follows else self._recount(context, index)
            if len(banned):
                row[banned] = NEG_INF
        return rows

    def _recount(self, context: ProcessContext, row: int) -> np.ndarray:
        prefix, k = context.prefix(row), self.n - 1
        if len(prefix) < self.n:
            return prefix[:0]
        if k == 0:
            return prefix
        # earlier k-grams equal to the last k tokens: test the first token everywhere, the rest only there
        tail = prefix[len(prefix) - k :]
        starts = np.flatnonzero(prefix[: len(prefix) - k] == tail[0])
        if k > 1 and starts.size:
            starts = starts[(prefix[starts[:, None] + np.arange(1, k)] == tail[1:]).all(axis=1)]
        return prefix[starts + k]

    def masked(self, context: ProcessContext) -> Sequence[int]:
        return self.table.banned(())

    def bound_argmax_at(
        self, context: ProcessContext, row: int, token: int, top: float, second: float
    ) -> tuple[float, float] | None:
        return super().bound_argmax_at(context, row, token, top, second) if self.table.follows(context) else None

    def holds_back(self, context: ProcessContext, row: int, token: int) -> bool:
        self.table.catch_up(context)
        return token in self.table.banned(context.paths[row])


class MinLength(_Prefixed):
    """logit_eos <- -inf while the whole sequence (prompt + generated) is shorter than min_length."""

    def __init__(self, min_length: int) -> None:
        self.min_length = min_length

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        short = [i for i in range(len(rows)) if len(context.prompt) + context.new_tokens(i) < self.min_length]
        return _mask_eos_where(rows, context, short)

    def masked(self, context: ProcessContext) -> Sequence[int]:
        return context.eos_token_ids if len(context.prompt) + len(context.output) < self.min_length else ()

    def holds_back(self, context: ProcessContext, row: int, token: int) -> bool:
        return token in context.eos_token_ids and len(context.prompt) + context.new_tokens(row) < self.min_length


class MinNewTokens(_Prefixed):
    """logit_eos <- -inf while fewer than min_new_tokens tokens were generated (the prompt does not count)."""

    def __init__(self, min_new_tokens: int) -> None:
        self.min_new_tokens = min_new_tokens

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        short = [i for i in range(len(rows)) if context.new_tokens(i) < self.min_new_tokens]
        return _mask_eos_where(rows, context, short)

    def masked(self, context: ProcessContext) -> Sequence[int]:
        return context.eos_token_ids if len(context.output) < self.min_new_tokens else ()

    def holds_back(self, context: ProcessContext, row: int, token: int) -> bool:
        return token in context.eos_token_ids and context.new_tokens(row) < self.min_new_tokens


class PrefixRun(Processor):
    """``members`` (neighbouring ``_Prefixed`` processors, in the configured order) as one step.

    When no row has a drafted path and every member's record follows the context, the tallied penalties' logits
    are gathered once (the union of their tokens, from a JointTally) and each member updates them in turn: a
    repetition penalty scales them (only its own tokens when the union holds others), a presence or frequency
    penalty subtracts its operand, a masking member sets its tokens to -inf (among the gathered logits when the
    union holds them, so later members see -inf as they would one by one; directly in the rows otherwise, where
    no later member touches them); then the logits go back. The arithmetic is each member's own, elementwise,
    in the same order, so the rows equal the members' one after another. Any other call runs the members one by
    one.
    """

    def __init__(self, members: tuple[_Prefixed, ...]) -> None:
        self.members = members
        tallied = [m for m in members if isinstance(m, _Tallied)]
        #: the records the fused paths read: the joint record and the masking members' (the penalties' own
        #: tallies serve only a call that runs the members one by one, which checks them itself)
        self._records = tuple(m.record for m in members if m.record is not None and not isinstance(m, _Tallied))
        self._joint = JointTally([m.tallied for m in tallied if m.tallied is not None])
        if tallied:
            # the joint record follows the first penalty's tally; the tallies themselves are read only when a
            # call runs the members one by one, so they take their tokens in then (a chain folds neighbours in
            # turn: the run it keeps, built last, is the one that stays the follower)
            tallied[0].tally.follower = self._joint
            self._records = (*self._records, self._joint)
            for member in tallied:
                member.tally.lazy = True
        union_has_prompt = any(m.include_prompt for m in tallied)
        #: per member: ("scale", joint index, factor, whether the union is all its tokens), ("sub", joint index)
        #: or ("mask", member)
        self._ops: list[tuple[Any, ...]] = []
        for member in members:
            if member.tallied is None:
                self._ops.append(("mask", member))
                continue
            at = len([op for op in self._ops if op[0] != "mask"])
            kind, amount, include_prompt = member.tallied
            if kind == JointTally.SCALE:
                self._ops.append(("scale", at, amount, include_prompt or not union_has_prompt))
            else:
                self._ops.append(("sub", at))
        self._lowers_only = all(member.lowers_only for member in tallied)
        #: per member, for bound_argmax_at: (member, its index in the joint record or None for a masking member)
        self._scalar: list[tuple[_Prefixed, int | None]] = []
        for member in members:
            self._scalar.append((member, tallied.index(member) if isinstance(member, _Tallied) else None))

    def fuse(self, following: object) -> PrefixRun | None:
        return PrefixRun((*self.members, following)) if isinstance(following, _Prefixed) else None

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for path in context.paths:
            if len(path):
                return self._one_by_one(rows, context)
        for record in self._records:
            if not record.follows(context):
                return self._one_by_one(rows, context)
        joint, vocab = self._joint, rows.shape[1]
        ids = joint.ids  # empty without a tallied member
        values = rows[:, ids]
        for op in self._ops:
            if op[0] == "scale":
                scaled = _scaled(values, op[2])
                values = scaled if op[3] else np.where(joint.operand(op[1]), scaled, values)
            elif op[0] == "sub":
                values -= joint.operand(op[1])
            else:
                for token in op[1].masked(context):
                    at = joint.position.get(token)
                    if at is not None:
                        values[:, at] = NEG_INF
                    elif token < vocab:  # EOS ids may lie outside the vocabulary
                        rows[:, token] = NEG_INF
        if ids.size:
            rows[:, ids] = values
        return rows

    def bound_argmax_at(
        self, context: ProcessContext, row: int, token: int, top: float, second: float
    ) -> tuple[float, float] | None:
        """The members' bounds in turn on ``token``'s logit alone, its counts read from the joint record (plus this
        row's path), when every penalty only lowers logits."""
        if not self._lowers_only:
            return None
        for record in self._records:
            if not record.follows(context):
                return None
        counts, extra = self._joint.counts, _occurrences(context.paths[row], token)
        value: float | None = top
        for member, at in self._scalar:
            if at is None:
                if member.holds_back(context, row, token):
                    return None
            else:
                count = counts[at].get(token, 0) + extra
                if count:
                    value = member.lower(value, count)  # type: ignore[attr-defined,arg-type]
        return value, second  # type: ignore[return-value]

    def _one_by_one(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for member in self.members:
            rows = member(rows, context)
        return rows

    def __repr__(self) -> str:
        return f"PrefixRun({', '.join(type(member).__name__ for member in self.members)})"


class LogitBias(Processor):
    """logit_t <- logit_t + bias_t for each given TOKEN:BIAS (-100 practically bans a token, +100 forces it)."""

    def __init__(self, biases: dict[int, float]) -> None:
        self.tokens = np.fromiter(biases, np.int64)
        self.biases = np.fromiter(biases.values(), np.float32)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        check_vocab(self.tokens, rows.shape[1], "logits processor 'logit-bias'")
        rows[:, self.tokens] += self.biases
        return rows


class BadWords(Processor):
    """For each banned sequence (w_1..w_k): logit_{w_k} <- -inf when the prefix ends with w_1..w_{k-1} (always
    for k = 1), so the sequence is never completed. A single-token sequence that is an EOS id is ignored, as
    in transformers (ban EOS with suppress_tokens or min_new_tokens instead)."""

    def __init__(self, sequences: Sequence[Sequence[int]]) -> None:
        self.sequences = tuple(tuple(s) for s in sequences)
        self.singles = np.array([s[0] for s in self.sequences if len(s) == 1], np.int64)
        by_length: dict[int, list[tuple[int, ...]]] = {}
        for sequence in self.sequences:
            if len(sequence) > 1:
                by_length.setdefault(len(sequence) - 1, []).append(sequence)
        #: prefix length -> (int64[m, length] prefixes, int64[m] the token each bans)
        self.groups = {
            length: (np.array([s[:-1] for s in group], np.int64), np.array([s[-1] for s in group], np.int64))
            for length, group in by_length.items()
        }

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        check_vocab((t for s in self.sequences for t in s), rows.shape[1], "logits processor 'bad-words'")
        singles = self.singles[~np.isin(self.singles, list(context.eos_token_ids))]
        rows[:, singles] = NEG_INF
        for index, row in enumerate(rows):
            prefix = context.prefix(index)
            for length, (prefixes, last) in self.groups.items():
                if length <= len(prefix):
                    row[last[(prefixes == prefix[len(prefix) - length :]).all(axis=1)]] = NEG_INF
        return rows


class SuppressTokens(Processor):
    """logit_t <- -inf for every given token, at every position."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = np.array(tokens, np.int64)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        check_vocab(self.tokens, rows.shape[1], "logits processor 'suppress-tokens'")
        rows[:, self.tokens] = NEG_INF
        return rows


class ExponentialDecayLengthPenalty(Processor):
    """Once g = generated tokens exceeds ``start``: logit_eos <- logit_eos + |logit_eos| * (factor^(g - start) - 1),
    so EOS grows ever more likely (a masked EOS stays masked)."""

    def __init__(self, start: int, factor: float) -> None:
        self.start = start
        self.factor = factor

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        eos = _eos(context, rows.shape[1])
        for index, row in enumerate(rows):
            excess = context.new_tokens(index) - self.start
            if excess > 0 and eos.size:
                values = row[eos]
                finite = np.isfinite(values)
                values[finite] += np.abs(values[finite]) * np.float32(self.factor**excess - 1.0)
                row[eos] = values
        return rows
