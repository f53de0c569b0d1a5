"""Never slower than greedy: lookahead takes plain one-token steps where the measured cost of its tree forwards says
they do not pay (decoctl.draft_length's DraftGate), gives greedy's tokens all the same, and goes back to trees once
they pay.

Costs come from a cost model, not from the machine (``Costed``: a target forward costs 1 ms plus ``per_token`` ms
for every token past the first), so what the gate decides is the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
from decoctl_lookahead import plugin
from decoctl_lookahead.controller import Lookahead

from decoctl import ControllerSpec, Generator, Host, hookimpl
from decoctl.draft_length import JUDGE_AFTER, REFRESH_EVERY
from decoctl.plugins import PluginRegistry
from decoctl.testing import ForwardCostClock

PROMPTS = [
    "def fib(n):",
    "x = [i * i for i in range(10)]\nx = [i * i for i in range(10)]\nx = [",
    "class Stack:\n    def push(self, item):\n        self.items.append(item)\n    def pop(self):",
]


class Costed(Lookahead):
    """Lookahead on a cost-model clock; ``per_token(target forwards so far)`` may change the price mid-generation."""

    def __init__(self, options: dict[str, Any], *, per_token: Callable[[int], float]) -> None:
        self.cost_clock = ForwardCostClock(per_token)
        super().__init__(options, clock=self.cost_clock)

    def start(self, host: Host) -> None:
        self.cost_clock.start(host)
        super().start(host)


def costed(per_token: Callable[[int], float]) -> PluginRegistry:
    class CostedPlugin:
        @hookimpl
        def decoctl_controllers(self) -> list[ControllerSpec]:
            (lookahead,) = plugin.decoctl_controllers()
            return [attrs.evolve(lookahead, name="costed", factory=partial(Costed, per_token=per_token))]

    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "lookahead")
    registry.register(CostedPlugin(), "costed")
    return registry


def test_where_tree_forwards_are_dear_lookahead_takes_plain_steps_with_greedys_tokens(
    tree_model: Path, registry: PluginRegistry
) -> None:
    # a forward over two tokens costs 1.48 one-token ones, a tree of 4 nodes 2.44: on text that does not repeat,
    # lookahead's trees bring too few tokens for that
    baseline = Generator({"target": tree_model}, "greedy", registry=registry)
    lookahead = Generator({"target": tree_model}, "costed", registry=costed(lambda _: 0.48))
    trees = []
    for prompt in (PROMPTS[0], PROMPTS[2]):
        result = lookahead.generate(prompt, max_new_tokens=64)
        assert result.tokens == baseline.generate(prompt, max_new_tokens=64).tokens, prompt
        stats = result.stats.controller
        assert stats["drafting_stopped"]
        assert stats["plain_steps"] >= 30
        trees.append(sum(count for count, _ in result.stats.forward_sizes["target"].tree.values()))
    # the first generation learns it (its judged trees and a probe or two); the Generator's next one starts from what
    # it measured, and tries a tree only to probe
    assert trees[0] <= JUDGE_AFTER + 4
    assert trees[1] <= 2


def test_where_tree_forwards_cost_what_one_token_costs_lookahead_verifies_a_tree_every_step(
    tree_model: Path, registry: PluginRegistry
) -> None:
    baseline = Generator({"target": tree_model}, "greedy", registry=registry)
    lookahead = Generator({"target": tree_model}, "costed", registry=costed(lambda _: 0.0))
    result = lookahead.generate(PROMPTS[1], max_new_tokens=64)
    assert result.tokens == baseline.generate(PROMPTS[1], max_new_tokens=64).tokens
    stats = result.stats.controller
    assert stats["drafting_stops"] == 0
    # the first two steps time a one-token forward, and one in every REFRESH_EVERY + 1 times it again
    assert stats["plain_steps"] <= 2 + stats["steps"] // REFRESH_EVERY
    assert result.stats.tokens_per_target_forward > 1.2


def test_lookahead_goes_back_to_trees_once_they_pay(tree_model: Path, registry: PluginRegistry) -> None:
    # dear while the machine is busy (the first 30 target forwards: a tree of 4 nodes costs 1.45 one-token forwards),
    # free afterwards; the probes wait until what the trees lost is within the budget of the generation's time
    lookahead = Generator({"target": tree_model}, "costed", registry=costed(lambda n: 0.15 if n < 30 else 0.0))
    result = lookahead.generate(PROMPTS[1], max_new_tokens=300)
    expected = Generator({"target": tree_model}, "greedy", registry=registry).generate(PROMPTS[1], max_new_tokens=300)
    assert result.tokens == expected.tokens
    stats = result.stats.controller
    assert stats["drafting_stops"] >= 1
    assert stats["probes"] >= 1
    assert not stats["drafting_stopped"]
    assert stats["drafting_loss"] < 0  # in all, the trees gained
    trees = sum(count for count, _ in result.stats.forward_sizes["target"].tree.values())
    assert trees >= 2 * JUDGE_AFTER
