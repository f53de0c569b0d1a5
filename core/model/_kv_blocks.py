"""A sequence's KV read out in blocks of positions and written back: what the prefix cache keeps
(decoctl.generation._prefix_cache).

A block is one array ``[2 * layers, kv_heads, size, head_size]`` (each layer's key then value, in the graph's element
type) holding positions ``start .. start + size - 1`` of every layer. Both cache kinds lay each tensor out
``[kv_heads, positions, head_size]``, so a block is the same for a shared past/present buffer and a concatenated
cache, and writing blocks 0..k-1 into an empty cache and setting its length gives the cache a prefill of those
tokens would have left.

Ring layers (sliding windows, decoctl.model._ring_cache) hold position p in row p only while no eviction happened:
up to the ring's capacity, and only on a ring that never spilled. :func:`linear_length` says how many positions of a
cache are laid out that way (all of them on a cache without rings), and :func:`reuse_limit` how many positions a
cache of a row can take back: the prefix cache stops at the window rather than keeping each block's ring state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from decoctl.model._kv_cache import ConcatKVCache, KVCache, SharedKVCache

__all__ = ["block_bytes", "linear_length", "read_blocks", "reuse_limit", "write_blocks"]


def block_bytes(num_layers: int, kv_heads: int, head_size: int, dtype: np.dtype[Any], size: int) -> int:
    """Bytes one block of ``size`` positions takes."""
    return 2 * num_layers * kv_heads * size * head_size * np.dtype(dtype).itemsize


def _tensors(cache: KVCache, length: int) -> list[np.ndarray]:
    """Every layer's key and value as [kv_heads, positions, head_size] views, valid for a cache of ``length``
    positions (a concatenated cache's flat buffer is laid out for one length)."""
    if isinstance(cache, SharedKVCache):
        return [buffer[0] for pair in cache._buffers for buffer in pair]
    if isinstance(cache, ConcatKVCache):
        return [cache._view(past, length) for past in cache._past]
    raise TypeError(f"no block layout for {type(cache).__name__}")


def _ring_capacity(cache: KVCache) -> int | None:
    """The lowest capacity of the cache's ring layers, or None without rings."""
    if cache.rings is None:
        return None
    return min(group.capacity for group in cache.rings.groups)


def linear_length(cache: KVCache) -> int:
    """How many of the cache's positions p sit at row p in every layer (readable as blocks)."""
    capacity = _ring_capacity(cache)
    if capacity is None:
        return cache.length
    assert cache.rings is not None
    if any(g.spill_hi or g.rows_from for g in cache.rings.groups):
        return 0  # a ring that evicted once lays its rows out from the oldest kept position, not from 0
    return min(cache.length, capacity)


def reuse_limit(cache: KVCache) -> int:
    """How many positions ``write_blocks`` may give this (empty) cache: its room, and a ring layer's capacity."""
    capacity = _ring_capacity(cache)
    room = cache.max_length
    return room if capacity is None else min(room, capacity)


def read_blocks(cache: KVCache, start: int, size: int, count: int) -> list[np.ndarray]:
    """``count`` blocks of ``size`` positions from position ``start`` (copies), each
    ``[2 * layers, kv_heads, size, head_size]``; every position must be below :func:`linear_length`."""
    end = start + size * count
    if end > linear_length(cache):
        raise ValueError(f"positions {start}..{end - 1} are not all laid out linearly in this cache")
    tensors = _tensors(cache, cache.length)
    return [np.stack([t[:, first : first + size] for t in tensors]) for first in range(start, end, size)]


def write_blocks(cache: KVCache, blocks: list[np.ndarray], size: int) -> None:
    """An empty cache takes ``blocks`` (positions 0 .. size * len(blocks) - 1) and that length, as if those tokens had
    been prefilled into it."""
    length = size * len(blocks)
    if cache.length:
        raise ValueError(f"write_blocks needs an empty cache, not one holding {cache.length} positions")
    if length > reuse_limit(cache):
        raise ValueError(f"{length} positions do not fit this cache's {reuse_limit(cache)} reusable ones")
    tensors = _tensors(cache, length)
    for index, block in enumerate(blocks):
        first = index * size
        for tensor, part in zip(tensors, block, strict=True):
            tensor[:, first : first + size] = part
    if cache.rings is not None:
        cache.rings.restore([(0, 0, 0)] * len(cache.rings.groups))
    cache.length = length
