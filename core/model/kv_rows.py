"""Several rows of one role in one batched KV buffer (GroupQueryAttention's shared past/present layout).

Each key and value tensor is one array ``[capacity, kv_heads, max_length + 1, head_size]``. Row r's slice
``[r:r+1]`` is C-contiguous, so it is a SharedKVCache of its own: everything a single sequence does (multi-token
forwards, trees, keep, rewind) runs on one row with a batch of one. A batched one-token step binds rows 0..k-1 at
once, each with its own past length (GroupQueryAttention's ``seqlens_k``). The extra position at the end is a
scratch slot: a step feeds every row in 0..k-1, and a row that is not stepped writes its (ignored) key and value at
its own length, which for a full row would otherwise fall past the buffer.

fork copies one row's valid prefix into another; reorder gathers whole rows (beam search); neither recomputes
anything.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

from decoctl.model.kv_cache import SharedKVCache
from decoctl.model.spec import ModelSpec

__all__ = ["SharedKVRows", "available_memory"]


def available_memory() -> int | None:
    """Bytes of memory the system can give without swapping (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class SharedKVRows:
    """The batched KV buffers of ``capacity`` rows of one role, and a SharedKVCache per row over its slice."""

    @staticmethod
    def row_bytes(spec: ModelSpec, dtype: np.dtype[Any], max_length: int) -> int:
        """Bytes one row of ``max_length`` positions (and the scratch slot) takes over every layer's key and value."""
        return 2 * spec.num_layers * spec.num_kv_heads * (max_length + 1) * spec.head_size * np.dtype(dtype).itemsize

    def __init__(self, spec: ModelSpec, dtype: np.dtype[Any], max_length: int, capacity: int) -> None:
        self.spec = spec
        self.dtype = dtype
        self.max_length = max_length
        self.capacity = capacity
        shape = (capacity, spec.num_kv_heads, max_length + 1, spec.head_size)
        self._buffers = [(np.zeros(shape, dtype), np.zeros(shape, dtype)) for _ in range(spec.num_layers)]
        self.caches = [
            SharedKVCache(spec, dtype, max_length, [(k[r : r + 1], v[r : r + 1]) for k, v in self._buffers])
            for r in range(capacity)
        ]

    def copy_row(self, source: int, destination: int) -> None:
        """Row ``destination`` becomes a copy of row ``source``'s valid prefix (fork)."""
        length = self.caches[source].length
        for pair in self._buffers:
            for buffer in pair:
                buffer[destination, :, :length] = buffer[source, :, :length]
        self.caches[destination].length = length

    def gather_rows(self, parents: np.ndarray) -> None:
        """Rows 0..k-1 become copies of rows ``parents`` (int64[k]) as they were before the call (reorder)."""
        k = len(parents)
        lengths = [self.caches[int(p)].length for p in parents]
        used = max(lengths, default=0)
        if np.array_equal(parents, np.arange(k)):
            return
        for pair in self._buffers:
            for buffer in pair:
                buffer[:k, :, :used] = buffer[parents, :, :used]
        for row, length in enumerate(lengths):
            self.caches[row].length = length

    def bind(self, binding: ort.IOBinding, rows: int) -> None:
        """Bind past and present of rows 0..rows-1 (one buffer: GroupQueryAttention writes in place)."""
        shape = [rows, self.spec.num_kv_heads, self.max_length + 1, self.spec.head_size]
        for layer, pair in enumerate(self._buffers):
            for past, present, buffer in zip(
                self.spec.past_names(layer), self.spec.present_names(layer), pair, strict=True
            ):
                pointer = buffer.ctypes.data
                binding.bind_input(past, "cpu", 0, self.dtype, shape, pointer)
                binding.bind_output(present, "cpu", 0, self.dtype, shape, pointer)
