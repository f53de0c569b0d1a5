"""Plugin discovery and the registry: entry points through pluggy, broken and disabled plugins, unknown hooks,
conflicts, caching, and hooks called through pluggy's hook callers."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import decoctl
from decoctl import ControllerSpec, Greedy, ModelBundle, PluginError, hookimpl
from decoctl.plugins import PluginRegistry, resolve_controller

CONTROLLERS_MODULE = """
from decoctl import ControllerSpec, Greedy, hookimpl

@hookimpl
def decoctl_controllers():
    return [ControllerSpec(name={name!r}, summary="", factory=Greedy)]
"""

Install = Callable[..., str]


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """``install(entry_point, source, distribution="decoctl-fake")`` installs a plugin distribution into a site
    folder that is all entry-point discovery sees (the real plugins stay out of these tests). Returns the name of
    the plugin's module, which is new to each test."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    real = importlib.metadata.distributions
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: real(path=[str(site)]))
    monkeypatch.delenv("DECOCTL_DISABLE_PLUGINS", raising=False)
    entry_points: dict[str, list[str]] = {}
    modules: list[str] = []

    def install(entry_point: str, source: str, distribution: str = "decoctl-fake", requires: str = "") -> str:
        module = f"plugin_{entry_point.replace('-', '_')}_{id(site)}"
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
        info.mkdir(exist_ok=True)
        metadata = f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n"
        metadata += "".join(f"Requires-Dist: {line}\n" for line in requires.splitlines() if line.strip())
        (info / "METADATA").write_text(metadata)
        entry_points.setdefault(distribution, []).append(f"{entry_point} = {module}")
        (info / "entry_points.txt").write_text("[decoctl]\n" + "\n".join(entry_points[distribution]) + "\n")
        modules.append(module)
        return module

    yield install
    for module in modules:
        sys.modules.pop(module, None)


def controllers_plugin(*names: str) -> object:
    class Plugin:
        @hookimpl
        def decoctl_controllers(self) -> list[ControllerSpec]:
            return [ControllerSpec(name=n, summary=n, factory=Greedy) for n in names]

    return Plugin()


def test_installed_plugins_are_loaded_from_their_entry_points_with_their_distribution(install: Install) -> None:
    install("fine", CONTROLLERS_MODULE.format(name="fine"), distribution="decoctl-fine")
    registry = PluginRegistry()
    assert registry.controllers()["fine"].plugin == "fine"
    assert registry.distribution_of("fine") == "decoctl-fine"


def test_a_plugin_that_fails_to_import_is_logged_with_its_distribution_and_skipped(install: Install) -> None:
    install("broken", "raise ImportError(\"no module named 'missing_dep'\")", distribution="decoctl-broken")
    install("fine", CONTROLLERS_MODULE.format(name="fine"))
    with capture_logs() as logs:
        registry = PluginRegistry()
    assert "fine" in registry.controllers()
    assert registry.skipped == {"broken": "ImportError: no module named 'missing_dep'"}
    skipped = [entry for entry in logs if entry["event"] == "decoctl.plugin_skipped"]
    assert [(entry["plugin"], entry["distribution"]) for entry in skipped] == [("broken", "decoctl-broken")]


def test_disabled_plugins_are_blocked_by_entry_point_or_distribution_name_and_never_imported(
    install: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_name = install("Fine_One", CONTROLLERS_MODULE.format(name="one"))
    by_distribution = install("two", CONTROLLERS_MODULE.format(name="two"), distribution="decoctl-two")
    install("three", CONTROLLERS_MODULE.format(name="three"))
    monkeypatch.setenv("DECOCTL_DISABLE_PLUGINS", "other, fine-one,decoctl_two")
    registry = PluginRegistry()
    controllers = registry.controllers()
    assert "three" in controllers and "one" not in controllers and "two" not in controllers
    assert by_name not in sys.modules and by_distribution not in sys.modules
    assert registry.manager.is_blocked("Fine_One") and registry.manager.is_blocked("two")


def test_a_plugin_made_for_another_decoctl_is_refused_before_import_naming_both_versions(install: Install) -> None:
    module = install("future", CONTROLLERS_MODULE.format(name="future"), "decoctl-future", requires="decoctl>=99,<100")
    install("fine", CONTROLLERS_MODULE.format(name="fine"), "decoctl-fine", requires="decoctl>=0.1\nnumpy")
    with capture_logs() as logs:
        registry = PluginRegistry()
    assert module not in sys.modules
    assert "fine" in registry.controllers() and "future" not in registry.controllers()
    reason = registry.skipped["future"]
    assert f"decoctl-future 1.0 works with decoctl <100,>=99, and decoctl {decoctl.__version__} is installed" in reason
    assert "pip install --upgrade decoctl-future" in reason
    assert [entry["plugin"] for entry in logs if entry["event"] == "decoctl.plugin_refused"] == ["future"]
    with pytest.raises(PluginError, match=r"plugin future was not loaded: decoctl-future 1\.0 works with decoctl"):
        resolve_controller("future", registry)


def test_a_plugin_that_needs_decoctl_only_for_an_extra_is_not_refused_for_it(install: Install) -> None:
    requires = 'decoctl>=99; extra == "bench"\ndecoctl>=0.1'
    install("extra", CONTROLLERS_MODULE.format(name="extra"), "decoctl-extra", requires=requires)
    assert "extra" in PluginRegistry().controllers()


def test_decoctl_version_comes_from_the_distributions_metadata() -> None:
    assert decoctl.__version__ == importlib.metadata.version("decoctl")


def test_a_registered_plugin_the_disable_list_names_is_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DECOCTL_DISABLE_PLUGINS", "extra")
    registry = PluginRegistry(autoload=False)
    registry.register(controllers_plugin("extra-loop"), "extra")
    assert "extra-loop" not in registry.controllers()


def test_a_misspelled_hook_is_an_error_naming_the_plugin_and_the_hook() -> None:
    class Typo:
        @hookimpl
        def decoctl_controller(self) -> list[ControllerSpec]:
            return []

    registry = PluginRegistry(autoload=False)
    with pytest.raises(
        PluginError, match=r"plugin 'typo' implements decoctl_controller \(did you mean decoctl_controllers\?\)"
    ):
        registry.register(Typo(), "typo")
    assert not registry.manager.has_plugin("typo")


def test_an_installed_plugin_with_a_misspelled_hook_is_an_error_when_plugins_load(install: Install) -> None:
    install("typo", "from decoctl import hookimpl\n\n@hookimpl\ndef decoctl_model():\n    return []\n")
    with pytest.raises(PluginError, match=r"plugin 'typo' implements decoctl_model \(did you mean decoctl_models\?\)"):
        PluginRegistry()


def test_a_plugin_whose_hook_takes_arguments_the_hook_does_not_have_is_an_error() -> None:
    class Misfit:
        @hookimpl
        def decoctl_commit(self, tokens: list[int], colour: str) -> None: ...

    with pytest.raises(PluginError, match=r"plugin 'misfit' does not fit decoctl's hooks.*colour"):
        PluginRegistry(autoload=False).register(Misfit(), "misfit")


def test_the_baselines_are_there_without_autoloading() -> None:
    registry = PluginRegistry(autoload=False)
    assert {"greedy", "sample"} <= set(registry.controllers())
    assert registry.distribution_of("decoctl") == "decoctl"
    assert set(PluginRegistry(autoload=False, builtins=False).controllers()) == set()


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


def test_records_are_stamped_with_their_plugin_and_names_normalised(tmp_path: Path) -> None:
    class Models:
        @hookimpl
        def decoctl_models(self) -> list[ModelBundle]:
            return [ModelBundle(name="My_Model", path=tmp_path)]

    registry = PluginRegistry(autoload=False)
    registry.register(Models(), "models-plugin")
    bundle = registry.models()["my-model"]
    assert bundle.plugin == "models-plugin"
    assert bundle.path == tmp_path


def test_records_are_collected_once_until_a_plugin_is_registered_or_blocked() -> None:
    calls: list[str] = []

    class Counted:
        @hookimpl
        def decoctl_controllers(self) -> list[ControllerSpec]:
            calls.append("counted")
            return [ControllerSpec(name="counted", summary="", factory=Greedy)]

    registry = PluginRegistry(autoload=False)
    registry.register(Counted(), "counted")
    registry.controllers()
    registry.controllers()
    assert calls == ["counted"]
    registry.register(controllers_plugin("later"), "later")
    assert "later" in registry.controllers()
    assert calls == ["counted", "counted"]
    registry.block("counted")
    assert "counted" not in registry.controllers()
    assert calls == ["counted", "counted"]


def test_hooks_are_called_through_the_hook_caller_so_wrappers_and_monitoring_see_them() -> None:
    class Renamer:
        @hookimpl(wrapper=True)
        def decoctl_controllers(self) -> Any:
            results = yield
            return [
                [ControllerSpec(name=f"wrapped-{r.name}", summary="", factory=Greedy) for r in rs] for rs in results
            ]

    seen: list[str] = []
    registry = PluginRegistry(autoload=False, builtins=False)
    registry.manager.add_hookcall_monitoring(lambda hook, impls, kwargs: seen.append(hook), lambda *args: None)
    registry.register(controllers_plugin("loop"), "loops")
    registry.register(Renamer(), "renamer")
    controllers = registry.controllers()
    assert set(controllers) == {"wrapped-loop"}
    assert controllers["wrapped-loop"].plugin == "loops"
    assert seen == ["decoctl_controllers"]


def test_a_contributing_hook_that_returns_none_is_an_error_saying_to_return_an_empty_list() -> None:
    class Nothing:
        @hookimpl
        def decoctl_models(self) -> None:
            return None

    registry = PluginRegistry(autoload=False)
    registry.register(Nothing(), "nothing")
    with pytest.raises(PluginError, match=r"decoctl_models gave 0 results for 1 implementations \(nothing\)"):
        registry.models()


def test_a_contributing_hook_that_returns_one_record_instead_of_a_list_is_an_error() -> None:
    class Single:
        @hookimpl
        def decoctl_controllers(self) -> ControllerSpec:
            return ControllerSpec(name="single", summary="", factory=Greedy)

    registry = PluginRegistry(autoload=False)
    registry.register(Single(), "single")
    with pytest.raises(PluginError, match=r"plugin 'single' returned .* from decoctl_controllers: return a list"):
        registry.controllers()


def test_the_builtins_come_through_decoctls_own_entry_point() -> None:
    builtin = [ep for ep in importlib.metadata.entry_points(group="decoctl") if ep.name == "decoctl"]
    assert [ep.value for ep in builtin] == ["decoctl.plugins._builtin"]
    registry = PluginRegistry()
    assert registry.manager.list_plugin_distinfo(), "no plugin came through an entry point"
    assert registry.distribution_of("decoctl") == "decoctl"
    assert registry.controllers()["greedy"].plugin == "decoctl"


def test_installed_distributions_are_discovered_through_real_entry_points() -> None:
    installed = {ep.name for ep in importlib.metadata.entry_points(group="decoctl")}
    registry = PluginRegistry()
    assert not registry.skipped
    for name in installed:
        assert registry.distribution_of(name), f"entry point {name} was not registered"
