"""Shared fixtures: tiny models in both layouts, built once per session, and a registry without autoload."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import structlog

from decoctl.plugins import PluginRegistry
from decoctl.testing import build_genai_model, build_optimum_model

ROOT = Path(__file__).resolve().parents[1]
#: the import packages of decoctl's distributions
PACKAGES = (
    "decoctl",
    "decoctl_speculative",
    "decoctl_lookahead",
    "decoctl_eagle",
    "decoctl_logits_chain",
    "decoctl_models",
)


def pytest_configure(config: pytest.Config) -> None:
    """Under DECOCTL_TEST_INSTALLED (make test-installed), refuse to run against anything but installed packages: a
    decoctl package found in the source tree means the run would test the checkout, not the wheels."""
    if not os.environ.get("DECOCTL_TEST_INSTALLED"):
        return
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin).resolve()
        if ROOT in origin.parents and "site-packages" not in origin.parts:
            raise pytest.UsageError(
                f"{package} imports from the source tree ({origin}), not from an installed wheel: run the tests from "
                "a folder outside the checkout, in an environment without editable installs (make test-installed)"
            )


T = TypeVar("T")
BuiltOnce = Callable[[str, Callable[[Path], T]], T]


@pytest.fixture(scope="session")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> BuiltOnce[object]:
    """``built_once(name, build)``: ``build(folder)``'s result, made once for the whole run however many pytest-xdist
    workers ask for it (an export costs tens of seconds): the first builds it under a lock in the folder the workers
    share, the others wait for it and take its (pickled) result."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this run's folder, above each worker's own
    root = shared / "built-once"
    root.mkdir(exist_ok=True)

    def built(name: str, build: Callable[[Path], T]) -> T:
        result = root / f"{name}.pickle"
        with (root / f"{name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if result.exists():
                value: T = pickle.loads(result.read_bytes())
                return value
            folder = root / name
            folder.mkdir()
            value = build(folder)
            result.write_bytes(pickle.dumps(value))
            return value

    return built


@pytest.fixture(scope="session")
def genai_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("genai"), seed=3, hidden_states=True)


@pytest.fixture(scope="session")
def genai_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("draft"), seed=4, num_layers=1, hidden=32, num_heads=2)


@pytest.fixture(scope="session")
def optimum_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_optimum_model(tmp_path_factory.mktemp("optimum"), seed=3)


@pytest.fixture(scope="session")
def optimum_model_no_positions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_optimum_model(tmp_path_factory.mktemp("optimum-nopos"), seed=5, position_ids=False)


@pytest.fixture(scope="session")
def last_logits_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("last"), seed=6, logits_all_positions=False)


@pytest.fixture(params=["genai", "optimum", "optimum_no_positions"])
def any_model(request: pytest.FixtureRequest) -> Path:
    name = {"genai": "genai_model", "optimum": "optimum_model", "optimum_no_positions": "optimum_model_no_positions"}
    return request.getfixturevalue(name[request.param])


@pytest.fixture(autouse=True)
def _unconfigured_logging() -> object:
    """Put structlog's library defaults back after every test (a test may configure it, as an application would)."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def registry() -> PluginRegistry:
    """Built-ins only: tests register plugin objects directly, entry points are not loaded."""
    return PluginRegistry(autoload=False)
