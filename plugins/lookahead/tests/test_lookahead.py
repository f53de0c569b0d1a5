"""Lookahead decoding: greedy is greedy, sampling keeps the distribution, the degraded mode only on request."""

from __future__ import annotations

from pathlib import Path

import pytest
from decoctl_lookahead import NGramPool

from decoctl import CapabilityError, GenerationError, Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import EOS_TOKEN_ID, chi_square_p, exact_two_token_marginals, sample_two_tokens

PROMPTS = [
    "def fib(n):",
    "x = [i * i for i in range(10)]\nx = [i * i for i in range(10)]\nx = [",
    "class Stack:\n    def push(self, item):\n        self.items.append(item)\n    def pop(self):",
    "é天😀 (x) é天😀 (x) é天",
]


@pytest.mark.parametrize(("window", "ngram", "guesses"), [(1, 2, 1), (3, 3, 2), (5, 4, 4), (4, 6, 3)])
def test_greedy_lookahead_is_greedy(
    tree_model: Path, registry: PluginRegistry, window: int, ngram: int, guesses: int
) -> None:
    baseline = Generator({"target": tree_model}, "greedy", registry=registry)
    options = {"window": window, "ngram": ngram, "guesses": guesses}
    lookahead = Generator({"target": tree_model}, "lookahead", options=options, registry=registry)
    for prompt in PROMPTS:
        assert (
            lookahead.generate(prompt, max_new_tokens=48).tokens == baseline.generate(prompt, max_new_tokens=48).tokens
        )


def test_lookahead_takes_several_tokens_per_forward_once_output_repeats(
    tree_model: Path, registry: PluginRegistry
) -> None:
    baseline = Generator({"target": tree_model}, "greedy", registry=registry).generate(PROMPTS[0], max_new_tokens=80)
    options = {"adaptive": False}  # a tree every step, whatever it costs (test_lookahead_gate.py: the gate)
    lookahead = Generator({"target": tree_model}, "lookahead", options=options, registry=registry).generate(
        PROMPTS[0], max_new_tokens=80
    )
    assert lookahead.tokens == baseline.tokens
    stats = lookahead.stats.controller
    assert lookahead.stats.forwards["target"] == stats["steps"]
    assert lookahead.stats.tokens_per_target_forward > 1.2
    assert stats["hits"] > 0
    assert stats["pool_size"] > 0


@pytest.mark.parametrize(("window", "ngram", "guesses", "copy_length"), [(1, 3, 1, 6), (2, 3, 2, 3), (1, 2, 1, 10)])
def test_greedy_lookahead_with_copies_is_greedy_and_takes_copied_tokens(
    tree_model: Path, registry: PluginRegistry, window: int, ngram: int, guesses: int, copy_length: int
) -> None:
    baseline = Generator({"target": tree_model}, "greedy", registry=registry)
    options = {"window": window, "ngram": ngram, "guesses": guesses, "copy_length": copy_length, "adaptive": False}
    lookahead = Generator({"target": tree_model}, "lookahead", options=options, registry=registry)
    copied = 0
    for prompt in PROMPTS:
        result = lookahead.generate(prompt, max_new_tokens=48)
        assert result.tokens == baseline.generate(prompt, max_new_tokens=48).tokens, prompt
        stats = result.stats.controller
        assert result.stats.forward_sizes["target"].chain == {}  # every step one tree forward
        copied += stats["copied_tokens_accepted"]
    assert copied > 0


def test_the_stats_count_every_target_forward_by_the_tokens_it_fed(tree_model: Path, registry: PluginRegistry) -> None:
    options = {"adaptive": False}
    result = Generator({"target": tree_model}, "lookahead", options=options, registry=registry).generate(
        PROMPTS[1], max_new_tokens=40
    )
    sizes = result.stats.forward_sizes["target"]
    assert sizes.chain == {}
    assert sum(count for count, _ in sizes.tree.values()) == result.stats.forwards["target"]
    assert sum(n * count for n, (count, _) in sizes.tree.items()) == result.stats.tokens_fed["target"]


def test_the_degraded_mode_counts_its_chain_forwards_by_size(plain_model: Path, registry: PluginRegistry) -> None:
    options = {"allow_degraded": True}
    result = Generator({"target": plain_model}, "lookahead", options=options, registry=registry).generate(
        PROMPTS[1], max_new_tokens=40
    )
    sizes = result.stats.forward_sizes["target"]
    assert sizes.tree == {}
    assert sum(count for count, _ in sizes.chain.values()) == result.stats.forwards["target"]
    assert sum(n * count for n, (count, _) in sizes.chain.items()) == result.stats.tokens_fed["target"]


def test_a_model_without_tree_inputs_is_refused_naming_the_transform(
    plain_model: Path, registry: PluginRegistry
) -> None:
    with pytest.raises(GenerationError) as info:
        Generator({"target": plain_model}, "lookahead", registry=registry).generate("x")
    assert isinstance(info.value.__cause__, CapabilityError)
    assert "decoctl models enable-tree" in str(info.value)
    assert "allow_degraded" in str(info.value)


def test_the_degraded_mode_is_greedy_and_named_in_the_stats(plain_model: Path, registry: PluginRegistry) -> None:
    baseline = Generator({"target": plain_model}, "greedy", registry=registry)
    degraded = Generator({"target": plain_model}, "lookahead", options={"allow_degraded": True}, registry=registry)
    for prompt in PROMPTS:
        result = degraded.generate(prompt, max_new_tokens=40)
        assert result.tokens == baseline.generate(prompt, max_new_tokens=40).tokens
    assert result.stats.trace["degraded"] == [
        "lookahead: verification branch only (model has no tree inputs; allow_degraded=true)"
    ]
    assert result.stats.controller["degraded"] is True


def test_the_pool_keeps_the_most_recent_grams_per_key() -> None:
    pool = NGramPool(per_key=2)
    pool.add_sequence([1, 2, 3, 1, 4, 5, 1, 2, 3], 3)
    assert pool.candidates(1, 5) == [(2, 3), (4, 5)]
    pool.add(1, (7, 7))
    assert pool.candidates(1, 5) == [(7, 7), (2, 3)]
    assert pool.size == 2 + 4  # keys 1 (2 grams), 2, 3, 4, 5 (one each), minus the one dropped


def test_the_pool_ranks_continuations_seen_after_the_same_two_tokens_first() -> None:
    pool = NGramPool(per_key=8)
    pool.add_sequence([9, 1, 2, 3, 8, 1, 4, 5, 7, 1, 6, 6], 3)
    assert pool.candidates(1, 3) == [(6, 6), (4, 5), (2, 3)]  # recency alone
    assert pool.candidates(1, 3, before=9) == [(2, 3), (6, 6), (4, 5)]  # 9 then 1 was followed by 2 3
    assert pool.candidates(1, 1, before=8) == [(4, 5)]
    assert pool.candidates(1, 2, before=0) == [(6, 6), (4, 5)]  # an unseen pair falls back to recency


TEMPERATURE = 1.3


@pytest.mark.parametrize("prompt", ["ab ab ab ab ab ab ab a", "x = 1\nx = 1\nx = 1\nx ="])
def test_sampling_lookahead_keeps_the_distribution_of_the_first_two_tokens(
    tree_model: Path, registry: PluginRegistry, prompt: str
) -> None:
    """Chi-square on 2,500 seeded generations per prompt; the power check refutes temperature 1.0 instead of 1.3
    (a total-variation difference of about 0.05-0.1) on the same samples."""
    options = {"sampling": True, "temperature": TEMPERATURE, "window": 3, "ngram": 3, "guesses": 3, "adaptive": False}
    generator = Generator({"target": tree_model}, "lookahead", options=options, registry=registry)
    trials = 2500
    first, second = sample_two_tokens(generator, prompt, trials)
    assert generator.last.stats.controller["verified_ngrams"] > 0
    ids = generator.tokenizer.encode(prompt)
    p1, p2 = exact_two_token_marginals(tree_model, ids, temperature=TEMPERATURE, eos_token_ids=(EOS_TOKEN_ID,))
    assert chi_square_p(first, p1, trials) > 1e-3
    assert chi_square_p(second, p2, trials) > 1e-3
    wrong1, wrong2 = exact_two_token_marginals(tree_model, ids, temperature=1.0, eos_token_ids=(EOS_TOKEN_ID,))
    assert min(chi_square_p(first, wrong1, trials), chi_square_p(second, wrong2, trials)) < 1e-3
