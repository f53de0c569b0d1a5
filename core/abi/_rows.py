"""The host table's functions over rows and outputs (ABI 1.3): the ``extern "Python"`` callbacks behind fork,
reorder, release, step_rows, the per-row forward/logits/rewind/length/tokens, and new_output, commit_to,
output_done, score, rank_outputs, process_outputs.

They follow decoctl.abi._host's rules: the instance whose create/step/reset runs on this thread answers, a Python
exception becomes a negative status (kept and raised again when the C call returns), arrays cross zero-copy and
stay alive for C as long as the header says. Row 0 of a role is the role's own Sequence, so the per-row functions
with row 0 are the 1.0 ones; other rows come from ``host.rows(name)`` (decoctl.host.Rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from decoctl.abi._host import (
    OK,
    ControllerInstance,
    _chain_input,
    _check_rows,
    _current,
    _fill_rows,
    _ids,
    _on_error,
)
from decoctl.abi._library import ffi, lib
from decoctl.errors import ConfigError, SequenceError

if TYPE_CHECKING:
    from decoctl.host import Rows, Sequence

__all__ = ["install"]


def _row_ids(pointer: Any, n: int, what: str) -> list[int]:
    """A copy of caller-owned int32 ids (rows, parents, outputs)."""
    if n < 0:
        raise ConfigError(f"{what}: n is {n}; give a count >= 0")
    if n == 0:
        return []
    if pointer == ffi.NULL:
        raise ConfigError(f"{what}: the id pointer is NULL with n = {n}")
    return np.frombuffer(ffi.buffer(pointer, n * 4), dtype=np.int32).tolist()


def _rows(instance: ControllerInstance, role: Any) -> Rows:
    return instance._host().rows(instance.role_name(role))


def _row(instance: ControllerInstance, role: Any, row: int) -> Sequence:
    """Row ``row`` of ``role``: row 0 is the role's own sequence (also in a host without rows)."""
    sequence = instance.sequence(role)
    return sequence if row == 0 else _rows(instance, role)[int(row)]


def _changed(instance: ControllerInstance, role: Any, *rows: Sequence) -> None:
    """After a primitive that may have changed ``rows`` of ``role``: forget C's views of their old buffers, end
    the role's step_rows output and mirror row 0. Called on failure too, as ControllerInstance.changed is."""
    for sequence in rows:
        instance.forget_views(sequence)
    instance.changed(role, instance.sequence(role))


# -- rows -----------------------------------------------------------------------------------------------------


def decoctl_py_fork(host_data: Any, role: Any, row: int, out_row: Any) -> int:
    instance = _current(host_data)
    rows = _rows(instance, role)
    if out_row == ffi.NULL:
        raise ConfigError("fork(): out_row must not be NULL")
    out_row[0] = rows.fork(int(row))
    return OK


def decoctl_py_reorder(host_data: Any, role: Any, parents: Any, n: int) -> int:
    instance = _current(host_data)
    rows = _rows(instance, role)
    order = _row_ids(parents, n, "reorder()")
    if not order:
        return OK
    try:
        rows.reorder(order)
    finally:
        _changed(instance, role, *rows)
    return OK


def decoctl_py_release(host_data: Any, role: Any, row: int) -> int:
    instance = _current(host_data)
    rows = _rows(instance, role)
    sequence = rows[int(row)]
    rows.release(int(row))
    _changed(instance, role, sequence)
    return OK


def decoctl_py_step_rows(host_data: Any, role: Any, rows_in: Any, tokens: Any, n: int, out_rows: Any) -> int:
    instance = _current(host_data)
    rows = _rows(instance, role)
    if n < 1 or rows_in == ffi.NULL or tokens == ffi.NULL:
        raise ConfigError(f"step_rows(): rows and tokens must not be NULL and n ({n}) at least 1")
    chosen = _row_ids(rows_in, n, "step_rows()")
    fed = _ids(tokens, n, "step_rows()")
    try:
        logits = rows.step(fed, chosen)
    finally:
        _changed(instance, role, *rows)
    if out_rows != ffi.NULL:
        _check_rows(out_rows)
        out_rows.data = instance.hold_step_output(role, logits, debug=rows[chosen[0]]._debug)
        out_rows.n, out_rows.width = logits.shape
    return OK


def decoctl_py_row_forward(host_data: Any, role: Any, row: int, tokens: Any, n: int, out_rows: Any) -> int:
    instance = _current(host_data)
    sequence = _row(instance, role, row)
    ids = _ids(tokens, n, "row_forward()")
    try:
        logits = sequence.forward(ids)
    finally:
        _changed(instance, role, sequence)
    _fill_rows(out_rows, instance, sequence, "logits", logits)
    return OK


def decoctl_py_row_logits(host_data: Any, role: Any, row: int, out_rows: Any) -> int:
    instance = _current(host_data)
    sequence = _row(instance, role, row)
    if out_rows == ffi.NULL:
        raise ConfigError("row_logits(): out_rows must not be NULL")
    _fill_rows(out_rows, instance, sequence, "logits", sequence.logits())
    return OK


def decoctl_py_row_rewind(host_data: Any, role: Any, row: int, length: int) -> int:
    instance = _current(host_data)
    sequence = _row(instance, role, row)
    try:
        sequence.rewind(int(length))
    finally:
        _changed(instance, role, sequence)
    return OK


def decoctl_py_row_length(host_data: Any, role: Any, row: int) -> int:
    return _row(_current(host_data), role, row).length


def decoctl_py_row_tokens(host_data: Any, role: Any, row: int, out_tokens: Any, out_n: Any) -> int:
    instance = _current(host_data)
    sequence = _row(instance, role, row)
    if out_tokens == ffi.NULL or out_n == ffi.NULL:
        raise ConfigError("row_tokens(): out_tokens and out_n must not be NULL")
    view = sequence.tokens
    out_tokens[0] = instance.pointer_to(sequence, "tokens", view) if len(view) else ffi.NULL
    out_n[0] = len(view)
    return OK


# -- outputs ----------------------------------------------------------------------------------------------------


def decoctl_py_new_output(host_data: Any, out_output: Any) -> int:
    host = _current(host_data)._host()
    if out_output == ffi.NULL:
        raise ConfigError("new_output(): out_output must not be NULL")
    out_output[0] = host.new_output()
    return OK


def decoctl_py_commit_to(host_data: Any, output: int, tokens: Any, n: int, out_taken: Any) -> int:
    instance = _current(host_data)
    host = instance._host()
    ids = _ids(tokens, n, "commit_to()")
    host.output_done(int(output))  # SequenceError for an output that does not exist
    vocab = host.target.vocab_size
    bad = [int(t) for t in ids if not 0 <= t < vocab]
    if bad:
        raise SequenceError(f"commit_to() got token ids outside [0, {vocab}): {bad[:5]}; nothing was committed")
    try:
        taken = host.commit(ids, output=int(output)) if n else 0
    finally:
        instance.mirror_generation()
    if out_taken != ffi.NULL:
        out_taken[0] = taken
    return OK


def decoctl_py_output_done(host_data: Any, output: int) -> int:
    return int(_current(host_data)._host().output_done(int(output)))


def decoctl_py_score(host_data: Any, output: int, value: float) -> int:
    _current(host_data)._host().score(int(output), float(value))
    return OK


def decoctl_py_rank_outputs(host_data: Any, order: Any, n: int) -> int:
    instance = _current(host_data)
    host = instance._host()
    picked = _row_ids(order, n, "rank_outputs()")
    try:
        host.rank_outputs(picked)
    finally:
        instance.mirror_generation()
    return OK


def decoctl_py_process_outputs(host_data: Any, rows: Any, n: int, width: int, outputs: Any, out_rows: Any) -> int:
    instance = _current(host_data)
    host = instance._host()
    given, _ = _chain_input(host, rows, n, width, ffi.NULL, 0, out_rows, "process_outputs", "out_rows")
    followed = _row_ids(outputs, n, "process_outputs()")
    for output in followed:
        host.output_done(output)  # SequenceError for an output that does not exist, processors or not
    result = host.process(given, outputs=followed)
    if result is given:  # no processor configured: the caller's rows, no copy
        _check_rows(out_rows)
        out_rows.data = rows
        out_rows.n, out_rows.width = n, width
        return OK
    _fill_rows(out_rows, instance, None, "processed", result)
    return OK


_CALLBACKS: tuple[Callable[..., int], ...] = (
    decoctl_py_fork,
    decoctl_py_reorder,
    decoctl_py_release,
    decoctl_py_step_rows,
    decoctl_py_row_forward,
    decoctl_py_row_logits,
    decoctl_py_row_rewind,
    decoctl_py_row_length,
    decoctl_py_row_tokens,
    decoctl_py_new_output,
    decoctl_py_commit_to,
    decoctl_py_output_done,
    decoctl_py_score,
    decoctl_py_rank_outputs,
    decoctl_py_process_outputs,
)


def install() -> None:
    """Define the extern "Python" callbacks of ABI 1.3 (decoctl.abi._host's install calls this)."""
    error = int(lib.DECOCTL_ERR_HOST)
    for callback in _CALLBACKS:
        ffi.def_extern(name=callback.__name__, error=error, onerror=_on_error)(callback)
