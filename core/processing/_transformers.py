"""transformers' logits processors in a decoctl chain: ``decoctl.from_transformers(processor)``.

    from transformers import RepetitionPenaltyLogitsProcessor, NoRepeatNGramLogitsProcessor
    Generator({"target": "pycode"}, "speculative", processors=[
        decoctl.from_transformers(RepetitionPenaltyLogitsProcessor(1.3)),
        decoctl.from_transformers(NoRepeatNGramLogitsProcessor(3)),
    ])

A transformers processor is called as ``processor(input_ids, scores)`` with a LongTensor[batch, length] of the tokens
so far and a FloatTensor[batch, vocab]. The adapter gives it each row's own prefix as its input_ids (the prompt, the
committed output and the tokens a controller drafted before that row: what transformers' generate would have at that
position), so it runs under every controller, a speculative verification's rows included. Rows whose prefixes have the
same length go to it together, as one batch; the scores are the rows themselves (shared with torch, not copied).

torch is imported here only, when an adapter is made; decoctl never imports transformers (the processor's own module
has done that).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from decoctl.errors import ConfigError, PluginError
from decoctl.processing._chain import ProcessContext

__all__ = ["TransformersProcessor", "from_transformers"]


class TransformersProcessor:
    """A transformers LogitsProcessor as a decoctl processor (see the module docstring). It keeps no state between
    calls (transformers' processors read everything from input_ids), so it serves several sequences as it is.

    ``sample_only``: the processor only shapes a distribution to draw from, as transformers' warpers do (temperature,
    top_k, top_p, ...): beam search refuses it, as transformers leaves warpers out of beam search. By default, true
    for a class whose name ends in "Warper".
    """

    stateless = True

    def __init__(self, processor: Any, *, sample_only: bool | None = None) -> None:
        import torch  # only here: decoctl runs without torch unless a transformers processor is used

        self._torch = torch
        self.processor = processor
        self.name = f"{type(processor).__name__} (transformers)"
        self.sample_only = type(processor).__name__.endswith("Warper") if sample_only is None else sample_only

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        torch = self._torch
        lengths = [context.new_tokens(row) for row in range(len(rows))]
        if len(set(lengths)) == 1:  # one batch: every row's prefix has the same length (the usual case)
            groups = [list(range(len(rows)))]
        else:
            by_length: dict[int, list[int]] = {}
            for row, length in enumerate(lengths):
                by_length.setdefault(length, []).append(row)
            groups = list(by_length.values())
        with torch.no_grad():
            for members in groups:
                ids = torch.from_numpy(np.stack([context.prefix(row) for row in members]))
                whole = len(members) == len(rows)
                scores = torch.from_numpy(rows if whole else rows[members])
                out = self.processor(ids, scores)
                if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(scores.shape):
                    shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                    raise PluginError(
                        f"logits processor {self.name!r} returned {shape} for scores of shape {list(scores.shape)}: a "
                        "transformers processor returns a FloatTensor of its scores' shape"
                    )
                processed = out.detach().to(torch.float32).numpy()
                if whole:
                    if processed is not rows and not np.shares_memory(processed, rows):
                        rows[...] = processed
                else:
                    rows[members] = processed
        return rows


def from_transformers(processor: Any, *, sample_only: bool | None = None) -> TransformersProcessor:
    """``processor`` (a ``transformers.LogitsProcessor``, or anything called as ``processor(input_ids, scores)``) as a
    decoctl logits processor, for ``processors=[...]`` under any controller. ``sample_only``: see
    TransformersProcessor (default: true for transformers' warpers)."""
    if isinstance(processor, type):
        raise ConfigError(
            f"from_transformers({processor.__qualname__}): that is a class; pass an instance "
            f"({processor.__qualname__}(...))"
        )
    if isinstance(processor, TransformersProcessor):
        raise ConfigError(f"from_transformers({processor.name}): it is wrapped already; pass it as it is")
    if not callable(processor):
        raise ConfigError(
            f"from_transformers({type(processor).__name__}): it is not callable; give a transformers LogitsProcessor, "
            "called as processor(input_ids, scores)"
        )
    return TransformersProcessor(processor, sample_only=sample_only)
