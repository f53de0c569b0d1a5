"""The tiny LLaVA of decoctl.testing.vlm for the tests: skipped, saying why, where its exporters are missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl.testing.vlm import IMAGE_MARK, IMAGE_TOKENS, Llava, build_llava, missing

__all__ = ["IMAGE_MARK", "IMAGE_TOKENS", "Llava", "llava"]


def llava(root: Path) -> Llava:
    absent = missing()
    if absent:
        pytest.skip(f"the vision-language export needs {', '.join(absent)} (make setup-test installs them)")
    return build_llava(root)
