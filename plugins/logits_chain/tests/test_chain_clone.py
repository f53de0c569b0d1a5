"""The chain's processors that keep state per sequence (the grammar, the penalties' records) clone, so a chain
holding them serves several samples and batched prompts, each sequence followed by a clone of its own."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import numpy as np

from decoctl import Generator
from decoctl.plugins import PluginRegistry

GRAMMAR = [{"name": "grammar", "regex": "[0-9]{3}"}]
PENALTIES = "repetition_penalty=1.3,no_repeat_ngram=2,presence_penalty=0.5"
PROMPTS = ["def fib(n):", "import os", "class A:", "x = 1"]


def bigrams_repeat(tokens: Any) -> bool:
    pairs = list(itertools.pairwise(tokens))
    return len(pairs) != len(set(pairs))


def test_several_samples_under_a_grammar_each_match_it(tiny_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": tiny_model}, "sample", options={"n": 3}, processors=GRAMMAR, registry=registry)
    for seed in range(3):
        result = generator.generate("def fib(n):", max_new_tokens=12, seed=seed)
        assert len(result.completions) == 3
        for completion in result.completions:
            assert re.fullmatch("[0-9]{3}", completion.text), completion.text
            assert completion.stop_reason == "eos"


def test_several_samples_under_stateful_penalties_each_keep_their_own_count(
    tiny_model: Path, registry: PluginRegistry
) -> None:
    chain = f"{PENALTIES},temperature=0.8"
    many = Generator({"target": tiny_model}, "sample", options={"n": 4}, processors=chain, registry=registry)
    alone = Generator({"target": tiny_model}, "sample", processors=chain, registry=registry)
    for seed in range(2):
        result = many.generate("def fib(n):", max_new_tokens=24, seed=seed)
        assert result.tokens == alone.generate("def fib(n):", max_new_tokens=24, seed=seed).tokens
        prompt = list(many.tokenizer.encode("def fib(n):"))
        for completion in result.completions:  # no_repeat_ngram=2 held within each sample's own prefix
            assert not bigrams_repeat(prompt + list(completion.tokens))


def test_batched_prompts_under_a_grammar_run_together_with_each_prompts_own_output(
    tiny_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator({"target": tiny_model}, "greedy", processors=GRAMMAR, registry=registry)
    alone = [generator.generate(p, max_new_tokens=12).tokens for p in PROMPTS]

    results = generator.generate_batch(PROMPTS, batch_size=2, max_new_tokens=12)

    assert [r.tokens for r in results] == alone
    assert all(re.fullmatch("[0-9]{3}", r.text) for r in results)
    assert results[0].stats.trace["batched"] == "2 rows in one buffer, refilled as prompts finish"


def test_batched_prompts_under_stateful_penalties_give_each_prompts_own_tokens(
    tiny_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator({"target": tiny_model}, "greedy", processors=PENALTIES, registry=registry)
    alone = [generator.generate(p, max_new_tokens=16).tokens for p in PROMPTS]
    results = generator.generate_batch(PROMPTS, batch_size=3, max_new_tokens=16)
    assert [r.tokens for r in results] == alone


def test_a_grammar_clone_starts_where_its_original_is_and_goes_on_alone(build: Any, tokenizer: Any) -> None:
    chain = build(GRAMMAR)
    chain.reset(np.zeros(0, np.int64))
    first, second = tokenizer.encode("1"), tokenizer.encode("2")
    chain.commit(first)
    twin = chain.clone()
    twin.commit(second)
    assert twin.processors[0]._committed == first + second
    assert chain.processors[0]._committed == first


def test_a_penalty_clone_counts_from_its_originals_counts_and_goes_on_alone(build: Any) -> None:
    chain = build("repetition_penalty=1.3")
    chain.reset(np.array([1, 2], np.int64))
    chain.commit([5])
    twin = chain.clone()
    twin.commit([6])
    original, copy = chain.processors[0].tally, twin.processors[0].tally
    assert (copy.count(5), copy.count(6)) == (1, 1)
    assert (original.count(5), original.count(6)) == (1, 0)
