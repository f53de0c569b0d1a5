"""EAGLE chains whose length the cost rule chooses (decoctl.draft_length): greedy's tokens whatever it chooses, no head
forward while it drafts nothing, and the choices a head's cost and acceptance call for.

The rule's costs come from a cost model here, not from the machine (conftest's CostedEagle: a target forward costs
1 ms plus 0.1 ms per token, a head forward 0.02 ms for the cheap head, 5 ms for the dear one), so what it chooses is
the same on every machine; the default controller, on measured time, is checked for greedy's tokens only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl import Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import first_divergence_is_a_tie

PROMPTS = [
    "def fib(n):",
    "import os\nimport sys\n",
    "x = [i * i for i in range(10)]\nx = [i * i for i in range(10)]\nx = [",
    "a",
]
DEMO_PROMPTS = [
    "def fibonacci(n):",
    "import os\n\n\ndef walk_files(root):\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
]


@pytest.mark.parametrize("controller", ["eagle-cheap-head", "eagle-dear-head", "eagle"])
def test_the_cost_rule_gives_greedys_tokens_whatever_it_chooses(
    controller: str, target: Path, head: Path, costed: PluginRegistry
) -> None:
    baseline = Generator({"target": target}, "greedy", registry=costed, threads=1)
    eagle = Generator({"target": target, "eagle": head}, controller, registry=costed, threads=1)
    ties = 0
    for prompt in PROMPTS:
        expected = baseline.generate(prompt, max_new_tokens=40).tokens
        got = eagle.generate(prompt, max_new_tokens=40).tokens
        assert first_divergence_is_a_tie(target, baseline.tokenizer.encode(prompt), expected, got), prompt
        ties += expected != got
    assert ties <= 1


def test_a_dear_head_drafts_only_to_learn_and_probes_only_within_the_budget(
    target: Path, random_head: Path, costed: PluginRegistry
) -> None:
    result = Generator({"target": target, "eagle": random_head}, "eagle-dear-head", registry=costed).generate(
        PROMPTS[0], max_new_tokens=40
    )
    stats = result.stats.controller
    # the first two steps time a one-token forward, the third drafts on the optimistic prior and loses 5 ms (the
    # head's forward) where a plain step costs 1.1 ms; no probe follows until the generation's time is
    # 1 / PROBE_BUDGET of that loss, far beyond these 40 tokens
    assert stats["probes"] == 0
    assert stats["catch_ups"] == 1
    assert stats["k_chosen"][0] >= 30
    head_steps = stats["drafted"] - stats["catch_ups"]  # each drafting step's first draft comes with its catch-up
    assert result.stats.forwards["eagle"] == stats["catch_ups"] + head_steps


def test_a_cheap_accepted_head_drafts_every_step_and_long(
    target: Path, mimic_head: Path, costed: PluginRegistry
) -> None:
    result = Generator({"target": target, "eagle": mimic_head}, "eagle-cheap-head", registry=costed).generate(
        PROMPTS[1], max_new_tokens=48
    )
    stats = result.stats.controller
    assert 0 not in stats["k_chosen"]  # only the first two steps (timing a one-token forward) drafted nothing
    assert stats["catch_ups"] >= stats["steps"] - 3  # all but those and maybe the last, which has no room
    assert stats["tau"] > 2.0


def test_the_options_bound_what_the_cost_rule_chooses(target: Path, mimic_head: Path, costed: PluginRegistry) -> None:
    options = {"k_min": 2, "k_max": 3}
    result = Generator(
        {"target": target, "eagle": mimic_head}, "eagle-cheap-head", options=options, registry=costed
    ).generate(PROMPTS[1], max_new_tokens=48)
    assert set(result.stats.controller["k_chosen"]) <= {2, 3}


@pytest.mark.demo
@pytest.mark.parametrize("controller", ["eagle", "eagle-cheap-head", "eagle-dear-head"])
def test_the_cost_rule_gives_greedys_tokens_on_the_demo_model(controller: str, demo_costed: PluginRegistry) -> None:
    path = demo_costed.models()["pycode"].path
    baseline = Generator({"target": "pycode"}, "greedy", registry=demo_costed, threads=1)
    eagle = Generator({"target": "pycode"}, controller, registry=demo_costed, threads=1)
    ties = 0
    for prompt in DEMO_PROMPTS:
        expected = baseline.generate(prompt, max_new_tokens=64).tokens
        got = eagle.generate(prompt, max_new_tokens=64).tokens
        assert first_divergence_is_a_tie(path, baseline.tokenizer.encode(prompt), expected, got), prompt
        ties += expected != got
    assert ties <= 1


def test_where_multi_token_forwards_are_dear_a_rejected_head_falls_back_to_plain_steps(
    target: Path, random_head: Path, costed: PluginRegistry
) -> None:
    baseline = Generator({"target": target}, "greedy", registry=costed, threads=1)
    eagle = Generator({"target": target, "eagle": random_head}, "eagle-dear-verify", registry=costed, threads=1)
    for prompt in PROMPTS[:2]:
        result = eagle.generate(prompt, max_new_tokens=48)
        expected = baseline.generate(prompt, max_new_tokens=48).tokens
        assert first_divergence_is_a_tie(target, baseline.tokenizer.encode(prompt), expected, result.tokens), prompt
        stats = result.stats.controller
        assert stats["k_chosen"][0] >= 36, stats["k_chosen"]  # a few drafting steps to learn, then plain ones
        assert stats["catch_ups"] <= 10


def test_a_long_backlog_is_caught_up_on_its_latest_pairs(
    target: Path, mimic_head: Path, costed: PluginRegistry
) -> None:
    prompt = "import os\nimport sys\n" * 8

    def caught_up(most: int) -> tuple[int, int, int]:
        result = Generator(
            {"target": target, "eagle": mimic_head},
            "eagle-cheap-head",
            options={"catch_up_most": most},
            registry=costed,
        ).generate(prompt, max_new_tokens=8)
        stats = result.stats.controller
        return stats["caught_up_rows"], stats["catch_ups"], result.stats.prompt_tokens

    rows, catch_ups, prompt_tokens = caught_up(4)
    assert catch_ups >= 1 and rows <= 4 * catch_ups  # the prompt's pairs and the first steps' too: the latest 4
    rows, _, _ = caught_up(0)
    assert rows >= prompt_tokens - 1 + 2  # every pair: the prompt's and the two plain steps'


def test_drafting_stops_while_verifying_is_dear_and_resumes_once_it_pays(
    target: Path, mimic_head: Path, costed: PluginRegistry
) -> None:
    baseline = Generator({"target": target}, "greedy", registry=costed, threads=1)
    eagle = Generator({"target": target, "eagle": mimic_head}, "eagle-busy-then-free", registry=costed, threads=1)
    prompt = PROMPTS[1]
    result = eagle.generate(prompt, max_new_tokens=160)
    expected = baseline.generate(prompt, max_new_tokens=160).tokens
    assert first_divergence_is_a_tie(target, baseline.tokenizer.encode(prompt), expected, result.tokens)
    stats = result.stats.controller
    assert stats["k_chosen"][0] >= 20  # plain steps while a forward over n tokens cost 1 + 1.5 (n - 1) ms
    assert stats["probes"] >= 1
    assert sum(n for k, n in stats["k_chosen"].items() if k) >= 10  # drafting again once it paid
    assert stats["drafting_loss"] < 0
