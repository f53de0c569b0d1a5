"""Tiny models for the EAGLE tests: a one-layer target (tree inputs, hidden states) and two heads for it.

The imitating head runs the target's own layer on the token embeddings (decoctl.testing.build_eagle_head's
copy_layer), so it agrees with the target most of the time and long drafts get accepted; the random head agrees
by chance only, and its output depends on the features it is fed, which makes a wrong feature visible.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from decoctl_eagle import plugin

from decoctl.plugins import PluginRegistry
from decoctl.testing import build_eagle_head, build_genai_model

SEED = 41


@pytest.fixture(scope="session")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(
        tmp_path_factory.mktemp("target"), seed=SEED, num_layers=1, hidden_states=True, tree_inputs=True
    )


@pytest.fixture(scope="session")
def plain_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights as ``target`` without the tree inputs."""
    return build_genai_model(tmp_path_factory.mktemp("plain"), seed=SEED, num_layers=1, hidden_states=True)


@pytest.fixture(scope="session")
def mimic_head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eagle_head(tmp_path_factory.mktemp("mimic"), target, copy_layer=0, feature_mix=0.1, tree_inputs=True)


@pytest.fixture(scope="session")
def random_head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eagle_head(tmp_path_factory.mktemp("random"), target, seed=42, tree_inputs=True)


@pytest.fixture(scope="session")
def narrow_head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The imitating head drafting from a draft vocabulary of half the target's tokens."""
    vocab = json.loads((target / "genai_config.json").read_text())["model"]["vocab_size"]
    return build_eagle_head(
        tmp_path_factory.mktemp("narrow"),
        target,
        copy_layer=0,
        feature_mix=0.1,
        tree_inputs=True,
        draft_vocab=vocab // 2,
    )


@pytest.fixture(params=["mimic", "random", "narrow"])
def head(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_head")


@pytest.fixture
def registry() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "eagle")
    return registry
