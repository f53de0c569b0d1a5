"""The engine under the server: rows admitted and released between steps, one Run for every one-token row, drafting
rows verifying alone, a failing controller failing its own request only, and shutdown draining."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from decoctl import ControllerSpec, Generator, hookimpl, load_model
from decoctl.generation import ChatPrompt
from decoctl.serve._engine import Delta, Engine, EngineClosedError, EngineRequest, Failed, Finished
from decoctl.serve._join_rule import JoinRule
from decoctl.testing import build_genai_model
from decoctl.testing._join_rules import Alternating

from .conftest import plugin_registry


class Broken:
    """Greedy for two steps, then a bug."""

    def __init__(self, options: Any) -> None:
        self.steps = 0

    def start(self, host: Any) -> None:
        pass

    def step(self, host: Any) -> None:
        self.steps += 1
        if self.steps > 2:
            raise ZeroDivisionError("the controller's bug")
        token = int(host.argmax(host.target.logits()[-1:])[0])
        host.commit((token,))
        host.target.forward((token,))


class BrokenPlugin:
    @hookimpl
    def decoctl_controllers(self) -> list[ControllerSpec]:
        return [ControllerSpec(name="broken", summary="fails on its third step", factory=Broken)]


class Never(JoinRule):
    """A join rule that keeps every speculating row drafting."""

    def choose(self, rows: Any, batch_rows: int, span: int, **given: Any) -> set[Any]:
        return set()


class AfterTwoSteps(JoinRule):
    """A join rule that moves a speculating row into the batched step after its second step."""

    def choose(self, rows: Any, batch_rows: int, span: int, **given: Any) -> set[Any]:
        return {row for row in rows if len(self._steps.get(row, ())) >= 2}


@pytest.fixture
def engine(tiny_model: Path) -> Iterator[Engine]:
    registry = plugin_registry()
    registry.register(BrokenPlugin(), "broken")
    made = Engine({"target": load_model(tiny_model)}, registry=registry, max_rows=4, max_queue=32, join_rule=Never())
    yield made
    made.close(drain=False)


def ids(engine: Engine, text: str) -> tuple[int, ...]:
    return tuple(engine.models["target"].tokenizer.encode(text))


def collect(events: queue.Queue[Any], count: int) -> list[Any]:
    """Events until ``count`` completions finished or failed."""
    seen, ended = [], 0
    while ended < count:
        event = events.get(timeout=120)
        seen.append(event)
        ended += isinstance(event, Finished | Failed)
    return seen


def test_one_token_rows_step_together_in_one_run(engine: Engine) -> None:
    prompts = ["def f(x):", "import os", "class A:", "x = 1"]
    inbox: list[queue.Queue[Any]] = []
    for prompt in prompts:  # queued before the engine starts: all four are admitted in its first step
        inbox.append(queue.Queue())
        engine.submit(EngineRequest(ids=ids(engine, prompt), max_new_tokens=10), inbox[-1].put)
    engine.start()
    finished = [next(e for e in collect(q, 1) if isinstance(e, Finished)) for q in inbox]
    # ten tokens each: the first from the prefill, nine fed in nine Runs of four rows (the last one is not fed)
    assert engine.batched_runs == 9
    offline = Generator({"target": engine.models["target"]}, "greedy", registry=engine.registry)
    assert [f.tokens for f in finished] == [offline.generate(p, max_new_tokens=10).tokens for p in prompts]


def test_a_drafting_row_verifies_alone_beside_batched_rows(engine: Engine) -> None:
    text = "def f(x):\n    return x\n\n\ndef f(x):\n"
    greedy, lookup = queue.Queue[Any](), queue.Queue[Any]()
    engine.submit(EngineRequest(ids=ids(engine, text), max_new_tokens=12), greedy.put)
    engine.submit(
        EngineRequest(
            ids=ids(engine, text), max_new_tokens=12, controller="speculative", options={"drafter": "prompt-lookup"}
        ),
        lookup.put,
    )
    engine.start()
    plain = next(e for e in collect(greedy, 1) if isinstance(e, Finished))
    drafted = next(e for e in collect(lookup, 1) if isinstance(e, Finished))
    assert drafted.tokens == plain.tokens
    assert engine.batched_runs == 11  # the greedy row's: the speculating row never joined a batched Run


def test_a_failing_controller_fails_its_own_request_and_frees_its_row(engine: Engine) -> None:
    engine.start()
    good, bad = queue.Queue[Any](), queue.Queue[Any]()
    engine.submit(EngineRequest(ids=ids(engine, "import os"), max_new_tokens=30), good.put)
    engine.submit(EngineRequest(ids=ids(engine, "import os"), max_new_tokens=30, controller="broken"), bad.put)
    failure = collect(bad, 1)[-1]
    assert isinstance(failure, Failed) and "ZeroDivisionError: the controller's bug" in failure.message
    assert isinstance(collect(good, 1)[-1], Finished)
    engine.close()
    assert engine.live_rows == 0


def test_cancel_ends_a_completion_and_frees_its_row(engine: Engine) -> None:
    events = queue.Queue[Any]()
    handles, seen = [], []

    def leave_after_the_third_token(event: Any) -> None:  # runs on the engine thread, between two steps
        events.put(event)
        if isinstance(event, Delta):
            seen.extend(event.tokens)
            if len(seen) == 3:
                handles[0].cancel()

    handles.append(
        engine.submit(EngineRequest(ids=ids(engine, "def f(x):"), max_new_tokens=900), leave_after_the_third_token)
    )
    engine.start()
    ended = next(e for e in collect(events, 1) if isinstance(e, Finished))
    assert ended.finish_reason == "cancelled" and len(ended.tokens) == 3
    engine.close()
    assert engine.live_rows == 0 and engine.cancelled == 1


def test_shutdown_drains_live_and_queued_requests(engine: Engine) -> None:
    inbox = [queue.Queue[Any]() for _ in range(6)]  # more than the four rows: two wait in the queue
    for number, events in enumerate(inbox):
        engine.submit(EngineRequest(ids=ids(engine, f"x = {number}"), max_new_tokens=8), events.put)
    engine.start()
    engine.close()  # drains: every request runs to its end
    finished = [next(e for e in collect(q, 1) if isinstance(e, Finished)) for q in inbox]
    assert [f.finish_reason for f in finished] == ["length"] * 6
    with pytest.raises(EngineClosedError):
        engine.submit(EngineRequest(ids=(5,), max_new_tokens=1), print)


def test_n_completions_share_a_request_and_draw_their_own_streams(engine: Engine) -> None:
    engine.start()
    events = queue.Queue[Any]()
    request = EngineRequest(ids=ids(engine, "class A:"), max_new_tokens=12, n=3, seed=4, controller="sample")
    engine.submit(request, events.put)
    finished = sorted((e for e in collect(events, 3) if isinstance(e, Finished)), key=lambda f: f.index)
    offline = Generator({"target": engine.models["target"]}, "sample", options={"n": 3}, registry=engine.registry)
    expected = offline.generate("class A:", max_new_tokens=12, seed=4)
    assert [f.tokens for f in finished] == [c.tokens for c in expected.completions]


class RecordedPrefills(JoinRule):
    """The cost rule, recording each prompt forward's (tokens, whether it computed logits)."""

    def __init__(self) -> None:
        super().__init__()
        self.prefills: list[tuple[int, bool]] = []

    def observe_prefill(self, tokens: int, seconds: float, *, logits: bool = True) -> None:
        self.prefills.append((tokens, logits))
        super().observe_prefill(tokens, seconds, logits=logits)


def test_a_long_prompt_prefills_a_chunk_a_step_while_other_rows_decode(tiny_model: Path) -> None:
    registry = plugin_registry()
    rule = RecordedPrefills()
    engine = Engine({"target": load_model(tiny_model)}, registry=registry, max_rows=2, prefill_chunk=4, join_rule=rule)
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    short, long = ids(engine, "x = 1"), ids(engine, "def read_lines(path, encoding):\n    with open(path) as f:")
    assert len(short) <= 4 < 24 < len(long)
    # the short row decodes for longer than the long prompt can take to go in, however many tokens the measured
    # costs let a step feed (one at the least): the long prompt never ends with no row decoding beside it
    engine.submit(EngineRequest(ids=short, max_new_tokens=len(long) + 30), lambda e: events.put(("short", e)))
    engine.submit(EngineRequest(ids=long, max_new_tokens=5), lambda e: events.put(("long", e)))
    engine.start()
    order: list[str] = []
    finished: dict[str, Finished] = {}
    while len(finished) < 2:
        who, event = events.get(timeout=120)
        if isinstance(event, Delta):
            order.extend([who] * len(event.tokens))
        if isinstance(event, Finished):
            finished[who] = event
    engine.close()
    chunks = -(-len(long) // 4)
    # the short prompt's tokens came one a step while the long one was fed a chunk a step
    assert order.index("long") >= chunks - 1
    offline = Generator({"target": engine.models["target"]}, "greedy", registry=registry, prefill_chunk=4)
    prompt = ChatPrompt(engine.models["target"].tokenizer.decode(long), long)  # these ids exactly
    assert finished["long"].tokens == offline.generate(prompt, max_new_tokens=5).tokens
    # the short prompt whole with its logits (no row decoding then); the long one's chunks without logits, its last
    # token fed in a batched Run beside the short row's
    assert rule.prefills[0] == (len(short), True)
    assert all(not logits for _, logits in rule.prefills[1:]) and sum(n for n, _ in rule.prefills[1:]) == len(long) - 1


@pytest.mark.parametrize("decoding", [False, True])
def test_n_completions_share_one_prefill_and_keep_their_offline_twins_tokens(tiny_model: Path, decoding: bool) -> None:
    registry = plugin_registry()
    rule = RecordedPrefills()
    engine = Engine({"target": load_model(tiny_model)}, registry=registry, max_rows=4, join_rule=rule)
    others = queue.Queue[Any]()
    if decoding:  # a row decoding already: the request's prompt goes in beside it
        engine.submit(EngineRequest(ids=ids(engine, "x = 1"), max_new_tokens=30), others.put)
    events = queue.Queue[Any]()
    text = "def read_lines(path, encoding):\n    with open(path) as f:"
    request = EngineRequest(ids=ids(engine, text), max_new_tokens=10, n=3, seed=7, controller="sample")
    engine.submit(request, events.put)
    engine.start()
    finished = sorted((e for e in collect(events, 3) if isinstance(e, Finished)), key=lambda f: f.index)
    if decoding:
        collect(others, 1)
    engine.close()
    offline = Generator({"target": engine.models["target"]}, "sample", options={"n": 3}, registry=registry)
    expected = offline.generate(text, max_new_tokens=10, seed=7)
    assert [f.tokens for f in finished] == [c.tokens for c in expected.completions]
    # the three completions' prompt: fed once, without logits, but for its last token (fed in the batched Run)
    prompt = rule.prefills[1:] if decoding else rule.prefills
    assert sum(n for n, _ in prompt) == len(request.ids) - 1 and not any(logits for _, logits in prompt)
    assert_no_row_left(engine)


def test_a_speculating_rows_last_prompt_chunk_computes_its_logits(tiny_model: Path) -> None:
    registry = plugin_registry()
    rule = RecordedPrefills()
    engine = Engine({"target": load_model(tiny_model)}, registry=registry, max_rows=2, prefill_chunk=4, join_rule=rule)
    text = "def read_lines(path, encoding):\n    with open(path) as f:"
    greedy, lookup = queue.Queue[Any](), queue.Queue[Any]()
    engine.submit(EngineRequest(ids=ids(engine, "x = 1"), max_new_tokens=40), greedy.put)
    options = {"drafter": "prompt-lookup"}
    request = EngineRequest(ids=ids(engine, text), max_new_tokens=6, controller="speculative", options=options)
    engine.submit(request, lookup.put)
    engine.start()
    got = next(e for e in collect(lookup, 1) if isinstance(e, Finished))
    collect(greedy, 1)
    engine.close()
    assert [logits for _, logits in rule.prefills[1:]] == [False] * (len(rule.prefills) - 2) + [True]
    offline = Generator({"target": engine.models["target"]}, "greedy", registry=registry)
    assert got.tokens == offline.generate(text, max_new_tokens=6).tokens


def test_a_speculating_row_the_join_rule_moves_into_the_batch_keeps_greedys_tokens(tiny_model: Path) -> None:
    registry = plugin_registry()
    engine = Engine({"target": load_model(tiny_model)}, registry=registry, max_rows=2, join_rule=AfterTwoSteps())
    text = "def f(x):\n    return x\n\n\ndef f(x):\n"
    greedy, lookup = queue.Queue[Any](), queue.Queue[Any]()
    engine.submit(EngineRequest(ids=ids(engine, text), max_new_tokens=16), greedy.put)
    options = {"drafter": "prompt-lookup"}
    request = EngineRequest(ids=ids(engine, text), max_new_tokens=16, controller="speculative", options=options)
    engine.submit(request, lookup.put)
    engine.start()
    plain = next(e for e in collect(greedy, 1) if isinstance(e, Finished))
    events = collect(lookup, 1)
    joined = next(e for e in events if isinstance(e, Finished))
    engine.close()
    assert engine.joined == 1
    assert joined.tokens == plain.tokens
    # its first step in the engine step after its prompt's (the join rule places it), two steps of its own, then its
    # pending token fed in a batched Run and one token a Run: the greedy row's 15 Runs, and as many more as the
    # joined row needs after the greedy row ended
    own = sum(len(e.tokens) for e in events[:2])
    assert engine.batched_runs == max(15, 3 + 16 - own)


def test_a_sampling_speculating_row_never_joins(tiny_model: Path) -> None:
    registry = plugin_registry()
    engine = Engine({"target": load_model(tiny_model)}, registry=registry, max_rows=2, join_rule=AfterTwoSteps())
    events = queue.Queue[Any]()
    options = {"drafter": "prompt-lookup", "sampling": True}
    engine.submit(
        EngineRequest(ids=ids(engine, "x = 1"), max_new_tokens=8, seed=1, controller="speculative", options=options),
        events.put,
    )
    engine.start()
    collect(events, 1)
    engine.close()
    assert engine.joined == 0


def assert_no_row_left(engine: Engine) -> None:
    """Every row free and empty, and the join rule holding no row's steps."""
    assert engine._free == list(range(engine.max_rows)) and not engine._slots
    assert all(engine.rows[row].length == 0 for row in range(engine.max_rows))
    assert not engine.join_rule._steps


@pytest.mark.parametrize(("batched", "drafting"), [(2, 1), (1, 2), (1, 1)])
def test_a_speculating_row_that_joins_and_resumes_keeps_greedys_tokens(
    tiny_model: Path, batched: int, drafting: int
) -> None:
    registry = plugin_registry()
    rule = Alternating(batched, drafting)
    engine = Engine({"target": load_model(tiny_model)}, registry=registry, max_rows=3, join_rule=rule)
    prompts = ["def f(x):\n    return x\n\n\ndef f(x):\n", "import os\nimport sys\nimport os\n"]
    inbox = []
    for text in prompts:
        inbox.append(queue.Queue[Any]())
        options = {"drafter": "prompt-lookup"}
        request = EngineRequest(ids=ids(engine, text), max_new_tokens=24, controller="speculative", options=options)
        engine.submit(request, inbox[-1].put)
    inbox.append(queue.Queue[Any]())
    engine.submit(EngineRequest(ids=ids(engine, "class A:"), max_new_tokens=24), inbox[-1].put)
    engine.start()
    finished = [next(e for e in collect(q, 1) if isinstance(e, Finished)) for q in inbox]
    engine.close()
    offline = Generator({"target": engine.models["target"]}, "greedy", registry=registry)
    expected = [offline.generate(text, max_new_tokens=24).tokens for text in [*prompts, "class A:"]]
    assert [f.tokens for f in finished] == expected
    assert engine.joined >= 4 and engine.resumed >= 2  # each speculating row went into the Run and back, twice
    assert_no_row_left(engine)


def test_a_draft_model_row_that_joins_and_resumes_keeps_greedys_tokens(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    draft = build_genai_model(tmp_path_factory.mktemp("serve-draft"), seed=4, max_length=1024)
    registry = plugin_registry()
    models = {"target": load_model(tiny_model), "draft": load_model(draft)}
    engine = Engine(models, registry=registry, max_rows=2, join_rule=Alternating(2, 2))
    text = "def f(x):\n    return x\n"
    events = queue.Queue[Any]()
    engine.submit(EngineRequest(ids=ids(engine, text), max_new_tokens=20, controller="speculative"), events.put)
    engine.start()
    finished = next(e for e in collect(events, 1) if isinstance(e, Finished))
    engine.close()
    offline = Generator({"target": models["target"]}, "greedy", registry=registry)
    assert finished.tokens == offline.generate(text, max_new_tokens=20).tokens
    assert engine.resumed >= 2
    assert_no_row_left(engine)


def test_a_cancelled_joined_row_frees_its_row(tiny_model: Path) -> None:
    registry = plugin_registry()
    engine = Engine({"target": load_model(tiny_model)}, registry=registry, max_rows=2, join_rule=Alternating(99, 1))
    events = queue.Queue[Any]()
    options = {"drafter": "prompt-lookup"}
    request = EngineRequest(ids=ids(engine, "x = 1"), max_new_tokens=500, controller="speculative", options=options)
    handle = engine.submit(request, events.put)
    engine.start()
    events.get(timeout=120)  # a first token: the row is in the Run
    handle.cancel()
    ended = next(e for e in collect(events, 1) if isinstance(e, Finished))
    engine.close()
    assert ended.finish_reason == "cancelled" and engine.joined == 1 and engine.resumed == 0
    assert_no_row_left(engine)
