"""Priority and preemption in the serving engine: a request of a higher priority takes the row of a decoding request
of a lower one, which waits, is resumed from its history and ends with the answer it would have given unpreempted."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from decoctl import Generator, load_model
from decoctl.serve._engine import Delta, Engine, EngineRequest, Failed, Finished

from .conftest import plugin_registry
from .test_refusals import completion, refused

LONG = 40


@pytest.fixture(params=[None, 4.0], ids=["no-cache", "prefix-cache"])
def engine(tiny_model: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    made = Engine(
        {"target": load_model(tiny_model)},
        registry=plugin_registry(),
        max_rows=2,
        max_queue=8,
        prefix_cache_mb=request.param,
    )
    yield made
    made.close(drain=False)


def ids(engine: Engine, text: str) -> tuple[int, ...]:
    return tuple(engine.models["target"].tokenizer.encode(text))


class Recorder:
    """Every request's events in one list, in the order the engine sent them (its thread calls ``on(name)``)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.ended = queue.Queue[str]()
        self.tokens: dict[str, int] = {}
        self.hooks: list[Callable[[], None]] = []

    def on(self, name: str) -> Callable[[Any], None]:
        def record(event: Any) -> None:
            self.events.append((name, event))
            if isinstance(event, Delta):
                self.tokens[name] = self.tokens.get(name, 0) + len(event.tokens)
            for hook in list(self.hooks):
                hook()
            if isinstance(event, Finished | Failed):
                self.ended.put(name)

        return record

    def wait(self, count: int) -> None:
        for _ in range(count):
            self.ended.get(timeout=120)

    def finished(self, name: str) -> Finished:
        return next(e for n, e in self.events if n == name and isinstance(e, Finished))

    def streamed(self, name: str) -> tuple[int, ...]:
        return tuple(t for n, e in self.events if n == name and isinstance(e, Delta) for t in e.tokens)


def low_rows_then(engine: Engine, recorder: Recorder, urgent: EngineRequest) -> None:
    """Two priority-5 requests fill both rows; once both decode, ``urgent`` is submitted (from the engine thread,
    between two steps, so that no timing decides whether they still decode)."""
    prompts = {"low-a": "def f(x):", "low-b": "import os"}
    submitted = threading.Event()

    def submit_when_both_decode() -> None:
        if not submitted.is_set() and all(recorder.tokens.get(name, 0) >= 3 for name in prompts):
            submitted.set()
            engine.submit(urgent, recorder.on("urgent"))

    recorder.hooks.append(submit_when_both_decode)
    for name, prompt in prompts.items():
        engine.submit(EngineRequest(ids=ids(engine, prompt), max_new_tokens=LONG, priority=5), recorder.on(name))
    engine.start()


def test_a_higher_priority_request_preempts_a_decoding_row_and_every_answer_is_unchanged(engine: Engine) -> None:
    recorder = Recorder()
    urgent = EngineRequest(ids=ids(engine, "class A:"), max_new_tokens=8, priority=0)
    low_rows_then(engine, recorder, urgent)
    recorder.wait(3)
    assert engine.preempted == 1
    order = [name for name, event in recorder.events if isinstance(event, Finished)]
    # the urgent request got a row at once: it ended before the request it preempted (the later admitted, low-b)
    assert order.index("urgent") < order.index("low-b")
    offline = Generator({"target": engine.models["target"]}, "greedy", registry=engine.registry)
    for name, prompt, length in (("low-a", "def f(x):", LONG), ("low-b", "import os", LONG), ("urgent", "class A:", 8)):
        finished = recorder.finished(name)
        assert finished.tokens == offline.generate(prompt, max_new_tokens=length).tokens
        assert recorder.streamed(name) == finished.tokens  # nothing streamed twice across the preemption
        assert finished.finish_reason == "length" and finished.prompt_tokens == len(ids(engine, prompt))
    engine.close()
    assert engine.live_rows == 0 and engine.queued == 0


def test_a_preempted_request_whose_client_leaves_ends_cancelled(engine: Engine) -> None:
    recorder = Recorder()
    handles: dict[str, Any] = {}
    urgent = EngineRequest(ids=ids(engine, "class A:"), max_new_tokens=8, priority=0)

    def leave_once_preempted() -> None:
        if engine.preempted and "low-b" not in handles:
            handles["low-b"] = True
            for handle in engine._queue:  # the preempted request waits in the queue again
                handle.cancel()

    recorder.hooks.append(leave_once_preempted)
    low_rows_then(engine, recorder, urgent)
    recorder.wait(3)
    assert recorder.finished("low-b").finish_reason == "cancelled"
    assert recorder.finished("low-a").finish_reason == "length"
    assert recorder.finished("urgent").finish_reason == "length"
    engine.close()
    assert engine.cancelled == 1 and engine.live_rows == 0 and engine.queued == 0


def test_a_drain_that_runs_out_ends_a_preempted_request_with_its_text_so_far(tiny_model: Path) -> None:
    engine = Engine({"target": load_model(tiny_model)}, registry=plugin_registry(), max_rows=1, max_queue=8)
    recorder = Recorder()
    urgent = EngineRequest(ids=ids(engine, "class A:"), max_new_tokens=900, priority=0)
    submitted = threading.Event()

    def preempt_then_drain() -> None:
        if not submitted.is_set() and recorder.tokens.get("low", 0) >= 3:
            submitted.set()
            engine.submit(urgent, recorder.on("urgent"))
        elif submitted.is_set() and engine.preempted and recorder.tokens.get("urgent", 0) >= 2:
            engine.drain(0)

    recorder.hooks.append(preempt_then_drain)
    engine.submit(EngineRequest(ids=ids(engine, "def f(x):"), max_new_tokens=900, priority=1), recorder.on("low"))
    engine.start()
    recorder.wait(2)
    engine.close()
    low = recorder.finished("low")
    assert low.finish_reason == "shutdown" and len(low.tokens) >= 3 and recorder.streamed("low") == low.tokens
    assert recorder.finished("urgent").finish_reason == "shutdown"


def test_deterministic_engines_do_not_preempt(tiny_model: Path) -> None:
    engine = Engine(
        {"target": load_model(tiny_model)}, registry=plugin_registry(), max_rows=2, max_queue=8, deterministic=True
    )
    recorder = Recorder()
    low_rows_then(engine, recorder, EngineRequest(ids=ids(engine, "class A:"), max_new_tokens=8, priority=0))
    recorder.wait(3)
    engine.close()
    assert engine.preempted == 0
    order = [name for name, event in recorder.events if isinstance(event, Finished)]
    assert order[-1] == "urgent"


def test_the_server_takes_a_priority_within_its_range(live: Any) -> None:
    status, message = refused(live, completion(decoctl={"priority": 2**40}))
    assert status == 400 and "priority" in message
