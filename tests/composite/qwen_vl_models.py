"""The tiny Qwen2.5-VL of decoctl.testing.vlm_qwen for the tests: skipped, saying why, where its exporters are
missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl.testing.vlm_qwen import IMAGE_MARK, QwenVL, build_qwen_vl, missing

__all__ = ["IMAGE_MARK", "QwenVL", "qwen_vl"]


def qwen_vl(root: Path) -> QwenVL:
    absent = missing()
    if absent:
        pytest.skip(f"the vision-language export needs {', '.join(absent)} (make setup-test installs them)")
    return build_qwen_vl(root)
