"""The bundled demo models: registered, wired to each other, and every strategy on them gives greedy's output.

These run on the committed bundle (plugins/models/decoctl_models), so a bundle missing a model fails here rather
than being skipped. The strategies' exactness on random models is tested in their own distributions; this checks
the real target with its real draft and head, where drafts are mostly accepted and long accepted runs happen.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest

from decoctl import Generator
from decoctl.model import load_model
from decoctl.plugins import PluginRegistry
from decoctl.testing import assert_greedys_tokens

pytestmark = pytest.mark.demo

NAMES = ("pycode", "pycode-small", "pycode-draft", "pycode-eagle")
PROMPTS = [
    "def fibonacci(n):",
    "import os\n\n\ndef walk_files(root):\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
]
STRATEGIES: dict[str, tuple[str, dict[str, Any]]] = {
    "speculative, draft model": ("speculative", {}),
    "speculative, prompt lookup": ("speculative", {"drafter": "prompt-lookup"}),
    "lookahead": ("lookahead", {}),
    "eagle, tree": ("eagle", {"drafting": "tree"}),
    "eagle, chain (the default)": ("eagle", {}),
    "eagle, chain k=4, unsure stops": ("eagle", {"drafting": "chain", "k": 4, "confidence": 0.3}),
}


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    return PluginRegistry().models()


def test_every_bundled_model_is_registered_and_pycode_names_its_draft_and_head(models: dict[str, Any]) -> None:
    missing = [name for name in NAMES if name not in models]
    assert not missing, f"not bundled: {missing}"
    assert dict(models["pycode"].roles) == {"draft": "pycode-draft", "eagle": "pycode-eagle"}


def test_the_target_can_verify_trees_and_hands_out_its_features(models: dict[str, Any]) -> None:
    capabilities = load_model(models["pycode"].path, threads=1).capabilities
    assert capabilities.tree and capabilities.hidden_states


def test_the_default_model_writes_python() -> None:
    prompt = "def fibonacci(n):"
    text = prompt + Generator(threads=1).generate(prompt, max_new_tokens=64).text
    lines = text.splitlines()
    # the longest run of whole lines from the start that is valid Python (the last lines may be cut mid-block)
    valid = next((n for n in range(len(lines) - 1, 0, -1) if _parses("\n".join(lines[:n]))), 0)
    assert valid >= 3, text
    tree = ast.parse("\n".join(lines[:valid]))
    assert any(isinstance(node, ast.Return) for node in ast.walk(tree.body[0])), text  # a function with a body


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


#: drafting on every step, whatever the measured costs say: the cost rules decide from the machine's timings, so
#: whether they draft at all is a benchmark's question (docs/BENCHMARKS.md), not a test's
ALWAYS_DRAFT: dict[str, dict[str, Any]] = {
    "speculative, draft model": {"adaptive": False, "k": 4},
    "speculative, prompt lookup": {"adaptive": False, "k": 4},
    "lookahead": {"adaptive": False},
    "eagle, tree": {},
    "eagle, chain (the default)": {"adaptive": False, "k": 2},
    "eagle, chain k=4, unsure stops": {"adaptive": False},
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_each_strategy_gives_greedys_tokens_on_the_bundled_models(strategy: str) -> None:
    controller, options = STRATEGIES[strategy]
    baseline = Generator({"target": "pycode"}, "greedy", threads=1)
    fast = Generator({"target": "pycode"}, controller, options=options, threads=1)

    assert_greedys_tokens(baseline, fast, PROMPTS, max_new_tokens=64)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_the_real_draft_is_accepted_on_the_bundled_models(strategy: str) -> None:
    controller, options = STRATEGIES[strategy]
    baseline = Generator({"target": "pycode"}, "greedy", threads=1)
    fast = Generator({"target": "pycode"}, controller, options={**options, **ALWAYS_DRAFT[strategy]}, threads=1)

    results = assert_greedys_tokens(baseline, fast, PROMPTS, max_new_tokens=64)

    # accepted, not just tolerated: fewer target forwards than tokens over the prompts (a first plain step, which
    # reads the prefill's logits, not counted)
    saved = sum(r.stats.controller.get("steps_without_forward", 0) for r in results)
    assert sum(r.stats.forwards["target"] for r in results) < sum(len(r.tokens) for r in results) - saved
