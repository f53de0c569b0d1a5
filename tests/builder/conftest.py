"""Builder exports of tiny models (builder_models.py), each made once per session."""

from __future__ import annotations

import builder_models
import pytest
from builder_models import Export


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Export:
    return builder_models.llama(tmp_path_factory.mktemp("builder-llama"))


@pytest.fixture(scope="session")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Export:
    return builder_models.qwen2(tmp_path_factory.mktemp("builder-qwen2"))


@pytest.fixture(scope="session")
def lfm2(tmp_path_factory: pytest.TempPathFactory) -> Export:
    return builder_models.lfm2(tmp_path_factory.mktemp("builder-lfm2"))


@pytest.fixture(scope="session")
def gemma2(tmp_path_factory: pytest.TempPathFactory) -> Export:
    return builder_models.gemma2(tmp_path_factory.mktemp("builder-gemma2"))


@pytest.fixture(scope="session")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Export:
    return builder_models.gpt_oss(tmp_path_factory.mktemp("builder-gpt-oss"))
