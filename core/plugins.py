"""Plugin hooks (pluggy project "decoctl"), entry-point discovery and the typed facade over them.

Contributing hooks return iterables of frozen records (ControllerSpec, ProcessorSpec, ModelBundle); the
facade normalises names, stamps each record with the plugin that gave it and raises one PluginError that lists
every name two plugins both provide. Observer hooks see a generation start, each commit and its end.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import attrs
import pluggy

from decoctl import builtin_plugin
from decoctl.errors import PluginError
from decoctl.logs import get_logger
from decoctl.specs import ControllerSpec, ModelBundle, ProcessorSpec, normalise_name

__all__ = ["ENTRY_POINT_GROUP", "PROJECT", "PluginRegistry", "hookimpl"]

PROJECT = "decoctl"
ENTRY_POINT_GROUP = "decoctl"
DISABLE_ENV = "DECOCTL_DISABLE_PLUGINS"

log = get_logger(__name__)

_hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class _Hookspecs:
    """The hooks a decoctl plugin may implement. Every hook is called with keyword arguments."""

    @_hookspec
    def decoctl_controllers(self) -> Iterable[ControllerSpec]:
        """Contribute decode controllers. Not firstresult: every plugin's records are collected.

        Example plugin::

            from decoctl import ControllerSpec, hookimpl

            class Mine:
                def __init__(self, options): ...
                def start(self, host): ...
                def step(self, host):
                    token = int(host.target.logits()[-1].argmax())
                    host.commit([token])
                    if not host.done:
                        host.target.forward([token])

            @hookimpl
            def decoctl_controllers():
                return [ControllerSpec(name="mine", summary="my loop", factory=Mine)]
        """
        raise AssertionError("hookspec body is never called")

    @_hookspec
    def decoctl_logits_processors(self) -> Iterable[ProcessorSpec]:
        """Contribute logits processors for the chain. Not firstresult.

        Example plugin::

            from decoctl import ProcessorSpec, hookimpl

            class Ban13:
                def __init__(self, options): ...
                def __call__(self, rows, context):
                    rows[:, 13] = float("-inf")
                    return rows
                def commit(self, tokens): ...
                def reset(self, prompt): ...

            @hookimpl
            def decoctl_logits_processors():
                return [ProcessorSpec(name="ban-13", summary="never token 13", factory=Ban13)]
        """
        raise AssertionError("hookspec body is never called")

    @_hookspec
    def decoctl_models(self) -> Iterable[ModelBundle]:
        """Contribute named model folders (``--model NAME``). Not firstresult.

        Example plugin::

            from pathlib import Path
            from decoctl import ModelBundle, hookimpl

            @hookimpl
            def decoctl_models():
                return [ModelBundle(name="mymodel", path=Path(__file__).parent / "mymodel")]
        """
        raise AssertionError("hookspec body is never called")

    @_hookspec
    def decoctl_generation_start(self, prompt: str, controller: str, roles: Mapping[str, str]) -> None:
        """Observe a generation starting. Not firstresult; implementations may be ``wrapper=True``.

        :param prompt: the prompt text.
        :param controller: the controller's name.
        :param roles: role -> model name.

        Example plugin::

            @hookimpl
            def decoctl_generation_start(prompt, controller, roles):
                print("starting", controller, "on", roles["target"])
        """

    @_hookspec
    def decoctl_commit(self, tokens: list[int], text: str) -> None:
        """Observe each commit: the tokens taken and the text they released. Not firstresult.

        :param tokens: the committed token ids.
        :param text: the newly released text (may be empty while a character or stop string is pending).

        Example plugin::

            @hookimpl
            def decoctl_commit(tokens, text):
                counts["tokens"] += len(tokens)
        """

    @_hookspec
    def decoctl_generation_end(self, stats: Any, error: BaseException | None) -> None:
        """Observe a generation ending, with its GenerationStats, and the error if it failed. Not firstresult.

        :param stats: the GenerationStats record.
        :param error: the exception that ended it, or None.

        Example plugin::

            @hookimpl
            def decoctl_generation_end(stats, error):
                log_to_my_dashboard(stats.tokens_per_second)
        """


R = TypeVar("R", ControllerSpec, ProcessorSpec, ModelBundle)


class PluginRegistry:
    """The plugin manager with a typed facade. ``autoload=False`` (tests) loads no entry points."""

    def __init__(self, *, autoload: bool = True, builtins: bool = True) -> None:
        self._pm = pluggy.PluginManager(PROJECT)
        self._pm.add_hookspecs(_Hookspecs)
        self.skipped: dict[str, str] = {}
        disabled = {normalise_name(n) for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}
        self._disabled = disabled
        self._distributions: dict[str, str] = {}
        if builtins:
            self._pm.register(builtin_plugin, name="decoctl")
            self._distributions["decoctl"] = "decoctl"
        if autoload:
            self._load_entry_points()

    # -- registration -----------------------------------------------------------------------------------
    def register(self, plugin: object, name: str) -> None:
        """Register a plugin object (module or instance with hookimpls) under ``name``."""
        if normalise_name(name) in self._disabled:
            log.info("decoctl.plugin_disabled", plugin=name, env=DISABLE_ENV)
            return
        self._pm.register(plugin, name=name)

    def _load_entry_points(self) -> None:
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = entry_point.dist.name if entry_point.dist else "?"
            if normalise_name(entry_point.name) in self._disabled or normalise_name(dist) in self._disabled:
                log.info("decoctl.plugin_disabled", plugin=entry_point.name, distribution=dist, env=DISABLE_ENV)
                continue
            if self._pm.get_plugin(entry_point.name) is not None:
                continue
            try:
                plugin = entry_point.load()
            except Exception as exc:  # a broken plugin must not take the host down; it is logged and skipped
                self.skipped[entry_point.name] = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "decoctl.plugin_skipped",
                    plugin=entry_point.name,
                    distribution=dist,
                    error=f"{type(exc).__name__}: {exc}",
                )
                continue
            self._pm.register(plugin, name=entry_point.name)
            self._distributions[entry_point.name] = dist

    def distribution_of(self, plugin: str) -> str:
        """The distribution that installed a plugin ("decoctl" for built-ins, "" for registered objects)."""
        return self._distributions.get(plugin, "")

    # -- facade -----------------------------------------------------------------------------------------
    def controllers(self) -> dict[str, ControllerSpec]:
        return self._collect("controller", self._pm.hook.decoctl_controllers)

    def processors(self) -> dict[str, ProcessorSpec]:
        return self._collect("logits processor", self._pm.hook.decoctl_logits_processors)

    def models(self) -> dict[str, ModelBundle]:
        return self._collect("model", self._pm.hook.decoctl_models)

    def _collect(self, kind: str, hook: Any) -> dict[str, Any]:
        found: dict[str, Any] = {}
        providers: dict[str, list[str]] = {}
        for impl in hook.get_hookimpls():
            try:
                records = impl.function()
            except Exception as exc:
                raise PluginError(
                    f"plugin {impl.plugin_name!r} failed while listing its {kind}s ({type(exc).__name__}: "
                    f"{exc}): fix or disable it with {DISABLE_ENV}={impl.plugin_name}"
                ) from exc
            for record in records or ():
                stamped = attrs.evolve(record, plugin=impl.plugin_name)
                providers.setdefault(stamped.name, []).append(impl.plugin_name)
                found[stamped.name] = stamped
        conflicts = {name: plugins for name, plugins in providers.items() if len(plugins) > 1}
        if conflicts:
            listing = "; ".join(f"{name!r} from {' and '.join(sorted(p))}" for name, p in sorted(conflicts.items()))
            raise PluginError(
                f"two plugins provide the same {kind} name: {listing}; uninstall one or disable it with "
                f"{DISABLE_ENV}=<plugin>"
            )
        return found

    def notify_start(self, *, prompt: str, controller: str, roles: Mapping[str, str]) -> None:
        self._pm.hook.decoctl_generation_start(prompt=prompt, controller=controller, roles=dict(roles))

    def commit_observed(self) -> bool:
        """Whether any plugin watches commits (so the host skips the hook call per commit otherwise)."""
        return bool(self._pm.hook.decoctl_commit.get_hookimpls())

    def notify_commit(self, *, tokens: list[int], text: str) -> None:
        self._pm.hook.decoctl_commit(tokens=tokens, text=text)

    def notify_end(self, *, stats: Any, error: BaseException | None) -> None:
        self._pm.hook.decoctl_generation_end(stats=stats, error=error)
