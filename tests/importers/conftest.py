"""Importer tests write to a throw-away user data dir, never the real ~/.local/share/decoctl."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def user_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG_DATA_HOME pointed at a temporary folder; returns decoctl's data dir inside it."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "decoctl"
