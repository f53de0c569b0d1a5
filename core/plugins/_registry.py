"""Plugin hooks (pluggy project "decoctl"), entry-point discovery and the typed facade over them.

Contributing hooks return iterables of frozen records (ControllerSpec, ProcessorSpec, ModelBundle, CommandSpec); the
facade normalises names, stamps each record with the plugin that gave it and raises one PluginError that lists
every name two plugins both provide. Observer hooks see a generation start, each commit and its end.

Everything goes through pluggy: entry points load with ``load_setuptools_entrypoints``,
``DECOCTL_DISABLE_PLUGINS`` becomes ``set_blocked``, ``check_pending`` refuses a hook name decoctl does not know,
and hooks are called through their hook callers, so ``wrapper=True`` implementations and call monitoring
(``add_hookcall_monitoring``) see every call.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

import attrs
import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from decoctl.errors import PluginError
from decoctl.logs import get_logger
from decoctl.specs import CommandSpec, ControllerSpec, ModelBundle, ProcessorSpec, normalise_name

__all__ = ["BUILTIN_PLUGIN", "ENTRY_POINT_GROUP", "PROJECT", "PluginRegistry", "hookimpl"]

PROJECT = "decoctl"
ENTRY_POINT_GROUP = "decoctl"
DISABLE_ENV = "DECOCTL_DISABLE_PLUGINS"
BUILTIN_PLUGIN = "decoctl"
"""The entry point (in decoctl's own distribution) that contributes the greedy and sample baselines."""

log = get_logger(__name__)

_hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
"""The marker of a plugin's hook implementations: ``@hookimpl def decoctl_controllers(): ...``."""


class _Hookspecs:
    """The hooks a decoctl plugin may implement. Every hook is called with keyword arguments."""

    @_hookspec
    def decoctl_controllers(self) -> Iterable[ControllerSpec]:
        """Contribute decode controllers. Not firstresult: every plugin's records are collected.

        Return an iterable, an empty one to contribute nothing. A ``wrapper=True`` implementation may change the
        records in each plugin's result but keeps one result per implementation (that is how records are stamped
        with their plugin); the same holds for the other contributing hooks.

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
        """Contribute logits processors for the chain. Not firstresult; return an iterable (maybe empty).

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
        """Contribute named model folders (``--model NAME``). Not firstresult; return an iterable (maybe empty).

        Example plugin::

            from pathlib import Path
            from decoctl import ModelBundle, hookimpl

            @hookimpl
            def decoctl_models():
                return [ModelBundle(name="mymodel", path=Path(__file__).parent / "mymodel")]
        """
        raise AssertionError("hookspec body is never called")

    @_hookspec
    def decoctl_commands(self) -> Iterable[CommandSpec]:
        """Contribute ``decoctl`` subcommands (``decoctl NAME ...``). Not firstresult; return an iterable (maybe empty).

        Each CommandSpec gets a subparser of its name, which ``add_arguments(parser)`` fills (with subparsers of
        its own for sub-subcommands); ``run(args)`` runs it and returns the exit status. ``decoctl --help`` lists
        the command with its summary and distribution; a name two plugins give, or one of decoctl's own commands,
        is a PluginError naming both. A DecoctlError raised by ``run`` is printed as ``decoctl: error: ...``
        (exit status 2), any other exception as one line (its traceback with -vv). ``add_arguments`` runs on every
        command line decoctl parses: keep heavy imports inside ``run``.

        Example plugin (``decoctl hello [--shout] NAME``)::

            import argparse

            from decoctl import CommandSpec, DecoctlError, hookimpl

            def add_arguments(parser: argparse.ArgumentParser) -> None:
                parser.add_argument("name")
                parser.add_argument("--shout", action="store_true")

            def run(args: argparse.Namespace) -> int:
                if not args.name.strip():
                    raise DecoctlError("hello: give a name that is not blank")
                greeting = f"hello, {args.name}"
                print(greeting.upper() if args.shout else greeting)
                return 0

            @hookimpl
            def decoctl_commands():
                return [CommandSpec(name="hello", summary="say hello", add_arguments=add_arguments, run=run)]
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


R = TypeVar("R", ControllerSpec, ProcessorSpec, ModelBundle, CommandSpec)

#: the hook names decoctl defines (a plugin's unknown hook name is compared with these for a hint)
HOOKS = tuple(sorted(name for name in vars(_Hookspecs) if name.startswith("decoctl_")))


class PluginRegistry:
    """The plugin manager with a typed facade.

    ``autoload``: load the installed plugins (entry-point group "decoctl"); tests turn it off and register plugin
    objects with ``register``. ``builtins``: make sure the greedy and sample baselines are there; they come through
    decoctl's own entry point like any plugin, and are registered directly when autoloading is off.
    ``DECOCTL_DISABLE_PLUGINS=a,b`` blocks plugins by entry-point or distribution name. A plugin whose
    distribution requires a decoctl version other than this one is refused before it is imported, and one that fails
    to import is skipped: each is logged (``decoctl.plugin_refused``, ``decoctl.plugin_skipped``) and listed in
    ``skipped`` with the reason; one that implements a hook decoctl does not define, or does not fit a hook's
    signature, is a PluginError.
    """

    def __init__(self, *, autoload: bool = True, builtins: bool = True) -> None:
        self._pm = pluggy.PluginManager(PROJECT)
        self._pm.add_hookspecs(_Hookspecs)
        #: entry-point name -> the error that kept it from loading
        self.skipped: dict[str, str] = {}
        self._disabled = frozenset(normalise_name(n) for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip())
        #: hook name -> its records by name, until a plugin is registered or blocked
        self._records: dict[str, dict[str, Any]] = {}
        if autoload:
            self._screen_entry_points()
            self._load_entry_points()
            self._check_hooks()
        if builtins and not (self._pm.has_plugin(BUILTIN_PLUGIN) or self._pm.is_blocked(BUILTIN_PLUGIN)):
            from decoctl.plugins import _builtin  # imports this module's hookimpl: here, not at the top

            self.register(_builtin, BUILTIN_PLUGIN)

    # -- registration -----------------------------------------------------------------------------------
    def register(self, plugin: object, name: str) -> None:
        """Register a plugin object (module or instance with hookimpls) under ``name``.

        A name that ``DECOCTL_DISABLE_PLUGINS`` lists is blocked instead. PluginError when the plugin implements
        a hook decoctl does not define or does not fit a hook (it is not registered then).
        """
        if normalise_name(name) in self._disabled:
            log.info("decoctl.plugin_disabled", plugin=name, env=DISABLE_ENV)
            self.block(name)
            return
        try:
            self._pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise _misfit(name, exc) from exc
        self._records.clear()
        try:
            self._check_hooks()
        except PluginError:
            self._pm.unregister(plugin)
            raise

    def block(self, name: str) -> None:
        """Unregister the plugin ``name`` if it is registered, and refuse it from now on (pluggy's set_blocked)."""
        self._pm.set_blocked(name)
        self._records.clear()

    def _screen_entry_points(self) -> None:
        """Block, before any is imported, the plugins DECOCTL_DISABLE_PLUGINS names and those whose distribution
        states decoctl versions this one is not (refused: logged and listed in ``skipped`` with the reason)."""
        for entry_point, dist in _entry_points():
            name, distribution = entry_point.name, _name(dist)
            if normalise_name(name) in self._disabled or normalise_name(distribution) in self._disabled:
                log.info("decoctl.plugin_disabled", plugin=name, distribution=distribution, env=DISABLE_ENV)
                self._pm.set_blocked(name)
                continue
            reason = unsupported_decoctl(dist)
            if reason is not None:
                self.skipped[name] = reason
                log.warning("decoctl.plugin_refused", plugin=name, distribution=distribution, reason=reason)
                self._pm.set_blocked(name)

    def _load_entry_points(self) -> None:
        try:
            self._pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except Exception:
            # pluggy stops at the first plugin that fails to load: load them one at a time, to name it and to
            # load the others (those already loaded and those blocked are passed over, as pluggy does)
            self._load_entry_points_one_by_one()

    def _load_entry_points_one_by_one(self) -> None:
        for entry_point, dist in _entry_points():
            if self._pm.has_plugin(entry_point.name) or self._pm.is_blocked(entry_point.name):
                continue
            try:
                self._pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=entry_point.name)
            except pluggy.PluginValidationError as exc:
                raise _misfit(entry_point.name, exc, _name(dist)) from exc
            except Exception as exc:  # a broken plugin must not take the host down; it is logged and skipped
                error = f"{type(exc).__name__}: {exc}"
                self.skipped[entry_point.name] = error
                log.warning("decoctl.plugin_skipped", plugin=entry_point.name, distribution=_name(dist), error=error)

    def _check_hooks(self) -> None:
        """pluggy's check_pending, as a PluginError naming the plugin, its unknown hooks and the likely intent."""
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            name = self._pm.get_name(exc.plugin) or repr(exc.plugin)
            unknown = sorted(
                caller.name
                for caller in self._pm.get_hookcallers(exc.plugin) or ()
                if not caller.has_spec()
                and any(impl.plugin is exc.plugin and not impl.optionalhook for impl in caller.get_hookimpls())
            )
            hints = [
                f"{hook} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(hook, HOOKS, n=1)) else hook
                for hook in unknown
            ]
            raise PluginError(
                f"plugin {name!r} implements {', '.join(hints) or exc}, which decoctl does not define (its hooks: "
                f"{', '.join(HOOKS)}): fix the hook's name, or disable the plugin with {DISABLE_ENV}={name}"
            ) from exc

    @property
    def manager(self) -> pluggy.PluginManager:
        """The pluggy manager, for what pluggy itself offers (``add_hookcall_monitoring``, ``list_name_plugin``).
        Register and block plugins through the registry: it drops the records it collected then."""
        return self._pm

    def distribution_of(self, plugin: str) -> str:
        """The distribution that installed a plugin ("decoctl" for built-ins, "" for registered objects)."""
        found = self._pm.get_plugin(plugin)
        if found is None:
            return ""
        for loaded, dist in self._pm.list_plugin_distinfo():
            if loaded is found:
                return str(dist.project_name)
        return PROJECT if getattr(found, "__name__", "") == "decoctl.plugins._builtin" else ""

    def version_of(self, plugin: str) -> str:
        """The version of the distribution that installed a plugin ("" for registered objects)."""
        dist = self.distribution_of(plugin)
        if not dist:
            return ""
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return ""

    # -- facade -----------------------------------------------------------------------------------------
    def controllers(self) -> dict[str, ControllerSpec]:
        """Every plugin's controllers by normalised name (PluginError naming both plugins for a name given twice)."""
        return self._collect("decoctl_controllers", "controller", ControllerSpec)

    def processors(self) -> dict[str, ProcessorSpec]:
        """Every plugin's logits processors by normalised name."""
        return self._collect("decoctl_logits_processors", "logits processor", ProcessorSpec)

    def models(self) -> dict[str, ModelBundle]:
        """Every plugin's model bundles by normalised name."""
        return self._collect("decoctl_models", "model", ModelBundle)

    def commands(self) -> dict[str, CommandSpec]:
        """The subcommands plugins add to ``decoctl``, by name (PluginError when two plugins give one name)."""
        return self._collect("decoctl_commands", "command", CommandSpec)

    def _collect(self, hook: str, kind: str, record_type: type[R]) -> dict[str, R]:
        records = self._records.get(hook)
        if records is None:
            records = self._records[hook] = self._call_contributing(hook, kind, record_type)
        return dict(records)

    def _call_contributing(self, hook: str, kind: str, record_type: type[R]) -> dict[str, R]:
        caller = getattr(self._pm.hook, hook)
        impls = caller.get_hookimpls()
        # pluggy calls the implementations last-registered first and returns what each gave, in that order
        called = [impl for impl in reversed(impls) if not (impl.wrapper or impl.hookwrapper)]
        try:
            results = caller()
        except Exception as exc:
            culprit = _culprit(exc, impls)
            raise PluginError(
                f"plugin {culprit!r} failed while listing its {kind}s ({type(exc).__name__}: {exc}): fix or "
                f"disable it with {DISABLE_ENV}={culprit}"
            ) from exc
        if len(results) != len(called):
            names = ", ".join(sorted(impl.plugin_name for impl in called))
            raise PluginError(
                f"{hook} gave {len(results)} results for {len(called)} implementations ({names}): each "
                "implementation returns an iterable (an empty one to contribute nothing), and a wrapper keeps one "
                "result per implementation"
            )
        found: dict[str, R] = {}
        providers: dict[str, list[str]] = {}
        for impl, contributed in zip(reversed(called), reversed(results), strict=True):
            if isinstance(contributed, record_type) or not isinstance(contributed, Iterable):
                raise PluginError(
                    f"plugin {impl.plugin_name!r} returned {contributed!r} from {hook}: return a list of "
                    f"{record_type.__name__} records"
                )
            for record in contributed:
                if not isinstance(record, record_type):
                    raise PluginError(
                        f"plugin {impl.plugin_name!r} listed {record!r} among its {kind}s: {hook} returns "
                        f"{record_type.__name__} records"
                    )
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
        """Call the decoctl_generation_start observers."""
        self._pm.hook.decoctl_generation_start(prompt=prompt, controller=controller, roles=dict(roles))

    def commit_observed(self) -> bool:
        """Whether any plugin watches commits (so the host skips the hook call per commit otherwise)."""
        return bool(self._pm.hook.decoctl_commit.get_hookimpls())

    def notify_commit(self, *, tokens: list[int], text: str) -> None:
        """Call the decoctl_commit observers."""
        self._pm.hook.decoctl_commit(tokens=tokens, text=text)

    def notify_end(self, *, stats: Any, error: BaseException | None) -> None:
        """Call the decoctl_generation_end observers."""
        self._pm.hook.decoctl_generation_end(stats=stats, error=error)


def _entry_points() -> Iterator[tuple[importlib.metadata.EntryPoint, importlib.metadata.Distribution]]:
    """(entry point, distribution) of group "decoctl", from the distributions pluggy reads, in its order."""
    for dist in importlib.metadata.distributions():
        for entry_point in dist.entry_points:
            if entry_point.group == ENTRY_POINT_GROUP:
                yield entry_point, dist


def _name(dist: importlib.metadata.Distribution) -> str:
    return str(dist.metadata["Name"])


def unsupported_decoctl(dist: importlib.metadata.Distribution, version: str | None = None) -> str | None:
    """Why the plugin distribution ``dist`` cannot run with decoctl ``version`` (the installed one by default):
    the decoctl versions its requirements state exclude it. None where they admit it or state none."""
    if version is None:
        from decoctl import __version__

        version = __version__
    name = _name(dist)
    if canonicalize_name(name) == PROJECT:
        return None
    for line in dist.requires or ():
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue  # the installer read these requirements already; a line it could not parse is not ours to judge
        if canonicalize_name(requirement.name) != PROJECT:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # a requirement of an extra only
        if requirement.specifier.contains(version, prereleases=True):
            return None
        return (
            f"{name} {dist.version} works with decoctl {requirement.specifier}, and decoctl {version} is installed: "
            f"install a release of {name} made for decoctl {version} (pip install --upgrade {name}), or a decoctl it "
            f"supports (pip install 'decoctl{requirement.specifier}')"
        )
    return None


def _misfit(plugin: str, exc: pluggy.PluginValidationError, dist: str = "") -> PluginError:
    source = f" (from {dist})" if dist else ""
    reason = "; ".join(line.strip() for line in str(exc).splitlines())  # pluggy's message spans lines
    return PluginError(
        f"plugin {plugin!r}{source} does not fit decoctl's hooks: {reason}; fix the plugin, or disable it with "
        f"{DISABLE_ENV}={plugin}"
    )


def _culprit(exc: BaseException, impls: Iterable[Any]) -> str:
    """The plugin whose hook implementation ``exc`` went through (found by its code in the traceback)."""
    owners = {}
    for impl in impls:
        code = getattr(getattr(impl.function, "__func__", impl.function), "__code__", None)
        if code is not None:
            owners[code] = impl.plugin_name
    frame = exc.__traceback__
    while frame is not None:
        owner = owners.get(frame.tb_frame.f_code)
        if owner is not None:
            return owner
        frame = frame.tb_next
    return " or ".join(sorted({impl.plugin_name for impl in impls}))
