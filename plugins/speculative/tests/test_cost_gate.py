"""Never slower than greedy: the cost rule (decoctl.draft_length) takes plain one-token steps where measured costs say
drafting does not pay, gives greedy's tokens all the same, and drafts again once it pays.

Costs come from a cost model, not from the machine (``Costed``: a target forward costs 1 ms plus ``per_token`` ms for
every token past the first, a draft-model forward ``draft_ms``), so what the rule chooses is the same everywhere.
A ``per_token`` of 0.48 is the CPU where a two-token forward costs 1.48 one-token ones (AVX-512, one thread).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
from decoctl_speculative import plugin
from decoctl_speculative.controller import Speculative

from decoctl import ControllerSpec, Generator, Host, hookimpl
from decoctl.plugins import PluginRegistry
from decoctl.testing import ForwardCostClock, first_divergence_is_a_tie

DEAR = 0.48  # ms per token past the first: a two-token forward costs 1.48 one-token ones
CHEAP = 0.02
PROMPTS = [
    "def fib(n):",
    "import os\nimport sys\n",
    "class Stack:\n    def push(self, item):\n        self.items.append(item)\n    def pop(self):",
]


class Costed(Speculative):
    """The speculative controller on a cost-model clock; ``per_token(target forwards so far)`` may change the price
    mid-generation."""

    def __init__(self, options: dict[str, Any], *, per_token: Callable[[int], float], draft_ms: float) -> None:
        self.cost_clock = ForwardCostClock(per_token, role_ms={"draft": draft_ms})
        super().__init__(options, clock=self.cost_clock)

    def start(self, host: Host) -> None:
        self.cost_clock.start(host)
        super().start(host)


def costed_registry(**prices: Any) -> PluginRegistry:
    class CostedPlugin:
        @hookimpl
        def decoctl_controllers(self) -> list[ControllerSpec]:
            (speculative,) = plugin.decoctl_controllers()
            return [attrs.evolve(speculative, name="costed", factory=partial(Costed, **prices))]

    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "speculative")
    registry.register(CostedPlugin(), "costed")
    return registry


def generate(target: Path, draft: Path | None, prompt: str, n: int, options: dict, **prices: Any) -> Any:
    """One generation by the costed controller (``draft``: the draft model, None for prompt lookup)."""
    registry = costed_registry(**prices)
    roles = {"target": target, **({"draft": draft} if draft else {})}
    generator = Generator(roles, "costed", options=options, registry=registry, threads=1)
    return generator.generate(prompt, max_new_tokens=n)


@pytest.mark.parametrize("drafter", ["draft-model", "prompt-lookup"])
def test_where_multi_token_forwards_are_dear_drafting_falls_back_to_plain_steps_with_greedys_tokens(
    target: Path, draft: Path, registry: PluginRegistry, drafter: str
) -> None:
    baseline = Generator({"target": target}, "greedy", registry=registry)
    for prompt in PROMPTS:
        result = generate(
            target, draft if drafter == "draft-model" else None, prompt, 48, {"drafter": drafter},
            per_token=lambda _: DEAR, draft_ms=0.3,
        )  # fmt: skip
        expected = baseline.generate(prompt, max_new_tokens=48).tokens
        assert first_divergence_is_a_tie(target, baseline.tokenizer.encode(prompt), expected, result.tokens), prompt
        # the unrelated draft (and lookups in text that barely repeats) is rarely accepted: a few drafting steps to
        # learn that, then plain ones
        forwards = result.stats.forward_sizes["target"].chain
        verifying = sum(count for n, (count, _) in forwards.items() if n > 1)
        assert 1 <= verifying <= 10, forwards
        assert forwards[1][0] >= 30


def test_a_draft_that_is_always_accepted_on_cheap_forwards_drafts_every_step(target: Path) -> None:
    result = generate(target, target, PROMPTS[0], 60, {}, per_token=lambda _: CHEAP, draft_ms=0.05)
    stats = result.stats.controller
    assert 0 not in stats["k_chosen"]  # only the first two steps, which time a one-token forward, drafted nothing
    assert not stats["drafting_stopped"]
    assert result.stats.tokens_per_target_forward > 3


def test_drafting_stops_while_forwards_are_dear_and_resumes_when_they_are_cheap_again(
    target: Path, registry: PluginRegistry
) -> None:
    # the target as its own draft, every draft accepted: drafting k costs 1 + 1.2k ms (and 0.05 ms a draft
    # forward) for k + 1 tokens while the machine is busy (the first 40 target forwards), and pays once it is not
    per_token = lambda forwards: 1.2 if forwards < 40 else CHEAP  # noqa: E731
    registry_ = costed_registry(per_token=per_token, draft_ms=0.05)
    generator = Generator({"target": target, "draft": target}, "costed", registry=registry_, threads=1)
    prompt = PROMPTS[1]
    result = generator.generate(prompt, max_new_tokens=120)
    expected = Generator({"target": target}, "greedy", registry=registry).generate(prompt, max_new_tokens=120)
    assert result.tokens == expected.tokens
    stats = result.stats.controller
    assert stats["probes"] >= 1
    assert stats["k_chosen"][0] >= 20  # plain steps while drafting lost
    assert sum(n for k, n in stats["k_chosen"].items() if k) >= 8  # drafting steps after it paid again
    assert stats["drafting_loss"] < 0  # in all, drafting gained
