"""Preallocated KV caches bound to a graph through IOBinding.

Two strategies, picked from the model's config (and, within the first, ring caches for sliding-window layers):
- SharedKVCache: one buffer per layer and key/value holds every position; past and present are bound to the
  same memory (GroupQueryAttention with past_present_share_buffer). A step writes only the new positions,
  rewind is a length change. Layers whose GroupQueryAttention keeps a window-sized ring
  (``sliding_window_cache=1``) get a buffer of the window plus a slack instead, and their eviction, spill and
  rewinds are decoctl.model._ring_cache's.
- ConcatKVCache: graphs whose present is past plus the new positions (Optimum, plain attention). Two
  preallocated buffers per tensor take turns as past and present, so a step allocates nothing and the only
  copy is the one onnxruntime makes while concatenating; a rewind re-lays the kept prefix once.

Both hold KV in the graph's own element type (float32, float16, or bfloat16 kept as its raw bits, since numpy has
no bfloat16), and both lay it out [batch, kv_heads, positions, head_size]; the heads and head size are the
graph's (:func:`kv_shape`), not the config's.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import onnxruntime as ort

from decoctl.errors import ModelLoadError, SequenceError
from decoctl.model._ring_cache import RingLayer, RingLayers, ring_groups
from decoctl.model._spec import ModelSpec

__all__ = [
    "BFLOAT16_BITS",
    "ConcatKVCache",
    "KVCache",
    "SharedKVCache",
    "binding_type",
    "describe_layers",
    "dtype_name",
    "graph_dtype",
    "kv_shape",
    "make_kv_cache",
    "ring_buffers",
    "to_float32",
]

#: how the host holds a bfloat16 tensor: its raw bits (numpy has no bfloat16), named to IOBinding as ONNX's
#: BFLOAT16 element type
BFLOAT16_BITS = np.dtype(np.uint16)
_ONNX_BFLOAT16 = 16
_ORT_TYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(bfloat16)": BFLOAT16_BITS,
}


def graph_dtype(ort_type: str) -> np.dtype[Any] | None:
    """The host dtype of a floating tensor of onnxruntime type ``ort_type`` ("tensor(float16)"): float32, float16
    or :data:`BFLOAT16_BITS`; None for a type decoctl does not bind."""
    return _ORT_TYPES.get(ort_type)


def binding_type(dtype: np.dtype[Any]) -> Any:
    """What IOBinding takes for a host buffer of ``dtype``: the numpy type, or ONNX's element type number for
    bfloat16 bits."""
    return _ONNX_BFLOAT16 if dtype == BFLOAT16_BITS else dtype.type


def dtype_name(dtype: np.dtype[Any]) -> str:
    """The element type a host dtype stands for: "float32", "float16" or "bfloat16"."""
    return "bfloat16" if dtype == BFLOAT16_BITS else dtype.name


def to_float32(source: np.ndarray, out: np.ndarray) -> None:
    """Write ``source`` (float16, or bfloat16 bits) into ``out`` (float32, the same shape): bfloat16 is the top
    half of a float32, so its bits shifted up are that float32 exactly."""
    if source.dtype == BFLOAT16_BITS:
        np.left_shift(source, 16, out=out.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(out, source)


def kv_dtype(session: ort.InferenceSession, spec: ModelSpec) -> np.dtype[Any]:
    """The host dtype of the graph's KV inputs (see :func:`graph_dtype`)."""
    name = spec.past_names(0)[0]
    ort_type = next(i.type for i in session.get_inputs() if i.name == name)
    dtype = graph_dtype(ort_type)
    if dtype is None:
        raise ModelLoadError(
            f"{spec.onnx_file} keeps its KV cache as {ort_type}, which decoctl does not bind: export with "
            "float32, float16 or bfloat16 KV"
        )
    return dtype


def kv_shape(session: ort.InferenceSession, spec: ModelSpec) -> tuple[int, int]:
    """(KV heads, head size) from the shapes of the graph's past inputs, [batch, kv_heads, past, head_size]; the
    spec's (the config's) where the graph leaves them symbolic.

    The graph is what the cache binds to: Falcon's multi-query export has one KV head whatever config.json's
    ``num_kv_heads`` says. KV layouts other than [batch, kv_heads, past, head_size] are refused by name.
    """
    inputs = {i.name: i for i in session.get_inputs()}
    shapes = []
    for layer in range(spec.num_layers):
        for name in spec.past_names(layer):
            node = inputs.get(name)
            if node is None:
                _refuse_fused(spec, name, inputs)
                continue  # Capabilities.from_session names what is missing
            shapes.append((name, list(node.shape)))
    for name, shape in shapes:
        if len(shape) != 4:
            raise ModelLoadError(
                f"{spec.onnx_file} keeps its KV cache with the heads merged into the batch axis ({name} is "
                f"{shape}: BLOOM exported with transformers < 4.44 keeps the key as [batch*heads, head_size, past] and "
                "the value as [batch*heads, past, head_size]); decoctl binds [batch, kv_heads, past, head_size]: "
                "export the model again with optimum-onnx and transformers >= 4.44"
            )
        if isinstance(shape[2], int) and not isinstance(shape[3], int):
            raise ModelLoadError(
                f"{spec.onnx_file} keeps {name} transposed ({shape}: [batch, heads, head_size, past]); decoctl binds "
                "[batch, kv_heads, past, head_size]: export the model again with a current optimum-onnx"
            )
    heads = {s[1] for _, s in shapes if isinstance(s[1], int)}
    sizes = {s[3] for _, s in shapes if isinstance(s[3], int)}
    if len(heads) > 1 or len(sizes) > 1:
        raise ModelLoadError(
            f"{spec.onnx_file} has KV inputs of different shapes ({sorted({str(s) for _, s in shapes})}): decoctl "
            "binds one [kv_heads, head_size] for every layer's key and value, so this model is not supported"
        )
    return (heads.pop() if heads else spec.num_kv_heads), (sizes.pop() if sizes else spec.head_size)


def _refuse_fused(spec: ModelSpec, name: str, inputs: dict[str, Any]) -> None:
    """Raise where ``name`` (``past_key_values.N.key``) is missing because the graph keeps key and value in one
    tensor (``past_key_values.N.key_value``: GPTBigCode exported with transformers < 4.54)."""
    fused = f"{name.rpartition('.')[0]}.key_value"
    if fused in inputs:
        raise ModelLoadError(
            f"{spec.onnx_file} keeps each layer's key and value in one tensor ({fused} {inputs[fused].shape}, "
            "GPTBigCode's multi-query layout of transformers < 4.54); decoctl binds past_key_values.N.key and .value "
            "apart: export the model again with optimum-onnx and transformers >= 4.54"
        )


class KVCache(abc.ABC):
    """The past/present bindings of one sequence. ``length`` positions are valid."""

    def __init__(self, spec: ModelSpec, dtype: np.dtype[Any], max_length: int) -> None:
        self.spec = spec
        self.dtype = dtype
        self._type = binding_type(dtype)
        self.max_length = max_length
        self.length = 0
        self._row = spec.num_kv_heads * spec.head_size

    #: the ring-cache layers' bookkeeping (decoctl.model._ring_cache), None where the model keeps none
    rings: RingLayers | None = None

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of KV memory this cache holds (ring caches' spills included)."""

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


def ring_buffers(
    spec: ModelSpec, dtype: np.dtype[Any], rings: tuple[RingLayer, ...], max_length: int, rows: int = 1
) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Zeroed key/value buffers for every ring layer, [rows, kv_heads, capacity, head_size], and their spills,
    [rows, kv_heads, slack, head_size]."""
    heads, head = spec.num_kv_heads, spec.head_size
    tensors, spills = {}, {}
    for ring in rings:
        capacity = ring.capacity(max_length)
        tensors[ring.layer] = (
            np.zeros((rows, heads, capacity, head), dtype),
            np.zeros((rows, heads, capacity, head), dtype),
        )
        spills[ring.layer] = (
            np.zeros((rows, heads, ring.slack, head), dtype),
            np.zeros((rows, heads, ring.slack, head), dtype),
        )
    return tensors, spills


class SharedKVCache(KVCache):
    """past == present: [1, kv_heads, max_length, head_size] per tensor (a ring layer's: its capacity), bound
    once. ``buffers`` (one (key, value) pair per layer, C-contiguous, that shape): memory owned by someone else,
    such as one row of a role's batched buffers (decoctl.model._kv_rows); None allocates its own. ``rings``: the
    ring layers (their buffers among ``buffers``); ``spills``: their spills where ``buffers`` is given."""

    def __init__(
        self,
        spec: ModelSpec,
        dtype: np.dtype[Any],
        max_length: int,
        buffers: list[tuple[np.ndarray, np.ndarray]] | None = None,
        rings: tuple[RingLayer, ...] = (),
        spills: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        super().__init__(spec, dtype, max_length)
        shape = (1, spec.num_kv_heads, max_length, spec.head_size)
        if buffers is None:
            ring_tensors, spills = ring_buffers(spec, dtype, rings, max_length)
            buffers = [
                ring_tensors.get(layer) or (np.zeros(shape, dtype), np.zeros(shape, dtype))
                for layer in range(spec.num_layers)
            ]
        self._buffers = buffers
        self._bound: set[int] = set()
        self._full = [pair for layer, pair in enumerate(buffers) if layer not in {r.layer for r in rings}]
        if rings:
            assert spills is not None
            self.rings = ring_groups(rings, max_length, {r.layer: buffers[r.layer] for r in rings}, spills)

    @property
    def nbytes(self) -> int:
        spills = [] if self.rings is None else [s for g in self.rings.groups for s in g.spills]
        return sum(b.nbytes for pair in self._buffers for b in pair) + sum(s.nbytes for s in spills)

    def bind(self, binding: ort.IOBinding, n: int) -> None:
        if self.rings is not None:
            self.rings.before_run(self.length, n)
        if id(binding) in self._bound:
            return
        for layer, pair in enumerate(self._buffers):
            for past_name, present_name, buffer in zip(
                self.spec.past_names(layer), self.spec.present_names(layer), pair, strict=True
            ):
                pointer = buffer.ctypes.data
                shape = list(buffer.shape)
                binding.bind_input(past_name, "cpu", 0, self._type, shape, pointer)
                binding.bind_output(present_name, "cpu", 0, self._type, shape, pointer)
        self._bound.add(id(binding))

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, length: int) -> None:
        if self.rings is not None and length != self.length:
            self.rings.relayout(self.length, length)
        self.length = length

    def gather(self, positions: np.ndarray, start: int) -> None:
        end = start + len(positions)
        if self.rings is not None:
            self.rings.relayout(self.length, end, positions, start)
        for pair in self._full:
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

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in (*self._past, *self._present))

    @staticmethod
    def row_bytes(spec: ModelSpec, dtype: np.dtype[Any], max_length: int) -> int:
        """Bytes one cache of ``max_length`` positions takes: a past and a present buffer for every layer's key and
        value."""
        return 4 * spec.num_layers * spec.num_kv_heads * max_length * spec.head_size * np.dtype(dtype).itemsize

    def copy_from(self, other: ConcatKVCache) -> None:
        """Hold a copy of ``other``'s valid positions (``other`` unchanged): a row forked from another row of a
        concatenated-cache model, where every row keeps a cache of its own (decoctl.host.Rows)."""
        if other.length > self.max_length or other.dtype != self.dtype or other._row != self._row:
            raise SequenceError(
                f"a KV cache of {self.max_length} positions ({dtype_name(self.dtype)}, {self._row} per position) "
                f"cannot take a copy of one holding {other.length} ({dtype_name(other.dtype)}, {other._row}): copy "
                "between the rows of one model"
            )
        size = self._row * other.length
        for mine, theirs in zip(self._past, other._past, strict=True):
            mine[:size] = theirs[:size]
        self.length = other.length

    def _view(self, flat: np.ndarray, length: int) -> np.ndarray:
        heads, head = self.spec.num_kv_heads, self.spec.head_size
        return flat[: self._row * length].reshape(heads, length, head)

    def bind(self, binding: ort.IOBinding, n: int) -> None:
        heads, head = self.spec.num_kv_heads, self.spec.head_size
        past_shape = [1, heads, self.length, head]
        present_shape = [1, heads, self.length + n, head]
        for (past_name, present_name), past, present in zip(self._names, self._past, self._present, strict=True):
            binding.bind_input(past_name, "cpu", 0, self._type, past_shape, past.ctypes.data)
            binding.bind_output(present_name, "cpu", 0, self._type, present_shape, present.ctypes.data)

    def bind_present(self, binding: ort.IOBinding, n: int) -> None:
        """Bind only the present outputs (``length + n`` positions), for a graph that takes no past: an
        encoder-decoder model's first-pass decoder, which runs on an empty cache."""
        heads, head = self.spec.num_kv_heads, self.spec.head_size
        present_shape = [1, heads, self.length + n, head]
        for (_, present_name), present in zip(self._names, self._present, strict=True):
            binding.bind_output(present_name, "cpu", 0, self._type, present_shape, present.ctypes.data)

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


def describe_layers(spec: ModelSpec, rings: tuple[RingLayer, ...], max_length: int) -> list[str]:
    """One line per cache kind: which layers keep it and its size in positions (``decoctl models info``)."""
    ringed = {r.layer for r in rings}
    full = [layer for layer in range(spec.num_layers) if layer not in ringed]
    kind = "shared past/present buffer" if spec.share_buffer else "concatenated past/present (two buffers)"
    lines = [f"{_spans(full)}: {kind}, {max_length} positions"] if full else []
    by_shape: dict[tuple[int, int, int, int], list[int]] = {}
    for ring in rings:
        by_shape.setdefault((ring.window, ring.kernel_window, ring.capacity(max_length), ring.slack), []).append(
            ring.layer
        )
    for (window, kernel, capacity, slack), layers in sorted(by_shape.items()):
        widened = f", kernel window {kernel} (trees of up to {kernel - window + 1} tokens)" if kernel > window else ""
        lines.append(
            f"{_spans(layers)}: ring cache, window {window}{widened}, {capacity} positions and a spill of "
            f"{slack} (rewinds of up to {slack + 1} tokens exact)"
        )
    return lines


def _spans(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> "layers 0-2, 5"; [3] -> "layer 3"."""
    spans: list[list[int]] = []
    for layer in sorted(layers):
        if spans and layer == spans[-1][-1] + 1:
            spans[-1].append(layer)
        else:
            spans.append([layer])
    named = ", ".join(f"{s[0]}-{s[-1]}" if len(s) > 1 else str(s[0]) for s in spans)
    return f"layer {named}" if len(layers) == 1 else f"layers {named}"


def make_kv_cache(
    session: ort.InferenceSession, spec: ModelSpec, max_length: int, rings: tuple[RingLayer, ...] = ()
) -> KVCache:
    dtype = kv_dtype(session, spec)
    if spec.share_buffer:
        return SharedKVCache(spec, dtype, max_length, rings=rings)
    if rings:
        raise ModelLoadError(
            f"{spec.onnx_file} keeps ring caches on layers {[r.layer for r in rings]} but its config turns "
            "past_present_share_buffer off: a ring cache is written in place; export it again with the shared buffer"
        )
    return ConcatKVCache(spec, dtype, max_length)
