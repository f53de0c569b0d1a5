"""The example plugin in README.md works as the contract there says."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np

from decoctl import Generator, ProcessContext
from decoctl.plugins import PluginRegistry, parse_processor_chain

README = Path(__file__).parents[1] / "README.md"


def example_plugin() -> types.ModuleType:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- example-plugin.*?-->\s*```python\n(.*?)```", text, re.S)
    assert block, "README.md lost its example plugin block"
    module = types.ModuleType("my_processors")
    exec(compile(block.group(1), str(README), "exec"), module.__dict__)
    return module


def test_the_example_plugin_overlays_drafted_tokens_without_advancing(registry: PluginRegistry) -> None:
    registry.register(example_plugin(), "my-processors")
    chain = parse_processor_chain("max_count=2", registry)
    chain.commit([4])
    context = ProcessContext(np.zeros(1, np.int64), np.array([4]), [[], [4], [4, 5]])
    out = chain(np.zeros((3, 8), np.float32), context)
    assert [np.flatnonzero(row == -np.inf).tolist() for row in out] == [[], [4], [4]]
    assert chain(np.zeros((1, 8), np.float32), ProcessContext(context.prompt, context.output, [[]]))[0, 4] == 0


def test_the_example_plugin_stops_repeats_under_a_generation(tiny_model: Path, registry: PluginRegistry) -> None:
    registry.register(example_plugin(), "my-processors")
    generator = Generator({"target": tiny_model}, "chain", processors="max_count=1,top_k=40", registry=registry)
    tokens = generator.generate("def fib(n):", max_new_tokens=24, seed=0).tokens
    assert len(set(tokens)) == len(tokens)
