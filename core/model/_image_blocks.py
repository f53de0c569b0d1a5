"""Bidirectional attention among an image's tokens through a causal attention kernel, exactly (Gemma 3).

transformers' Gemma 3 lets the image soft tokens of one image attend to each other in both directions while the
prompt goes in (``token_type_ids`` -> an or-mask over each run of image tokens, on every layer, the sliding ones
within their window); every other token, and every token of a decode step, attends causally. onnxruntime's
GroupQueryAttention is causal whatever bias it is given: a bias can hide keys, never show a later one.

A block of N image tokens after P cached tokens goes in as copies instead. Copy 0 is fed causally at slots P..P+N-1.
Copy c (c >= 1) is fed after copy c - 1 at the same positions P..P+N-1, and its bias shows it the cached prefix and
all of copy c - 1, nothing of itself; then its KV rows move onto copy c - 1's slots (the cache is P + N long again).
Each layer's keys and values of copy c come from copy c's input to that layer, which is the block's true
(bidirectional) hidden state if copy c - 1 was true one layer lower; the embeddings (the input to layer 1) are true in
every copy. So after copies 0..L, L the decoder's layers, the cached rows and the last copy's logits are those of
the bidirectional forward: L + 1 forwards of N tokens for a block, a prompt's text forwards as it would.

It needs the decoder's ``position_ids`` and ``attention_bias`` inputs (``decoctl models enable-tree`` adds them to
a builder export) and an image's tokens in one forward: a forward that ends on an image token that takes features is
refused (the block may go on in the next), never fed as a causal part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from decoctl.errors import CapabilityError

if TYPE_CHECKING:
    from decoctl.model._runner import Runner, RunOutputs

__all__ = ["BidirectionalImages"]


class BidirectionalImages:
    """Feeds the fed tokens' image blocks as ``layers`` + 1 copies (see the module docstring)."""

    def __init__(self, *, layers: int, image_token: int) -> None:
        self.layers = layers
        self.image_token = image_token

    def spans(self, tokens: np.ndarray, pending: int, model: str) -> list[tuple[int, int, bool]]:
        """The fed ``tokens`` (int64[n]) cut into (start, end, is_block) pieces, in order: the runs of image tokens
        that take the ``pending`` feature rows are blocks. [] where no block is fed. CapabilityError where the
        tokens end inside one."""
        images = np.flatnonzero(tokens == self.image_token)[:pending]
        if not len(images):
            return []
        if images[-1] == len(tokens) - 1:
            raise CapabilityError(
                f"model {model} attends bidirectionally among an image's tokens, so they go in one forward with the "
                "token after them, but this forward of the prompt ends on an image token: feed the prompt whole (no "
                "prefill_chunk, or one that keeps each image's tokens and the token after them together)"
            )
        pieces: list[tuple[int, int, bool]] = []
        at = 0
        starts = images[np.r_[True, np.diff(images) > 1]]
        ends = images[np.r_[np.diff(images) > 1, True]] + 1
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            if start > at:
                pieces.append((at, start, False))
            pieces.append((start, end, True))
            at = end
        pieces.append((at, len(tokens), False))
        return pieces

    def run(
        self, runner: Runner, tokens: np.ndarray, pieces: list[tuple[int, int, bool]], keep: int | None
    ) -> RunOutputs:
        """Feed ``tokens`` piece by piece; the outputs of the rows the caller reads (``keep`` as Runner.run takes
        it), copied out of the runner's buffers."""
        from decoctl.model._runner import RunOutputs

        n = len(tokens)
        tail = n if keep is None else min(keep, n)
        logits, hidden, aux = [], [], []
        for start, end, block in pieces:
            wanted = max(0, min(end - start, tail - (n - end))) if keep is not None else None
            piece = tokens[start:end]
            out = self._block(runner, piece, wanted) if block else runner.run(piece, keep=wanted)
            rows = len(out.logits) if wanted is None else min(wanted, len(out.logits))
            logits.append(out.logits[len(out.logits) - rows :].copy())
            if out.hidden is not None:
                hidden.append(out.hidden.copy())
            if out.aux is not None:
                aux.append(out.aux.copy())
        return RunOutputs(
            np.concatenate(logits),
            np.concatenate(hidden) if hidden else None,
            np.concatenate(aux) if aux else None,
        )

    def _block(self, runner: Runner, block: np.ndarray, keep: int | None) -> RunOutputs:
        n = len(block)
        start = runner.length
        positions = np.arange(start, start + n, dtype=np.int64)
        first = runner.feature_row(start)
        out = runner.run(block, positions=positions, keep=0 if self.layers else keep)
        bias = np.zeros((n, 2 * n), np.float32)
        bias[:, n:] = -np.inf  # a copy sees the copy before it, not itself
        slots = np.concatenate([positions, positions])
        for copy in range(1, self.layers + 1):
            runner.set_feature_row(start + n, first)  # every copy takes the block's own feature rows
            out = runner.run(
                block, positions=positions, bias=bias, bias_positions=slots, keep=keep if copy == self.layers else 0
            )
            runner.gather(np.arange(start + n, start + 2 * n, dtype=np.int64), start)
        return out
