"""plain_twin: a tree-enabled model's twin without tree inputs, derived once into the user's cache directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from decoctl.errors import ConfigError
from decoctl.model import load_model
from decoctl.model.graph import cache_dir, plain_twin
from decoctl.testing import build_genai_model


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "decoctl"


@pytest.fixture(scope="module")
def tree_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("twin-tree"), seed=3, tree_inputs=True)


def test_the_cache_follows_xdg_cache_home(cache: Path) -> None:
    assert cache_dir() == cache


def test_without_xdg_cache_home_the_cache_is_under_the_home_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "decoctl"


def test_a_model_without_tree_inputs_is_its_own_twin(genai_model: Path, cache: Path) -> None:
    assert plain_twin(genai_model) == genai_model.resolve()
    assert not cache.exists()


def test_a_tree_model_gets_a_plain_twin_in_the_cache_and_says_so(tree_model: Path, cache: Path) -> None:
    with capture_logs() as logs:
        twin = plain_twin(tree_model)
    assert twin.parent == cache / "plain"
    assert twin.name.startswith(f"{tree_model.name}-")
    assert "tree" not in load_model(twin, threads=1).capabilities.names()
    derived = [e for e in logs if e["event"] == "decoctl.plain_twin_derived"]
    assert derived == [
        {
            "event": "decoctl.plain_twin_derived",
            "log_level": "info",
            "source": str(tree_model.resolve()),
            "twin": str(twin),
        }
    ]


def test_the_twin_is_derived_once(tree_model: Path) -> None:
    first = plain_twin(tree_model)
    with capture_logs() as logs:
        assert plain_twin(tree_model) == first
    assert not [e for e in logs if e["event"] == "decoctl.plain_twin_derived"]
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".")]  # no staging folder left behind


def test_an_edited_source_gets_a_new_twin(tree_model: Path, tmp_path: Path) -> None:
    source = tmp_path / "edited"
    shutil.copytree(tree_model, source)
    before = plain_twin(source)
    stat = (source / "model.onnx").stat()
    os.utime(source / "model.onnx", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert plain_twin(source) != before


def test_an_unwritable_cache_is_an_error_naming_the_fix(
    tree_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with pytest.raises(ConfigError, match="set XDG_CACHE_HOME to a writable folder"):
        plain_twin(tree_model)
