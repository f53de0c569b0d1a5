"""The tiny Gemma 3 of decoctl.testing.vlm_gemma3 for the tests: skipped, saying why, where its exporters are
missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl.testing.vlm_gemma3 import IMAGE_MARK, IMAGE_TOKENS, Gemma3, build_gemma3, missing

__all__ = ["IMAGE_MARK", "IMAGE_TOKENS", "Gemma3", "gemma3"]


def gemma3(root: Path) -> Gemma3:
    absent = missing()
    if absent:
        pytest.skip(f"the vision-language export needs {', '.join(absent)} (make setup-test installs them)")
    return build_gemma3(root)
