"""Biases that depend on where a row is: what its prefix ends with (``sequence_bias``), or whether it is the first
generated position (``suppress_tokens_at_begin``). Both match transformers' processors of the same name."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from decoctl import ProcessContext
from decoctl_logits_chain.base import NEG_INF, Processor, check_vocab

__all__ = ["SequenceBias", "SuppressTokensAtBegin"]


class SequenceBias(Processor):
    """For each (sequence, bias): a one-token sequence's token gets ``bias`` at every position; a longer one's last
    token gets it where the row's prefix ends with the rest of the sequence (transformers'
    ``SequenceBiasLogitsProcessor``; biases of several sequences ending in the same token add up)."""

    def __init__(self, biases: Sequence[tuple[Sequence[int], float]]) -> None:
        single: dict[int, float] = {}
        longer: list[tuple[np.ndarray, int, np.float32]] = []
        for sequence, bias in biases:
            tokens = [int(t) for t in sequence]
            if len(tokens) == 1:
                single[tokens[0]] = single.get(tokens[0], 0.0) + float(bias)
            else:
                longer.append((np.array(tokens[:-1], np.int64), tokens[-1], np.float32(bias)))
        self.single_ids = np.array(sorted(single), np.int64)
        self.single_bias = np.array([single[t] for t in sorted(single)], np.float32)
        self.longer = longer
        self._ids = [int(t) for sequence, _ in biases for t in sequence]

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        check_vocab(self._ids, rows.shape[1], "logits processor 'sequence-bias'")
        if self.single_ids.size:
            rows[:, self.single_ids] += self.single_bias
        for index, row in enumerate(rows):
            prefix = context.prefix(index)
            for head, last, bias in self.longer:
                if head.size <= prefix.size and np.array_equal(prefix[prefix.size - head.size :], head):
                    row[last] += bias
        return rows


class SuppressTokensAtBegin(Processor):
    """logit_t <- -inf for the given tokens at generated position ``at`` only (0: the first generated token), as
    transformers' ``SuppressTokensAtBeginLogitsProcessor`` does at its ``begin_index``."""

    def __init__(self, tokens: Sequence[int], at: int = 0) -> None:
        self.tokens = np.array(tokens, np.int64)
        self.at = at

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        check_vocab(self.tokens, rows.shape[1], "logits processor 'suppress-tokens-at-begin'")
        for index in range(len(rows)):
            if context.new_tokens(index) == self.at:
                rows[index, self.tokens] = NEG_INF
        return rows
