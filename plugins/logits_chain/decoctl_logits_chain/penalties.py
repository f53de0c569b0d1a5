"""Processors that look at the prefix or at fixed token ids: penalties, bans, biases and length rules.

Every row is processed with its own prefix (``context.prefix(row)``: prompt, committed output, then the tokens
drafted before that row), so a verifier sees what plain decoding would have seen at that position. Loops run
over rows and prefix tokens, never over the vocabulary. Prefix tokens are ids below the vocabulary size (the host
checks every token it feeds), so they index rows directly. The penalties and no_repeat_ngram keep their counts
up to date through ``reset``/``commit`` (decoctl_logits_chain.history) and recount only for a context they did
not follow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from decoctl import ProcessContext
from decoctl_logits_chain.base import NEG_INF, Processor, check_vocab
from decoctl_logits_chain.history import NGramTable, TokenTally

__all__ = [
    "BadWords",
    "ExponentialDecayLengthPenalty",
    "FrequencyPenalty",
    "LogitBias",
    "MinLength",
    "MinNewTokens",
    "NoRepeatNGram",
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


class _Recording(Processor):
    """A processor whose ``record`` (decoctl_logits_chain.history) follows the generation through reset/commit."""

    record: TokenTally | NGramTable

    def reset(self, prompt: np.ndarray) -> None:
        self.record.reset(prompt)

    def commit(self, tokens: Sequence[int]) -> None:
        self.record.commit(tokens)


class _Tallied(_Recording):
    """A penalty over the distinct tokens before each row (with their counts), kept in a TokenTally."""

    def __init__(self, include_prompt: bool) -> None:
        self.include_prompt = include_prompt
        self.record = self.tally = TokenTally(include_prompt)

    def _seen(self, context: ProcessContext, row: int) -> tuple[np.ndarray, np.ndarray]:
        """(int64[u] the distinct tokens before ``row``, float32[u] how often each occurred)."""
        if self.tally.follows(context):
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

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for index, row in enumerate(rows):
            seen, _ = self._seen(context, index)
            values = row[seen]
            row[seen] = np.where(values < 0, values * self.penalty, values / self.penalty)
        return rows


class _CountPenalty(_Tallied):
    def __init__(self, amount: float, include_prompt: bool = False) -> None:
        super().__init__(include_prompt)
        self.amount = np.float32(amount)


class PresencePenalty(_CountPenalty):
    """logit_t <- logit_t - presence_penalty * [count_t > 0], count_t the occurrences of t among the generated
    tokens (the prompt's too with include_prompt=true). Negative values encourage repetition."""

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for index, row in enumerate(rows):
            seen, _ = self._seen(context, index)
            row[seen] -= self.amount
        return rows


class FrequencyPenalty(_CountPenalty):
    """logit_t <- logit_t - frequency_penalty * count_t, count_t the occurrences of t among the generated tokens
    (the prompt's too with include_prompt=true). Negative values encourage repetition."""

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for index, row in enumerate(rows):
            seen, counts = self._seen(context, index)
            row[seen] -= self.amount * counts
        return rows


class NoRepeatNGram(_Recording):
    """With n = ngram_size and the prefix's last n-1 tokens s: logit_t <- -inf for every t such that s + (t,)
    already occurs in the prefix (an n-gram never repeats). n = 1 bans every token seen."""

    def __init__(self, ngram_size: int) -> None:
        self.n = ngram_size
        self.record = self.table = NGramTable(ngram_size)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        follows = self.table.follows(context)
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


class MinLength(Processor):
    """logit_eos <- -inf while the whole sequence (prompt + generated) is shorter than min_length."""

    def __init__(self, min_length: int) -> None:
        self.min_length = min_length

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        short = [i for i in range(len(rows)) if len(context.prompt) + context.new_tokens(i) < self.min_length]
        return _mask_eos_where(rows, context, short)


class MinNewTokens(Processor):
    """logit_eos <- -inf while fewer than min_new_tokens tokens were generated (the prompt does not count)."""

    def __init__(self, min_new_tokens: int) -> None:
        self.min_new_tokens = min_new_tokens

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        short = [i for i in range(len(rows)) if context.new_tokens(i) < self.min_new_tokens]
        return _mask_eos_where(rows, context, short)


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
