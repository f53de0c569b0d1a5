"""Tiny models for the lookahead tests: one with tree inputs, one without."""

from __future__ import annotations

from pathlib import Path

import pytest
from decoctl_lookahead import plugin

from decoctl.plugins import PluginRegistry
from decoctl.testing import build_genai_model


@pytest.fixture(scope="session")
def tree_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("tree"), seed=21, tree_inputs=True)


@pytest.fixture(scope="session")
def plain_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("plain"), seed=21)


@pytest.fixture
def registry() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "lookahead")
    return registry
