"""Whether this onnxruntime keeps the ring caches a graph asks for, found by running its kernel (no file can tell).

A GroupQueryAttention node with ``sliding_window_cache=1`` is bound a window-sized buffer and evicts as the window
moves (decoctl.model._ring_cache). An onnxruntime whose kernel predates the attribute ignores it, and one whose
eviction differs from the layout decoctl keeps gives other attention than the model's: either way the export would
run past its window with wrong tokens, or fail in the kernel. ``probe_rings`` runs one GroupQueryAttention node with
the ring layers' heads, head size, KV type and kernel window (at most PROBE_WINDOW) on random queries, keys and
values, past the window and through evictions, once over a window-sized ring and once over a full-length buffer
(which the kernel never evicts from), and refuses the export (ModelLoadError) where the outputs differ. The node is
written in protobuf's wire format (the onnx package is not needed) and runs in a session of its own: milliseconds,
once per process for each shape, where running the whole model past its window would cost a long prompt at every
load.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from decoctl.errors import ModelLoadError
from decoctl.logs import get_logger
from decoctl.model._kv_layout import Attention
from decoctl.model._ring_cache import RingLayer
from decoctl.model.graph import _protowire as pw

__all__ = ["PROBE_WINDOW", "probe_rings"]

log = get_logger(__name__)

#: the largest kernel window probed as it is: a larger one is probed at this size (how the kernel lays out and evicts
#: a ring does not depend on its size, and a probe at a window of 4,096 would cost seconds at every load)
PROBE_WINDOW = 128
#: single-token steps after the ring is full: each one evicts (the probe's ring keeps no slack)
STEPS = 3
#: outputs of the two runs may differ by summation order only
_TOLERANCE = 1e-3
#: ONNX element types: FLOAT, FLOAT16, INT32
_ELEMENT = {np.dtype(np.float32): 1, np.dtype(np.float16): 10}
_INT32 = 6


def probe_rings(
    onnx_file: object,
    rings: tuple[RingLayer, ...],
    attention: Mapping[int, Attention],
    head_size: int,
    dtype: np.dtype[Any],
) -> None:
    """Probe each distinct (heads, KV heads, head size, KV type, kernel window) of the ``rings`` (``attention``: the
    graph's GroupQueryAttention nodes by layer); raise ModelLoadError naming ``onnx_file`` where this onnxruntime's
    kernel does not keep a ring as the graph asks."""
    element = np.dtype(dtype) if np.dtype(dtype) in _ELEMENT else np.dtype(np.float32)  # bfloat16: float32's path
    shapes: dict[tuple[int, int, int, str, int], list[int]] = {}
    for ring in rings:
        node = attention.get(ring.layer)
        if node is None or node.num_heads is None or node.kv_num_heads is None:
            continue
        window = min(ring.kernel_window, PROBE_WINDOW)
        shapes.setdefault((node.num_heads, node.kv_num_heads, head_size, element.str, window), []).append(ring.layer)
    for (heads, kv_heads, size, kind, window), layers in shapes.items():
        failure = _kernel_failure(heads, kv_heads, size, kind, window)
        if failure is not None:
            raise ModelLoadError(
                f"{onnx_file}: layers {layers} keep window-sized ring caches (GroupQueryAttention's "
                f"sliding_window_cache=1), and this onnxruntime's kernel run past the window over such a cache "
                f"{failure}: onnxruntime {ort.__version__} does not keep the ring as the graph asks, so the model's "
                "tokens would be wrong past its window. Run it with the onnxruntime that onnxruntime-genai's builder "
                "targets, or export it without ring caches (the builder's --extra_options windowed_kv_cache=false: "
                "full-length caches, the same window)"
            )


@functools.lru_cache(maxsize=64)
def _kernel_failure(heads: int, kv_heads: int, head_size: int, kind: str, window: int) -> str | None:
    """What is wrong with the kernel's ring at this shape (None: nothing), probed once per process."""
    dtype = np.dtype(kind)
    length = window + STEPS
    session = ort.InferenceSession(_graph(heads, kv_heads, head_size, _ELEMENT[dtype], window), _options())
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, length, heads * head_size)).astype(dtype)
    k = rng.standard_normal((1, length, kv_heads * head_size)).astype(dtype)
    v = rng.standard_normal((1, length, kv_heads * head_size)).astype(dtype)
    try:
        got = ring_outputs(session, (q, k, v), window, window)
    except Exception as exc:  # onnxruntime's own error types: the kernel refused the window-sized buffer
        return f"fails ({type(exc).__name__}: {exc})"
    expected = ring_outputs(session, (q, k, v), window, length)
    worst = max(float(np.max(np.abs(a.astype(np.float32) - b))) for a, b in zip(got, expected, strict=True))
    scale = max(1.0, max(float(np.max(np.abs(b))) for b in expected))
    log.debug("decoctl.ring_probe", heads=heads, kv_heads=kv_heads, head_size=head_size, window=window, diff=worst)
    if not worst <= _TOLERANCE * scale:
        return f"gives other attention than over a full-length buffer (by up to {worst:.3g})"
    return None


def ring_outputs(
    session: ort.InferenceSession, qkv: tuple[np.ndarray, np.ndarray, np.ndarray], prompt: int, capacity: int
) -> list[np.ndarray]:
    """The attention of the last query of a ``prompt``-token run, then of each single-token step after it, over one
    past/present buffer of ``capacity`` positions (float32 copies)."""
    q, k, v = qkv
    kv_heads = session.get_inputs()[3].shape[1]
    cache = np.zeros((1, kv_heads, capacity, k.shape[2] // kv_heads), q.dtype)
    caches = (cache, cache.copy())
    outputs = []
    for start, end in [(0, prompt), *((t, t + 1) for t in range(prompt, q.shape[1]))]:
        binding = session.io_binding()
        for name, array in (("q", q[:, start:end]), ("k", k[:, start:end]), ("v", v[:, start:end])):
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        binding.bind_output("output", "cpu")  # first: copy_outputs_to_cpu()[0]
        binding.bind_cpu_input("seqlens_k", np.array([end - 1], np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(end, np.int32))
        for past, present, buffer in zip(
            ("past_key", "past_value"), ("present_key", "present_value"), caches, strict=True
        ):
            binding.bind_input(past, "cpu", 0, buffer.dtype.type, list(buffer.shape), buffer.ctypes.data)
            binding.bind_output(present, "cpu", 0, buffer.dtype.type, list(buffer.shape), buffer.ctypes.data)
        session.run_with_iobinding(binding)
        outputs.append(binding.copy_outputs_to_cpu()[0][0, -1].astype(np.float32))
    return outputs


def _options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    return options


def _graph(heads: int, kv_heads: int, head_size: int, element: int, window: int) -> bytes:
    """A ModelProto of one com.microsoft GroupQueryAttention node keeping a ring cache of kernel window
    ``window``, its inputs and outputs named as ``ring_outputs`` binds them."""
    attributes = {"num_heads": heads, "kv_num_heads": kv_heads, "local_window_size": window, "sliding_window_cache": 1}
    inputs = ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    outputs = ["output", "present_key", "present_value"]
    node = [
        *(pw.length_delimited(1, name.encode()) for name in inputs),
        *(pw.length_delimited(2, name.encode()) for name in outputs),
        pw.length_delimited(3, b"ring_probe"),
        pw.length_delimited(4, b"GroupQueryAttention"),
        pw.length_delimited(7, b"com.microsoft"),
        *(
            pw.length_delimited(5, [pw.length_delimited(1, key.encode()), pw.varint_field(3, value), _INT_ATTRIBUTE])
            for key, value in attributes.items()
        ),
    ]
    kv: list[int | str] = ["batch", kv_heads, "capacity", head_size]
    values = [
        _value(11, "q", element, ["batch", "sequence", heads * head_size]),
        _value(11, "k", element, ["batch", "sequence", kv_heads * head_size]),
        _value(11, "v", element, ["batch", "sequence", kv_heads * head_size]),
        _value(11, "past_key", element, kv),
        _value(11, "past_value", element, kv),
        _value(11, "seqlens_k", _INT32, ["batch"]),
        _value(11, "total_sequence_length", _INT32, []),
        _value(12, "output", element, ["batch", "sequence", heads * head_size]),
        _value(12, "present_key", element, kv),
        _value(12, "present_value", element, kv),
    ]
    graph = pw.length_delimited(7, [pw.length_delimited(1, node), pw.length_delimited(2, b"ring_probe"), *values])
    opsets = [
        pw.length_delimited(8, [pw.length_delimited(1, domain.encode()), pw.varint_field(2, version)])
        for domain, version in (("", 17), ("com.microsoft", 1))
    ]
    return b"".join([pw.varint_field(1, 8), *opsets, graph])


#: AttributeProto.type = INT
_INT_ATTRIBUTE = pw.varint_field(20, 2)


def _value(number: int, name: str, element: int, shape: Iterable[int | str]) -> bytes:
    """A graph input (11) or output (12): ValueInfoProto with a tensor type of ``element`` and ``shape``."""
    dims = [
        pw.length_delimited(1, pw.length_delimited(2, d.encode()) if isinstance(d, str) else pw.varint_field(1, d))
        for d in shape
    ]
    tensor = [pw.varint_field(1, element), pw.length_delimited(2, dims)]
    return pw.length_delimited(
        number, [pw.length_delimited(1, name.encode()), pw.length_delimited(2, [pw.length_delimited(1, tensor)])]
    )
