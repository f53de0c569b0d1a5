"""What EAGLE refuses, before any token is generated, and how each refusal names the thing and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from decoctl import CapabilityError, ConfigError, GenerationError, Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_eagle_head, build_genai_model


@pytest.fixture(scope="module")
def no_hidden_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("no-hidden"), seed=41, num_layers=1, tree_inputs=True)


@pytest.fixture(scope="module")
def narrow_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A head for a hidden-32 target: the wrong feature width for the hidden-64 test target."""
    narrow = build_genai_model(tmp_path_factory.mktemp("narrow"), seed=5, hidden=32, num_heads=2, hidden_states=True)
    return build_eagle_head(tmp_path_factory.mktemp("narrow-head"), narrow, seed=6)


@pytest.fixture(scope="module")
def other_vocab_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    other = build_genai_model(tmp_path_factory.mktemp("other-vocab"), seed=5, vocab=400, hidden_states=True)
    return build_eagle_head(tmp_path_factory.mktemp("other-vocab-head"), other, seed=6)


def test_a_target_without_hidden_states_is_refused_naming_the_export_option(
    no_hidden_target: Path, mimic_head: Path, registry: PluginRegistry
) -> None:
    with pytest.raises(CapabilityError, match=r"\['hidden_states'\] on role 'target'.*include_hidden_states=1"):
        Generator({"target": no_hidden_target, "eagle": mimic_head}, "eagle", registry=registry)


def test_a_head_without_the_feature_input_is_refused_naming_it(
    target: Path, plain_target: Path, registry: PluginRegistry
) -> None:
    with pytest.raises(CapabilityError, match=r"\['features'\] on role 'eagle'.*target_hidden_states.*export_eagle"):
        Generator({"target": target, "eagle": plain_target}, "eagle", options={"drafting": "chain"}, registry=registry)


def test_a_head_for_a_target_of_another_width_is_refused_before_it_runs(
    target: Path, narrow_head: Path, registry: PluginRegistry
) -> None:
    generator = Generator(
        {"target": target, "eagle": narrow_head}, "eagle", options={"drafting": "chain"}, registry=registry
    )
    with pytest.raises(GenerationError) as caught:
        generator.generate("def f(x):", max_new_tokens=4)
    assert isinstance(caught.value.__cause__, ConfigError)
    assert "does not fit target" in str(caught.value)
    assert "hidden size 32, the target's 64" in str(caught.value)
    assert "decoctl eagle train" in str(caught.value) and "tools/train_eagle.py" in str(caught.value)
    assert caught.value.tokens == []


def test_a_head_with_another_vocabulary_is_refused(
    target: Path, other_vocab_head: Path, registry: PluginRegistry
) -> None:
    with pytest.raises(ConfigError, match=r"role 'eagle' .*vocabulary 400.*vocabulary 384"):
        Generator({"target": target, "eagle": other_vocab_head}, "eagle", registry=registry)


def test_tree_drafting_needs_tree_inputs_on_the_target_and_says_how_to_add_them(
    plain_target: Path, mimic_head: Path, registry: PluginRegistry
) -> None:
    with pytest.raises(CapabilityError, match=r"\['tree'\] on role 'target'.*decoctl models enable-tree"):
        Generator(
            {"target": plain_target, "eagle": mimic_head}, "eagle", options={"drafting": "tree"}, registry=registry
        )


def test_a_missing_head_is_refused_naming_the_role(target: Path, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=r"needs the role\(s\) \['eagle'\].*--role eagle=PATH"):
        Generator({"target": target}, "eagle", registry=registry)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"beam": 2}, "has no option 'beam'"),
        ({"drafting": "beam"}, r"drafting='beam' must be one of \['tree', 'chain'\]"),
        ({"k": 0}, "k=0 must be at least 1"),
        ({"topk": "many"}, "topk='many' is not an int"),
        ({"temperature": 0}, "temperature=0.0 must be at least"),
        (
            {"drafting": "tree", "depth": 2, "topk": 2, "nodes": 7},
            "nodes=7 is more than the 6 candidates a tree of depth=2 and topk=2",
        ),
    ],
)
def test_bad_options_are_refused_before_any_model_loads(
    options: dict[str, Any], message: str, tmp_path: Path, registry: PluginRegistry
) -> None:
    missing = tmp_path / "not-a-model"  # never opened: the options are checked first
    with pytest.raises(ConfigError, match=message):
        Generator({"target": missing, "eagle": missing}, "eagle", options=options, registry=registry)


def test_the_distribution_registers_eagle_through_its_entry_point() -> None:
    registry = PluginRegistry()
    spec = registry.controllers()["eagle"]
    assert spec.roles == ("target", "eagle")
    assert registry.distribution_of(spec.plugin) == "decoctl-eagle"
