"""The API reference (tools/api_docs.py, `make docs`) documents exactly the public modules, every public name with a
docstring and every cross-reference leading somewhere."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("pdoc")


@pytest.fixture(scope="module")
def api_docs() -> ModuleType:
    path = Path(__file__).parents[1] / "tools" / "api_docs.py"
    spec = importlib.util.spec_from_file_location("api_docs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["api_docs"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def modules(api_docs: ModuleType) -> list:
    return api_docs.load()


def test_the_reference_covers_exactly_the_public_modules(modules: list) -> None:
    from decoctl._api import PUBLIC_MODULES

    assert [module.fullname for module in modules] == list(PUBLIC_MODULES)


def test_every_public_name_has_a_docstring(api_docs: ModuleType, modules: list) -> None:
    assert api_docs.missing_docstrings(modules) == []


def test_every_cross_reference_names_something_the_reference_documents(api_docs: ModuleType, modules: list) -> None:
    assert api_docs.broken_references(modules) == []


def test_a_name_without_a_docstring_and_a_reference_to_a_private_module_are_caught(
    api_docs: ModuleType, modules: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = {module.fullname: module for module in modules}["decoctl.model"].members["Tree"]
    monkeypatch.setattr(tree, "docstring", "")
    assert "decoctl.model.Tree: no docstring" in api_docs.missing_docstrings(modules)
    monkeypatch.setattr(tree, "docstring", "See :func:`from_parents` and ``decoctl.model._tree`` and :func:`nowhere`.")
    broken = api_docs.broken_references(modules)
    assert any("`decoctl.model._tree`" in problem for problem in broken), broken
    assert any(":role:`nowhere`" in problem for problem in broken), broken
    assert not any("from_parents" in problem for problem in broken), broken
