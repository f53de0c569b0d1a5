"""The Controller protocol, the two baselines every other controller is measured against, and beam search.

A controller drives one generation through host primitives only. ``step(host)`` is called until ``host.done`` and
must commit at least one token or finish the generation; the optional ``start(host)`` runs once before, after the
prompt is in the target's KV cache (``host.target.logits()`` holds the prompt's last row).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from decoctl.controllers._beam import beam_spec
from decoctl.errors import ConfigError
from decoctl.host import Host
from decoctl.specs import ControllerSpec, Option
from decoctl.verify import draw

__all__ = [
    "Controller",
    "Greedy",
    "RowController",
    "Sample",
    "builtin_controllers",
    "sample_from_logits",
    "start_controller",
]


@runtime_checkable
class Controller(Protocol):
    """What a decode strategy implements: ``step(host)``, the one required method, commits at least one token
    (``host.commit``) or finishes the generation.

    Optional, with their defaults:

    - ``start(host)`` (default: nothing): runs once per generation before the first step, after the prompt's
      prefill; ``host.target.logits()`` holds the prompt's last row. A controller object used for several
      generations (an instance given to a Generator) starts each one afresh here.
    - ``stats() -> Mapping[str, Any]`` (default: none): the controller's own counters, in the result's
      ``stats.controller``.
    - ``next_token(host) -> int`` (default: none): the token ``step`` would commit next, read from the last row of
      ``host.target.logits()``; with it, batched prompts step this controller's prompts together (RowController).
    - ``resume(host)`` (default: none): take the generation back after another controller stepped it, which left
      the last committed token in the target's KV cache and its logits ready (greedy's state); the controller
      rebuilds what it keeps of the context from ``host.prompt_tokens`` and ``host.output_tokens``. With it,
      ``decoctl serve`` moves a speculating row that verifies greedily into its batched one-token step and back,
      step by step, as its measured costs say; without it, such a move is for good.

    A controller class given to a Generator (or as ``file.py:Class``) may also say, as class attributes, what a
    plugin's ControllerSpec says: ``roles``, ``capabilities``, ``options`` (its Option schema, checked before it is
    built as ``Class(options)``), and ``roles_for``, ``capabilities_for``, ``check_options``, ``rows_for``,
    ``scratch_for`` as static methods taking the parsed options (decoctl.plugins.controller_spec_of).
    """

    def step(self, host: Host) -> None:
        """Commit at least one token (or finish the generation) with the host's primitives."""
        ...


def start_controller(controller: Any, host: Host) -> None:
    """``controller.start(host)`` where the controller has one (it is optional: Controller)."""
    start = getattr(controller, "start", None)
    if start is not None:
        start(host)


@runtime_checkable
class RowController(Protocol):
    """A controller that batched prompts (decoctl.generation) step one row per prompt, many prompts in one Run:
    ``start(host)`` as usual (where it has one), then ``next_token(host)``, the token its step() would commit next,
    read from ``host.target.logits()``'s last row; the batch commits it and feeds it. Its ControllerSpec says
    ``batched=True`` (a controller class with ``next_token`` gets it without saying so)."""

    def next_token(self, host: Host) -> int:
        """The token step() would commit next, from the last row of ``host.target.logits()``."""
        ...


class Greedy:
    """Commit the argmax of the (processed) target logits, one token per target forward."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        del options

    def start(self, host: Host) -> None:
        """Nothing to set up: greedy keeps no state."""
        del host

    def next_token(self, host: Host) -> int:
        """The token step() commits next (batched prompts call this, one row per prompt; decoctl.generation)."""
        return int(host.argmax(host.target.logits()[-1:])[0])

    def step(self, host: Host) -> None:
        """Commit the processed argmax of the target's last logits and feed it."""
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


def _sample_scored(row: np.ndarray, rng: np.random.Generator, temperature: float) -> tuple[int, float]:
    """sample_from_logits' draw (the same token for the same rng) and the token's log-probability under
    softmax(row / temperature)."""
    scaled = row.astype(np.float64) / temperature
    scaled -= scaled.max()
    weights = np.exp(scaled)
    token = draw(weights, rng)
    return token, float(scaled[token] - np.log(weights.sum()))


class Sample:
    """Sample from softmax(processed logits / temperature) with the generation's seeded rng.

    ``n`` > 1 (or ``best_of``) draws several samples that share one prefill: rows forked from row 0 (their KV
    copied, not recomputed), one completion each (``host.new_output``), every unfinished row stepped in one
    onnxruntime Run a step (``rows.step``), each completion with its own stop rules. Sample 0 draws from
    ``host.rng``, as n=1 does; sample i from the i-th stream ``host.rng.spawn`` gives, so a seed fixes every
    sample. Each completion's score is the mean log-probability of its tokens under the distribution they were
    drawn from (softmax(processed / temperature)); ``best_of`` = M > n samples M and keeps the n best by that
    score, best first (vLLM's best_of). Without best_of the samples stay in their order.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.temperature = float(options["temperature"])
        self.n = int(options.get("n") or 1)
        self.best_of = int(options.get("best_of") or self.n)
        #: several samples: each sample's row, rng, log-probability sum and token count
        self._rows: list[int] = []
        self._outputs: list[int] = []
        self._streams: list[np.random.Generator] = []
        self._logprob = np.zeros(0)
        self._taken = np.zeros(0, np.int64)
        #: the unfinished samples and their rows' last logits, float32[len(live), vocab]
        self._live: list[int] = []
        self._pending = np.zeros((0, 0), np.float32)

    def next_token(self, host: Host) -> int:
        """The token step() commits next with one sample (batched prompts call this, one row per prompt)."""
        row = host.process(host.target.logits()[-1:])[0]
        return sample_from_logits(row, host.rng, self.temperature)

    def start(self, host: Host) -> None:
        """With several samples (n, best_of), fork the prompt's row for each, with an output and a random stream
        of its own."""
        samples = self.best_of
        if samples == 1:
            return
        prompt_row = np.array(host.target.logits()[-1:])  # the prefill's last row: every sample's first step
        rows = host.rows("target")
        self._rows = [0] + [rows.fork(0) for _ in range(samples - 1)]
        self._outputs = [0] + [host.new_output() for _ in range(samples - 1)]
        self._streams = [host.rng, *host.rng.spawn(samples - 1)]
        self._logprob = np.zeros(samples)
        self._taken = np.zeros(samples, np.int64)
        self._live = list(range(samples))
        self._pending = np.repeat(prompt_row, samples, axis=0)

    def step(self, host: Host) -> None:
        """Draw the next token from the processed distribution and commit it (every unfinished sample's, in one
        batched Run, with several samples)."""
        if self.best_of > 1:
            self._step_samples(host)
            return
        target = host.target
        row = host.process(target.logits()[-1:])[0]
        token = sample_from_logits(row, host.rng, self.temperature)
        host.commit((token,))
        if not host.done:
            target.forward((token,))

    def _step_samples(self, host: Host) -> None:
        live = self._live
        outputs = self._outputs
        processed = host.process(self._pending, outputs=[outputs[s] for s in live])
        going, tokens = [], []
        for sample, row in zip(live, processed, strict=True):
            token, logprob = _sample_scored(row, self._streams[sample], self.temperature)
            if host.commit((token,), output=outputs[sample]):
                self._logprob[sample] += logprob
                self._taken[sample] += 1
            if host.output_done(outputs[sample]):
                host.score(outputs[sample], self._score(sample))
            else:
                going.append(sample)
                tokens.append(token)
        self._live = going
        if going:
            self._pending = host.rows("target").step(tokens, rows=[self._rows[s] for s in going])
        elif self.best_of > self.n:
            # stable: of equal scores the earlier sample stays first
            ranked = sorted(range(self.best_of), key=lambda s: -self._score(s))
            host.rank_outputs([outputs[s] for s in ranked[: self.n]])

    def _score(self, sample: int) -> float:
        """A sample's mean log-probability over the tokens it committed."""
        return float(self._logprob[sample]) / max(1, int(self._taken[sample]))

    def stats(self) -> Mapping[str, Any]:
        """With several samples: how many were drawn and kept, and the tokens they took."""
        if self.best_of == 1:
            return {}
        return {"samples": self.best_of, "kept": self.n, "tokens": int(self._taken.sum())}


def _check_sample(options: dict[str, Any]) -> None:
    best_of = options.get("best_of")
    if best_of is not None and best_of < options["n"]:
        raise ConfigError(
            f"controller 'sample': best_of={best_of} must be at least n={options['n']} (it draws best_of samples "
            "and keeps the n best)"
        )


def _sample_rows(options: dict[str, Any]) -> int:
    return max(int(options["n"]), int(options.get("best_of") or 0))


def builtin_controllers() -> tuple[ControllerSpec, ...]:
    """The baselines' ControllerSpecs (greedy, sample, beam), which decoctl's own plugin contributes."""
    return (
        ControllerSpec(
            name="greedy",
            summary="argmax of the target's logits, one token per forward (the baseline)",
            factory=Greedy,
            batched=True,
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
                    minimum=0.0,
                    exclusive_minimum=True,
                    help="divide logits by this before softmax (> 0)",
                ),
                Option(name="n", type="int", default=1, minimum=1, help="samples to return, sharing one prefill"),
                Option(
                    name="best_of",
                    type="int",
                    minimum=1,
                    help="draw this many samples (at least n) and keep the n best by mean log-probability",
                ),
            ),
            check_options=_check_sample,
            rows_for=_sample_rows,
            batched=True,
        ),
        beam_spec(),
    )
