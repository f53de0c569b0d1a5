"""Speculative sampling keeps the target's distribution: chi-square goodness-of-fit tests with fixed seeds.

The rules themselves (decoctl.verify) are checked in tests/test_acceptance.py. Power: each test also runs the
same statistic against a plausible wrong answer (verification that ignores the temperature, 1.0 instead of 1.3)
and requires it to be rejected at p < 1e-3. That alternative differs from the right distribution by a total
variation of about 0.05-0.1; at 2,500 samples per test the statistic rejects it every time, so a pass is
evidence, not luck.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl import Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import (
    EOS_TOKEN_ID,
    PenaliseSeenPlugin,
    chi_square_p,
    exact_two_token_marginals,
    penalise_seen,
    sample_two_tokens,
)

ALPHA = 1e-3
TEMPERATURE = 1.3


CASES = {
    "draft-model sampled (min(1, p/q), residual p - q)": ({"drafter": "draft-model"}, "def fib(n):", False),
    "draft-model greedy (point-mass rule)": ({"drafter": "draft-model", "draft_greedy": True}, "def fib(n):", False),
    "prompt lookup (point-mass rule)": ({"drafter": "prompt-lookup"}, "ab ab ab ab ab ab ab a", False),
    "draft-model sampled with a processor chain": ({"drafter": "draft-model"}, "def fib(n):", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_matches_plain_sampling_on_the_first_two_tokens(
    case: str, target: Path, draft: Path, registry: PluginRegistry
) -> None:
    options, prompt, processed = CASES[case]
    registry.register(PenaliseSeenPlugin(), "test-processors")
    roles = {"target": target, "draft": draft} if options["drafter"] == "draft-model" else {"target": target}
    generator = Generator(
        roles,
        "speculative",
        options={**options, "sampling": True, "temperature": TEMPERATURE, "k": 1, "adaptive": False},
        processors="penalise-seen" if processed else None,
        registry=registry,
    )
    trials = 2500
    first, second = sample_two_tokens(generator, prompt, trials)
    assert generator.last.stats.controller["drafted"] > 0
    ids = generator.tokenizer.encode(prompt)

    def exact(temperature: float) -> tuple[dict[int, float], dict[int, float]]:
        process = penalise_seen if processed else None
        return exact_two_token_marginals(
            target, ids, temperature=temperature, eos_token_ids=(EOS_TOKEN_ID,), process=process
        )

    p1, p2 = exact(TEMPERATURE)
    assert chi_square_p(first, p1, trials) > ALPHA
    assert chi_square_p(second, p2, trials) > ALPHA
    # power: the same samples must refute a plausible bug, verification ignoring the temperature
    wrong1, wrong2 = exact(1.0)
    assert min(chi_square_p(first, wrong1, trials), chi_square_p(second, wrong2, trials)) < ALPHA
