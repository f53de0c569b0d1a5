"""The ``chain`` controller: one token per target forward, drawn from the processed distribution."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from decoctl import ControllerError, Host, sample_from_logits

__all__ = ["ChainController", "pick_token"]


def pick_token(row: np.ndarray, rng: np.random.Generator) -> int:
    """A token from float32[vocab] processed logits: the only unmasked token when one is left (a greedy
    terminal, top_k=1; no random draw), else a draw from softmax(row) with ``rng``."""
    alive = int(np.count_nonzero(row > -np.inf))
    if alive == 0:
        raise ControllerError(
            "the logits processors masked every token of a row (for example a grammar that the committed text "
            "can no longer satisfy, or bans that cover the vocabulary): loosen the chain"
        )
    if alive == 1:
        return int(np.argmax(row))
    return sample_from_logits(row, rng)


class ChainController:
    """Sample each token from the processor chain's output (``--processors``) with the generation's seeded rng;
    with a ``greedy`` terminal (or any chain that leaves one token) it takes the argmax instead."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        del options

    def start(self, host: Host) -> None:
        del host

    def step(self, host: Host) -> None:
        target = host.target
        token = pick_token(host.process(target.logits()[-1:])[0], host.rng)
        host.commit((token,))
        if not host.done:
            target.forward((token,))
