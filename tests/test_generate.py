"""One generation end to end: baselines, stop rules, streaming, stats, and errors that keep the text."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from decoctl import (
    CapabilityError,
    ConfigError,
    ControllerError,
    ControllerSpec,
    GenerationError,
    Generator,
    PluginError,
    SequenceError,
    hookimpl,
)
from decoctl.plugins import PluginRegistry
from decoctl.testing import EOS_TOKEN_ID, build_genai_model, reference_logits

PROMPT = "def fib(n):"


def greedy_by_recompute(folder: Path, prompt_ids: list[int], steps: int) -> list[int]:
    ids = list(prompt_ids)
    for _ in range(steps):
        ids.append(int(np.argmax(reference_logits(folder, ids)[-1])))
    return ids[len(prompt_ids) :]


def test_greedy_equals_argmax_of_a_from_scratch_recompute(any_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": any_model}, "greedy", registry=registry, threads=1)
    result = generator.generate(PROMPT, max_new_tokens=12)
    prompt_ids = generator.tokenizer.encode(PROMPT)
    assert list(result.tokens) == greedy_by_recompute(any_model, prompt_ids, 12)
    assert result.stats.stop_reason == "max_new_tokens"
    assert result.stats.forwards["target"] == 11
    assert result.stats.tokens_per_target_forward == pytest.approx(12 / 11)


def test_both_layouts_of_the_same_weights_generate_the_same_tokens(tmp_path: Path, registry: PluginRegistry) -> None:
    from decoctl.testing import build_optimum_model

    genai = build_genai_model(tmp_path / "g", seed=9, num_kv_heads=4)
    optimum = build_optimum_model(tmp_path / "o", seed=9, num_kv_heads=4)
    texts = [
        Generator({"target": f}, registry=registry).generate(PROMPT, max_new_tokens=16).tokens for f in (genai, optimum)
    ]
    assert texts[0] == texts[1]


def test_sampling_is_reproducible_per_seed(genai_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": genai_model}, "sample", registry=registry)
    first = generator.generate(PROMPT, max_new_tokens=16, seed=7).tokens
    assert generator.generate(PROMPT, max_new_tokens=16, seed=7).tokens == first
    assert generator.generate(PROMPT, max_new_tokens=16, seed=8).tokens != first


def test_stream_pieces_join_to_the_final_text(genai_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": genai_model}, registry=registry)
    pieces = list(generator.stream(PROMPT, max_new_tokens=24))
    assert "".join(pieces) == generator.last.text
    assert generator.last.text == generator.tokenizer.decode(generator.last.tokens)


def test_a_stop_string_ends_the_generation_and_is_cut_from_the_text(
    genai_model: Path, registry: PluginRegistry
) -> None:
    generator = Generator({"target": genai_model}, registry=registry)
    full = generator.generate(PROMPT, max_new_tokens=24).text
    stop = full[5:7]
    result = generator.generate(PROMPT, max_new_tokens=24, stop=[stop])
    assert result.stats.stop_reason == "stop_string"
    assert result.text == full[: full.find(stop)]
    assert stop not in "".join(generator.stream(PROMPT, max_new_tokens=24, stop=[stop]))


class CommitsGiven:
    """Commits a fixed token list in one step (to drive the stop rules)."""

    tokens: ClassVar[list[int]] = []

    def __init__(self, options: dict[str, Any]) -> None:
        del options

    def start(self, host: Any) -> None:
        del host

    def step(self, host: Any) -> None:
        self.taken = host.commit(self.tokens)


def test_eos_is_taken_ends_the_generation_and_adds_no_text(genai_model: Path, registry: PluginRegistry) -> None:
    CommitsGiven.tokens = [40, 41, EOS_TOKEN_ID, 42]
    generator = Generator({"target": genai_model}, f"{__name__}:CommitsGiven", registry=registry)
    result = generator.generate(PROMPT, max_new_tokens=10)
    assert result.tokens == (40, 41, EOS_TOKEN_ID)
    assert result.stats.stop_reason == "eos"
    assert result.text == generator.tokenizer.decode([40, 41])


def test_commit_takes_no_more_than_max_new_tokens(genai_model: Path, registry: PluginRegistry) -> None:
    CommitsGiven.tokens = [40, 41, 42, 43, 44]
    generator = Generator({"target": genai_model}, f"{__name__}:CommitsGiven", registry=registry)
    result = generator.generate(PROMPT, max_new_tokens=3)
    assert result.tokens == (40, 41, 42)
    assert result.stats.stop_reason == "max_new_tokens"


class Stalls:
    def __init__(self, options: dict[str, Any]) -> None:
        del options

    def start(self, host: Any) -> None:
        del host

    def step(self, host: Any) -> None:
        del host


def test_a_step_without_progress_is_an_error_naming_the_controller(genai_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": genai_model}, f"{__name__}:Stalls", registry=registry)
    with pytest.raises(GenerationError, match="'stalls' made a step that committed no token") as info:
        generator.generate(PROMPT)
    assert isinstance(info.value.__cause__, ControllerError)


class FailsAfterThree:
    def __init__(self, options: dict[str, Any]) -> None:
        self.steps = 0

    def start(self, host: Any) -> None:
        del host

    def step(self, host: Any) -> None:
        self.steps += 1
        if self.steps > 3:
            raise RuntimeError("the drafter broke")
        token = int(np.argmax(host.target.logits()[-1]))
        host.commit([token])
        host.target.forward([token])


def test_a_controller_failing_midway_returns_the_text_so_far(genai_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": genai_model}, f"{__name__}:FailsAfterThree", registry=registry)
    greedy = Generator({"target": genai_model}, registry=registry).generate(PROMPT, max_new_tokens=3)
    with pytest.raises(GenerationError, match="the drafter broke") as info:
        generator.generate(PROMPT, max_new_tokens=20)
    assert info.value.tokens == list(greedy.tokens)
    assert info.value.text == greedy.text
    assert isinstance(info.value.__cause__, RuntimeError)
    assert info.value.stats.new_tokens == 3


class OverrunsCache:
    def __init__(self, options: dict[str, Any]) -> None:
        del options

    def start(self, host: Any) -> None:
        del host

    def step(self, host: Any) -> None:
        host.commit([5])
        host.target.forward([5] * (host.target.max_length + 1))


def test_a_primitive_error_inside_a_step_keeps_its_type_as_cause(genai_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": genai_model}, f"{__name__}:OverrunsCache", registry=registry)
    with pytest.raises(GenerationError) as info:
        generator.generate(PROMPT)
    assert isinstance(info.value.__cause__, SequenceError)
    assert info.value.tokens == [5]


def test_custom_controller_from_a_file(genai_model: Path, registry: PluginRegistry) -> None:
    example = Path(__file__).parents[1] / "examples" / "custom_loop.py"
    generator = Generator({"target": genai_model}, f"{example}:MyLoop", registry=registry)
    greedy = Generator({"target": genai_model}, registry=registry).generate(PROMPT, max_new_tokens=10)
    assert generator.generate(PROMPT, max_new_tokens=10).tokens == greedy.tokens


def test_unknown_controller_lists_the_installed_ones(genai_model: Path, registry: PluginRegistry) -> None:
    with pytest.raises(PluginError, match=r"unknown controller 'nope' \(installed: beam, greedy, sample\)"):
        Generator({"target": genai_model}, "nope", registry=registry)


def test_an_unknown_controller_option_is_refused(genai_model: Path, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match="has no option 'k'"):
        Generator({"target": genai_model}, "sample", options={"k": 3}, registry=registry)


def test_negative_temperature_is_refused(genai_model: Path, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match="temperature"):
        Generator({"target": genai_model}, "sample", options={"temperature": -1}, registry=registry)


class NeedsDraft:
    roles = ("target", "draft")
    capabilities: ClassVar[dict[str, tuple[str, ...]]] = {"draft": ("hidden_states",)}

    def __init__(self, options: dict[str, Any]) -> None:
        del options

    def start(self, host: Any) -> None:
        del host

    def step(self, host: Any) -> None:
        host.commit([1])


def test_a_required_role_that_is_missing_is_named(genai_model: Path, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=r"needs the role\(s\) \['draft'\]"):
        Generator({"target": genai_model}, f"{__name__}:NeedsDraft", registry=registry)


def test_a_role_no_controller_uses_is_refused(genai_model: Path, genai_draft: Path, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=r"role\(s\) \['draft'\] were given but controller 'greedy'"):
        Generator({"target": genai_model, "draft": genai_draft}, "greedy", registry=registry)


def test_roles_with_different_vocabularies_name_both(
    genai_model: Path, tmp_path: Path, registry: PluginRegistry
) -> None:
    other = build_genai_model(tmp_path / "big-vocab", vocab=512, hidden_states=True)
    with pytest.raises(ConfigError, match=r"role 'draft' \(model big-vocab, vocabulary 512\) and role 'target'"):
        Generator({"target": genai_model, "draft": other}, f"{__name__}:NeedsDraft", registry=registry)


def test_a_capability_a_role_lacks_is_named(genai_model: Path, genai_draft: Path, registry: PluginRegistry) -> None:
    with pytest.raises(CapabilityError, match=r"needs \['hidden_states'\] on role 'draft'"):
        Generator({"target": genai_model, "draft": genai_draft}, f"{__name__}:NeedsDraft", registry=registry)


def test_missing_default_model_says_how_to_get_one(registry: PluginRegistry) -> None:
    with pytest.raises(Exception, match="default model 'pycode' is not installed"):
        Generator(registry=registry)


def test_observer_hooks_see_start_commits_and_end(genai_model: Path) -> None:
    seen: dict[str, Any] = {"commits": 0}

    class Observer:
        @hookimpl
        def decoctl_generation_start(self, prompt: str, controller: str, roles: dict[str, str]) -> None:
            seen["start"] = (prompt, controller, roles["target"])

        @hookimpl
        def decoctl_commit(self, tokens: list[int], text: str) -> None:
            seen["commits"] += len(tokens)

        @hookimpl
        def decoctl_generation_end(self, stats: Any, error: BaseException | None) -> None:
            seen["end"] = (stats.new_tokens, error)

    registry = PluginRegistry(autoload=False)
    registry.register(Observer(), "observer")
    Generator({"target": genai_model}, registry=registry).generate(PROMPT, max_new_tokens=5)
    assert seen == {"start": (PROMPT, "greedy", genai_model.name), "commits": 5, "end": (5, None)}


def test_stats_carry_an_execution_trace(genai_model: Path, registry: PluginRegistry) -> None:
    result = Generator({"target": genai_model}, "sample", options={"temperature": 0.5}, registry=registry).generate(
        PROMPT, max_new_tokens=4
    )
    trace = result.stats.trace
    assert trace["controller"] == "sample"
    assert trace["options"] == {"temperature": 0.5, "n": 1, "best_of": None}
    assert trace["roles"] == {"target": genai_model.name}
    assert trace["degraded"] == []


def test_a_controller_plugin_registered_directly_is_found(genai_model: Path) -> None:
    class Plugin:
        @hookimpl
        def decoctl_controllers(self) -> list[ControllerSpec]:
            return [ControllerSpec(name="Stall_Loop", summary="never moves", factory=Stalls)]

    registry = PluginRegistry(autoload=False)
    registry.register(Plugin(), "stall-plugin")
    spec = registry.controllers()["stall-loop"]
    assert spec.plugin == "stall-plugin"
