"""Importing a low layer loads nothing above it (the package inits are lazy), and decoctl's public names all
resolve. The import contracts themselves are checked by `lint-imports` in `make lint`."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import decoctl
from decoctl._api import PUBLIC_MODULES


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    script = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout))


def test_the_tree_loads_neither_the_host_nor_onnxruntime() -> None:
    loaded = loaded_after("import decoctl.model._tree")
    assert "decoctl.host" not in loaded
    assert "onnxruntime" not in loaded
    assert {m for m in loaded if m.startswith("decoctl")} == {
        "decoctl",
        "decoctl._lazy",  # the packages' lazy exports, a leaf
        "decoctl.errors",
        "decoctl.model",
        "decoctl.model._tree",
    }


def test_importing_decoctl_loads_no_onnxruntime_and_no_pluggy() -> None:
    loaded = loaded_after("import decoctl")
    assert "onnxruntime" not in loaded and "pluggy" not in loaded


def test_the_names_a_plugin_imports_load_no_model_runtime() -> None:
    loaded = loaded_after("from decoctl import ControllerSpec, ModelBundle, hookimpl")
    assert "onnxruntime" not in loaded and "decoctl.host" not in loaded


def test_processor_chains_and_the_transformers_adapter_load_no_torch_until_one_is_made() -> None:
    loaded = loaded_after("import decoctl\nimport decoctl.plugins\ndecoctl.from_transformers")
    assert "torch" not in loaded and "transformers" not in loaded


@pytest.mark.parametrize("module", ["decoctl.importers._registry", "decoctl.plugins"])
def test_reading_the_model_registry_loads_no_importer(module: str) -> None:
    assert "decoctl.importers._gemma3" not in loaded_after(f"import {module}")


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_public_name_resolves(name: str) -> None:
    module = importlib.import_module(name)
    for public in module.__all__:
        assert getattr(module, public) is not None, public
    assert set(module.__all__) <= set(dir(module))


def test_the_top_level_names_are_the_subpackages_objects() -> None:
    import decoctl.generation
    import decoctl.host
    import decoctl.plugins

    assert decoctl.generation.Generator is decoctl.Generator
    assert decoctl.generation.generate is decoctl.generate
    assert decoctl.host.Host is decoctl.Host
    assert decoctl.plugins.PluginRegistry is decoctl.PluginRegistry


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = decoctl.Nope  # type: ignore[attr-defined]


def _public_modules_in_the_code() -> set[str]:
    """Every module of the package whose dotted name has no underscore-led part."""
    import pkgutil

    found = {"decoctl"}
    for info in pkgutil.walk_packages(decoctl.__path__, "decoctl."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.add(info.name)
    return found


def _public_modules_in_the_docs() -> set[str]:
    """The modules docs/ARCHITECTURE.md's "Public modules" lists (the bullets after its first paragraph)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("### Public modules", 1)[1].split("\n## ", 1)[0]
    items = section[section.index("\n- ") + 1 :].split("\n\n", 1)[0]  # the list after the paragraph
    return set(re.findall(r"`(decoctl[\w.]*)`", items))


def _public_modules_plugins_may_import() -> set[str]:
    """The modules pyproject.toml's import contract lets a plugin distribution import: the package itself and the
    modules its forbidden contract ignores."""
    import tomllib
    from pathlib import Path

    config = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["type"] == "forbidden" and "decoctl_eagle" in c["source_modules"]
    ]
    assert contract["forbidden_modules"] == ["decoctl.*"]
    return {"decoctl", *(entry.removeprefix("** -> ") for entry in contract["ignore_imports"])}


def test_the_public_modules_are_one_set_in_the_code_the_docs_and_the_import_contract() -> None:
    public = set(PUBLIC_MODULES)
    assert len(public) == len(PUBLIC_MODULES), "a module listed twice in decoctl._api.PUBLIC_MODULES"
    code, docs, contract = (
        _public_modules_in_the_code(),
        _public_modules_in_the_docs(),
        _public_modules_plugins_may_import(),
    )
    assert code == public, (
        f"not underscore-named but not public: {sorted(code - public)}; missing: {sorted(public - code)}"
    )
    assert docs == public, f"docs/ARCHITECTURE.md lists {sorted(docs - public)}, and leaves out {sorted(public - docs)}"
    assert contract == public, (
        f"pyproject.toml's plugin contract allows {sorted(contract - public)}, and forbids {sorted(public - contract)}"
    )


def test_plugins_and_their_tests_import_only_public_modules() -> None:
    """A plugin and its tests use decoctl as any plugin author would: the public modules only (import-linter checks
    the distributions' own packages; this covers their tests as well)."""
    import ast
    from pathlib import Path

    private: list[str] = []
    plugins = Path(__file__).parents[1] / "plugins"
    for path in sorted(plugins.glob("*/**/*.py")):
        if not all(part.isidentifier() for part in path.relative_to(plugins).parts[1:-1]):
            continue  # not a package's or the tests' (a build's unpacked copy)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules = [node.module]
            private.extend(
                f"{path.name}: {m}" for m in modules if m.split(".")[0] == "decoctl" and m not in PUBLIC_MODULES
            )
    assert not private, private
