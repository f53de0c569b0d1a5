"""Builder exports of tiny models (builder_models.py), each made once per run (once for every xdist worker)."""

from __future__ import annotations

from collections.abc import Callable

import builder_models
import pytest
from builder_models import Export

#: tests/conftest.py's built_once fixture: (name, build) -> build's result, made once per run
BuiltOnce = Callable[[str, Callable[..., Export]], Export]


@pytest.fixture(scope="session")
def llama(built_once: BuiltOnce) -> Export:
    return built_once("builder-llama", builder_models.llama)


@pytest.fixture(scope="session")
def qwen2(built_once: BuiltOnce) -> Export:
    return built_once("builder-qwen2", builder_models.qwen2)


@pytest.fixture(scope="session")
def lfm2(built_once: BuiltOnce) -> Export:
    return built_once("builder-lfm2", builder_models.lfm2)


@pytest.fixture(scope="session")
def gemma2(built_once: BuiltOnce) -> Export:
    return built_once("builder-gemma2", builder_models.gemma2)


@pytest.fixture(scope="session")
def gpt_oss(built_once: BuiltOnce) -> Export:
    return built_once("builder-gpt-oss", builder_models.gpt_oss)
