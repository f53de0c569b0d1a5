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
a builder export). A forward that ends inside an image's tokens (a prompt chunk) feeds them causally for now; the
next forward rewinds them and feeds the whole block, with its own tokens, as above. Nothing reads those rows in
between: a prompt's chunks go in one after another, and only its last chunk's logits are read, which never ends on
an image token (a forward asked for the logits of an image token whose image is not all in is refused).
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

    def run(self, runner: Runner, tokens: np.ndarray, keep: int | None) -> RunOutputs | None:
        """Feed ``tokens`` (int64[n]) after the runner's length where an image block is among them or open at the
        end of its cache; the outputs of the rows the caller reads (``keep`` as Runner.run takes it), copied out
        of the runner's buffers. None: no block, the runner feeds them as it does any."""
        held = 0 if runner.images is None else len(runner.images.rows)
        start = self._open_block(runner, held)
        if start is not None:  # the block the last forward ended in goes in again, whole, with these tokens
            reopened = np.concatenate([runner.fed_tokens(start, runner.length), tokens])
            runner.truncate(start)
            out = self._feed(runner, reopened, len(tokens) if keep is None else min(keep, len(tokens)), held)
            return _outputs(out.logits, _tail(out.hidden, tokens), _tail(out.aux, tokens))
        return self._feed(runner, tokens, keep, held) if self._pieces(runner, tokens, held) else None

    def _open_block(self, runner: Runner, held: int) -> int | None:
        """Where the image tokens at the end of the cache begin, where the last one took a feature (a block a
        forward ended in, fed causally); None where the cache ends otherwise."""
        end = runner.length
        if end == 0 or runner.fed_tokens(end - 1, end)[0] != self.image_token or runner.feature_row(end) > held:
            return None
        start = end - 1
        while start > 0 and runner.fed_tokens(start - 1, start)[0] == self.image_token:
            start -= 1
        return start

    def _pieces(self, runner: Runner, tokens: np.ndarray, held: int) -> list[tuple[int, int, bool]]:
        """``tokens`` cut into (start, end, is_block) pieces, in order: the runs of image tokens that take features
        are blocks. [] where no image token takes one."""
        images = np.flatnonzero(tokens == self.image_token)[: max(0, held - runner.feature_row(runner.length))]
        if not len(images):
            return []
        pieces: list[tuple[int, int, bool]] = []
        at = 0
        starts = images[np.r_[True, np.diff(images) > 1]]
        ends = images[np.r_[np.diff(images) > 1, True]] + 1
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            if start > at:
                pieces.append((at, start, False))
            pieces.append((start, end, True))
            at = end
        if at < len(tokens):
            pieces.append((at, len(tokens), False))
        return pieces

    def _feed(self, runner: Runner, tokens: np.ndarray, keep: int | None, held: int) -> RunOutputs:
        n = len(tokens)
        tail = n if keep is None else min(keep, n)
        logits, hidden, aux = [], [], []
        for start, end, block in self._pieces(runner, tokens, held):
            wanted = max(0, min(end - start, tail - (n - end))) if keep is not None else None
            piece = tokens[start:end]
            # positions given: the runner feeds the piece as it is (a block just fed ends the cache for now)
            positions = np.arange(runner.length, runner.length + len(piece), dtype=np.int64)
            if block and end == n:  # open: the rest of the image comes in the next forward
                if wanted != 0:
                    raise CapabilityError(
                        f"model {runner.model.name} attends bidirectionally among an image's tokens, so no image "
                        "token's logits exist before the whole image has gone in, and this forward asks for them: "
                        "feed the image's tokens and the token after them first"
                    )
                out = runner.run(piece, positions=positions, keep=0)
            elif block:
                out = self._block(runner, piece, wanted)
            else:
                out = runner.run(piece, positions=positions, keep=wanted)
            rows = len(out.logits) if wanted is None else min(wanted, len(out.logits))
            logits.append(out.logits[len(out.logits) - rows :].copy())
            if out.hidden is not None:
                hidden.append(out.hidden.copy())
            if out.aux is not None:
                aux.append(out.aux.copy())
        return _outputs(
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


def _tail(rows: np.ndarray | None, tokens: np.ndarray) -> np.ndarray | None:
    return None if rows is None else rows[-len(tokens) :]


def _outputs(logits: np.ndarray, hidden: np.ndarray | None, aux: np.ndarray | None) -> RunOutputs:
    from decoctl.model._runner import RunOutputs

    return RunOutputs(logits, hidden, aux)
