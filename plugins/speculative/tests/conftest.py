"""Tiny models for the speculative plugin's tests: a target, an unrelated draft, and the target as its own draft."""

from __future__ import annotations

from pathlib import Path

import pytest
from decoctl_speculative import plugin

from decoctl.plugins import PluginRegistry
from decoctl.testing import build_genai_model, build_optimum_model


@pytest.fixture(scope="session")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("target"), seed=11, num_layers=2)


@pytest.fixture(scope="session")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture family, other weights: it agrees with the target only by chance."""
    return build_genai_model(tmp_path_factory.mktemp("draft"), seed=12, num_layers=1, hidden=32, num_heads=2)


@pytest.fixture(scope="session")
def optimum_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_optimum_model(tmp_path_factory.mktemp("optimum"), seed=11)


@pytest.fixture
def registry() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "speculative")
    return registry
