"""A tiny LLaVA exported into vision, embedding and decoder graphs (vlm_models.py), made once per session."""

from __future__ import annotations

import pytest
import vlm_models
from vlm_models import Llava


@pytest.fixture(scope="session")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Llava:
    return vlm_models.llava(tmp_path_factory.mktemp("llava"))
