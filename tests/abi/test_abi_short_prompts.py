"""The example C controllers generate from a prompt of one or two tokens, giving greedy's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl import Generator
from decoctl.plugins import PluginRegistry

#: "x" and "xy" are one and two tokens with the test tokenizer (no BOS is added)
PROMPTS = {1: "x", 2: "xy"}


@pytest.mark.parametrize("length", sorted(PROMPTS))
@pytest.mark.parametrize("name", ["greedy", "prompt_lookup"])
def test_a_c_controller_on_a_short_prompt_gives_greedys_tokens(
    name: str, length: int, genai_model: Path, c_examples: dict[str, Path], registry: PluginRegistry
) -> None:
    prompt = PROMPTS[length]
    greedy = Generator({"target": genai_model}, registry=registry, threads=1)
    assert len(greedy.tokenizer.encode(prompt)) == length
    expected = greedy.generate(prompt, max_new_tokens=16)
    controller = Generator({"target": genai_model}, f"{c_examples[name]}:{name}", registry=registry, threads=1)
    assert controller.generate(prompt, max_new_tokens=16).tokens == expected.tokens
