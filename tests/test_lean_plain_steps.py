"""Never slower than greedy, pinned by structure rather than by time: where drafting does not pay and no probe is
due, a drafting controller's step makes the host calls greedy's step makes and asks its draft-length rule nothing
(decoctl.draft_length.PlainRun: the rule grants the plain steps until a probe could be due at once).

Each controller runs on a cost-model clock (decoctl.testing.ForwardCostClock) on which a forward of several tokens is
dear, with a drafter the target rarely agrees with, so its gate stops drafting after a few steps whatever the
machine; a spy records, for every step, the calls the controller made on the Host and its Sequences (calls those
make inside are not counted) and whether it called its rule or gate at all.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial, wraps
from pathlib import Path
from typing import Any

import attrs
import pytest
from decoctl_eagle import plugin as eagle_plugin
from decoctl_lookahead import plugin as lookahead_plugin
from decoctl_speculative import plugin as speculative_plugin

from decoctl import ControllerSpec, Generator, Host, hookimpl
from decoctl.draft_length import CostAwareLength, DraftGate, DraftLength
from decoctl.host import Sequence
from decoctl.plugins import PluginRegistry
from decoctl.testing import ForwardCostClock, build_eagle_head, build_genai_model

DEAR = 0.48  # ms per token past a forward's first: drafting does not pay here
CATCH_UP_MOST = 4
PROMPTS = [
    "def fib(n):",
    "class Stack:\n    def push(self, item):\n        self.items.append(item)\n    def pop(self):",
]
#: what a plain step calls: host.target, its forward of the pending token, host.argmax, host.commit, host.done
PLAIN = Counter({"Host.target": 1, "Sequence.forward": 1, "Host.argmax": 1, "Host.commit": 1, "Host.done": 1})


class Spy:
    """Records each controller step's calls on Host and Sequence (at the top level only) and on the rule."""

    def __init__(self) -> None:
        self.steps: list[tuple[Counter[str], bool]] = []
        self._depth = 0
        self._inside = False

    def wrap_class(self, monkeypatch: pytest.MonkeyPatch, cls: type, *, rule: bool) -> None:
        for name, attribute in inspect.getmembers(cls):
            if name.startswith("_"):
                continue
            static = inspect.getattr_static(cls, name)
            if isinstance(static, property) and static.fget is not None:
                monkeypatch.setattr(cls, name, property(self._wrap(f"{cls.__name__}.{name}", static.fget, rule)))
            elif inspect.isfunction(attribute):
                monkeypatch.setattr(cls, name, self._wrap(f"{cls.__name__}.{name}", attribute, rule))

    def _wrap(self, label: str, function: Callable[..., Any], rule: bool) -> Callable[..., Any]:
        @wraps(function)
        def called(*args: Any, **kwargs: Any) -> Any:
            if self._inside and self._depth == 0:
                if rule:
                    self._asked = True
                else:
                    self._calls[label] += 1
            self._depth += 1
            try:
                return function(*args, **kwargs)
            finally:
                self._depth -= 1

        return called

    def unseen(self, function: Callable[[], float]) -> Callable[[], float]:
        """``function`` with the calls it makes left out (the test's clock, which reads the host's statistics)."""

        def call() -> float:
            self._depth += 1
            try:
                return function()
            finally:
                self._depth -= 1

        return call

    def step(self, step: Callable[[Host], None], host: Host) -> None:
        self._calls: Counter[str] = Counter()
        self._asked = False
        self._inside = True
        try:
            step(host)
        finally:
            self._inside = False
        self.steps.append((self._calls, self._asked))

    def granted(self) -> Iterator[Counter[str]]:
        """The host calls of the steps that asked the rule nothing."""
        return (calls for calls, asked in self.steps if not asked)


def spied(cls: type, spy: Spy, draft_ms: float = 0.3) -> Callable[[dict[str, Any]], Any]:
    """``cls`` on the cost-model clock, its steps recorded by ``spy``."""

    class Spied(cls):
        def __init__(self, options: dict[str, Any]) -> None:
            self.cost_clock = ForwardCostClock(DEAR, role_ms={"draft": draft_ms, "eagle": draft_ms})
            if cls.__name__ == "Greedy":
                super().__init__(options)
            else:
                super().__init__(options, clock=spy.unseen(self.cost_clock))

        def start(self, host: Host) -> None:
            self.cost_clock.start(host)
            super().start(host)

        def step(self, host: Host) -> None:
            spy.step(super().step, host)

    return Spied


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    target = build_genai_model(tmp_path_factory.mktemp("target"), seed=3, hidden_states=True, tree_inputs=True)
    draft = build_genai_model(tmp_path_factory.mktemp("draft"), seed=4, num_layers=1, hidden=32, num_heads=2)
    head = build_eagle_head(tmp_path_factory.mktemp("head"), target, seed=42, tree_inputs=True)
    return {"target": target, "draft": draft, "eagle": head}


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    spy = Spy()
    for cls in (Host, Sequence):
        spy.wrap_class(monkeypatch, cls, rule=False)
    for cls in (DraftLength, CostAwareLength, DraftGate):
        spy.wrap_class(monkeypatch, cls, rule=True)
    return spy


def generate(spy: Spy, models: dict[str, Path], plugin: Any, roles: tuple[str, ...], options: dict[str, Any]) -> Any:
    (spec,) = [s for s in plugin.decoctl_controllers() if s.name in ("speculative", "lookahead", "eagle")]

    class SpiedPlugin:
        @hookimpl
        def decoctl_controllers(self) -> list[ControllerSpec]:
            return [attrs.evolve(spec, name="spied", factory=spied(spec.factory, spy))]

    registry = PluginRegistry(autoload=False)
    registry.register(plugin, spec.name)
    registry.register(SpiedPlugin(), "spied")
    generator = Generator({role: models[role] for role in roles}, "spied", options=options, registry=registry)
    baseline = Generator({"target": models["target"]}, "greedy")
    for prompt in PROMPTS:
        assert (
            generator.generate(prompt, max_new_tokens=64).tokens == baseline.generate(prompt, max_new_tokens=64).tokens
        )
    return generator


def test_greedys_step_makes_the_plain_steps_calls_and_reads_the_last_logits(
    spy: Spy, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from decoctl.controllers import Greedy

    registry = PluginRegistry(autoload=False)
    generator = Generator({"target": models["target"]}, "greedy", registry=registry)
    step = Greedy.step
    monkeypatch.setattr(Greedy, "step", lambda self, host: spy.step(partial(step, self), host))
    generator.generate(PROMPTS[0], max_new_tokens=32)
    *steps, (last, _) = spy.steps
    assert all(calls == PLAIN + Counter({"Sequence.logits": 1}) for calls, _ in steps)
    assert last == PLAIN + Counter({"Sequence.logits": 1}) - Counter({"Sequence.forward": 1})  # done: no forward


@pytest.mark.parametrize(
    ("plugin", "roles", "options"),
    [
        (speculative_plugin, ("target", "draft"), {}),
        (lookahead_plugin, ("target",), {}),
    ],
    ids=["draft-model", "lookahead"],
)
def test_a_gated_off_step_makes_greedys_host_calls_and_asks_the_rule_nothing(
    spy: Spy, models: dict[str, Path], plugin: Any, roles: tuple[str, ...], options: dict[str, Any]
) -> None:
    generate(spy, models, plugin, roles, options)
    granted = list(spy.granted())
    assert len(granted) >= len(spy.steps) * 2 // 3  # drafting stopped early: most steps are granted plain steps
    for calls in granted:
        assert calls == PLAIN, calls


def test_a_gated_off_eagle_step_feeds_its_head_only_what_a_catch_up_would_read(
    spy: Spy, models: dict[str, Path]
) -> None:
    """EAGLE's plain steps keep a pair for the head's next catch-up only within catch_up_most of the granted run's end
    (a catch-up feeds no more): those read the target's features too."""
    generate(spy, models, eagle_plugin, ("target", "eagle"), {"catch_up_most": CATCH_UP_MOST})
    granted = list(spy.granted())
    assert len(granted) >= len(spy.steps) * 2 // 3
    runs = sum(asked for _, asked in spy.steps)  # every run of granted steps follows a step that asked the rule
    features = Counter({"Host.target": 1, "Sequence.hidden_states": 1})
    for calls in granted:
        assert calls in (PLAIN, PLAIN + features), calls
    assert sum(calls == PLAIN + features for calls in granted) <= CATCH_UP_MOST * runs
    assert sum(calls == PLAIN for calls in granted) > 0
