"""Importing a low layer loads nothing above it (the package inits are lazy), and decoctl's public names all
resolve. The import contracts themselves are checked by `lint-imports` in `make lint`."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

import decoctl
import decoctl.bench
import decoctl.controllers
import decoctl.generation
import decoctl.host
import decoctl.model
import decoctl.model.graph
import decoctl.plugins
import decoctl.processing

SUBPACKAGES = [
    decoctl.bench,
    decoctl.controllers,
    decoctl.generation,
    decoctl.host,
    decoctl.model,
    decoctl.model.graph,
    decoctl.plugins,
    decoctl.processing,
]


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


@pytest.mark.parametrize("package", [decoctl, *SUBPACKAGES], ids=lambda p: p.__name__)
def test_every_public_name_resolves(package: types.ModuleType) -> None:
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert set(package.__all__) <= set(dir(package))


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
    """The modules docs/ARCHITECTURE.md's "Public modules" lists ("`decoctl.x` and its modules `a`, `b`")."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("### Public modules", 1)[1].split("\n## ", 1)[0]
    items = "\n" + section[section.index("\n- ") + 1 :].split("\n\n", 1)[0]  # the list after the paragraph
    listed: set[str] = set()
    for entry in re.split(r"\n- ", items):
        for clause in re.split(r",\s+(?:and\s+)?(?=`decoctl)|;", entry):
            names = re.findall(r"`([\w.]+)`", clause)
            if not names:
                continue
            head, *children = names
            listed.add(head)
            if " and its modules " in clause:
                listed.update(f"{head}.{child}" for child in children)
            else:
                listed.update(name for name in children if name.startswith("decoctl"))
    return listed


def test_the_public_modules_are_exactly_those_the_architecture_lists() -> None:
    code, docs = _public_modules_in_the_code(), _public_modules_in_the_docs()
    assert not code - docs, f"public in the code but not listed in docs/ARCHITECTURE.md: {sorted(code - docs)}"
    assert not docs - code, f"listed in docs/ARCHITECTURE.md but not a public module: {sorted(docs - code)}"


def test_plugin_tests_import_only_public_modules() -> None:
    """A plugin's tests use decoctl as any plugin author would: no module with an underscore-led part."""
    import ast
    from pathlib import Path

    private: list[str] = []
    for path in sorted((Path(__file__).parents[1] / "plugins").glob("*/tests/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for name in names:
                if name.split(".")[0] == "decoctl" and any(part.startswith("_") for part in name.split(".")[1:]):
                    private.append(f"{path.name}: {name}")
    assert not private, private
