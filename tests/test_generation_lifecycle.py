"""How a generation starts and ends on a Generator: one at a time, streams that are overtaken, threads, interrupts,
failures in the middle of a step, and the seed it is given."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from decoctl import ConfigError, GenerationError, GenerationResult, Generator, GeneratorInUseError, hookimpl
from decoctl.plugins import PluginRegistry

PROMPT = "def fib(n):"
OTHER = "class Stack:"
#: long enough for a few events, short of a flaky hang: an Event wait, never a sleep
WAIT_SECONDS = 60


def greedy(model: Path, registry: PluginRegistry, prompt: str, n: int) -> GenerationResult:
    return Generator({"target": model}, registry=registry, threads=1).generate(prompt, max_new_tokens=n)


class Ends:
    """An observer that records each generation's end: (stop reason, error type or None)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, type[BaseException] | None]] = []

    @hookimpl
    def decoctl_generation_end(self, stats: Any, error: BaseException | None) -> None:
        self.seen.append((stats.stop_reason, None if error is None else type(error)))


@pytest.fixture
def ends() -> Ends:
    return Ends()


@pytest.fixture
def observed(ends: Ends) -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    registry.register(ends, "ends")
    return registry


def _greedy_step(host: Any) -> None:
    token = int(np.argmax(host.target.logits()[-1]))
    host.commit([token])
    if not host.done:
        host.target.forward([token])


# -- streams -----------------------------------------------------------------------------------------------------
def test_an_older_stream_raises_on_its_next_item_once_a_newer_stream_has_started(
    genai_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator({"target": genai_model}, registry=registry, threads=1)
    older = generator.stream(PROMPT, max_new_tokens=16)
    newer = generator.stream(OTHER, max_new_tokens=16)
    next(older)
    first = next(newer)
    with pytest.raises(GeneratorInUseError, match="ended by a newer generation on the same Generator"):
        next(older)
    assert first + "".join(newer) == greedy(genai_model, registry, OTHER, 16).text


def test_an_abandoned_stream_resumed_after_a_newer_generation_raises(
    genai_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator({"target": genai_model}, registry=registry, threads=1)
    abandoned = generator.stream(PROMPT, max_new_tokens=16)
    next(abandoned)
    assert generator.generate(OTHER, max_new_tokens=16).tokens == greedy(genai_model, registry, OTHER, 16).tokens
    with pytest.raises(GeneratorInUseError, match="finish \\(or close\\) a stream before starting another"):
        next(abandoned)


def test_an_overtaken_streams_generation_ends_as_superseded(
    genai_model: Path, observed: PluginRegistry, ends: Ends
) -> None:
    generator = Generator({"target": genai_model}, registry=observed, threads=1)
    abandoned = generator.stream(PROMPT, max_new_tokens=16)
    next(abandoned)
    generator.generate(OTHER, max_new_tokens=4)
    assert ends.seen == [("superseded", None), ("max_new_tokens", None)]


def test_closing_a_stream_early_ends_its_generation_with_the_text_so_far(
    genai_model: Path, observed: PluginRegistry, ends: Ends
) -> None:
    generator = Generator({"target": genai_model}, registry=observed, threads=1)
    stream = generator.stream(PROMPT, max_new_tokens=16)
    first = next(stream)
    stream.close()
    assert ends.seen == [("closed", None)]
    assert generator.last.stats.stop_reason == "closed"
    assert generator.last.text.startswith(first)


# -- threads -----------------------------------------------------------------------------------------------------
class HoldsItsFirstStep:
    """Greedy, but its first step waits for ``release`` after setting ``entered``."""

    entered: ClassVar[threading.Event] = threading.Event()
    release: ClassVar[threading.Event] = threading.Event()

    def __init__(self, options: dict[str, Any]) -> None:
        self.first = True

    def start(self, host: Any) -> None:
        del host

    def step(self, host: Any) -> None:
        if self.first:
            self.first = False
            type(self).entered.set()
            type(self).release.wait(WAIT_SECONDS)
        _greedy_step(host)


def test_a_generation_from_a_second_thread_while_one_runs_is_refused_with_the_rule(
    genai_model: Path, registry: PluginRegistry
) -> None:
    HoldsItsFirstStep.entered.clear()
    HoldsItsFirstStep.release.clear()
    generator = Generator({"target": genai_model}, f"{__name__}:HoldsItsFirstStep", registry=registry, threads=1)
    results: list[GenerationResult] = []
    running = threading.Thread(target=lambda: results.append(generator.generate(PROMPT, max_new_tokens=8)))
    running.start()
    try:
        assert HoldsItsFirstStep.entered.wait(WAIT_SECONDS)
        with pytest.raises(GeneratorInUseError, match="in another thread: use one Generator per thread"):
            generator.generate(OTHER, max_new_tokens=8)
    finally:
        HoldsItsFirstStep.release.set()
        running.join()
    assert results[0].tokens == greedy(genai_model, registry, PROMPT, 8).tokens


def test_generators_sharing_a_model_generate_in_two_threads_at_once(
    genai_model: Path, registry: PluginRegistry
) -> None:
    first = Generator({"target": genai_model}, registry=registry, threads=1)
    second = Generator({"target": first.models["target"]}, registry=registry)
    expected = {prompt: greedy(genai_model, registry, prompt, 32).tokens for prompt in (PROMPT, OTHER)}
    together = threading.Barrier(2, timeout=WAIT_SECONDS)
    got: dict[str, tuple[int, ...]] = {}

    def run(generator: Generator, prompt: str) -> None:
        together.wait()
        got[prompt] = generator.generate(prompt, max_new_tokens=32).tokens

    threads = [threading.Thread(target=run, args=pair) for pair in ((first, PROMPT), (second, OTHER))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == expected


# -- interrupts --------------------------------------------------------------------------------------------------
class InterruptedAfterThree:
    """Greedy; its fourth step raises KeyboardInterrupt, in the first generation only (``armed``)."""

    armed: ClassVar[bool] = True

    def __init__(self, options: dict[str, Any]) -> None:
        self.steps = 0

    def start(self, host: Any) -> None:
        del host

    def step(self, host: Any) -> None:
        self.steps += 1
        if self.steps > 3 and type(self).armed:
            type(self).armed = False
            raise KeyboardInterrupt
        _greedy_step(host)


def _interrupted(generator: Generator, mode: str) -> None:
    InterruptedAfterThree.armed = True
    with pytest.raises(KeyboardInterrupt):
        if mode == "generate":
            generator.generate(PROMPT, max_new_tokens=20)
        else:
            for _ in generator.stream(PROMPT, max_new_tokens=20):
                pass


@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_a_keyboard_interrupt_still_calls_the_end_hook(
    mode: str, genai_model: Path, observed: PluginRegistry, ends: Ends
) -> None:
    generator = Generator({"target": genai_model}, f"{__name__}:InterruptedAfterThree", registry=observed)
    _interrupted(generator, mode)
    assert ends.seen == [("interrupted", KeyboardInterrupt)]


@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_after_a_keyboard_interrupt_last_holds_the_text_so_far(
    mode: str, genai_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator({"target": genai_model}, f"{__name__}:InterruptedAfterThree", registry=registry)
    _interrupted(generator, mode)
    expected = greedy(genai_model, registry, PROMPT, 3)
    assert generator.last.tokens == expected.tokens
    assert generator.last.text == expected.text
    assert generator.last.stats.stop_reason == "interrupted"


def test_a_generator_interrupted_midway_generates_normally_afterwards(
    genai_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator({"target": genai_model}, f"{__name__}:InterruptedAfterThree", registry=registry)
    _interrupted(generator, "generate")
    assert generator.generate(PROMPT, max_new_tokens=12).tokens == greedy(genai_model, registry, PROMPT, 12).tokens


# -- a step that fails after committing ----------------------------------------------------------------------------
class FailsAfterCommittingInStepThree:
    def __init__(self, options: dict[str, Any]) -> None:
        self.steps = 0

    def start(self, host: Any) -> None:
        del host

    def step(self, host: Any) -> None:
        self.steps += 1
        _greedy_step(host)
        if self.steps == 3:
            raise RuntimeError("the drafter broke after committing")


def _stream_until_it_fails(generator: Generator, stop: tuple[str, ...]) -> tuple[list[str], GenerationError]:
    pieces: list[str] = []
    stream: Iterator[str] = generator.stream(PROMPT, max_new_tokens=20, stop=stop)
    with pytest.raises(GenerationError, match="the drafter broke after committing") as info:
        for piece in stream:
            pieces.append(piece)
    return pieces, info.value


@pytest.mark.parametrize("held_back", [False, True], ids=["plain", "text-held-back-for-a-stop-string"])
def test_a_stream_yields_what_a_failing_step_committed_before_raising(
    held_back: bool, genai_model: Path, registry: PluginRegistry
) -> None:
    expected = greedy(genai_model, registry, PROMPT, 3)
    # a stop string that begins with the text's last character holds that character back from the stream
    stop = (expected.text[-1] + "\uffff",) if held_back else ()
    generator = Generator({"target": genai_model}, f"{__name__}:FailsAfterCommittingInStepThree", registry=registry)
    pieces, error = _stream_until_it_fails(generator, stop)
    assert error.tokens == list(expected.tokens)
    assert error.text == expected.text
    assert "".join(pieces) == error.text


# -- seeds -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["generate", "stream"])
@pytest.mark.parametrize("seed", [-1, 1.5, "7", True])
def test_a_seed_that_is_not_a_whole_number_from_zero_is_refused(
    seed: Any, mode: str, genai_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator({"target": genai_model}, "sample", registry=registry, threads=1)
    with pytest.raises(ConfigError, match=r"seed=.+ is not a valid seed: give a whole number from 0 up"):
        if mode == "generate":
            generator.generate(PROMPT, max_new_tokens=4, seed=seed)
        else:
            next(generator.stream(PROMPT, max_new_tokens=4, seed=seed))


def test_a_numpy_integer_seed_is_the_same_seed(genai_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": genai_model}, "sample", registry=registry, threads=1)
    expected = generator.generate(PROMPT, max_new_tokens=8, seed=7).tokens
    assert generator.generate(PROMPT, max_new_tokens=8, seed=np.int64(7)).tokens == expected
