"""The C ABI in Python: shared-library controllers as ordinary Controllers (the public facade).

A library speaking abi/decoctl.h exports ``decoctl_plugin_entry``; ``load_library(path)`` opens it by its
absolute path and lists its controllers. ``library_controller_spec(path, name)`` turns one into a ControllerSpec
(options schema included); ``library_factory(spec)`` builds ``LibraryController``s, ordinary Controllers that
create the C instance in ``start(host)`` and call its step in ``step(host)``.

The work is split by job: decoctl.abi._library (the compiled bridge, the loader, the entry and struct checks),
decoctl.abi._options (the option schema a controller declares) and decoctl.abi._host (the host table: the
``extern "Python"`` callbacks C calls and the mirror of the host's state C reads).
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from decoctl.abi._host import ControllerInstance
from decoctl.abi._library import ABI_MAJOR, ABI_MINOR, ENTRY_SYMBOL, ControllerEntry, Library, load_library
from decoctl.abi._library import ffi as ffi  # the bridge's FFI, for tests and tools that build C structs
from decoctl.errors import AbiError, PluginError
from decoctl.host import Host
from decoctl.logs import get_logger
from decoctl.specs import ControllerSpec

__all__ = [
    "ABI_MAJOR",
    "ABI_MINOR",
    "ENTRY_SYMBOL",
    "ControllerEntry",
    "Library",
    "LibraryController",
    "include_dir",
    "library_controller_spec",
    "library_factory",
    "load_library",
]

log = get_logger(__name__)


def include_dir() -> Path:
    """The folder holding ``decoctl.h``, the header a C controller compiles against (installed with decoctl):
    ``cc -I"$(python -m decoctl.abi --include-dir)" ...``."""
    return Path(__file__).resolve().parent / "include"


def library_controller_spec(path: Path, symbol: str | None = None) -> ControllerSpec:
    """The ControllerSpec of controller ``symbol`` in the library at ``path`` (None: its only controller), with
    its roles, summary and option schema read from the library. Plugin distributions may return it from
    ``decoctl_controllers()``."""
    entry = load_library(path).controller(symbol)
    return ControllerSpec(
        name=entry.name,
        summary=entry.summary,
        library=entry.path,
        symbol=entry.name,
        roles=entry.roles,
        options=entry.options,
        rows_for=None if entry.rows_for is None else entry.rows,
        plugin=str(entry.path),
    )


def library_factory(spec: ControllerSpec) -> Callable[[dict[str, Any]], LibraryController]:
    """``factory(options) -> LibraryController`` for a spec naming a library (``spec.library``) and a controller
    in it (``spec.symbol``, else ``spec.name``)."""
    if spec.library is None:
        raise PluginError(f"controller spec {spec.name!r} names no shared library: give library=Path(...)")
    entry = load_library(spec.library).controller(spec.symbol or spec.name)
    return functools.partial(LibraryController, entry)


# -- the Controller -----------------------------------------------------------------------------------------------


class LibraryController:
    """A controller from a shared library, used like any other Controller.

    ``start(host)`` creates the C instance with the options as a JSON object (or resets the previous one, if the
    library provides reset); ``step(host)`` calls its step. The instance is destroyed when the generation is
    done, when a call fails, or when this object is collected.
    """

    def __init__(self, entry: ControllerEntry, options: Mapping[str, Any] | None = None) -> None:
        self.entry = entry
        self._config = json.dumps(dict(options or {})).encode("utf-8")
        self._instance: ControllerInstance | None = None
        self._finalizer: weakref.finalize | None = None
        self._stats: dict[str, Any] = {}

    def start(self, host: Host) -> None:
        """Create the C controller's instance over ``host`` (or reset the one it has, where the library can)."""
        instance = self._instance
        if instance is not None and self.entry.reset is not None:
            instance.bind(host)
            self._guarded("reset", self.entry.reset, instance.state)
            return
        self.close()
        instance = ControllerInstance(self.entry)
        self._instance = instance
        self._finalizer = weakref.finalize(self, instance.destroy)
        instance.bind(host)
        try:
            instance.create(self._config)
        except BaseException:
            self._close_after_error()
            raise

    def step(self, host: Host) -> None:
        """One step of the C controller; its instance is destroyed when the generation is done."""
        instance = self._instance
        if instance is None:
            raise AbiError(f"{self.entry.label}: step() before start(): the generator calls start(host) first")
        self._guarded("step", self.entry.step, instance.state)
        if host.done:
            self.close()

    def stats(self) -> dict[str, Any]:
        """The C controller's own counters (its stats_json), kept after the instance is destroyed. A stats_json
        that breaks its contract is reported here (and logged) rather than hiding how the generation ended."""
        if self._instance is not None and self._instance.state is not None:
            try:
                return self._instance.stats()
            except AbiError as exc:
                log.warning("decoctl.abi_stats_failed", controller=self.entry.name, error=str(exc))
                return {"stats_error": str(exc)}
        return dict(self._stats)

    def close(self) -> None:
        """Destroy the C instance now (idempotent), keeping its last stats."""
        instance, self._instance = self._instance, None
        if instance is None:
            return
        try:
            if instance.state is not None:
                self._stats = instance.stats()
        finally:
            if self._finalizer is not None:
                self._finalizer()  # runs instance.destroy once

    def _guarded(self, what: str, function: Any, state: Any) -> None:
        instance = self._instance
        assert instance is not None
        try:
            instance.call(what, function, state)
        except BaseException:
            self._close_after_error()
            raise

    def _close_after_error(self) -> None:
        """close(), without letting a second failure (in stats_json) hide the first."""
        try:
            self.close()
        except Exception as exc:  # the error being raised already explains the failure
            log.warning("decoctl.abi_close_failed", controller=self.entry.name, error=str(exc))
