"""Requests checked into plans: a logits chain built (its grammars compiled) once per distinct choice, prepared where
the plan is made, and cloned for each completion; a request checked without building a Generator."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import Generator, hookimpl, load_model
from decoctl.errors import ConfigError
from decoctl.serve._engine import Engine, EngineRequest, Finished
from decoctl.specs import ProcessorSpec

from .conftest import plugin_registry


class Counted:
    """A logits processor that keeps state per sequence and counts what is done to it: built, prepared (its first
    call, as a grammar builds its matcher), cloned."""

    built = 0
    prepared = 0
    cloned = 0

    def __init__(self, options: Any) -> None:
        type(self).built += 1
        self.ready = False

    def reset(self, prompt: np.ndarray) -> None:
        pass

    def commit(self, tokens: Any) -> None:
        pass

    def clone(self) -> Counted:
        type(self).cloned += 1
        twin = Counted.__new__(Counted)
        twin.ready = self.ready
        return twin

    def __call__(self, rows: np.ndarray, context: Any) -> np.ndarray:
        if not self.ready:
            type(self).prepared += 1
            self.ready = True
        return rows


class CountedPlugin:
    @hookimpl
    def decoctl_logits_processors(self) -> list[ProcessorSpec]:
        return [ProcessorSpec(name="counted", summary="counts its builds", factory=Counted)]


@pytest.fixture
def engine(tiny_model: Path) -> Any:
    registry = plugin_registry()
    registry.register(CountedPlugin(), "counted")
    made = Engine({"target": load_model(tiny_model)}, registry=registry, max_rows=4, warm=False)
    for name in ("built", "prepared", "cloned"):
        setattr(Counted, name, 0)
    yield made
    made.close(drain=False)


def test_a_chain_is_built_and_prepared_once_per_choice_and_each_completion_runs_a_clone(engine: Engine) -> None:
    ids = tuple(engine.models["target"].tokenizer.encode("def f(x):"))
    request = EngineRequest(ids=ids, max_new_tokens=4, n=2, controller="sample", seed=1, processors="counted")
    plans = {id(engine.check(request)) for _ in range(3)}
    assert len(plans) == 1 and (Counted.built, Counted.prepared) == (1, 1)
    engine.start()
    events = queue.Queue[Any]()
    for _ in range(2):
        engine.submit(request, events.put)
    finished = 0
    while finished < 4:
        finished += isinstance(events.get(timeout=120), Finished)
    # four completions: four clones of the one chain, each prepared already (none built on the engine thread)
    assert (Counted.built, Counted.prepared, Counted.cloned) == (1, 1, 4)


def test_a_grammar_is_compiled_when_the_request_is_checked(engine: Engine) -> None:
    ids = tuple(engine.models["target"].tokenizer.encode("x = "))
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'
    request = EngineRequest(ids=ids, max_new_tokens=4, processors=[{"name": "grammar", "json_schema": schema}])
    grammar = engine.check(request).chain.processors[0]
    assert grammar.grammar is not None and grammar._initial is not None  # its matcher built for the model's tokens


def test_a_bad_schema_is_refused_when_the_request_is_checked(engine: Engine) -> None:
    ids = tuple(engine.models["target"].tokenizer.encode("x = "))
    request = EngineRequest(ids=ids, max_new_tokens=4, processors=[{"name": "grammar", "json_schema": "{"}])
    with pytest.raises(ConfigError, match="grammar"):
        engine.check(request)


def test_a_request_is_refused_as_decoctl_generate_refuses_its_choice(engine: Engine) -> None:
    ids = tuple(engine.models["target"].tokenizer.encode("x = "))
    options = {"drafter": "prompt-lookup", "bogus": 1}
    request = EngineRequest(ids=ids, max_new_tokens=4, controller="speculative", options=options)
    with pytest.raises(ConfigError, match="bogus") as served:
        engine.check(request)
    with pytest.raises(ConfigError) as offline:
        Generator({"target": engine.models["target"]}, "speculative", options=options, registry=engine.registry)
    assert str(served.value) == str(offline.value)
