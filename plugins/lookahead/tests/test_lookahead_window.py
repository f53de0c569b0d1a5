"""Lookahead on a sliding-window model: its trees stay exact past the window, so its text is greedy's."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl import Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_genai_model

# long enough that every prompt and its output run far past the window
PROMPTS = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "x = [i * i for i in range(10)]\nx = [i * i for i in range(10)]\nx = [",
    "class Stack:\n    def push(self, item):\n        self.items.append(item)\n    def pop(self):",
    "import os\nimport sys\nimport json\nimport time\n",
    "a = 1\nb = 2\nc = a + b\nd = c * a\ne = d - b\n",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n",
]


@pytest.fixture(scope="session")
def windowed_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(
        tmp_path_factory.mktemp("windowed"), seed=16, num_layers=3, tree_inputs=True, local_window_size=6
    )


@pytest.mark.parametrize(("window", "ngram", "guesses", "copy_length"), [(1, 2, 1, 8), (3, 3, 2, 0), (2, 4, 3, 4)])
def test_greedy_lookahead_is_greedy_past_the_window(
    windowed_model: Path, registry: PluginRegistry, window: int, ngram: int, guesses: int, copy_length: int
) -> None:
    baseline = Generator({"target": windowed_model}, "greedy", registry=registry, threads=1)
    options = {"window": window, "ngram": ngram, "guesses": guesses, "copy_length": copy_length}
    lookahead = Generator({"target": windowed_model}, "lookahead", options=options, registry=registry, threads=1)
    for prompt in PROMPTS:
        expected = baseline.generate(prompt, max_new_tokens=40).tokens
        assert lookahead.generate(prompt, max_new_tokens=40).tokens == expected, prompt
