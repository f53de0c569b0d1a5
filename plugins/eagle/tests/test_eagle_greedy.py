"""Greedy EAGLE decoding is token-for-token greedy decoding, with chain and tree drafts.

A verify pass over many tokens and single steps differ by ~1e-6 in the logits, so a near-tie may flip: the
comparison allows a different choice only where the baseline's top-2 logit gap is below 1e-4, and counts them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from decoctl import Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import first_divergence_is_a_tie

PROMPTS = [
    "def fib(n):",
    "import os\nimport sys\n",
    "x = [i * i for i in range(10)]\nx = [i * i for i in range(10)]\nx = [",
    "é天😀 (x) é天😀 (x) é天",
    "a",
]
OPTIONS: dict[str, dict[str, Any]] = {
    "chain k=1": {"drafting": "chain", "k": 1, "adaptive": False},
    "chain k=4": {"drafting": "chain", "k": 4, "adaptive": False},
    "chain k=9": {"drafting": "chain", "k": 9, "adaptive": False},
    "chain k=4, stopping where the head is unsure": {"drafting": "chain", "k": 4, "adaptive": False, "confidence": 0.2},
    "chain, the cost rule on measured time (the default)": {"drafting": "chain"},
    "chain, HF's schedule from k=0": {"drafting": "chain", "length_rule": "schedule", "k": 1, "k_min": 0},
    "tree default": {"drafting": "tree"},
    "tree narrow and deep": {"drafting": "tree", "topk": 1, "depth": 7, "nodes": 7},
    "tree wide": {"drafting": "tree", "topk": 6, "depth": 3, "nodes": 30},
}


@pytest.mark.parametrize("case", list(OPTIONS))
def test_greedy_eagle_is_greedy(case: str, target: Path, head: Path, registry: PluginRegistry) -> None:
    baseline = Generator({"target": target}, "greedy", registry=registry, threads=1)
    eagle = Generator({"target": target, "eagle": head}, "eagle", options=OPTIONS[case], registry=registry, threads=1)
    ties = 0
    for prompt in PROMPTS:
        expected = baseline.generate(prompt, max_new_tokens=40).tokens
        got = eagle.generate(prompt, max_new_tokens=40).tokens
        assert first_divergence_is_a_tie(target, baseline.tokenizer.encode(prompt), expected, got), prompt
        ties += expected != got
        if OPTIONS[case].get("confidence"):
            stats = eagle.last.stats.controller
            assert stats["stopped_unsure"] > 0 and stats["drafted"] > 0, stats  # both ways taken
    assert ties <= 1


@pytest.mark.parametrize("drafting", ["chain", "tree"])
def test_a_chunked_prefill_gives_the_head_every_prompt_feature(
    drafting: str, target: Path, mimic_head: Path, registry: PluginRegistry
) -> None:
    roles = {"target": target, "eagle": mimic_head}
    prompt = PROMPTS[2]
    options = {"drafting": drafting, "adaptive": False}  # the same drafts in both runs
    whole = Generator(roles, "eagle", options=options, registry=registry, threads=1)
    chunked = Generator(roles, "eagle", options=options, registry=registry, threads=1, prefill_chunk=5)
    expected = whole.generate(prompt, max_new_tokens=30)
    got = chunked.generate(prompt, max_new_tokens=30)
    assert got.tokens == expected.tokens
    assert got.stats.controller["accepted"] == expected.stats.controller["accepted"]
    assert got.stats.trace["eagle_prompt_refed"] is True


def test_chain_drafting_runs_on_a_target_without_tree_inputs(
    plain_target: Path, mimic_head: Path, registry: PluginRegistry
) -> None:
    baseline = Generator({"target": plain_target}, "greedy", registry=registry, threads=1)
    eagle = Generator(
        {"target": plain_target, "eagle": mimic_head}, "eagle", options={"drafting": "chain"}, registry=registry
    )
    assert (
        eagle.generate(PROMPTS[0], max_new_tokens=30).tokens == baseline.generate(PROMPTS[0], max_new_tokens=30).tokens
    )


@pytest.mark.parametrize("drafting", ["chain", "tree"])
def test_an_imitating_head_gets_several_tokens_per_target_forward(
    drafting: str, target: Path, mimic_head: Path, registry: PluginRegistry
) -> None:
    options = {"drafting": drafting, "adaptive": False}
    result = Generator({"target": target, "eagle": mimic_head}, "eagle", options=options, registry=registry).generate(
        PROMPTS[1], max_new_tokens=48
    )
    stats = result.stats.controller
    assert stats["tau"] > 2.0
    assert result.stats.tokens_per_target_forward == pytest.approx(stats["tau"])
    assert stats["accepted"] > 0


@pytest.mark.parametrize(
    "options",
    [
        {"drafting": "chain", "k": 4, "adaptive": False},
        {"drafting": "chain", "k": 4},
        {"drafting": "tree", "depth": 4, "topk": 2, "nodes": 6},
    ],
    ids=["chain k=4", "chain, the cost rule", "tree"],
)
def test_stats_account_for_every_forward(
    options: dict[str, Any], target: Path, random_head: Path, registry: PluginRegistry
) -> None:
    result = Generator({"target": target, "eagle": random_head}, "eagle", options=options, registry=registry).generate(
        PROMPTS[0], max_new_tokens=12
    )
    stats, steps = result.stats.controller, result.stats.controller["steps"]
    target = result.stats.forward_sizes["target"]
    sizes = {n: count for n, (count, _) in (*target.chain.items(), *target.tree.items())}
    forwarded = steps - stats["steps_without_forward"]  # a first plain step reads the prefill's logits
    assert stats["steps_without_forward"] <= 1
    assert forwarded == result.stats.forwards["target"] == sum(sizes.values())
    assert sum(n * count for n, count in sizes.items()) == result.stats.tokens_fed["target"]
    assert stats["drafted"] == result.stats.tokens_fed["target"] - forwarded
    assert stats["tau"] == pytest.approx(result.stats.new_tokens / steps)
    assert 0.0 <= stats["acceptance_rate"] <= 1.0
    head_forwards = result.stats.forwards["eagle"]
    # the head runs only in steps that draft: one catch-up forward (the prompt's pairs first, then what was
    # committed since), then its drafting forwards
    drafting_steps = sum(count for n, count in sizes.items() if n > 1)
    assert stats["catch_ups"] == drafting_steps
    assert stats["caught_up_rows"] <= result.stats.prompt_tokens - 1 + result.stats.new_tokens
    if options["drafting"] == "chain":
        # a chain of n - 1 drafts (a verify of n tokens) took n - 2 head forwards after the root
        assert head_forwards == sum(max(n - 2, 0) * count for n, count in sizes.items()) + drafting_steps
    else:
        assert stats["largest_tree"] == options["nodes"] + 1
        assert drafting_steps < head_forwards <= drafting_steps * (options["depth"] - 1) + drafting_steps
