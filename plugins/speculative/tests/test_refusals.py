"""Bad speculative set-ups are refused before generation starts, each with the thing and the fix named."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl import ConfigError, Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_genai_model


def test_a_draft_with_another_vocabulary_is_refused_naming_both_models(
    target: Path, registry: PluginRegistry, tmp_path: Path
) -> None:
    target_vocab = Generator({"target": target}, "greedy", registry=registry).models["target"].spec.vocab_size
    other = build_genai_model(tmp_path / "other-vocab", seed=12, num_layers=1, vocab=target_vocab + 64)
    with pytest.raises(ConfigError, match=r"role 'draft' \(model other-vocab.*different vocabularies") as caught:
        Generator({"target": target, "draft": other}, "speculative", registry=registry)
    assert target.name in str(caught.value)


def test_a_draft_model_drafter_without_a_draft_asks_for_one(target: Path, registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=r"needs the role\(s\) \['draft'\].*--draft"):
        Generator({"target": target}, "speculative", registry=registry)


@pytest.mark.parametrize(("option", "value"), [("k", 0), ("k_min", -1), ("k_max", 0)])
def test_a_draft_length_out_of_range_is_refused(
    target: Path, draft: Path, registry: PluginRegistry, option: str, value: int
) -> None:
    with pytest.raises(ConfigError, match=option):
        Generator({"target": target, "draft": draft}, "speculative", options={option: value}, registry=registry)


def test_prompt_lookup_n_gram_bounds_in_the_wrong_order_are_refused(target: Path, registry: PluginRegistry) -> None:
    options = {"drafter": "prompt-lookup", "ngram_min": 4, "ngram_max": 2}
    with pytest.raises(ConfigError, match="ngram_min=4 is above ngram_max=2"):
        Generator({"target": target}, "speculative", options=options, registry=registry).generate("x", max_new_tokens=2)


def test_an_unknown_length_rule_is_refused_listing_the_choices(target: Path, registry: PluginRegistry) -> None:
    options = {"drafter": "prompt-lookup", "length_rule": "guess"}
    with pytest.raises(ConfigError, match=r"cost.*schedule"):
        Generator({"target": target}, "speculative", options=options, registry=registry)
