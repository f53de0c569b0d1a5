"""A tiny LLaVA exported into vision, embedding and decoder graphs (vlm_models.py), made once per session."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import vlm_models
from vlm_models import Llava


@pytest.fixture(scope="session")
def llava(built_once: Callable[[str, Callable[..., Llava]], Llava]) -> Llava:
    """Made once per run, however many xdist workers use it (tests/conftest.py's built_once)."""
    return built_once("llava", vlm_models.llava)
