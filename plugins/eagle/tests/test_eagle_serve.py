"""EAGLE rows in decoctl serve: the engine's cost rule moves a speculating row into the batched greedy step and back
(``Eagle.resume``), and the row keeps greedy's tokens."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import pytest

from decoctl import Generator, load_model
from decoctl.plugins import PluginRegistry
from decoctl.serve import Engine, EngineRequest, Finished
from decoctl.testing import Alternating, first_divergence_is_a_tie

#: drafting options fixed, so that the rows draft whatever the machine's costs
DRAFTING = {"chain": {"drafting": "chain", "k": 4, "adaptive": False}, "tree": {"drafting": "tree"}}


@pytest.mark.parametrize("drafting", list(DRAFTING))
def test_an_eagle_row_that_joins_and_resumes_keeps_greedys_tokens(
    target: Path, mimic_head: Path, drafting: str
) -> None:
    registry = PluginRegistry()
    models = {"target": load_model(target), "eagle": load_model(mimic_head)}
    engine = Engine(models, registry=registry, max_rows=3, join_rule=Alternating(2, 2))
    prompts = ["x = [i * i for i in range(10)]\nx = [", "def fib(n):", "import os\nimport sys\n"]
    inbox = []
    for number, text in enumerate(prompts):
        inbox.append(queue.Queue[Any]())
        controller = "eagle" if number < 2 else "greedy"
        request = EngineRequest(
            ids=models["target"].tokenizer.encode(text),
            max_new_tokens=30,
            controller=controller,
            options=DRAFTING[drafting] if controller == "eagle" else {},
        )
        engine.submit(request, inbox[-1].put)
    engine.start()
    finished = []
    for events in inbox:
        while not isinstance(event := events.get(timeout=120), Finished):
            pass
        finished.append(event)
    engine.close()
    offline = Generator({"target": models["target"]}, "greedy", registry=registry)
    for text, got in zip(prompts, finished, strict=True):
        expected = offline.generate(text, max_new_tokens=30).tokens
        assert first_divergence_is_a_tie(target, offline.tokenizer.encode(text), expected, list(got.tokens)), text
    assert engine.joined >= 4 and engine.resumed >= 2  # each eagle row went into the Run and back
    assert sum(f.drafted for f in finished[:2]) > 0  # and drafted, the imitating head's drafts accepted
