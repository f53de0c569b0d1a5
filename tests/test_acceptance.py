"""decoctl.verify's acceptance rules keep the target's distribution: chi-square goodness-of-fit tests with fixed seeds.

Each rule is run 20,000 times on random distributions over 8 tokens. Power: every check is paired with the same
statistic on a plausible wrong rule (a residual that is not norm(max(0, p - q)); a point-mass rule that does not
renormalise after a refusal), which must be rejected at p < 1e-3; those differ from the right distribution by a
total variation of about 0.05-0.1, which 20,000 draws detect every time, so a pass is evidence, not luck.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from decoctl import verify
from decoctl.testing._distributions import chi_square_p

ALPHA = 1e-3
DRAWS = 20_000


def random_distributions(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    weights = rng.gamma(0.6, size=(rows, vocab))
    return weights / weights.sum(axis=1, keepdims=True)


def first_tokens_of_chain(rule: Any, seed: int) -> tuple[Counter[int], np.ndarray]:
    rng = np.random.default_rng(seed)
    p, q = random_distributions(rng, 2, 8), random_distributions(rng, 1, 8)
    counts: Counter[int] = Counter()
    for _ in range(DRAWS):
        draft = int(rng.choice(8, p=q[0]))
        accepted, following = rule(p, q, [draft], rng)
        counts[draft if accepted else following] += 1
    return counts, p[0]


def tokens_of_tree_node(rule: Any, seed: int) -> tuple[Counter[int], np.ndarray]:
    rng = np.random.default_rng(seed)
    p = random_distributions(rng, 1, 8)[0]
    children = [int(t) for t in np.argsort(-p)[:3]]  # the likeliest tokens, as a good head would propose them
    counts: Counter[int] = Counter()
    for _ in range(DRAWS):
        counts[rule(p, children, rng)[1]] += 1
    return counts, p


def test_the_chain_rule_yields_the_target_distribution() -> None:
    counts, p = first_tokens_of_chain(verify.accept_sampled, seed=1)
    assert chi_square_p(counts, dict(enumerate(p)), DRAWS) > ALPHA


def test_the_statistic_rejects_a_chain_residual_that_is_not_p_minus_q() -> None:
    def broken(p: np.ndarray, q: np.ndarray, drafts: list[int], rng: np.random.Generator) -> tuple[int, int]:
        if rng.random() * q[0, drafts[0]] < p[0, drafts[0]]:
            return 1, 0
        return 0, verify.draw(p[0], rng)  # should be norm(max(0, p - q))

    counts, p = first_tokens_of_chain(broken, seed=1)
    assert chi_square_p(counts, dict(enumerate(p)), DRAWS) < ALPHA


def test_the_point_mass_rule_over_several_children_yields_the_target_distribution() -> None:
    counts, p = tokens_of_tree_node(verify.choose_child, seed=2)
    assert chi_square_p(counts, dict(enumerate(p)), DRAWS) > ALPHA


def test_the_statistic_rejects_a_point_mass_rule_that_does_not_renormalise() -> None:
    def broken(p: np.ndarray, children: list[int], rng: np.random.Generator) -> tuple[int | None, int]:
        residual = p.copy()
        for place, token in enumerate(children):
            if rng.random() < p[token]:  # should be the renormalised residual's probability
                return place, token
            residual[token] = 0.0
        return None, verify.draw(residual, rng)

    counts, p = tokens_of_tree_node(broken, seed=2)
    assert chi_square_p(counts, dict(enumerate(p)), DRAWS) < ALPHA


def test_a_point_mass_residual_takes_its_token_even_when_rounding_says_otherwise() -> None:
    p = np.zeros(4)
    p[2] = 1.0 - 1e-17  # rounds to a probability below one uniform draw in 1e16; the rest of p is 0
    assert verify.choose_child(p, [1, 2], np.random.default_rng(0)) == (1, 2)


def test_the_point_mass_chain_rule_yields_the_target_distribution() -> None:
    rng = np.random.default_rng(2)
    p = random_distributions(rng, 2, 8)
    counts: Counter[int] = Counter()
    for _ in range(DRAWS):
        accepted, following = verify.accept_deterministic(p, [3], rng)
        counts[3 if accepted else following] += 1
    assert chi_square_p(counts, dict(enumerate(p[0])), DRAWS) > ALPHA
