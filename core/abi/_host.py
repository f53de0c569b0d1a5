"""The host table C controllers call: one C instance's state, the mirror C reads, and the host functions.

The host functions are compiled ``extern "Python"`` callbacks (decoctl._abi, out-of-line API mode), except the
cheap read-only queries (length, remaining, done, max_length, logits): C functions of the bridge answer those from
a mirror of the host's state that ``ControllerInstance`` keeps up to date, so they never enter Python. Logits,
hidden states and tokens cross zero-copy (``ffi.from_buffer`` on the host's C-contiguous arrays). A Python
exception inside a callback becomes a negative status in C (``onerror``) and is raised again, unchanged, when
the C create/step/reset returns; a negative status without one raises AbiError with the controller's last_error.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from decoctl.abi._library import ControllerEntry, ffi, field_end, lib
from decoctl.errors import AbiError, CapabilityError, ConfigError, ControllerError, SequenceError
from decoctl.host import Host, Sequence
from decoctl.logs import get_logger

__all__ = ["STATUS_NAMES", "ControllerInstance"]

log = get_logger(__name__)

STATUS_NAMES = {
    -1: "DECOCTL_ERR_FAILED",
    -2: "DECOCTL_ERR_HOST",
    -3: "DECOCTL_ERR_CAPABILITY",
    -4: "DECOCTL_ERR_SEQUENCE",
    -5: "DECOCTL_ERR_ARGUMENT",
}
OK = 0  # DECOCTL_OK
RETIRED_STEPS = 4  # debug mode: step_rows outputs kept alive (NaN-filled) past their lifetime, per instance


_calls = threading.local()  # .stack: the instances inside a create/step/reset on this thread, innermost last
_LIVE: dict[Any, ControllerInstance] = {}  # host_data -> instance, from create until destroy (keeps its mirror alive)


def _active() -> list[ControllerInstance]:
    try:
        stack: list[ControllerInstance] = _calls.stack
    except AttributeError:
        stack = _calls.stack = []
    return stack


class ControllerInstance:
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
        # the bound generation's source (ABI 1.4 source_tokens): (its array, the pointer C holds) until the next bind
        self._source: tuple[np.ndarray, Any] | None = None
        # step_rows' output per role handle (ABI 1.3) until the role's next change: (pointer, the debug-mode copy
        # or None); the copy is filled with NaN when that lifetime ends and kept alive a while (_retired_steps)
        self._step_outputs: dict[Any, tuple[Any, np.ndarray | None]] = {}
        self._retired_steps: deque[np.ndarray] = deque(maxlen=RETIRED_STEPS)
        self.pending: BaseException | None = None
        self._error_text: Any = ffi.NULL

    # -- binding and calling --------------------------------------------------------------------------------
    def bind(self, host: Host | None) -> None:
        """Serve ``host`` from now on. Role handles C already holds stay valid for the same role names."""
        self.host = host
        self._views.clear()
        self._processed_views.clear()
        self._source = None
        self._step_outputs.clear()
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
        self.retire_step_output(role)
        self._mirror_role(self._role_mirrors[role], sequence)

    # -- rows (ABI 1.3, decoctl.abi._rows) -------------------------------------------------------------------
    def role_name(self, role: Any) -> str:
        self.sequence(role)  # AbiError for a handle this instance never gave out
        return next(name for name, handle in self._role_handles.items() if handle == role)

    def forget_views(self, sequence: Sequence) -> None:
        """Drop C's views of a row's buffers (it changed, or was released)."""
        self._views.pop(sequence, None)

    def hold_step_output(self, role: Any, logits: np.ndarray, *, debug: bool) -> Any:
        """A ``float *`` to step_rows' float32[k, vocab] output, alive until the role's next change (a copy in
        debug mode, which retire_step_output then fills with NaN)."""
        array = np.array(logits, dtype=np.float32) if debug else np.ascontiguousarray(logits, dtype=np.float32)
        pointer = ffi.from_buffer("float[]", array)  # keeps the array alive
        self._step_outputs[role] = (pointer, array if debug else None)
        return pointer

    def retire_step_output(self, role: Any) -> None:
        """End the lifetime of the role's step_rows output: in debug mode a kept pointer then reads NaN."""
        _, copy = self._step_outputs.pop(role, (None, None))
        if copy is not None:
            copy.fill(np.nan)
            self._retired_steps.append(copy)

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

    def source_pointer(self) -> tuple[Any, int]:
        """An ``int64_t *`` to the bound generation's source tokens and their count (``ffi.NULL`` and 0 for a
        decoder-only target), alive until the next bind (a reset or destroy)."""
        source = self._host().source_tokens
        if not len(source):
            return ffi.NULL, 0
        if self._source is None or self._source[0] is not source:
            self._source = (source, ffi.from_buffer("int64_t[]", np.ascontiguousarray(source, dtype=np.int64)))
        return self._source[1], len(source)

    def error_text(self) -> Any:
        return self._error_text


def _status_name(status: int) -> str:
    return STATUS_NAMES.get(status, "a plugin-defined error")


# -- what the host functions share ------------------------------------------------------------------------------


def _current(host_data: Any) -> ControllerInstance:
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


_ROWS_MIN_SIZE = 0  # set by _install(), once the bridge is there


def _check_rows(out: Any) -> None:
    if out.struct_size < _ROWS_MIN_SIZE:
        raise ConfigError(
            f"decoctl_rows.struct_size is {out.struct_size}, less than {_ROWS_MIN_SIZE}: initialise it with "
            "DECOCTL_ROWS_INIT"
        )


def _fill_rows(out: Any, instance: ControllerInstance, sequence: Sequence | None, kind: str, array: np.ndarray) -> None:
    """Point ``out`` at ``array`` (float32[n, width]) zero-copy and keep the array alive for C."""
    if out == ffi.NULL:
        return
    _check_rows(out)
    pointer = instance.pointer_to(sequence, kind, array)
    out.data = pointer
    out.n, out.width = array.shape


# -- the host functions (extern "Python") ------------------------------------------------------------------------


def decoctl_py_role(host_data: Any, name: Any, out_role: Any) -> int:
    instance = _current(host_data)
    if name == ffi.NULL or out_role == ffi.NULL:
        raise ConfigError("role(): name and out_role must not be NULL")
    out_role[0] = instance.role_handle(ffi.string(name).decode("utf-8"))
    return OK


def decoctl_py_forward(host_data: Any, role: Any, tokens: Any, n: int, out_rows: Any) -> int:
    instance = _current(host_data)
    sequence = instance.sequence(role)
    ids = _ids(tokens, n, "forward()")
    try:
        rows = sequence.forward(ids)
    finally:
        instance.changed(role, sequence)
    _fill_rows(out_rows, instance, sequence, "logits", rows)
    return OK


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
    return OK


def decoctl_py_forward_features(
    host_data: Any, role: Any, tokens: Any, parents: Any, n: int, features: Any, width: int, out_rows: Any
) -> int:
    instance = _current(host_data)
    sequence = instance.sequence(role)
    ids = _ids(tokens, n, "forward_features()")
    if n > 0 and (features == ffi.NULL or width < 1):
        raise ConfigError(f"forward_features(): features must not be NULL and width ({width}) at least 1")
    rows_in = np.frombuffer(ffi.buffer(features, n * width * 4), dtype=np.float32).reshape(n, width) if n > 0 else None
    tree = None if parents == ffi.NULL else np.frombuffer(ffi.buffer(parents, n * 4), dtype=np.int32).tolist()
    try:
        rows = sequence.forward(ids, tree=tree, features=rows_in)
    finally:
        instance.changed(role, sequence)
    _fill_rows(out_rows, instance, sequence, "logits", rows)
    return OK


def decoctl_py_keep(host_data: Any, role: Any, indices: Any, n: int) -> int:
    instance = _current(host_data)
    sequence = instance.sequence(role)
    kept = [int(i) for i in _ids(indices, n, "keep()")]
    try:
        sequence.keep(kept)
    finally:
        instance.changed(role, sequence)
    return OK


def decoctl_py_logits(host_data: Any, role: Any, out_rows: Any) -> int:
    instance = _current(host_data)
    sequence = instance.sequence(role)
    if out_rows == ffi.NULL:
        raise ConfigError("logits(): out_rows must not be NULL")
    _fill_rows(out_rows, instance, sequence, "logits", sequence.logits())
    return OK


def decoctl_py_hidden_states(host_data: Any, role: Any, kind: Any, out_rows: Any) -> int:
    instance = _current(host_data)
    sequence = instance.sequence(role)
    if out_rows == ffi.NULL:
        raise ConfigError("hidden_states(): out_rows must not be NULL")
    name = "final" if kind == ffi.NULL else ffi.string(kind).decode("utf-8")
    _fill_rows(out_rows, instance, sequence, f"hidden:{name}", sequence.hidden_states(name))
    return OK


def decoctl_py_rewind(host_data: Any, role: Any, length: int) -> int:
    instance = _current(host_data)
    sequence = instance.sequence(role)
    try:
        sequence.rewind(int(length))
    finally:
        instance.changed(role, sequence)
    return OK


def decoctl_py_length(host_data: Any, role: Any) -> int:
    return _current(host_data).sequence(role).length


def decoctl_py_tokens(host_data: Any, role: Any, out_tokens: Any, out_n: Any) -> int:
    instance = _current(host_data)
    sequence = instance.sequence(role)
    if out_tokens == ffi.NULL or out_n == ffi.NULL:
        raise ConfigError("tokens(): out_tokens and out_n must not be NULL")
    view = sequence.tokens
    out_tokens[0] = instance.pointer_to(sequence, "tokens", view) if len(view) else ffi.NULL
    out_n[0] = len(view)
    return OK


def decoctl_py_has_capability(host_data: Any, role: Any, name: Any) -> int:
    sequence = _current(host_data).sequence(role)
    if name == ffi.NULL:
        raise ConfigError("has_capability(): name must not be NULL")
    return int(ffi.string(name).decode("utf-8") in sequence.capabilities)


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
    return OK


def decoctl_py_done(host_data: Any) -> int:
    return int(_current(host_data)._host().done)


def decoctl_py_is_eos(host_data: Any, token: int) -> int:
    return int(_current(host_data)._host().is_eos(token))


def decoctl_py_max_length(host_data: Any) -> int:
    return _current(host_data)._host().max_length


def decoctl_py_remaining(host_data: Any) -> int:
    return _current(host_data)._host().remaining


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
        return OK
    _fill_rows(out_rows, instance, None, "processed", result)
    return OK


def decoctl_py_argmax(
    host_data: Any, rows: Any, n: int, width: int, drafted: Any, n_drafted: int, out_tokens: Any
) -> int:
    host = _current(host_data)._host()
    given, prefix = _chain_input(host, rows, n, width, drafted, n_drafted, out_tokens, "argmax", "out_tokens")
    chosen = host.argmax(given, prefix)
    np.frombuffer(ffi.buffer(out_tokens, n * 8), dtype=np.int64)[:] = chosen
    return OK


def decoctl_py_uniform(host_data: Any, out_value: Any) -> int:
    host = _current(host_data)._host()
    if out_value == ffi.NULL:
        raise ConfigError("uniform(): out_value must not be NULL")
    out_value[0] = float(host.rng.random())
    return OK


def decoctl_py_log_message(host_data: Any, level: int, message: Any) -> int:
    instance = _current(host_data)
    if message == ffi.NULL:
        raise ConfigError("log_message(): message must not be NULL")
    text = ffi.string(message).decode("utf-8", "replace")
    method = "error" if level >= 40 else "warning" if level >= 30 else "info" if level >= 20 else "debug"
    getattr(log, method)("decoctl.c_controller_log", controller=instance.entry.name, message=text)
    return OK


def decoctl_py_host_error(host_data: Any) -> Any:
    return _current(host_data).error_text()


def decoctl_py_source_tokens(host_data: Any, out_tokens: Any, out_n: Any) -> int:
    instance = _current(host_data)
    if out_tokens == ffi.NULL or out_n == ffi.NULL:
        raise ConfigError("source_tokens(): out_tokens and out_n must not be NULL")
    out_tokens[0], out_n[0] = instance.source_pointer()
    return OK


# every status-returning host function (and the queries the mirror answers in C, for what it cannot)
_CALLBACKS: tuple[Callable[..., int], ...] = (
    decoctl_py_role,
    decoctl_py_forward,
    decoctl_py_forward_tree,
    decoctl_py_forward_features,
    decoctl_py_keep,
    decoctl_py_logits,
    decoctl_py_hidden_states,
    decoctl_py_rewind,
    decoctl_py_length,
    decoctl_py_tokens,
    decoctl_py_has_capability,
    decoctl_py_commit,
    decoctl_py_done,
    decoctl_py_is_eos,
    decoctl_py_max_length,
    decoctl_py_remaining,
    decoctl_py_process,
    decoctl_py_argmax,
    decoctl_py_uniform,
    decoctl_py_log_message,
    decoctl_py_source_tokens,
)


def _install() -> None:
    """Define every host function's extern "Python" callback. The table points at C functions of the bridge for
    length, remaining, done, max_length and logits (answered from the mirror); their callbacks here run only for
    what the mirror cannot answer (a refused call, no current logits), so that a refusal stays what it was."""
    global _ROWS_MIN_SIZE
    _ROWS_MIN_SIZE = field_end("decoctl_rows", "width")
    error = int(lib.DECOCTL_ERR_HOST)
    for callback in _CALLBACKS:
        ffi.def_extern(name=callback.__name__, error=error, onerror=_on_error)(callback)
    ffi.def_extern(name="decoctl_py_host_error", onerror=_on_error_pointer)(decoctl_py_host_error)
    # the rows and outputs of ABI 1.3: callbacks of their own module, on this one
    from decoctl.abi import _rows as abi_rows

    abi_rows.install()


if lib is not None:
    _install()
