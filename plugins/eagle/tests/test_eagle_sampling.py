"""Sampling EAGLE keeps the target's distribution: chi-square goodness-of-fit tests with fixed seeds.

Chains are drafted from the head's q and verified by speculative sampling (min(1, p/q), residual
norm(max(0, p - q))); trees are chosen deterministically and verified by the point-mass rule over each node's
children. The rules themselves (decoctl.verify) are checked in tests/test_acceptance.py; here, end to end on
the first two tokens of 2,500 seeded generations, with and without a prefix-dependent logits processor.

Power: every test also runs the same statistic against a plausible wrong answer and requires it to be rejected at
p < 1e-3: verification that ignores the temperature (1.0 instead of 1.3 for chains, of 0.6 for trees: the
point-mass rule accepts a child with the target's own probability, so the trees are checked where the target is
confident enough that about half of the generations accept a drafted token). Those differ from the right
distribution by a total variation of about 0.05-0.1 or more; at these sample sizes the statistic rejects them
every time, so a pass is evidence, not luck.
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
DRAWS = 20_000
REPETITIVE = "x = [i * i for i in range(10)]\nx = [i * i for i in range(10)]\nx = ["


CHAIN = {"drafting": "chain", "k": 2, "adaptive": False, "temperature": 1.3}
TREE = {"drafting": "tree", "depth": 2, "topk": 3, "nodes": 6, "temperature": 0.6}
CASES = {
    "chain drafted from q (min(1, p/q))": (CHAIN, "def fib(n):", False, "eagle"),
    # three tokens a generation: the first draft is always made, the second only after some first tokens
    "chain drafted from q, stopping where the head is unsure": (
        {**CHAIN, "confidence": 0.07},
        "def fib(n):",
        False,
        "eagle",
    ),
    "chain drafted from q, with a processor chain": (CHAIN, "def fib(n):", True, "eagle"),
    # four tokens a generation: the first two steps draft nothing (they time a one-token forward), the third drafts
    # the one token there is room for, on the cost model's costs (conftest's CostedEagle); the first two tokens come
    # from plain steps, so this case checks that the rule's set-up keeps the distribution, and the fixed chains
    # above check what a drafted chain does
    "chain of the cost rule's length": ({**CHAIN, "adaptive": True}, "def fib(n):", False, "eagle-cheap-head"),
    "tree (point-mass rule over children)": (TREE, REPETITIVE, False, "eagle"),
    "tree, with a processor chain": (TREE, REPETITIVE, True, "eagle"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sampling_eagle_matches_plain_sampling_on_the_first_two_tokens(
    case: str, target: Path, mimic_head: Path, costed: PluginRegistry
) -> None:
    options, prompt, processed, controller = CASES[case]
    costed.register(PenaliseSeenPlugin(), "test-processors")
    generator = Generator(
        {"target": target, "eagle": mimic_head},
        controller,
        options={**options, "sampling": True},
        processors="penalise-seen" if processed else None,
        registry=costed,
        threads=1,
    )
    trials = 2500
    if options.get("confidence") or options.get("adaptive"):
        n = 4 if options.get("adaptive") else 3
        first, second = sample_two_tokens(generator, prompt, trials, max_new_tokens=n)
        seen = [generator.generate(prompt, max_new_tokens=n, seed=s).stats.controller for s in range(50)]
        assert sum(c["drafted"] for c in seen) > 0
        if options.get("confidence"):
            assert sum(c["stopped_unsure"] for c in seen) > 0
    else:
        first, second = sample_two_tokens(generator, prompt, trials)
        assert generator.last.stats.controller["drafted"] > 0
    ids = generator.tokenizer.encode(prompt)

    def exact(temperature: float) -> tuple[dict[int, float], dict[int, float]]:
        process = penalise_seen if processed else None
        return exact_two_token_marginals(
            target, ids, temperature=temperature, eos_token_ids=(EOS_TOKEN_ID,), process=process
        )

    p1, p2 = exact(float(options["temperature"]))
    assert chi_square_p(first, p1, trials) > ALPHA
    assert chi_square_p(second, p2, trials) > ALPHA
    wrong1, wrong2 = exact(1.0)
    assert min(chi_square_p(first, wrong1, trials), chi_square_p(second, wrong2, trials)) < ALPHA
