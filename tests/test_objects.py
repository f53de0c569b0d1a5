"""Controllers and logits processors as Python objects: wherever a name is taken (Generator, decoctl.generate, a
processor chain), a class or an instance that satisfies decoctl.Controller / decoctl.LogitsProcessor is taken too,
and an object that breaks the contract is refused by name, keeping the text generated before it broke."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import decoctl
from decoctl import (
    ConfigError,
    Controller,
    GenerationError,
    Generator,
    LogitsProcessor,
    Option,
    PluginError,
    ProcessContext,
    ProcessorSpec,
    hookimpl,
)
from decoctl.plugins import PluginRegistry

PROMPT = "def fib(n):"
NEW = 8


def greedy_tokens(model: Path, registry: PluginRegistry, prompt: str = PROMPT, **kwargs: Any) -> tuple[int, ...]:
    return (
        Generator({"target": model}, "greedy", registry=registry, **kwargs).generate(prompt, max_new_tokens=NEW).tokens
    )


# -- controllers --------------------------------------------------------------------------------------------------
class Argmax:
    """Greedy over host primitives: step() alone."""

    def step(self, host: Any) -> None:
        token = int(host.argmax(host.target.logits()[-1:])[0])
        host.commit([token])
        if not host.done:
            host.target.forward([token])


class Banning(Argmax):
    """Greedy that never picks token ``ban`` (an option, checked against its schema)."""

    options = (Option(name="ban", type="int", default=0, minimum=0),)

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.ban = options["ban"]

    def step(self, host: Any) -> None:
        row = np.array(host.process(host.target.logits()[-1:])[0])
        row[self.ban] = -np.inf
        token = int(row.argmax())
        host.commit([token])
        if not host.done:
            host.target.forward([token])


class Counting(Argmax):
    """Counts its generations in start()."""

    def __init__(self) -> None:
        self.generations = 0

    def start(self, host: Any) -> None:
        self.generations += 1

    def stats(self) -> Mapping[str, Any]:
        return {"generations": self.generations}


class NoStep:
    def start(self, host: Any) -> None:
        del host


def test_a_controller_with_step_alone_satisfies_the_protocol() -> None:
    assert isinstance(Argmax(), Controller)
    assert not isinstance(NoStep(), Controller)


def test_a_controller_class_without_options_runs_as_greedy(genai_model: Path, registry: PluginRegistry) -> None:
    got = Generator({"target": genai_model}, Argmax, registry=registry).generate(PROMPT, max_new_tokens=NEW)
    assert got.tokens == greedy_tokens(genai_model, registry)
    assert got.stats.trace["controller"] == "argmax"


def test_a_controller_class_is_built_with_its_checked_options(genai_model: Path, registry: PluginRegistry) -> None:
    first = greedy_tokens(genai_model, registry)[0]
    generator = Generator({"target": genai_model}, Banning, options={"ban": str(first)}, registry=registry)
    assert generator.options == {"ban": first}  # converted and checked like a named controller's
    assert first not in generator.generate(PROMPT, max_new_tokens=NEW).tokens


def test_a_controller_class_refuses_options_outside_its_schema(genai_model: Path, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match="option ban=-1 must be at least 0"):
        Generator({"target": genai_model}, Banning, options={"ban": -1}, registry=registry)


def test_options_for_a_class_whose_init_takes_none_are_refused_naming_it(registry: PluginRegistry) -> None:
    with pytest.raises(
        ConfigError, match=r"controller Counting: its __init__ takes no options, but options \{'k': 2\}"
    ):
        Generator({"target": "/no/such/model"}, Counting, options={"k": 2}, registry=registry)


def test_a_class_declaring_options_it_cannot_receive_is_refused(registry: PluginRegistry) -> None:
    class Deaf(Argmax):
        options = (Option(name="k", type="int", default=1),)

    with pytest.raises(ConfigError, match=r"declares options \['k'\] but its __init__ takes no argument"):
        Generator({"target": "/no/such/model"}, Deaf, registry=registry)


def test_a_ready_instance_runs_every_generation_and_starts_each(genai_model: Path, registry: PluginRegistry) -> None:
    controller = Counting()
    generator = Generator({"target": genai_model}, controller, registry=registry)
    generator.generate(PROMPT, max_new_tokens=NEW)
    second = generator.generate(PROMPT, max_new_tokens=NEW)
    assert controller.generations == 2
    assert second.stats.controller == {"generations": 2}
    assert second.tokens == greedy_tokens(genai_model, registry)


def test_an_instance_given_options_is_refused_naming_it(registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=r"controller Counting is an instance, built already, but options"):
        Generator({"target": "/no/such/model"}, Counting(), options={"k": 2}, registry=registry)


@pytest.mark.parametrize("given", [NoStep, NoStep()], ids=["class", "instance"])
def test_a_controller_without_step_is_refused_naming_the_method(given: Any, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=r"controller NoStep \((class|object) NoStep\) has no step\(host\) method"):
        Generator({"target": "/no/such/model"}, given, registry=registry)


def test_the_one_shot_function_takes_a_controller_class(genai_model: Path, registry: PluginRegistry) -> None:
    got = decoctl.generate(PROMPT, model=genai_model, controller=Argmax, max_new_tokens=NEW, registry=registry)
    assert got.tokens == greedy_tokens(genai_model, registry)


def test_a_controller_class_with_next_token_runs_batched_prompts_together(
    genai_model: Path, registry: PluginRegistry
) -> None:
    class RowArgmax(Argmax):
        def next_token(self, host: Any) -> int:
            return int(host.argmax(host.target.logits()[-1:])[0])

    prompts = ["def f(x):", "import os", "class A:"]
    results = Generator({"target": genai_model}, RowArgmax, registry=registry).generate_batch(
        prompts, batch_size=3, max_new_tokens=NEW
    )
    assert [r.tokens for r in results] == [greedy_tokens(genai_model, registry, p) for p in prompts]
    assert results[0].stats.trace["batched"] == "3 rows in one buffer, refilled as prompts finish"


# -- processors ---------------------------------------------------------------------------------------------------
def ban_token_seven(rows: np.ndarray, context: ProcessContext) -> np.ndarray:
    rows[:, 7] = -np.inf
    return rows


class Ban:
    """Sets the given tokens to -inf (a processor without state: __call__ alone)."""

    def __init__(self, *tokens: int) -> None:
        self.tokens = list(tokens)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        rows[:, self.tokens] = -np.inf
        return rows


class BanPlugin:
    @hookimpl
    def decoctl_logits_processors(self) -> list[ProcessorSpec]:
        option = Option(name="token", type="int", default=0, minimum=0)
        return [ProcessorSpec(name="ban", summary="test", factory=lambda o: Ban(o["token"]), options=(option,))]


@pytest.fixture
def with_ban(registry: PluginRegistry) -> PluginRegistry:
    registry.register(BanPlugin(), "ban-plugin")
    return registry


def argmax_banning(model: Path, banned: Sequence[int], prompt: str = PROMPT) -> tuple[int, ...]:
    """Greedy decoding with ``banned`` tokens set to -inf at every step, written out over a Sequence."""
    from decoctl.host import Sequence as Seq
    from decoctl.model import load_model

    sequence = Seq("target", load_model(model, threads=1))
    row = np.array(sequence.prefill(sequence.model.tokenizer.encode(prompt))[0])
    tokens: list[int] = []
    for _ in range(NEW):
        row[list(banned)] = -np.inf
        tokens.append(int(row.argmax()))
        row = np.array(sequence.forward([tokens[-1]])[0])
    return tuple(tokens)


def test_a_processor_may_be_a_plain_function() -> None:
    assert isinstance(ban_token_seven, LogitsProcessor)


def test_processors_mix_chain_strings_tables_pairs_and_objects(genai_model: Path, with_ban: PluginRegistry) -> None:
    processors = ["ban=3", {"name": "ban", "token": 4}, ("ban", {"token": 5}), Ban(6), ban_token_seven]
    generator = Generator({"target": genai_model}, "greedy", processors=processors, registry=with_ban)
    assert generator.chain.names == ("ban", "ban", "ban", "Ban", "ban_token_seven")
    assert generator.generate(PROMPT, max_new_tokens=NEW).tokens == argmax_banning(genai_model, [3, 4, 5, 6, 7])
    assert generator.last.stats.trace["processors"] == [
        "ban=3",
        {"name": "ban", "token": 4},
        {"name": "ban", "token": 5},
        "Ban",
        "ban_token_seven",
    ]


@pytest.mark.parametrize(
    ("processor", "message"),
    [
        (Ban, r"logits processor Ban is a class: pass an instance \(Ban\(...\)\)"),
        (42, r"logits processor int has no __call__\(rows, context\) method"),
        ("unknown_processor", "unknown logits processor 'unknown_processor'"),
    ],
    ids=["class", "not callable", "unknown name"],
)
def test_what_is_no_processor_is_refused_naming_it(processor: Any, message: str, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=message):
        Generator({"target": "/no/such/model"}, processors=[processor], registry=registry)


def test_a_transformers_processor_must_be_wrapped(registry: PluginRegistry) -> None:
    from transformers import RepetitionPenaltyLogitsProcessor

    with pytest.raises(
        ConfigError, match=r"transformers'.*decoctl.from_transformers\(RepetitionPenaltyLogitsProcessor"
    ):
        Generator({"target": "/no/such/model"}, processors=[RepetitionPenaltyLogitsProcessor(1.2)], registry=registry)


class BreaksAt:
    """Behaves until the sequence holds ``after`` generated tokens, then breaks its contract as ``how`` says."""

    def __init__(self, after: int, how: str) -> None:
        self.after, self.how = after, how

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        if context.new_tokens(0) < self.after:
            return rows
        if self.how == "raises":
            raise ValueError("no more")
        if self.how == "shape":
            return rows[:, :10]
        if self.how == "float64":
            return rows.astype(np.float64)
        return None  # type: ignore[return-value]  # the contract broken on purpose


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("raises", r"logits processor 'BreaksAt' raised ValueError: no more"),
        ("shape", r"logits processor 'BreaksAt' returned float32\[1, 10\], but a processor returns float32\[1, \d+\]"),
        ("float64", r"logits processor 'BreaksAt' returned float64\[1, \d+\], but a processor returns float32"),
        ("none", r"logits processor 'BreaksAt' returned None, but a processor returns float32\[1, \d+\]"),
    ],
)
@pytest.mark.parametrize("controller", ["greedy", "sample"])
def test_a_processor_that_breaks_is_named_and_the_text_so_far_kept(
    how: str, message: str, controller: str, genai_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator({"target": genai_model}, controller, processors=[BreaksAt(3, how)], registry=registry)
    with pytest.raises(
        GenerationError, match=rf"controller '{controller}' failed after 3 token\(s\): {message}"
    ) as err:
        generator.generate(PROMPT, max_new_tokens=NEW, seed=1)
    assert isinstance(err.value.__cause__, PluginError)
    assert len(err.value.tokens) == 3
    assert err.value.text == generator.tokenizer.decode(err.value.tokens)


# -- processors with state per sequence: clone() ----------------------------------------------------------------
class FollowsItsSequence:
    """Remembers the tokens committed to its sequence and checks, every call, that the context shows exactly those;
    bans the last one (so its state changes what is generated). Every instance is kept to be looked at."""

    made: ClassVar[list[FollowsItsSequence]] = []

    def __init__(self) -> None:
        self.seen: list[int] = []
        FollowsItsSequence.made.append(self)

    def reset(self, prompt: np.ndarray) -> None:
        self.seen = []

    def commit(self, tokens: Sequence[int]) -> None:
        self.seen.extend(int(t) for t in tokens)

    def clone(self) -> FollowsItsSequence:
        copy = FollowsItsSequence()
        copy.seen = list(self.seen)
        return copy

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for row in range(len(rows)):
            assert list(context.generated(row)[: len(self.seen)]) == self.seen, "followed another sequence"
        if self.seen:
            rows[:, self.seen[-1]] = -np.inf
        return rows


class Unclonable(FollowsItsSequence):
    clone = None  # type: ignore[assignment]  # a stateful processor without clone()


@pytest.fixture
def follows() -> FollowsItsSequence:
    FollowsItsSequence.made.clear()
    return FollowsItsSequence()


def test_a_stateful_chain_with_clone_runs_several_samples_each_followed_by_its_clone(
    genai_model: Path, registry: PluginRegistry, follows: FollowsItsSequence
) -> None:
    generator = Generator({"target": genai_model}, "sample", options={"n": 3}, processors=[follows], registry=registry)
    result = generator.generate(PROMPT, max_new_tokens=NEW, seed=5)

    assert len({c.tokens for c in result.completions}) == 3
    seen = sorted(tuple(p.seen) for p in FollowsItsSequence.made if p.seen)
    assert seen == sorted(c.tokens for c in result.completions)  # each clone saw exactly its completion's commits
    for completion in result.completions:
        assert all(a != b for a, b in itertools.pairwise(completion.tokens))


def test_the_first_of_several_samples_is_the_single_sample_under_a_stateful_chain(
    genai_model: Path, registry: PluginRegistry, follows: FollowsItsSequence
) -> None:
    alone = Generator({"target": genai_model}, "sample", processors=[follows], registry=registry)
    many = Generator(
        {"target": genai_model}, "sample", options={"n": 3}, processors=[follows.clone()], registry=registry
    )
    assert (
        many.generate(PROMPT, max_new_tokens=NEW, seed=5).tokens
        == alone.generate(PROMPT, max_new_tokens=NEW, seed=5).tokens
    )


def test_a_stateful_chain_without_clone_is_refused_with_several_samples_naming_it(
    genai_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator(
        {"target": genai_model}, "sample", options={"n": 2}, processors=[Unclonable()], registry=registry
    )
    with pytest.raises(
        GenerationError, match=r"holds state per sequence \(Unclonable\).*give those processors a clone"
    ):
        generator.generate(PROMPT, max_new_tokens=NEW)


def test_batched_prompts_under_a_stateful_chain_with_clone_run_together(
    genai_model: Path, registry: PluginRegistry, follows: FollowsItsSequence
) -> None:
    prompts = ["def f(x):", "import os", "class A:", "x = 1"]
    generator = Generator({"target": genai_model}, "greedy", processors=[follows], registry=registry)
    alone = [generator.generate(p, max_new_tokens=NEW).tokens for p in prompts]

    results = generator.generate_batch(prompts, batch_size=2, max_new_tokens=NEW)

    assert [r.tokens for r in results] == alone
    assert {r.stats.trace["batched"] for r in results} == {"2 rows in one buffer, refilled as prompts finish"}


def test_batched_prompts_under_a_stateful_chain_without_clone_run_one_at_a_time(
    genai_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator({"target": genai_model}, "greedy", processors=[Unclonable()], registry=registry)
    results = generator.generate_batch(["def f(x):", "import os"], batch_size=2, max_new_tokens=NEW)
    assert results[0].stats.trace["batched"] == (
        "one at a time: the logits chain holds state per sequence (Unclonable) without clone()"
    )


def test_a_clone_that_returns_itself_is_refused(genai_model: Path, registry: PluginRegistry) -> None:
    class Selfish(FollowsItsSequence):
        def clone(self) -> Selfish:
            return self

    generator = Generator(
        {"target": genai_model}, "sample", options={"n": 2}, processors=[Selfish()], registry=registry
    )
    with pytest.raises(GenerationError, match=r"logits processor 'Selfish': clone\(\) returned itself"):
        generator.generate(PROMPT, max_new_tokens=NEW)


class NoRepeats:
    """Bans every token generated before each row: its state is the committed tokens, a row's drafted path (a beam's
    tokens, during beam search) goes on top."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def reset(self, prompt: np.ndarray) -> None:
        self.seen = []

    def commit(self, tokens: Sequence[int]) -> None:
        self.seen.extend(int(t) for t in tokens)

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for row in range(len(rows)):
            rows[row, [*self.seen, *context.paths[row]]] = -np.inf
        return rows


def test_beam_search_runs_a_stateful_chain_with_each_beams_tokens_as_its_path(
    genai_model: Path, registry: PluginRegistry
) -> None:
    options = {"num_beams": 3, "num_return_sequences": 2}
    plain = Generator({"target": genai_model}, "beam", options=options, registry=registry)
    assert any(len(set(c.tokens)) < len(c.tokens) for c in plain.generate(PROMPT, max_new_tokens=NEW).completions)

    processors = [NoRepeats()]
    generator = Generator({"target": genai_model}, "beam", options=options, processors=processors, registry=registry)
    result = generator.generate(PROMPT, max_new_tokens=NEW)
    assert len(result.completions) == 2
    assert all(len(set(c.tokens)) == len(c.tokens) for c in result.completions)
