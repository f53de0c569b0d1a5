"""Fixtures for the logits-chain tests: a registry holding this plugin, a tiny model, random rows and prefixes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from decoctl_logits_chain import plugin

from decoctl import ProcessorChain
from decoctl.model import Tokenizer
from decoctl.plugins import PluginRegistry, parse_processor_chain
from decoctl.testing import build_genai_model


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "oracle: compares with HF transformers (needs the test extra: pip install -e 'plugins/logits_chain[test]')",
    )


@pytest.fixture
def registry() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    registry.register(plugin, "logits-chain")
    return registry


@pytest.fixture
def build(registry: PluginRegistry) -> Any:
    """build("top_k=5") or build([{"name": "top_k", ...}]) -> the ProcessorChain the host would run."""

    def make(chain: str | list[Any]) -> ProcessorChain:
        return parse_processor_chain(chain, registry)

    return make


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("chain-model"), seed=3)


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path) -> Tokenizer:
    return Tokenizer.from_file(tiny_model / "tokenizer.json", bos_token_id=None, add_bos=False)
