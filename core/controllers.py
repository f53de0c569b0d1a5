"""The Controller protocol and the two baselines every other controller is measured against.

A controller drives one generation through host primitives only. ``start(host)`` runs once after the prompt
is in the target's KV cache (``host.target.logits()`` holds the prompt's last row); ``step(host)`` is called
until ``host.done`` and must commit at least one token or finish the generation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from decoctl.host import Host
from decoctl.specs import ControllerSpec, Option
from decoctl.verify import draw

__all__ = ["Controller", "Greedy", "Sample", "builtin_controllers", "sample_from_logits"]


@runtime_checkable
class Controller(Protocol):
    """What a decode strategy implements. Optional: ``stats() -> Mapping[str, Any]`` for its own counters."""

    def start(self, host: Host) -> None: ...

    def step(self, host: Host) -> None: ...


class Greedy:
    """Commit the argmax of the (processed) target logits, one token per target forward."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        del options

    def start(self, host: Host) -> None:
        del host

    def step(self, host: Host) -> None:
        target = host.target
        token = int(host.argmax(target.logits()[-1:])[0])
        host.commit((token,))
        if not host.done:
            target.forward((token,))


def sample_from_logits(row: np.ndarray, rng: np.random.Generator, temperature: float = 1.0) -> int:
    """Draw a token from softmax(row / temperature) by inverting the CDF at one uniform draw.

    row: float32[vocab]. One draw per token keeps a seeded generation reproducible across controllers.
    """
    scaled = row.astype(np.float64) / temperature
    scaled -= scaled.max()
    return draw(np.exp(scaled), rng)


class Sample:
    """Sample from softmax(processed logits / temperature) with the generation's seeded rng."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.temperature = float(options["temperature"])

    def start(self, host: Host) -> None:
        del host

    def step(self, host: Host) -> None:
        target = host.target
        row = host.process(target.logits()[-1:])[0]
        token = sample_from_logits(row, host.rng, self.temperature)
        host.commit((token,))
        if not host.done:
            target.forward((token,))


def builtin_controllers() -> tuple[ControllerSpec, ...]:
    return (
        ControllerSpec(
            name="greedy",
            summary="argmax of the target's logits, one token per forward (the baseline)",
            factory=Greedy,
        ),
        ControllerSpec(
            name="sample",
            summary="seeded multinomial sampling at a temperature (the sampling baseline)",
            factory=Sample,
            options=(
                Option(
                    name="temperature",
                    type="float",
                    default=1.0,
                    minimum=1e-6,
                    help="divide logits by this before softmax",
                ),
            ),
        ),
    )
