"""Greedy speculative decoding is token-for-token greedy decoding.

A K-token verify pass and single steps differ by ~1e-6 in the logits, so a near-tie may flip: the comparison
allows a different choice only where the baseline's top-2 logit gap is below 1e-4, and counts such places.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from decoctl_speculative.controller import OPTIONS, Speculative

from decoctl import Generator, Host
from decoctl.plugins import PluginRegistry
from decoctl.testing import first_divergence_is_a_tie

PROMPTS = [
    "def fib(n):",
    "import os\nimport sys\n",
    "x = [i * i for i in range(10)]\nx = [i * i for i in range(10)]\nx = [",
    "class Stack:\n    def push(self, item):\n        self.items.append(item)\n    def pop(self):",
    "é天😀 (x) é天😀 (x) é天",
]


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("rule", ["fixed", "schedule", "cost"])
def test_draft_model_greedy_is_greedy(target: Path, draft: Path, registry: PluginRegistry, k: int, rule: str) -> None:
    baseline = Generator({"target": target}, "greedy", registry=registry)
    options = {"k": k, "adaptive": rule != "fixed", "length_rule": "cost" if rule == "fixed" else rule}
    speculative = Generator({"target": target, "draft": draft}, "speculative", options=options, registry=registry)
    ties = 0
    for prompt in PROMPTS:
        expected = baseline.generate(prompt, max_new_tokens=40).tokens
        got = speculative.generate(prompt, max_new_tokens=40).tokens
        assert first_divergence_is_a_tie(target, baseline.tokenizer.encode(prompt), expected, got), prompt
        ties += expected != got
    assert ties <= 1


@pytest.mark.parametrize("k", [2, 5, 12])
@pytest.mark.parametrize("rule", ["fixed", "cost"])
def test_prompt_lookup_greedy_is_greedy(target: Path, registry: PluginRegistry, k: int, rule: str) -> None:
    baseline = Generator({"target": target}, "greedy", registry=registry)
    options = {"drafter": "prompt-lookup", "k": k, "k_max": max(k, 16), "adaptive": rule != "fixed"}
    speculative = Generator({"target": target}, "speculative", options=options, registry=registry)
    for prompt in PROMPTS:
        expected = baseline.generate(prompt, max_new_tokens=48).tokens
        got = speculative.generate(prompt, max_new_tokens=48).tokens
        assert first_divergence_is_a_tie(target, baseline.tokenizer.encode(prompt), expected, got), prompt


def test_greedy_is_greedy_on_an_optimum_model(optimum_target: Path, registry: PluginRegistry) -> None:
    baseline = Generator({"target": optimum_target}, "greedy", registry=registry)
    speculative = Generator(
        {"target": optimum_target, "draft": optimum_target}, "speculative", options={"k": 4}, registry=registry
    )
    assert (
        speculative.generate(PROMPTS[0], max_new_tokens=30).tokens
        == baseline.generate(PROMPTS[0], max_new_tokens=30).tokens
    )


def test_the_target_as_its_own_draft_accepts_everything(target: Path, registry: PluginRegistry) -> None:
    speculative = Generator(
        {"target": target, "draft": target}, "speculative", options={"k": 4, "adaptive": False}, registry=registry
    )
    result = speculative.generate(PROMPTS[1], max_new_tokens=40)
    assert result.stats.controller["acceptance_rate"] == 1.0
    assert result.stats.forwards["target"] == 8  # 40 tokens in steps of 5: 4 accepted drafts + 1
    assert result.stats.tokens_per_target_forward == 5.0


def test_prompt_lookup_needs_fewer_target_forwards_on_a_repetitive_prompt(
    target: Path, registry: PluginRegistry
) -> None:
    baseline = Generator({"target": target}, "greedy", registry=registry)
    # the model's own greedy continuation, pasted back, makes a prompt whose continuation repeats itself
    seed = baseline.generate("def fib(n):", max_new_tokens=60)
    prompt = "def fib(n):" + seed.text + "\n\ndef fib(n):"
    expected = baseline.generate(prompt, max_new_tokens=60)
    options = {"drafter": "prompt-lookup", "k": 8, "adaptive": False}  # test_cost_gate.py: the cost rule
    lookup = Generator({"target": target}, "speculative", options=options, registry=registry)
    got = lookup.generate(prompt, max_new_tokens=60)
    assert got.tokens == expected.tokens
    assert got.stats.forwards["target"] < 0.75 * expected.stats.forwards["target"]
    assert got.stats.trace["drafter"] == "prompt-lookup"


def test_stats_count_drafted_and_accepted_tokens(target: Path, draft: Path, registry: PluginRegistry) -> None:
    result = Generator({"target": target, "draft": draft}, "speculative", registry=registry).generate(
        PROMPTS[0], max_new_tokens=20
    )
    stats = result.stats.controller
    assert stats["drafted"] >= stats["accepted"] >= 0
    # every step is a target forward but a first plain one, which reads the prefill's logits
    assert stats["steps"] == result.stats.forwards["target"] + stats["steps_without_forward"]
    assert stats["steps_without_forward"] <= 1
    assert result.stats.forwards["draft"] > 0
    assert result.stats.trace["acceptance"] == "greedy-exact-match"
    assert np.isclose(stats["acceptance_rate"], stats["accepted"] / stats["drafted"])


def test_the_stats_count_every_target_forward_by_the_tokens_it_fed(
    target: Path, draft: Path, registry: PluginRegistry
) -> None:
    result = Generator({"target": target, "draft": draft}, "speculative", registry=registry).generate(
        PROMPTS[2], max_new_tokens=30
    )
    sizes = result.stats.forward_sizes["target"]
    assert sizes.tree == {}
    assert sum(count for count, _ in sizes.chain.values()) == result.stats.forwards["target"]
    assert sum(n * count for n, (count, _) in sizes.chain.items()) == result.stats.tokens_fed["target"]


class HandsOver:
    """Speculative for ``own`` steps, then greedy one-token steps for ``others`` (feeding the pending token first, as
    decoctl serve's batched step does when a row joins it), then ``resume`` and speculative again, and so on."""

    def __init__(self, options: dict[str, Any], own: int = 2, others: int = 3) -> None:
        self.speculative = Speculative({**speculative_options(), **options})
        self.own, self.others = own, others
        self.steps = self.resumed = 0

    def start(self, host: Host) -> None:
        self.speculative.start(host)
        self.steps = 0

    def step(self, host: Host) -> None:
        phase = self.steps % (self.own + self.others)
        self.steps += 1
        if phase < self.own:
            if phase == 0 and self.steps > 1:
                self.speculative.resume(host)
                self.resumed += 1
            self.speculative.step(host)
            return
        if phase == self.own:  # the row joins: its pending token goes into the target's KV
            host.target.forward((self.speculative.verifier.pending,))
        token = int(host.argmax(host.target.logits()[-1:])[0])
        host.commit((token,))
        if not host.done:
            host.target.forward((token,))


class HandsOverDrafting(HandsOver):
    """HandsOver with a draft model."""

    roles = ("target", "draft")


def speculative_options() -> dict[str, Any]:
    return {option.name: option.default for option in OPTIONS}


@pytest.mark.parametrize(("own", "others"), [(1, 1), (2, 3), (3, 1)])
@pytest.mark.parametrize("drafter", ["prompt-lookup", "draft-model"])
def test_resuming_after_greedy_steps_keeps_greedys_tokens(
    target: Path, draft: Path, registry: PluginRegistry, own: int, others: int, drafter: str
) -> None:
    baseline = Generator({"target": target}, "greedy", registry=registry)
    loop = (HandsOverDrafting if drafter == "draft-model" else HandsOver)({"drafter": drafter}, own, others)
    models = {"target": target, "draft": draft} if drafter == "draft-model" else {"target": target}
    handing = Generator(models, loop, registry=registry)
    for prompt in PROMPTS:
        expected = baseline.generate(prompt, max_new_tokens=40).tokens
        got = handing.generate(prompt, max_new_tokens=40).tokens
        assert first_divergence_is_a_tie(target, baseline.tokenizer.encode(prompt), expected, got), prompt
    assert loop.resumed > 0
