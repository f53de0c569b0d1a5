"""Statistical checks that a sampling controller keeps the target's distribution (for plugin tests).

A controller is lossless when the tokens it samples follow plain sampling's distribution. These helpers sample
the first two tokens of many seeded generations and compare their marginals with the exact ones computed from
the target itself (chi-square goodness of fit, cells expecting fewer than 5 pooled). scipy is needed (test
extras only).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.plugins import hookimpl
from decoctl.specs import ProcessorSpec

__all__ = [
    "NO_SECOND",
    "PenaliseSeen",
    "PenaliseSeenPlugin",
    "chi_square_p",
    "exact_two_token_marginals",
    "penalise_seen",
    "sample_two_tokens",
    "softmax",
]

NO_SECOND = -1
"""The second-token cell for "the first token ended the generation"."""

RowProcessor = Callable[[np.ndarray, list[int]], np.ndarray]


def softmax(row: np.ndarray, temperature: float) -> np.ndarray:
    """float64[vocab] softmax(row / temperature)."""
    scaled = row.astype(np.float64) / temperature
    scaled -= scaled.max()
    weights = np.exp(scaled)
    return weights / weights.sum()


def chi_square_p(observed: Mapping[Hashable, int], expected: Mapping[Hashable, float], total: int) -> float:
    """p-value of observed counts against expected probabilities; cells expecting < 5 are pooled."""
    from scipy.stats import chisquare

    keys = sorted(expected, key=lambda key: -expected[key])
    big = [key for key in keys if expected[key] * total >= 5]
    obs = [observed.get(key, 0) for key in big]
    exp = [expected[key] * total for key in big]
    rest_obs, rest_exp = total - sum(obs), total - sum(exp)
    if rest_obs or rest_exp > 1e-9:
        obs.append(rest_obs)
        exp.append(max(rest_exp, 1e-9))
    scaled = np.asarray(exp) * (sum(obs) / sum(exp))
    return float(chisquare(obs, scaled).pvalue)


def exact_two_token_marginals(
    folder: Path,
    prompt_ids: list[int],
    *,
    temperature: float,
    eos_token_ids: tuple[int, ...],
    process: RowProcessor | None = None,
) -> tuple[dict[int, float], dict[int, float]]:
    """Plain sampling's p(t1) and p(t2) = sum_t1 p(t1) p(t2 | t1), with NO_SECOND for an EOS first token.

    ``process(row, prefix)`` applies whatever logits processing the controller under test applies.
    """
    sequence = Sequence("target", load_model(folder, threads=1))

    def distribution(row: np.ndarray, prefix: list[int]) -> np.ndarray:
        row = np.array(row, dtype=np.float32)
        return softmax(process(row, prefix) if process else row, temperature)

    first = distribution(sequence.prefill(prompt_ids)[0], list(prompt_ids))
    second = np.zeros(len(first))
    no_second = 0.0
    for token in np.flatnonzero(first > 1e-7):
        if int(token) in eos_token_ids:
            no_second += first[token]
            continue
        sequence.rewind(len(prompt_ids))
        row = sequence.forward([int(token)])[0]
        second += first[token] * distribution(row, [*prompt_ids, int(token)])
    return dict(enumerate(first.tolist())), {**dict(enumerate(second.tolist())), NO_SECOND: no_second}


def sample_two_tokens(
    generator: Any, prompt: str, trials: int, *, max_new_tokens: int = 2
) -> tuple[Counter[int], Counter[int]]:
    """Counts of the first and second token over ``trials`` generations seeded 0..trials-1 (each generating
    ``max_new_tokens``: more lets a controller draft beyond the second token)."""
    first: Counter[int] = Counter()
    second: Counter[int] = Counter()
    for seed in range(trials):
        tokens = generator.generate(prompt, max_new_tokens=max_new_tokens, seed=seed).tokens
        first[tokens[0]] += 1
        second[tokens[1] if len(tokens) > 1 else NO_SECOND] += 1
    return first, second


class PenaliseSeen:
    """A test processor that subtracts 1.5 from every token already in the row's prefix: prefix-dependent, so a
    sampling check with it shows that every drafted and verified row is processed with its own prefix."""

    def __init__(self, options: dict[str, Any]) -> None:
        del options

    def __call__(self, rows: np.ndarray, context: Any) -> np.ndarray:
        for index in range(len(rows)):
            rows[index, np.unique(context.prefix(index))] -= 1.5
        return rows

    def commit(self, tokens: Any) -> None:
        """Nothing to keep: what it has seen is each row's prefix."""
        del tokens

    def reset(self, prompt: Any) -> None:
        """Nothing to forget."""
        del prompt


def penalise_seen(row: np.ndarray, prefix: list[int]) -> np.ndarray:
    """PenaliseSeen on one row, for exact_two_token_marginals' ``process``."""
    row[np.unique(prefix)] -= 1.5
    return row


class PenaliseSeenPlugin:
    """Registers PenaliseSeen as the processor "penalise-seen" (``registry.register(PenaliseSeenPlugin(), ...)``)."""

    @hookimpl
    def decoctl_logits_processors(self) -> list[ProcessorSpec]:
        """The processor "penalise-seen"."""
        return [ProcessorSpec(name="penalise-seen", summary="test processor", factory=PenaliseSeen)]
