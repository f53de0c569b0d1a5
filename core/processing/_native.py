"""Numeric helpers compiled into decoctl's C bridge (abi/build_bridge.py), for steps numpy needs several calls for.

The bridge (decoctl._abi) is built when decoctl is installed. Without it every helper here falls back to a numpy
twin that gives the same numbers, more slowly: the bridge is optional everywhere except for controllers loaded
from a shared library (loading one without it is a PluginError that says how to build the bridge).
"""

from __future__ import annotations

import numpy as np

__all__ = ["COMPILED", "top2"]

try:
    from decoctl._abi import ffi, lib
except ImportError:  # built at install time (setup.py); decoctl.abi reports it where the bridge is required
    ffi = lib = None
else:
    _OUT = ffi.new("float[2]")
#: whether the helpers run compiled (else numpy)
COMPILED = lib is not None


def top2(row: np.ndarray) -> tuple[int, float, float]:
    """(index, top, second) of a float32 row: numpy's argmax (the first maximum; the first NaN when there is one),
    its value and the largest other value (equal to top when the maximum is tied; -inf for a one-entry row; the
    largest value before the NaN when top is NaN)."""
    if row.dtype != np.float32 or not row.flags.c_contiguous or row.ndim != 1 or row.size == 0:
        raise ValueError("top2 takes a non-empty contiguous float32 row")
    if lib is None:
        return _top2_numpy(row)
    index = lib.decoctl_bridge_top2(ffi.from_buffer("float[]", row), row.size, _OUT)
    return int(index), float(_OUT[0]), float(_OUT[1])


def _top2_numpy(row: np.ndarray) -> tuple[int, float, float]:
    index = int(row.argmax())
    top = row[index]
    second = row[:index].max(initial=-np.inf)
    if not np.isnan(top):
        second = max(second, row[index + 1 :].max(initial=-np.inf))
    return index, float(top), float(second)
