"""Every controller generates from a prompt of one or two tokens, and the greedy ones give greedy's tokens.

A one-token prompt is the edge of the pending-token set-up every drafting controller shares: after start() the
target's KV cache is empty and the whole context is the pending token, so the first step cannot be a tree.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from decoctl import Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_eagle_head, build_genai_model

#: "x" and "xy" are one and two tokens with the test tokenizer (no BOS is added)
PROMPTS = {1: "x", 2: "xy"}
NEW_TOKENS = 16

#: (controller, options, roles beyond the target); roles name the fixtures below
GREEDY_CONTROLLERS = [
    ("greedy", {}, ()),
    ("speculative", {"drafter": "prompt-lookup"}, ()),
    ("speculative", {"drafter": "draft-model"}, ("draft",)),
    ("lookahead", {}, ()),
    ("lookahead", {"window": 3, "ngram": 3, "guesses": 2}, ()),
    ("eagle", {"drafting": "chain"}, ("eagle",)),
    ("eagle", {"drafting": "tree", "depth": 3, "topk": 2, "nodes": 6}, ("eagle",)),
]
SAMPLING_CONTROLLERS = [
    ("sample", {}, ()),
    ("speculative", {"drafter": "prompt-lookup", "sampling": True}, ()),
    ("speculative", {"drafter": "draft-model", "sampling": True}, ("draft",)),
    ("lookahead", {"sampling": True}, ()),
    ("eagle", {"drafting": "chain", "sampling": True}, ("eagle",)),
    ("eagle", {"drafting": "tree", "sampling": True}, ("eagle",)),
]


def _id(case: tuple[str, dict[str, Any], tuple[str, ...]]) -> str:
    name, options, _ = case
    return name + "".join(f"-{k}={v}" for k, v in options.items())


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("short-target"), seed=3, hidden_states=True, tree_inputs=True)


@pytest.fixture(scope="module")
def head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eagle_head(
        tmp_path_factory.mktemp("short-eagle"), target, copy_layer=0, feature_mix=0.1, tree_inputs=True
    )


@pytest.fixture
def plugins() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    for distribution in ("decoctl_speculative", "decoctl_lookahead", "decoctl_eagle"):
        registry.register(pytest.importorskip(f"{distribution}.plugin"), distribution)
    return registry


def _generator(
    case: tuple[str, dict[str, Any], tuple[str, ...]], target: Path, roles: dict[str, Path], registry: PluginRegistry
) -> Generator:
    name, options, extra = case
    models = {"target": target, **{role: roles[role] for role in extra}}
    return Generator(models, name, options=options, registry=registry, threads=1)


@pytest.mark.parametrize("length", sorted(PROMPTS))
@pytest.mark.parametrize("case", GREEDY_CONTROLLERS, ids=_id)
def test_a_greedy_controller_on_a_short_prompt_gives_greedys_tokens(
    case: tuple[str, dict[str, Any], tuple[str, ...]],
    length: int,
    target: Path,
    genai_draft: Path,
    head: Path,
    plugins: PluginRegistry,
) -> None:
    prompt = PROMPTS[length]
    greedy = Generator({"target": target}, registry=plugins, threads=1)
    assert len(greedy.tokenizer.encode(prompt)) == length
    expected = greedy.generate(prompt, max_new_tokens=NEW_TOKENS)
    result = _generator(case, target, {"draft": genai_draft, "eagle": head}, plugins).generate(
        prompt, max_new_tokens=NEW_TOKENS
    )
    assert result.tokens == expected.tokens


@pytest.mark.parametrize("length", sorted(PROMPTS))
@pytest.mark.parametrize("case", SAMPLING_CONTROLLERS, ids=_id)
def test_a_sampling_controller_on_a_short_prompt_runs_to_its_token_limit(
    case: tuple[str, dict[str, Any], tuple[str, ...]],
    length: int,
    target: Path,
    genai_draft: Path,
    head: Path,
    plugins: PluginRegistry,
) -> None:
    generator = _generator(case, target, {"draft": genai_draft, "eagle": head}, plugins)
    result = generator.generate(PROMPTS[length], max_new_tokens=NEW_TOKENS, seed=5)
    assert result.stats.stop_reason in ("max_new_tokens", "eos")
    assert result.stats.stop_reason == "eos" or len(result.tokens) == NEW_TOKENS


@pytest.mark.parametrize("length", sorted(PROMPTS))
def test_degraded_lookahead_on_a_short_prompt_gives_greedys_tokens(
    length: int, genai_model: Path, plugins: PluginRegistry
) -> None:
    prompt = PROMPTS[length]
    expected = Generator({"target": genai_model}, registry=plugins, threads=1).generate(prompt, max_new_tokens=12)
    lookahead = Generator(
        {"target": genai_model}, "lookahead", options={"allow_degraded": True}, registry=plugins, threads=1
    )
    assert lookahead.generate(prompt, max_new_tokens=12).tokens == expected.tokens


@pytest.mark.demo
@pytest.mark.parametrize("controller", ["lookahead", "speculative", "eagle", "eagle -o drafting=tree"])
def test_the_cli_generates_greedys_text_from_a_one_character_prompt_on_the_demo_model(controller: str) -> None:
    decoctl = Path(sys.executable).with_name("decoctl")

    def generate(*options: str) -> str:
        command = [str(decoctl), "generate", "x", "-n", "24", "--stats", "none", *options]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert generate("-c", *controller.split()) == generate("-c", "greedy")
