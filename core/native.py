"""Numeric helpers compiled into decoctl's C bridge (abi/build_bridge.py), for steps numpy needs several calls for."""

from __future__ import annotations

import numpy as np

from decoctl.errors import AbiError

__all__ = ["top2"]

try:
    from decoctl._abi import ffi, lib
except ImportError as _exc:  # compiled at install time (setup.py); abi.py reports the same way
    ffi = lib = None
    _MISSING: ImportError | None = _exc
else:
    _MISSING = None
    _OUT = ffi.new("float[2]")


def top2(row: np.ndarray) -> tuple[int, float, float]:
    """(index, top, second) of a float32 row: numpy's argmax (the first maximum; the first NaN when there is one),
    its value and the largest other value (equal to top when the maximum is tied; -inf for a one-entry row)."""
    if _MISSING is not None:
        raise AbiError(
            f"decoctl's compiled bridge decoctl._abi is missing ({_MISSING}): reinstall decoctl (pip install -e .) "
            "with a C compiler and cffi available"
        )
    if row.dtype != np.float32 or not row.flags.c_contiguous or row.ndim != 1 or row.size == 0:
        raise ValueError("top2 takes a non-empty contiguous float32 row")
    index = lib.decoctl_bridge_top2(ffi.from_buffer("float[]", row), row.size, _OUT)
    return int(index), float(_OUT[0]), float(_OUT[1])
