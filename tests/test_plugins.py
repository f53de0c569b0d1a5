"""Plugin discovery: entry points, broken plugins, disabling, conflicts."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest
from structlog.testing import capture_logs

from decoctl import ControllerSpec, Greedy, ModelBundle, PluginError, hookimpl
from decoctl.plugins import PluginRegistry


class FakeDist:
    name = "decoctl-broken"


class FakeEntryPoint:
    def __init__(self, name: str, loader: Any) -> None:
        self.name = name
        self.dist = FakeDist()
        self._loader = loader

    def load(self) -> Any:
        return self._loader()


def controllers_plugin(*names: str) -> object:
    class Plugin:
        @hookimpl
        def decoctl_controllers(self) -> list[ControllerSpec]:
            return [ControllerSpec(name=n, summary=n, factory=Greedy) for n in names]

    return Plugin()


def fake_entry_points(monkeypatch: pytest.MonkeyPatch, *entry_points: FakeEntryPoint) -> None:
    def entry_points_for(group: str) -> tuple[FakeEntryPoint, ...]:
        assert group == "decoctl"
        return entry_points

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points_for)


def test_a_plugin_that_fails_to_import_is_logged_with_its_distribution_and_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken() -> Any:
        raise ImportError("no module named 'missing_dep'")

    fake_entry_points(
        monkeypatch, FakeEntryPoint("broken", broken), FakeEntryPoint("fine", lambda: controllers_plugin("fine"))
    )
    with capture_logs() as logs:
        registry = PluginRegistry()
    assert "fine" in registry.controllers()
    assert registry.skipped == {"broken": "ImportError: no module named 'missing_dep'"}
    assert logs[0]["event"] == "decoctl.plugin_skipped"
    assert logs[0]["distribution"] == "decoctl-broken"


def test_disabled_plugins_are_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_entry_points(monkeypatch, FakeEntryPoint("fine", lambda: controllers_plugin("fine")))
    monkeypatch.setenv("DECOCTL_DISABLE_PLUGINS", "other, fine")
    assert "fine" not in PluginRegistry().controllers()


def test_two_plugins_giving_the_same_name_raise_one_error_naming_both() -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(controllers_plugin("fast", "Twin_Loop"), "alpha")
    registry.register(controllers_plugin("twin-loop", "other"), "beta")
    with pytest.raises(PluginError, match=r"'twin-loop' from alpha and beta"):
        registry.controllers()


def test_a_plugin_may_not_shadow_a_builtin() -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(controllers_plugin("greedy"), "impostor")
    with pytest.raises(PluginError, match=r"'greedy' from decoctl and impostor"):
        registry.controllers()


def test_records_are_stamped_with_their_plugin_and_names_normalised(tmp_path: Any) -> None:
    class Models:
        @hookimpl
        def decoctl_models(self) -> list[ModelBundle]:
            return [ModelBundle(name="My_Model", path=tmp_path)]

    registry = PluginRegistry(autoload=False)
    registry.register(Models(), "models-plugin")
    bundle = registry.models()["my-model"]
    assert bundle.plugin == "models-plugin"
    assert bundle.path == tmp_path


def test_installed_distributions_are_discovered_through_real_entry_points() -> None:
    installed = {ep.name for ep in importlib.metadata.entry_points(group="decoctl")}
    registry = PluginRegistry()
    assert not registry.skipped
    for name in installed:
        assert registry.distribution_of(name), f"entry point {name} was not registered"
