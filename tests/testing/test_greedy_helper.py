"""decoctl.testing.assert_greedys_tokens: the one loop behind every "this strategy gives greedy's tokens" test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import assert_greedys_tokens

PROMPTS = ["def fib(n):", "import os"]


class SecondBest:
    """Takes greedy's runner-up at the third step: a difference where greedy's choice is no tie."""

    def start(self, host: Any) -> None:
        self.steps = 0

    def step(self, host: Any) -> None:
        row = np.array(host.target.logits()[-1])
        self.steps += 1
        if self.steps == 3:
            row[row.argmax()] = -np.inf
        token = int(row.argmax())
        host.commit([token])
        if not host.done:
            host.target.forward([token])


def test_greedy_against_itself_passes_and_returns_each_prompts_result(
    genai_model: Path, registry: PluginRegistry
) -> None:
    baseline = Generator({"target": genai_model}, registry=registry)
    results = assert_greedys_tokens(
        baseline, Generator({"target": genai_model}, registry=registry), PROMPTS, max_new_tokens=8
    )
    assert [len(r.tokens) for r in results] == [8, 8]


def test_a_difference_where_greedy_is_sure_fails_naming_the_prompt(genai_model: Path, registry: PluginRegistry) -> None:
    baseline = Generator({"target": genai_model}, registry=registry)
    other = Generator({"target": genai_model}, SecondBest, registry=registry)
    with pytest.raises(
        AssertionError, match=r"'def fib\(n\):': greedy gave .* first apart where greedy's choice is no tie"
    ):
        assert_greedys_tokens(baseline, other, PROMPTS, max_new_tokens=8)
