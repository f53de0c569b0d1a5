"""Preallocated KV caches bound to a graph through IOBinding.

Two strategies, picked from the model's config:
- SharedKVCache: one buffer per layer and key/value holds every position; past and present are bound to the
  same memory (GroupQueryAttention with past_present_share_buffer). A step writes only the new positions,
  rewind is a length change.
- ConcatKVCache: graphs whose present is past plus the new positions (Optimum, plain attention). Two
  preallocated buffers per tensor take turns as past and present, so a step allocates nothing and the only
  copy is the one onnxruntime makes while concatenating; a rewind re-lays the kept prefix once.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import onnxruntime as ort

from decoctl.errors import ModelLoadError
from decoctl.model.spec import ModelSpec

__all__ = ["ConcatKVCache", "KVCache", "SharedKVCache", "make_kv_cache"]

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bfloat16)": None}


def kv_dtype(session: ort.InferenceSession, spec: ModelSpec) -> np.dtype[Any]:
    name = spec.past_names(0)[0]
    ort_type = next(i.type for i in session.get_inputs() if i.name == name)
    dtype = _ORT_TYPES.get(ort_type)
    if dtype is None:
        raise ModelLoadError(
            f"{spec.onnx_file} keeps its KV cache as {ort_type}, which decoctl does not bind: export with "
            "float32 or float16 KV"
        )
    return np.dtype(dtype)


class KVCache(abc.ABC):
    """The past/present bindings of one sequence. ``length`` positions are valid."""

    def __init__(self, spec: ModelSpec, dtype: np.dtype[Any], max_length: int) -> None:
        self.spec = spec
        self.dtype = dtype
        self.max_length = max_length
        self.length = 0
        self._row = spec.num_kv_heads * spec.head_size

    @abc.abstractmethod
    def bind(self, binding: ort.IOBinding, n: int) -> None:
        """Bind past (``length`` positions) and present (``length + n``) before a run over n new tokens."""

    @abc.abstractmethod
    def advance(self, n: int) -> None:
        """The run succeeded: n more positions are valid."""

    @abc.abstractmethod
    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions."""

    @abc.abstractmethod
    def gather(self, positions: np.ndarray, start: int) -> None:
        """Move the rows at ``positions`` (int64[k], all >= start) to start..start+k-1; length = start+k."""


class SharedKVCache(KVCache):
    """past == present: [1, kv_heads, max_length, head_size] per tensor, bound once. ``buffers`` (one
    (key, value) pair per layer, C-contiguous, that shape): memory owned by someone else, such as one row of a
    role's batched buffers (decoctl.model.kv_rows); None allocates its own."""

    def __init__(
        self,
        spec: ModelSpec,
        dtype: np.dtype[Any],
        max_length: int,
        buffers: list[tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        super().__init__(spec, dtype, max_length)
        shape = (1, spec.num_kv_heads, max_length, spec.head_size)
        if buffers is None:
            buffers = [(np.zeros(shape, dtype), np.zeros(shape, dtype)) for _ in range(spec.num_layers)]
        self._buffers = buffers
        self._bound: set[int] = set()

    def bind(self, binding: ort.IOBinding, n: int) -> None:
        if id(binding) in self._bound:
            return
        shape = list(self._buffers[0][0].shape)
        for layer, pair in enumerate(self._buffers):
            for past_name, present_name, buffer in zip(
                self.spec.past_names(layer), self.spec.present_names(layer), pair, strict=True
            ):
                pointer = buffer.ctypes.data
                binding.bind_input(past_name, "cpu", 0, self.dtype, shape, pointer)
                binding.bind_output(present_name, "cpu", 0, self.dtype, shape, pointer)
        self._bound.add(id(binding))

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, length: int) -> None:
        self.length = length

    def gather(self, positions: np.ndarray, start: int) -> None:
        end = start + len(positions)
        for pair in self._buffers:
            for buffer in pair:
                buffer[:, :, start:end, :] = buffer[:, :, positions, :]
        self.length = end


class ConcatKVCache(KVCache):
    """present = concat(past, new): two flat buffers per tensor alternate as past and present."""

    def __init__(self, spec: ModelSpec, dtype: np.dtype[Any], max_length: int) -> None:
        super().__init__(spec, dtype, max_length)
        size = self._row * max_length
        self._past = [np.zeros(size, dtype) for _ in range(2 * spec.num_layers)]
        self._present = [np.zeros(size, dtype) for _ in range(2 * spec.num_layers)]
        self._names = [
            (past, present)
            for layer in range(spec.num_layers)
            for past, present in zip(spec.past_names(layer), spec.present_names(layer), strict=True)
        ]

    def _view(self, flat: np.ndarray, length: int) -> np.ndarray:
        heads, head = self.spec.num_kv_heads, self.spec.head_size
        return flat[: self._row * length].reshape(heads, length, head)

    def bind(self, binding: ort.IOBinding, n: int) -> None:
        heads, head = self.spec.num_kv_heads, self.spec.head_size
        past_shape = [1, heads, self.length, head]
        present_shape = [1, heads, self.length + n, head]
        for (past_name, present_name), past, present in zip(self._names, self._past, self._present, strict=True):
            binding.bind_input(past_name, "cpu", 0, self.dtype, past_shape, past.ctypes.data)
            binding.bind_output(present_name, "cpu", 0, self.dtype, present_shape, present.ctypes.data)

    def advance(self, n: int) -> None:
        self.length += n
        self._past, self._present = self._present, self._past

    def truncate(self, length: int) -> None:
        if length == self.length:
            return
        for index, past in enumerate(self._past):
            target = self._present[index]
            self._view(target, length)[:] = self._view(past, self.length)[:, :length, :]
        self._past, self._present = self._present, self._past
        self.length = length

    def gather(self, positions: np.ndarray, start: int) -> None:
        end = start + len(positions)
        for index, past in enumerate(self._past):
            source = self._view(past, self.length)
            target = self._view(self._present[index], end)
            target[:, :start, :] = source[:, :start, :]
            target[:, start:end, :] = source[:, positions, :]
        self._past, self._present = self._present, self._past
        self.length = end


def make_kv_cache(session: ort.InferenceSession, spec: ModelSpec, max_length: int) -> KVCache:
    dtype = kv_dtype(session, spec)
    if spec.share_buffer:
        return SharedKVCache(spec, dtype, max_length)
    return ConcatKVCache(spec, dtype, max_length)
