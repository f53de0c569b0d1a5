"""The loader of shared-library controllers: open a library by path, check its ABI, read its controllers.

A library speaking abi/decoctl.h exports ``decoctl_plugin_entry``; ``load_library(path)`` opens it by its
absolute path (never a search of the working directory or the loader's path), checks the ABI major and every
struct_size, and lists its controllers (ControllerEntry: metadata, option schema, function pointers). This module
also imports the compiled bridge (decoctl._abi, out-of-line API mode) that decoctl.abi._host and decoctl.abi use.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from decoctl.abi._options import options_from_json
from decoctl.errors import AbiError, PluginError
from decoctl.logs import get_logger
from decoctl.specs import Option, normalise_name

try:
    from decoctl._abi import ffi, lib
except ImportError as _exc:  # the bridge is compiled at install time; without it nothing here can load
    ffi = lib = None
    _BRIDGE_ERROR: ImportError | None = _exc
else:
    _BRIDGE_ERROR = None

__all__ = [
    "ABI_MAJOR",
    "ABI_MINOR",
    "ENTRY_SYMBOL",
    "ControllerEntry",
    "Library",
    "ffi",
    "field_end",
    "lib",
    "load_library",
    "require_bridge",
]

log = get_logger(__name__)

ABI_MAJOR = 1
"""The ABI major version this host speaks: a library built for another major is refused when it loads."""
ABI_MINOR = 4
"""The newest ABI minor version this host speaks (a library built for an older minor of the same major loads)."""
ENTRY_SYMBOL = "decoctl_plugin_entry"
"""The one data symbol a controller library exports (abi/decoctl.h)."""
MAX_CONTROLLERS = 1024  # more than this in one entry means the entry is garbage, not a big library

if lib is not None and (lib.DECOCTL_ABI_MAJOR, lib.DECOCTL_ABI_MINOR) != (ABI_MAJOR, ABI_MINOR):
    raise ImportError(
        f"decoctl._abi was built from decoctl.h {lib.DECOCTL_ABI_MAJOR}.{lib.DECOCTL_ABI_MINOR}, but decoctl.abi "
        f"speaks {ABI_MAJOR}.{ABI_MINOR}: reinstall decoctl so that the bridge is built again "
        "(pip install --force-reinstall decoctl; in a checkout: pip install .)"
    )


def require_bridge() -> None:
    """PluginError, saying how to build it, where the compiled bridge decoctl._abi is missing."""
    if _BRIDGE_ERROR is not None:
        raise PluginError(
            f"the C ABI bridge decoctl._abi is missing from this decoctl install ({_BRIDGE_ERROR}): install a decoctl "
            "wheel built for this platform, or build one from the sdist where a C compiler and the Python headers are "
            "(pip install --force-reinstall --no-binary decoctl decoctl; in a checkout: pip install .)"
        )


# -- reading structs the other side wrote ------------------------------------------------------------------------


def field_end(ctype: str, field: str) -> int:
    """Bytes a struct needs to hold ``field``: a reader touches the field only if struct_size reaches this."""
    info = dict(ffi.typeof(ctype).fields)[field]
    end: int = info.offset + ffi.sizeof(info.type)
    return end


def _text(pointer: Any, what: str, owner: str) -> str | None:
    if pointer == ffi.NULL:
        return None
    try:
        text: str = ffi.string(pointer).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AbiError(f"{owner}: {what} is not UTF-8 ({exc}): write every string in UTF-8") from None
    return text


@attrs.frozen(kw_only=True)
class ControllerEntry:
    """One decoctl_controller of a loaded library: its metadata and its function pointers (cdata)."""

    path: Path
    name: str
    summary: str
    roles: tuple[str, ...]
    options: tuple[Option, ...]
    create: Any
    step: Any
    destroy: Any
    last_error: Any
    reset: Any | None
    stats_json: Any | None
    rows_for: Any | None = None  # ABI 1.3

    @property
    def label(self) -> str:
        return f"C controller {self.name!r} ({self.path})"

    def rows(self, options: Mapping[str, Any]) -> int:
        """How many rows each role holds for these (parsed) options: the controller's rows_for, else 1. AbiError
        with its last_error when it returns a negative status, or 0."""
        if self.rows_for is None:
            return 1
        count = int(self.rows_for(json.dumps(dict(options)).encode("utf-8")))
        if count >= 1:
            return count
        pointer = self.last_error(ffi.NULL)
        if pointer == ffi.NULL:
            message = "no message (its last_error(NULL) returned NULL)"
        else:
            message = ffi.string(pointer).decode("utf-8", "replace")
        what = "0, not a row count (return at least 1)" if count == 0 else f"status {count}"
        raise AbiError(f"{self.label} rows_for returned {what}: {message}")

    @classmethod
    def from_struct(cls, path: Path, index: int, pointer: Any) -> ControllerEntry:
        """Read the library ``path``'s controller ``index`` from its ``decoctl_controller`` struct (``pointer``),
        checking its struct_size and every function it must provide."""
        owner = f"{path}: controllers[{index}]"
        if pointer == ffi.NULL:
            raise AbiError(f"{owner} is NULL: list only filled decoctl_controller pointers in decoctl_plugin_entry")
        struct = "decoctl_controller"
        size = int(pointer.struct_size)
        needed = field_end(struct, "last_error")
        if size < needed:
            raise AbiError(
                f"{owner}: struct_size is {size}, less than the {needed} bytes ABI {ABI_MAJOR}.0 requires: set it to "
                "sizeof(decoctl_controller) and rebuild against this decoctl's abi/decoctl.h"
            )
        name = _text(pointer.name, "name", owner)
        if not name:
            raise AbiError(f"{owner}: name is NULL or empty: give every controller a name")
        owner = f"{path}: controller {name!r}"
        for required in ("create", "step", "destroy", "last_error"):
            if getattr(pointer, required) == ffi.NULL:
                raise AbiError(f"{owner}: {required} is NULL, but it is required (see abi/decoctl.h)")
        roles_text = _text(pointer.roles, "roles", owner) or "target"
        roles = tuple(r.strip() for r in roles_text.split(",") if r.strip())
        if "target" not in roles:
            raise AbiError(f"{owner}: roles {roles_text!r} lack 'target': every controller drives the target role")
        roles = ("target", *(r for r in roles if r != "target"))

        def optional(field: str) -> Any | None:
            if size < field_end(struct, field):
                return None
            value = getattr(pointer, field)
            return None if value == ffi.NULL else value

        return cls(
            path=path,
            name=name,
            summary=_text(pointer.summary, "summary", owner) or f"{name} from {path.name}",
            roles=roles,
            options=options_from_json(_text(pointer.options_json, "options_json", owner), owner),
            create=pointer.create,
            step=pointer.step,
            destroy=pointer.destroy,
            last_error=pointer.last_error,
            reset=optional("reset"),
            stats_json=optional("stats_json"),
            rows_for=optional("rows_for"),
        )


@attrs.frozen(kw_only=True)
class Library:
    """A loaded shared library and the controllers its entry lists. Libraries stay loaded for the process."""

    path: Path
    controllers: Mapping[str, ControllerEntry]
    handle: Any = attrs.field(repr=False)

    def controller(self, name: str | None = None) -> ControllerEntry:
        """The controller called ``name``; None: the library's only controller (PluginError if it has several)."""
        entries = list(self.controllers.values())
        names = ", ".join(e.name for e in entries)
        if name is None:
            if len(entries) != 1:
                raise PluginError(
                    f"{self.path} provides {len(entries)} controllers ({names}): pick one with {self.path}:NAME, "
                    f"e.g. {self.path}:{entries[0].name}"
                )
            return entries[0]
        entry = self.controllers.get(normalise_name(name))
        if entry is None:
            raise PluginError(
                f"{self.path} has no controller named {name!r} (it provides: {names}): pick one with {self.path}:NAME"
            )
        return entry


_LOAD_LOCK = threading.Lock()
_LIBRARIES: dict[Path, Library] = {}


def load_library(path: str | Path) -> Library:
    """Open a shared library by path and read its ``decoctl_plugin_entry``; cached per absolute path.

    Raises PluginError when the file does not exist, AbiError when it cannot be loaded or breaks the ABI (no
    entry symbol, another major version, a struct_size too small, a required function NULL).
    """
    require_bridge()
    given = Path(path).expanduser()
    if not given.is_file():
        raise PluginError(
            f"shared library {given} does not exist: build it (see examples/c_controller) or fix the path"
        )
    # an absolute path: dlopen then loads that file and never searches LD_LIBRARY_PATH or the working directory
    resolved = given.resolve()
    with _LOAD_LOCK:
        cached = _LIBRARIES.get(resolved)
        if cached is not None:
            return cached
        handle = lib.decoctl_bridge_open(os.fsencode(resolved))
        if handle == ffi.NULL:
            reason = ffi.string(lib.decoctl_bridge_loader_error()).decode("utf-8", "replace")
            raise AbiError(f"cannot load shared library {resolved}: {reason}")
        try:
            library = _read_entry(resolved, handle)
        except BaseException:
            lib.decoctl_bridge_close(handle)
            raise
        _LIBRARIES[resolved] = library
        log.debug("decoctl.abi._library_loaded", path=str(resolved), controllers=sorted(library.controllers))
        return library


def _read_entry(path: Path, handle: Any) -> Library:
    symbol = lib.decoctl_bridge_symbol(handle, ENTRY_SYMBOL.encode())
    if symbol == ffi.NULL:
        reason = ffi.string(lib.decoctl_bridge_loader_error()).decode("utf-8", "replace")
        raise AbiError(
            f"{path} exports no {ENTRY_SYMBOL} ({reason}): it is not a decoctl controller library; define "
            f"`DECOCTL_EXPORT const decoctl_plugin {ENTRY_SYMBOL} = ...;` (see abi/ABI.md)"
        )
    entry = ffi.cast("const decoctl_plugin *", symbol)
    # struct_size, abi_major and abi_minor keep their place in every version: read them before anything else
    major, minor, size = int(entry.abi_major), int(entry.abi_minor), int(entry.struct_size)
    if major != ABI_MAJOR:
        raise AbiError(
            f"{path} was built for decoctl ABI {major}.{minor}, but this host speaks ABI {ABI_MAJOR}.{ABI_MINOR}: "
            f"rebuild the library against this decoctl's abi/decoctl.h"
        )
    needed = field_end("decoctl_plugin", "controllers")
    if size < needed:
        raise AbiError(
            f"{path}: {ENTRY_SYMBOL}.struct_size is {size}, less than the {needed} bytes ABI {ABI_MAJOR}.0 requires: "
            "set it to sizeof(decoctl_plugin) (DECOCTL_PLUGIN(...) does)"
        )
    count = int(entry.controller_count)
    if count == 0 or count > MAX_CONTROLLERS or entry.controllers == ffi.NULL:
        raise AbiError(
            f"{path}: {ENTRY_SYMBOL} lists {count} controller(s) at {entry.controllers}: list 1 to {MAX_CONTROLLERS} "
            "decoctl_controller pointers"
        )
    controllers: dict[str, ControllerEntry] = {}
    for index in range(count):
        controller = ControllerEntry.from_struct(path, index, entry.controllers[index])
        key = normalise_name(controller.name)
        if key in controllers:
            raise AbiError(f"{path}: two controllers are named {controller.name!r}: give each a unique name")
        controllers[key] = controller
    return Library(path=path, controllers=controllers, handle=handle)
