"""The cffi bridge: the host table C controllers call, and the loader of shared-library controllers.

A library speaking abi/decoctl.h exports ``decoctl_plugin_entry``; ``load_library(path)`` opens it by its
absolute path (never a search of the working directory or the loader's path), checks the ABI major and every
struct_size, and lists its controllers. ``library_controller_spec(path, name)`` turns one into a ControllerSpec
(options schema included); ``library_factory(spec)`` builds ``LibraryController``s, ordinary Controllers that
create the C instance in ``start(host)`` and call its step in ``step(host)``.

The host functions are compiled ``extern "Python"`` callbacks (decoctl._abi, out-of-line API mode), except the
cheap read-only queries (length, remaining, done, max_length, logits): C functions of the bridge answer those from
a mirror of the host's state that ``_Instance`` keeps up to date, so they never enter Python. Logits,
hidden states and tokens cross zero-copy (``ffi.from_buffer`` on the host's C-contiguous arrays). A Python
exception inside a callback becomes a negative status in C (``onerror``) and is raised again, unchanged, when
the C create/step/reset returns; a negative status without one raises AbiError with the controller's last_error.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl.errors import AbiError, CapabilityError, ConfigError, ControllerError, PluginError, SequenceError
from decoctl.host import Host, Sequence
from decoctl.logs import get_logger
from decoctl.specs import ControllerSpec, Option, normalise_name

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
    "LibraryController",
    "library_controller_spec",
    "library_factory",
    "load_library",
]

log = get_logger(__name__)

ABI_MAJOR = 1
ABI_MINOR = 2
ENTRY_SYMBOL = "decoctl_plugin_entry"
MAX_CONTROLLERS = 1024  # more than this in one entry means the entry is garbage, not a big library

STATUS_NAMES = {
    -1: "DECOCTL_ERR_FAILED",
    -2: "DECOCTL_ERR_HOST",
    -3: "DECOCTL_ERR_CAPABILITY",
    -4: "DECOCTL_ERR_SEQUENCE",
    -5: "DECOCTL_ERR_ARGUMENT",
}


def _require_bridge() -> None:
    if _BRIDGE_ERROR is not None:
        raise PluginError(
            f"the C ABI bridge decoctl._abi is not built ({_BRIDGE_ERROR}): reinstall decoctl (pip install -e .) "
            "with a C compiler and cffi available, so that setup.py compiles it"
        )


# -- reading structs the other side wrote ------------------------------------------------------------------------


def _field_end(ctype: str, field: str) -> int:
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


def _options_from_json(text: str | None, owner: str) -> tuple[Option, ...]:
    if text is None:
        return ()
    try:
        entries = json.loads(text)
        if not isinstance(entries, list):
            raise TypeError("the schema must be a JSON array of objects")
        options = []
        for entry in entries:
            if not isinstance(entry, dict):
                raise TypeError(f"{entry!r} is not an object")
            options.append(
                Option(
                    name=str(entry["name"]),
                    type=str(entry["type"]),
                    default=entry.get("default"),
                    help=str(entry.get("help", "")),
                    choices=tuple(entry.get("choices", ())),
                    minimum=entry.get("minimum"),
                    maximum=entry.get("maximum"),
                )
            )
    except (ValueError, TypeError, KeyError) as exc:
        raise AbiError(
            f"{owner}: options_json is not an option schema ({type(exc).__name__}: {exc}); write a JSON array such "
            'as [{"name": "k", "type": "int", "default": 8, "help": "..."}]'
        ) from None
    return tuple(options)


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

    @property
    def label(self) -> str:
        return f"C controller {self.name!r} ({self.path})"

    @classmethod
    def from_struct(cls, path: Path, index: int, pointer: Any) -> ControllerEntry:
        owner = f"{path}: controllers[{index}]"
        if pointer == ffi.NULL:
            raise AbiError(f"{owner} is NULL: list only filled decoctl_controller pointers in decoctl_plugin_entry")
        struct = "decoctl_controller"
        size = int(pointer.struct_size)
        needed = _field_end(struct, "last_error")
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
            if size < _field_end(struct, field):
                return None
            value = getattr(pointer, field)
            return None if value == ffi.NULL else value

        return cls(
            path=path,
            name=name,
            summary=_text(pointer.summary, "summary", owner) or f"{name} from {path.name}",
            roles=roles,
            options=_options_from_json(_text(pointer.options_json, "options_json", owner), owner),
            create=pointer.create,
            step=pointer.step,
            destroy=pointer.destroy,
            last_error=pointer.last_error,
            reset=optional("reset"),
            stats_json=optional("stats_json"),
        )


@attrs.frozen(kw_only=True)
class Library:
    """A loaded shared library and the controllers its entry lists. Libraries stay loaded for the process."""

    path: Path
    abi_minor: int
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
    _require_bridge()
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
        log.debug("decoctl.abi_library_loaded", path=str(resolved), controllers=sorted(library.controllers))
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
    needed = _field_end("decoctl_plugin", "controllers")
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
    return Library(path=path, abi_minor=minor, controllers=controllers, handle=handle)


# -- specs and factories ------------------------------------------------------------------------------------------


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
        plugin=str(entry.path),
    )


def library_factory(spec: ControllerSpec) -> Callable[[dict[str, Any]], LibraryController]:
    """``factory(options) -> LibraryController`` for a spec naming a library (``spec.library``) and a controller
    in it (``spec.symbol``, else ``spec.name``)."""
    if spec.library is None:
        raise PluginError(f"controller spec {spec.name!r} names no shared library: give library=Path(...)")
    entry = load_library(spec.library).controller(spec.symbol or spec.name)
    return functools.partial(LibraryController, entry)


# -- one C instance and the host table it calls ------------------------------------------------------------------

_calls = threading.local()  # .stack: the instances inside a create/step/reset on this thread, innermost last
_LIVE: dict[Any, _Instance] = {}  # host_data -> instance, from create until destroy (keeps its mirror alive)


def _active() -> list[_Instance]:
    try:
        stack: list[_Instance] = _calls.stack
    except AttributeError:
        stack = _calls.stack = []
    return stack


class _Instance:
    """One C controller instance: its state, its host table, the host it is bound to and what C may point at.

    host_data is the instance's mirror (decoctl_bridge_host, abi/build_bridge.py) and each role handle a
    decoctl_role * to the role's decoctl_bridge_role: C answers length, remaining, done, max_length and logits from
    them. They are written before every create/step/reset and after every callback that changes what they hold, so
    C never reads a stale value; C holds no reference of its own, so they live as long as this object.
    """

    def __init__(self, entry: ControllerEntry) -> None:
        self.entry = entry
        self.mirror = ffi.new("decoctl_bridge_host *")
        self.host_data = ffi.cast("void *", self.mirror)
        self.table = ffi.new("decoctl_host *")
        lib.decoctl_bridge_fill_table(self.table, self.mirror)
        self.state: Any = None
        self.host: Host | None = None
        self._roles: dict[Any, Sequence] = {}  # role handle -> its sequence in the bound host
        self._role_handles: dict[str, Any] = {}  # role name -> role handle
        self._role_mirrors: dict[Any, Any] = {}  # role handle -> its decoctl_bridge_role (the owning cdata)
        self._role_list: Any = ffi.new("decoctl_bridge_role *[]", 0)  # what the mirror's roles point at
        # buffers C may point at, (array, pointer) by kind: per role until its next forward/rewind, and the
        # last process() output
        self._views: dict[Sequence, dict[str, tuple[np.ndarray, Any]]] = {}
        self._processed_views: dict[str, tuple[np.ndarray, Any]] = {}
        self.pending: BaseException | None = None
        self._error_text: Any = ffi.NULL

    # -- binding and calling --------------------------------------------------------------------------------
    def bind(self, host: Host | None) -> None:
        """Serve ``host`` from now on. Role handles C already holds stay valid for the same role names."""
        self.host = host
        self._views.clear()
        self._processed_views.clear()
        for name, handle in list(self._role_handles.items()):
            if host is not None and name in host.roles:
                self._roles[handle] = host.role(name)
            else:
                del self._role_handles[name]
                self._roles.pop(handle, None)
                del self._role_mirrors[handle]
        self._list_roles()
        self.mirror_all()

    def call(self, what: str, function: Any, *args: Any, out_state: Any = None) -> int:
        """Call one of the controller's status-returning functions (create, step, reset); raise what a callback
        raised, AbiError on an error status, ControllerError on a positive one (no status the ABI defines).

        ``out_state``: create's ``void **``, read before the error checks so that last_error sees the state."""
        stack = _active()
        self.mirror_all()  # the host may have moved since the last call (a prefill, another controller)
        stack.append(self)
        lib.decoctl_bridge_serve(self.mirror)
        try:
            status = int(function(*args))
        finally:
            stack.pop()
            lib.decoctl_bridge_serve(stack[-1].mirror if stack else ffi.NULL)
            self._error_text = ffi.NULL
            if out_state is not None:
                self.state = out_state[0]
        pending, self.pending = self.pending, None
        if pending is not None:
            message = self.last_error()
            pending.add_note(
                f"raised inside a host function called by {self.entry.label} during {what}, which returned "
                f"{status}" + (f" ({message})" if message else "")
            )
            raise pending
        if status < 0:
            message = self.last_error() or "no message (its last_error returned NULL)"
            raise AbiError(f"{self.entry.label} {what} failed with status {status} ({_status_name(status)}): {message}")
        if status > 0:
            message = self.last_error()
            raise ControllerError(
                f"{self.entry.label} {what} returned {status}, an invalid status: return DECOCTL_OK (0) on success "
                "or a negative DECOCTL_ERR_* on failure (abi/decoctl.h)"
                + (f"; its last_error: {message}" if message else "")
            )
        return status

    def last_error(self) -> str | None:
        pointer = self.entry.last_error(self.state if self.state is not None else ffi.NULL)
        if pointer == ffi.NULL:
            return None
        return ffi.string(pointer).decode("utf-8", "replace")

    def create(self, config: bytes) -> None:
        """Call create; afterwards ``state`` is the C state (``ffi.NULL`` for a stateless controller), or None
        when create failed without one (then there is nothing to destroy)."""
        out = ffi.new("void **")
        _LIVE[self.host_data] = self
        try:
            self.call("create", self.entry.create, self.table, config, out, out_state=out)
        except BaseException:
            if self.state == ffi.NULL:
                self.state = None
            raise

    def stats(self) -> dict[str, Any]:
        if self.entry.stats_json is None or self.state is None:
            return {}
        pointer = self.entry.stats_json(self.state)
        if pointer == ffi.NULL:
            return {}
        text = ffi.string(pointer).decode("utf-8", "replace")
        try:
            stats = json.loads(text)
        except ValueError as exc:
            raise AbiError(f"{self.entry.label} stats_json returned {text[:80]!r}, not JSON ({exc})") from None
        if not isinstance(stats, dict):
            raise AbiError(f"{self.entry.label} stats_json returned {text[:80]!r}: return a JSON object")
        return stats

    def destroy(self) -> None:
        """Free the C state (host functions called from destroy are refused: the instance is not active)."""
        if self.state is not None:
            state, self.state = self.state, None
            self.entry.destroy(state)
        _LIVE.pop(self.host_data, None)
        self.bind(None)

    # -- what the callbacks use -----------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """Keep a callback's exception: the first one is raised when the C call returns (it explains the rest);
        host_error() reports the latest."""
        if self.pending is None:
            self.pending = exc
        self._error_text = ffi.new("char[]", f"{type(exc).__name__}: {exc}".encode("utf-8", "replace"))

    def role_handle(self, name: str) -> Any:
        handle = self._role_handles.get(name)
        if handle is None:
            sequence = self._host().role(name)
            mirror = ffi.new("decoctl_bridge_role *")
            handle = ffi.cast("decoctl_role *", mirror)  # opaque to C; the bridge maps it back through _roles
            self._role_handles[name] = handle
            self._roles[handle] = sequence
            self._role_mirrors[handle] = mirror
            self._list_roles()
            self._mirror_role(mirror, sequence)
        return handle

    def sequence(self, role: Any) -> Sequence:
        sequence = self._roles.get(role)
        if sequence is None:
            raise AbiError(
                f"{self.entry.label} passed an unknown role handle: get one from host->role(host_data, name)"
            )
        return sequence

    def _host(self) -> Host:
        if self.host is None:
            raise AbiError(f"{self.entry.label} called the host with no generation bound")
        return self.host

    def changed(self, role: Any, sequence: Sequence) -> None:
        """After a primitive that may have changed ``sequence`` (``role``'s): forget C's views of its old
        buffers and mirror its new length and logits. Called on failure too: a forward that failed midway may
        have changed it."""
        self._views.pop(sequence, None)
        self._mirror_role(self._role_mirrors[role], sequence)

    # -- the mirror C reads ---------------------------------------------------------------------------------
    def mirror_all(self) -> None:
        for handle, sequence in self._roles.items():
            self._mirror_role(self._role_mirrors[handle], sequence)
        self.mirror_generation()

    def mirror_generation(self) -> None:
        """Mirror done, remaining and max_length (commit is the only callback that changes them)."""
        mirror, host = self.mirror, self.host
        if host is None:
            mirror.bound = 0  # C then asks Python, which refuses: no generation bound
            return
        mirror.done = host.done
        mirror.remaining = host.remaining
        mirror.max_length = host.max_length
        mirror.bound = 1

    def _mirror_role(self, mirror: Any, sequence: Sequence) -> None:
        mirror.length = sequence.length
        try:
            logits = sequence.logits()
        except SequenceError:
            # no current logits: C's logits() then calls Python, which raises this error for the controller
            mirror.logits = ffi.NULL
            return
        mirror.logits = self.pointer_to(sequence, "logits", logits)
        mirror.logits_n, mirror.logits_width = logits.shape

    def _list_roles(self) -> None:
        mirrors = list(self._role_mirrors.values())
        self._role_list = ffi.new("decoctl_bridge_role *[]", mirrors)
        self.mirror.roles = self._role_list
        self.mirror.n_roles = len(mirrors)

    def pointer_to(self, sequence: Sequence | None, kind: str, array: np.ndarray) -> Any:
        """A ``float *`` / ``int64_t *`` to ``array`` (C-contiguous), alive until the role's next forward or
        rewind (``sequence`` None: until the next process call). Asking again for the same array reuses it."""
        if sequence is None:
            views = self._processed_views
            views.clear()
        else:
            views = self._views.setdefault(sequence, {})
            cached = views.get(kind)
            if cached is not None and cached[0] is array:
                return cached[1]
        if array.dtype == np.int64:
            pointer = ffi.from_buffer("int64_t[]", np.ascontiguousarray(array))
        else:
            pointer = ffi.from_buffer("float[]", np.ascontiguousarray(array, dtype=np.float32))
        views[kind] = (array, pointer)
        return pointer

    def error_text(self) -> Any:
        return self._error_text


def _status_name(status: int) -> str:
    return STATUS_NAMES.get(status, "a plugin-defined error")


# -- the host functions (extern "Python") ------------------------------------------------------------------------


def _current(host_data: Any) -> _Instance:
    """The instance whose create/step/reset is running on this thread, if host_data is its table's."""
    stack = _active()
    if stack and stack[-1].host_data == host_data:
        return stack[-1]
    if _LIVE.get(host_data) is None:
        raise AbiError("a host function got a host_data that is no live decoctl host: pass host->host_data")
    raise AbiError(
        "a host function was called outside create/step/reset of its own controller instance, or from another "
        "thread: host functions are [controller-thread] (see abi/decoctl.h)"
    )


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, CapabilityError):
        return int(lib.DECOCTL_ERR_CAPABILITY)
    if isinstance(exc, SequenceError):
        return int(lib.DECOCTL_ERR_SEQUENCE)
    if isinstance(exc, (ConfigError, AbiError)):
        return int(lib.DECOCTL_ERR_ARGUMENT)
    return int(lib.DECOCTL_ERR_HOST)


def _on_error(exc_type: type[BaseException], exc: BaseException, traceback: Any) -> int:
    """onerror of every status-returning callback: keep the exception for the running C call, return a status."""
    exc = exc if exc is not None else exc_type()
    stack = _active()
    if stack:
        stack[-1].fail(exc.with_traceback(traceback))
    else:
        log.error("decoctl.abi_callback_outside_call", error=f"{type(exc).__name__}: {exc}")
    return _status_of(exc)


def _on_error_pointer(exc_type: type[BaseException], exc: BaseException, traceback: Any) -> None:
    _on_error(exc_type, exc, traceback)
    return None  # the callback then returns NULL


def _ids(pointer: Any, n: int, what: str) -> np.ndarray:
    """int64[n], a copy of caller-owned ids (C memory is only valid during the call)."""
    if n < 0:
        raise ConfigError(f"{what}: n is {n}; give a count >= 0")
    if n == 0:
        return np.zeros(0, np.int64)
    if pointer == ffi.NULL:
        raise ConfigError(f"{what}: the token pointer is NULL with n = {n}")
    return np.frombuffer(ffi.buffer(pointer, n * 8), dtype=np.int64).copy()


def _chain_input(
    host: Host, rows: Any, n: int, width: int, drafted: Any, n_drafted: int, out: Any, what: str, out_name: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """process()/argmax(): the caller's float32[n, vocab] rows as an array (no copy) and the drafted prefix."""
    if rows == ffi.NULL or out == ffi.NULL or n < 1:
        raise ConfigError(f"{what}(): rows and {out_name} must not be NULL and n ({n}) at least 1")
    vocab = host.target.vocab_size
    if width != vocab:
        raise ConfigError(f"{what}(): width is {width}, but rows must span the vocabulary ({vocab})")
    given = np.frombuffer(ffi.buffer(rows, n * width * 4), dtype=np.float32).reshape(n, width)
    return given, (_ids(drafted, n_drafted, f"{what}()") if n_drafted else None)


_ROWS_MIN_SIZE = 0  # set once the bridge is imported


def _check_rows(out: Any) -> None:
    if out.struct_size < _ROWS_MIN_SIZE:
        raise ConfigError(
            f"decoctl_rows.struct_size is {out.struct_size}, less than {_ROWS_MIN_SIZE}: initialise it with "
            "DECOCTL_ROWS_INIT"
        )


def _fill_rows(out: Any, instance: _Instance, sequence: Sequence | None, kind: str, array: np.ndarray) -> None:
    """Point ``out`` at ``array`` (float32[n, width]) zero-copy and keep the array alive for C."""
    if out == ffi.NULL:
        return
    _check_rows(out)
    pointer = instance.pointer_to(sequence, kind, array)
    out.data = pointer
    out.n, out.width = array.shape


def _install_callbacks() -> None:
    """Define every host function's extern "Python" callback. The table points at C functions of the bridge for
    length, remaining, done, max_length and logits (answered from the mirror); their callbacks here run only for
    what the mirror cannot answer (a refused call, no current logits), so that a refusal stays what it was."""
    ok = int(lib.DECOCTL_OK)
    error = int(lib.DECOCTL_ERR_HOST)

    def extern(function: Callable[..., Any]) -> Callable[..., Any]:
        return ffi.def_extern(name=function.__name__, error=error, onerror=_on_error)(function)

    @extern
    def decoctl_py_role(host_data: Any, name: Any, out_role: Any) -> int:
        instance = _current(host_data)
        if name == ffi.NULL or out_role == ffi.NULL:
            raise ConfigError("role(): name and out_role must not be NULL")
        out_role[0] = instance.role_handle(ffi.string(name).decode("utf-8"))
        return ok

    @extern
    def decoctl_py_forward(host_data: Any, role: Any, tokens: Any, n: int, out_rows: Any) -> int:
        instance = _current(host_data)
        sequence = instance.sequence(role)
        ids = _ids(tokens, n, "forward()")
        try:
            rows = sequence.forward(ids)
        finally:
            instance.changed(role, sequence)
        _fill_rows(out_rows, instance, sequence, "logits", rows)
        return ok

    @extern
    def decoctl_py_forward_tree(host_data: Any, role: Any, tokens: Any, parents: Any, n: int, out_rows: Any) -> int:
        instance = _current(host_data)
        sequence = instance.sequence(role)
        ids = _ids(tokens, n, "forward_tree()")
        if parents == ffi.NULL:
            raise ConfigError("forward_tree(): parents must not be NULL")
        tree = np.frombuffer(ffi.buffer(parents, n * 4), dtype=np.int32).tolist() if n > 0 else []
        try:
            rows = sequence.forward(ids, tree=tree)
        finally:
            instance.changed(role, sequence)
        _fill_rows(out_rows, instance, sequence, "logits", rows)
        return ok

    @extern
    def decoctl_py_forward_features(
        host_data: Any, role: Any, tokens: Any, parents: Any, n: int, features: Any, width: int, out_rows: Any
    ) -> int:
        instance = _current(host_data)
        sequence = instance.sequence(role)
        ids = _ids(tokens, n, "forward_features()")
        if n > 0 and (features == ffi.NULL or width < 1):
            raise ConfigError(f"forward_features(): features must not be NULL and width ({width}) at least 1")
        rows_in = (
            np.frombuffer(ffi.buffer(features, n * width * 4), dtype=np.float32).reshape(n, width) if n > 0 else None
        )
        tree = None if parents == ffi.NULL else np.frombuffer(ffi.buffer(parents, n * 4), dtype=np.int32).tolist()
        try:
            rows = sequence.forward(ids, tree=tree, features=rows_in)
        finally:
            instance.changed(role, sequence)
        _fill_rows(out_rows, instance, sequence, "logits", rows)
        return ok

    @extern
    def decoctl_py_keep(host_data: Any, role: Any, indices: Any, n: int) -> int:
        instance = _current(host_data)
        sequence = instance.sequence(role)
        kept = [int(i) for i in _ids(indices, n, "keep()")]
        try:
            sequence.keep(kept)
        finally:
            instance.changed(role, sequence)
        return ok

    @extern
    def decoctl_py_logits(host_data: Any, role: Any, out_rows: Any) -> int:
        instance = _current(host_data)
        sequence = instance.sequence(role)
        if out_rows == ffi.NULL:
            raise ConfigError("logits(): out_rows must not be NULL")
        _fill_rows(out_rows, instance, sequence, "logits", sequence.logits())
        return ok

    @extern
    def decoctl_py_hidden_states(host_data: Any, role: Any, kind: Any, out_rows: Any) -> int:
        instance = _current(host_data)
        sequence = instance.sequence(role)
        if out_rows == ffi.NULL:
            raise ConfigError("hidden_states(): out_rows must not be NULL")
        name = "final" if kind == ffi.NULL else ffi.string(kind).decode("utf-8")
        _fill_rows(out_rows, instance, sequence, f"hidden:{name}", sequence.hidden_states(name))
        return ok

    @extern
    def decoctl_py_rewind(host_data: Any, role: Any, length: int) -> int:
        instance = _current(host_data)
        sequence = instance.sequence(role)
        try:
            sequence.rewind(int(length))
        finally:
            instance.changed(role, sequence)
        return ok

    @extern
    def decoctl_py_length(host_data: Any, role: Any) -> int:
        return _current(host_data).sequence(role).length

    @extern
    def decoctl_py_tokens(host_data: Any, role: Any, out_tokens: Any, out_n: Any) -> int:
        instance = _current(host_data)
        sequence = instance.sequence(role)
        if out_tokens == ffi.NULL or out_n == ffi.NULL:
            raise ConfigError("tokens(): out_tokens and out_n must not be NULL")
        view = sequence.tokens
        out_tokens[0] = instance.pointer_to(sequence, "tokens", view) if len(view) else ffi.NULL
        out_n[0] = len(view)
        return ok

    @extern
    def decoctl_py_has_capability(host_data: Any, role: Any, name: Any) -> int:
        sequence = _current(host_data).sequence(role)
        if name == ffi.NULL:
            raise ConfigError("has_capability(): name must not be NULL")
        return int(ffi.string(name).decode("utf-8") in sequence.capabilities)

    @extern
    def decoctl_py_commit(host_data: Any, tokens: Any, n: int, out_taken: Any) -> int:
        instance = _current(host_data)
        host = instance._host()
        ids = _ids(tokens, n, "commit()")
        vocab = host.target.vocab_size
        bad = [int(t) for t in ids if not 0 <= t < vocab]
        if bad:
            raise SequenceError(f"commit() got token ids outside [0, {vocab}): {bad[:5]}; nothing was committed")
        try:
            taken = host.commit(ids) if n else 0
        finally:
            instance.mirror_generation()
        if out_taken != ffi.NULL:
            out_taken[0] = taken
        return ok

    @extern
    def decoctl_py_done(host_data: Any) -> int:
        return int(_current(host_data)._host().done)

    @extern
    def decoctl_py_is_eos(host_data: Any, token: int) -> int:
        return int(_current(host_data)._host().is_eos(token))

    @extern
    def decoctl_py_max_length(host_data: Any) -> int:
        return _current(host_data)._host().max_length

    @extern
    def decoctl_py_remaining(host_data: Any) -> int:
        return _current(host_data)._host().remaining

    @extern
    def decoctl_py_process(
        host_data: Any, rows: Any, n: int, width: int, drafted: Any, n_drafted: int, out_rows: Any
    ) -> int:
        instance = _current(host_data)
        host = instance._host()
        given, prefix = _chain_input(host, rows, n, width, drafted, n_drafted, out_rows, "process", "out_rows")
        result = host.process(given, prefix)
        if result is given:  # no processor configured: the caller's rows, no copy
            _check_rows(out_rows)
            out_rows.data = rows
            out_rows.n, out_rows.width = n, width
            return ok
        _fill_rows(out_rows, instance, None, "processed", result)
        return ok

    @extern
    def decoctl_py_argmax(
        host_data: Any, rows: Any, n: int, width: int, drafted: Any, n_drafted: int, out_tokens: Any
    ) -> int:
        host = _current(host_data)._host()
        given, prefix = _chain_input(host, rows, n, width, drafted, n_drafted, out_tokens, "argmax", "out_tokens")
        chosen = host.argmax(given, prefix)
        np.frombuffer(ffi.buffer(out_tokens, n * 8), dtype=np.int64)[:] = chosen
        return ok

    @extern
    def decoctl_py_uniform(host_data: Any, out_value: Any) -> int:
        host = _current(host_data)._host()
        if out_value == ffi.NULL:
            raise ConfigError("uniform(): out_value must not be NULL")
        out_value[0] = float(host.rng.random())
        return ok

    @extern
    def decoctl_py_log_message(host_data: Any, level: int, message: Any) -> int:
        instance = _current(host_data)
        if message == ffi.NULL:
            raise ConfigError("log_message(): message must not be NULL")
        text = ffi.string(message).decode("utf-8", "replace")
        method = "error" if level >= 40 else "warning" if level >= 30 else "info" if level >= 20 else "debug"
        getattr(log, method)("decoctl.c_controller_log", controller=instance.entry.name, message=text)
        return ok

    @ffi.def_extern(onerror=_on_error_pointer)
    def decoctl_py_host_error(host_data: Any) -> Any:
        return _current(host_data).error_text()


if lib is not None:
    if (lib.DECOCTL_ABI_MAJOR, lib.DECOCTL_ABI_MINOR) != (ABI_MAJOR, ABI_MINOR):
        raise ImportError(
            f"decoctl._abi was built from decoctl.h {lib.DECOCTL_ABI_MAJOR}.{lib.DECOCTL_ABI_MINOR}, but decoctl.abi "
            f"speaks {ABI_MAJOR}.{ABI_MINOR}: reinstall decoctl (pip install -e .) to rebuild the bridge"
        )
    _ROWS_MIN_SIZE = _field_end("decoctl_rows", "width")
    _install_callbacks()


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
        self._instance: _Instance | None = None
        self._finalizer: weakref.finalize | None = None
        self._stats: dict[str, Any] = {}

    def start(self, host: Host) -> None:
        instance = self._instance
        if instance is not None and self.entry.reset is not None:
            instance.bind(host)
            self._guarded("reset", self.entry.reset, instance.state)
            return
        self.close()
        instance = _Instance(self.entry)
        self._instance = instance
        self._finalizer = weakref.finalize(self, instance.destroy)
        instance.bind(host)
        try:
            instance.create(self._config)
        except BaseException:
            self._close_after_error()
            raise

    def step(self, host: Host) -> None:
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
