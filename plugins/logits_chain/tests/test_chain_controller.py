"""The ``chain`` controller draws from the processed distribution; processors compose with every controller."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from decoctl_logits_chain import pick_token

from decoctl import ControllerError, Generator, ProcessContext
from decoctl.plugins import PluginRegistry, parse_processor_chain
from decoctl.testing import reference_logits

PROMPT = "def fib(n):"


def test_the_first_token_distribution_matches_the_processed_distribution(
    tiny_model: Path, registry: PluginRegistry
) -> None:
    """2000 first tokens (seeds 0..1999) under top_k=8,temperature=0.7, against softmax of the processed logits.

    Pearson chi-square with 7 degrees of freedom at alpha = 0.001 (critical value 24.32); the seeds are fixed,
    so the outcome is too. Power against plausible bugs (noncentral chi-square, checked by simulation): the
    temperature left out (T = 1) gives lambda ~ 144, power ~ 1.0; T = 0.8 instead of 0.7 gives lambda ~ 20,
    power ~ 0.58; a token outside the top 8 (a top_k off by one: ~1.5% of draws) fails the support check.
    """
    chain = "top_k=8,temperature=0.7"
    generator = Generator({"target": tiny_model}, "chain", processors=chain, registry=registry, threads=1)
    prompt = np.asarray(generator.tokenizer.encode(PROMPT), np.int64)
    context = ProcessContext(prompt, np.zeros(0, np.int64), [[]])
    processed = parse_processor_chain(chain, registry)(reference_logits(tiny_model, prompt)[-1:], context)[0]
    support = np.flatnonzero(processed > -np.inf)
    expected = np.exp(processed[support] - processed.max())
    expected /= expected.sum()

    draws = 2000
    tokens = [generator.generate(PROMPT, max_new_tokens=1, seed=seed).tokens[0] for seed in range(draws)]

    assert set(tokens) <= set(support.tolist())
    observed = np.array([tokens.count(int(t)) for t in support])
    statistic = float((((observed - draws * expected) ** 2) / (draws * expected)).sum())
    assert len(support) == 8
    assert statistic < 24.32, f"chi-square {statistic:.1f} (observed {observed}, expected {draws * expected})"


def test_a_greedy_terminal_decodes_greedily(tiny_model: Path, registry: PluginRegistry) -> None:
    plain = Generator({"target": tiny_model}, "greedy", registry=registry).generate(PROMPT, max_new_tokens=16)
    chained = Generator({"target": tiny_model}, "chain", processors="top_k=5,greedy", registry=registry)
    assert chained.generate(PROMPT, max_new_tokens=16, seed=3).tokens == plain.tokens


def test_without_processors_chain_samples_like_sample(tiny_model: Path, registry: PluginRegistry) -> None:
    sample = Generator({"target": tiny_model}, "sample", registry=registry)
    chain = Generator({"target": tiny_model}, "chain", registry=registry)
    for seed in range(3):
        assert (
            chain.generate(PROMPT, max_new_tokens=16, seed=seed).tokens
            == sample.generate(PROMPT, max_new_tokens=16, seed=seed).tokens
        )


@pytest.mark.parametrize("controller", ["greedy", "sample", "chain"])
def test_a_chain_applies_under_any_controller(controller: str, tiny_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": tiny_model}, controller, processors="no_repeat_ngram=1", registry=registry)
    tokens = generator.generate(PROMPT, max_new_tokens=24, seed=1).tokens
    prompt = set(generator.tokenizer.encode(PROMPT))
    assert len(set(tokens)) == len(tokens) and not prompt & set(tokens)


def test_one_unmasked_token_is_taken_without_a_draw() -> None:
    row = np.full(10, -np.inf, np.float32)
    row[7] = 0.5
    rng = np.random.default_rng(0)
    assert pick_token(row, rng) == 7
    assert rng.random() == np.random.default_rng(0).random()


def test_a_row_with_every_token_masked_raises() -> None:
    with pytest.raises(ControllerError, match="masked every token"):
        pick_token(np.full(10, -np.inf, np.float32), np.random.default_rng(0))


def test_the_entry_point_provides_the_processors_and_the_chain_controller() -> None:
    registry = PluginRegistry()
    assert registry.controllers()["chain"].plugin == "logits-chain"
    assert registry.processors()["top-p"].plugin == "logits-chain"
    assert registry.distribution_of("logits-chain") == "decoctl-logits-chain"
