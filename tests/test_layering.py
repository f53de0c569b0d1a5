"""Importing a low layer loads nothing above it (the package inits are lazy), and decoctl's public names all
resolve. The import contracts themselves are checked by `lint-imports` in `make lint`."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

import decoctl
import decoctl.model


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    script = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout))


def test_the_tree_loads_neither_the_host_nor_onnxruntime() -> None:
    loaded = loaded_after("import decoctl.model.tree")
    assert "decoctl.host" not in loaded
    assert "onnxruntime" not in loaded
    assert {m for m in loaded if m.startswith("decoctl")} == {
        "decoctl",
        "decoctl._lazy",  # the packages' lazy exports, a leaf
        "decoctl.errors",
        "decoctl.model",
        "decoctl.model.tree",
    }


def test_importing_decoctl_loads_no_onnxruntime_and_no_pluggy() -> None:
    loaded = loaded_after("import decoctl")
    assert "onnxruntime" not in loaded and "pluggy" not in loaded


def test_the_names_a_plugin_imports_load_no_model_runtime() -> None:
    loaded = loaded_after("from decoctl import ControllerSpec, ModelBundle, hookimpl")
    assert "onnxruntime" not in loaded and "decoctl.host" not in loaded


def test_processor_chains_and_the_transformers_adapter_load_no_torch_until_one_is_made() -> None:
    loaded = loaded_after("import decoctl\nimport decoctl.resolve\ndecoctl.from_transformers")
    assert "torch" not in loaded and "transformers" not in loaded


@pytest.mark.parametrize("module", ["decoctl.importers.registry", "decoctl.resolve"])
def test_reading_the_model_registry_loads_no_importer(module: str) -> None:
    assert "decoctl.importers.gemma3" not in loaded_after(f"import {module}")


@pytest.mark.parametrize("package", [decoctl, decoctl.model], ids=lambda p: p.__name__)
def test_every_public_name_resolves(package: types.ModuleType) -> None:
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert set(package.__all__) <= set(dir(package))


def test_decoctl_generate_stays_the_function_after_its_module_loads() -> None:
    script = "import decoctl.generate, decoctl; from decoctl import Generator; print(decoctl.generate.__doc__)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("One-shot generation")
    assert sys.modules["decoctl.generate"].Generator is decoctl.Generator


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = decoctl.Nope  # type: ignore[attr-defined]
