"""The logits-processor contract and the chain that host.process() runs.

A processor sees rows of logits, each with its own prefix: the prompt, the committed output, and the tokens a
controller drafted before that row. Controllers that verify drafted tokens therefore see exactly the
distribution plain decoding would have seen at that position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["LogitsProcessor", "ProcessContext", "ProcessorChain"]


class ProcessContext:
    """What the rows of one process() call condition on.

    ``prompt``: int64[p]; ``output``: int64[m], the committed tokens; ``paths[i]``: the drafted tokens between
    the committed output and row i (empty for the next position). ``eos_token_ids``: the target model's EOS ids
    (for processors that hold EOS back); ``tokenizer``: the target's tokenizer, or None outside a host (for
    processors that need the vocabulary's text, such as a grammar).
    """

    __slots__ = ("eos_token_ids", "output", "paths", "prompt", "tokenizer")

    def __init__(
        self,
        prompt: np.ndarray,
        output: np.ndarray,
        paths: Sequence[Sequence[int]],
        *,
        eos_token_ids: frozenset[int] = frozenset(),
        tokenizer: Any = None,
    ) -> None:
        self.prompt = prompt
        self.output = output
        self.paths = paths
        self.eos_token_ids = frozenset(eos_token_ids)
        self.tokenizer = tokenizer

    def prefix(self, row: int) -> np.ndarray:
        """int64[p + m + len(paths[row])]: every token before row ``row``'s position."""
        path = self.paths[row]
        if not len(path):
            return np.concatenate((self.prompt, self.output))
        return np.concatenate((self.prompt, self.output, np.asarray(path, np.int64)))

    def new_tokens(self, row: int) -> int:
        """How many generated tokens precede row ``row`` (committed plus drafted)."""
        return len(self.output) + len(self.paths[row])


@runtime_checkable
class LogitsProcessor(Protocol):
    """One step of a chain. ``__call__`` returns float32[n, vocab]; it may modify ``rows`` in place (the
    chain hands it a private copy). Stateful processors (a grammar) advance in ``commit`` and start over in
    ``reset``; they must not advance on drafted tokens, which reach them only through ``context.paths``.
    A processor with a true ``terminal`` attribute (greedy, sample) must come last in its chain."""

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray: ...

    def commit(self, tokens: Sequence[int]) -> None: ...

    def reset(self, prompt: np.ndarray) -> None: ...


class ProcessorChain:
    """Processors applied in order. An empty chain is the identity and copies nothing."""

    def __init__(self, processors: Sequence[LogitsProcessor] = ()) -> None:
        self.processors = tuple(processors)

    def __bool__(self) -> bool:
        return bool(self.processors)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if not self.processors:
            return rows
        out = np.array(rows, dtype=np.float32, copy=True)
        for processor in self.processors:
            out = processor(out, context)
        return out

    def commit(self, tokens: Sequence[int]) -> None:
        for processor in self.processors:
            processor.commit(tokens)

    def reset(self, prompt: np.ndarray) -> None:
        for processor in self.processors:
            processor.reset(prompt)
