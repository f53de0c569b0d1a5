"""Several rows of one role in one batched KV buffer (GroupQueryAttention's shared past/present layout).

Each key and value tensor is one array ``[capacity, kv_heads, max_length + 1, head_size]``. Row r's slice
``[r:r+1]`` is C-contiguous, so it is a SharedKVCache of its own: everything a single sequence does (multi-token
forwards, trees, keep, rewind) runs on one row with a batch of one. A batched one-token step binds rows 0..k-1 at
once, each with its own past length (GroupQueryAttention's ``seqlens_k``). The extra position at the end is a
scratch slot: a step feeds every row in 0..k-1, and a row that is not stepped writes its (ignored) key and value at
its own length, which for a full row would otherwise fall past the buffer.

fork copies one row's valid prefix into another; reorder gathers whole rows (beam search); neither recomputes
anything. Ring-cache layers (decoctl.model._ring_cache) keep [capacity, kv_heads, ring capacity, head_size] and a
spill per row; fork and reorder copy a row's whole ring, spill and bookkeeping. A batched step feeds every row
below the highest stepped one, so a row it passes over may see the kernel evict on its ring: its spill is filled
before the Run and its layout put back after (``before_step`` / ``after_step``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

from decoctl.model._kv_cache import SharedKVCache, ring_buffers
from decoctl.model._ring_cache import RingLayer
from decoctl.model._spec import ModelSpec

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
    def row_bytes(spec: ModelSpec, dtype: np.dtype[Any], max_length: int, rings: tuple[RingLayer, ...] = ()) -> int:
        """Bytes one row of ``max_length`` positions (and the scratch slot) takes over every layer's key and value
        (a ring layer's: its capacity and spill)."""
        positions = (spec.num_layers - len(rings)) * (max_length + 1)
        positions += sum(r.capacity(max_length) + r.slack for r in rings)
        return 2 * spec.num_kv_heads * positions * spec.head_size * np.dtype(dtype).itemsize

    def __init__(
        self,
        spec: ModelSpec,
        dtype: np.dtype[Any],
        max_length: int,
        capacity: int,
        rings: tuple[RingLayer, ...] = (),
    ) -> None:
        self.spec = spec
        self.dtype = dtype
        self.max_length = max_length
        self.capacity = capacity
        shape = (capacity, spec.num_kv_heads, max_length + 1, spec.head_size)
        ring_tensors, self._spills = ring_buffers(spec, dtype, rings, max_length, capacity)
        self._rings = {r.layer for r in rings}
        self._buffers = [
            ring_tensors.get(layer) or (np.zeros(shape, dtype), np.zeros(shape, dtype))
            for layer in range(spec.num_layers)
        ]
        self.caches = [
            SharedKVCache(
                spec,
                dtype,
                max_length,
                [(k[r : r + 1], v[r : r + 1]) for k, v in self._buffers],
                rings,
                {layer: (k[r : r + 1], v[r : r + 1]) for layer, (k, v) in self._spills.items()},
            )
            for r in range(capacity)
        ]

    def _whole(self) -> list[np.ndarray]:
        """The ring layers' buffers and spills: copied whole between rows (their layout is the kernel's)."""
        return [b for layer in self._rings for b in (*self._buffers[layer], *self._spills[layer])]

    def _prefixed(self) -> list[np.ndarray]:
        return [b for layer, pair in enumerate(self._buffers) if layer not in self._rings for b in pair]

    def copy_row(self, source: int, destination: int) -> None:
        """Row ``destination`` becomes a copy of row ``source``'s valid prefix (fork)."""
        length = self.caches[source].length
        for buffer in self._prefixed():
            buffer[destination, :, :length] = buffer[source, :, :length]
        for buffer in self._whole():
            buffer[destination] = buffer[source]
        self._copy_state(self.caches[source], self.caches[destination])

    def gather_rows(self, parents: np.ndarray) -> None:
        """Rows 0..k-1 become copies of rows ``parents`` (int64[k]) as they were before the call (reorder)."""
        k = len(parents)
        lengths = [self.caches[int(p)].length for p in parents]
        used = max(lengths, default=0)
        if np.array_equal(parents, np.arange(k)):
            return
        for buffer in self._prefixed():
            buffer[:k, :, :used] = buffer[parents, :, :used]
        for buffer in self._whole():
            buffer[:k] = buffer[parents]
        states = [self._state(self.caches[int(p)]) for p in parents]
        for row, (length, state) in enumerate(zip(lengths, states, strict=True)):
            self.caches[row].length = length
            rings = self.caches[row].rings
            if rings is not None and state is not None:
                rings.restore(state)

    @staticmethod
    def _state(cache: SharedKVCache) -> list[tuple[int, int, int]] | None:
        return None if cache.rings is None else cache.rings.state()

    @staticmethod
    def _copy_state(source: SharedKVCache, destination: SharedKVCache) -> None:
        destination.length = source.length
        if source.rings is not None and destination.rings is not None:
            destination.rings.restore(source.rings.state())

    def before_step(self, rows: int) -> None:
        """A batched step is about to feed one token to each of rows 0..rows-1: fill their rings' spills."""
        if self._rings:
            for cache in self.caches[:rows]:
                assert cache.rings is not None
                cache.rings.before_run(cache.length, 1)

    def after_step(self, rows: int, stepped: set[int]) -> None:
        """After a batched step: the rows it fed but did not step get their ring layout back (their length is
        unchanged; the kernel's layout moved one token on)."""
        if self._rings:
            for row in range(rows):
                cache = self.caches[row]
                if row not in stepped and cache.rings is not None:
                    cache.rings.relayout(cache.length + 1, cache.length)

    def bind(self, binding: ort.IOBinding, rows: int) -> None:
        """Bind past and present of rows 0..rows-1 (one buffer: GroupQueryAttention writes in place)."""
        for layer, pair in enumerate(self._buffers):
            for past, present, buffer in zip(
                self.spec.past_names(layer), self.spec.present_names(layer), pair, strict=True
            ):
                shape = [rows, *buffer.shape[1:]]
                pointer = buffer.ctypes.data
                binding.bind_input(past, "cpu", 0, self.dtype, shape, pointer)
                binding.bind_output(present, "cpu", 0, self.dtype, shape, pointer)
