"""The session's Whisper exports (tests/speech/whisper_exports.py), each made once, on first use."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("torch", reason="the Whisper tests export with torch (the test extra brings it)")
    pytest.importorskip("transformers", reason="the Whisper tests build their models with transformers")
    from whisper_exports import WhisperExports

    return WhisperExports(tmp_path_factory.mktemp("whisper"))
