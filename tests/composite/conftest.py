"""A tiny LLaVA (vlm_models.py) and a tiny Qwen2.5-VL (qwen_vl_models.py), each exported into vision, embedding and
decoder graphs, made once per session."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import qwen_vl_models
import vlm_models
from qwen_vl_models import QwenVL
from vlm_models import Llava


@pytest.fixture(scope="session")
def llava(built_once: Callable[[str, Callable[..., Llava]], Llava]) -> Llava:
    """Made once per run, however many xdist workers use it (tests/conftest.py's built_once)."""
    return built_once("llava", vlm_models.llava)


@pytest.fixture(scope="session")
def qwen_vl(built_once: Callable[[str, Callable[..., QwenVL]], QwenVL]) -> QwenVL:
    """The tiny Qwen2.5-VL (qwen_vl_models.py), made once per run like ``llava``."""
    return built_once("qwen_vl", qwen_vl_models.qwen_vl)
