"""One onnxruntime Run that feeds one token to each of rows 0..k-1 of a role's batched KV buffer.

Rows may have different lengths: GroupQueryAttention takes one past length per row (``seqlens_k``), either fed
directly (the loader removed the builder's mask subgraph, decoctl.model.graph._fed_lengths) or derived by that subgraph
from an attention mask whose row r holds length_r + 1 ones. Graphs with tree inputs get each row's position and a
bias row (zero, plus each sliding window counted from the row's own position). Multi-token forwards with a past
are not batched: GroupQueryAttention refuses them at batch > 1, so they run one row at a time through the row's own
Runner.
"""

from __future__ import annotations

import numpy as np

from decoctl.model._kv_rows import SharedKVRows
from decoctl.model._loader import LoadedModel
from decoctl.model._runner import RunOutputs, kernel_failure

__all__ = ["BatchStep"]


class BatchStep:
    """The bindings of a batched one-token step over a role's rows (see the module docstring)."""

    def __init__(self, model: LoadedModel, rows: SharedKVRows) -> None:
        spec, caps = model.spec, model.capabilities
        self.model = model
        self.rows = rows
        capacity, width = rows.capacity, rows.max_length + 1
        self._binding = model.session.io_binding()
        self._ids = np.zeros((capacity, 1), np.int64)
        self._positions = np.zeros((capacity, 1), np.int64)
        self._axes = np.zeros(caps.position_axes * capacity, np.int64)
        self._seqlens = np.zeros(capacity, np.int32)
        self._total = np.zeros((), np.int32)
        # [k, total] blocks laid out at the start of flat buffers: their shape changes every step
        self._mask = np.zeros(capacity * width, np.int64)
        self._bias = np.zeros(capacity * width, np.float32)
        self._windows = [np.zeros(capacity * width, np.float32) for _ in caps.windows]
        self._logits = np.zeros((capacity, spec.vocab_size), np.float32)
        self._hidden = (
            np.zeros((capacity, caps.hidden_size), np.float32) if caps.hidden_states and caps.hidden_size else None
        )
        self._aux = (
            np.zeros((capacity, caps.aux_hidden_size), np.float32)
            if caps.aux_hidden_states and caps.aux_hidden_size
            else None
        )
        # stacked LoRA slots (decoctl.model._adapters): the tables bound once, each row's table index per Run
        self._adapters = np.zeros(capacity, np.int64)
        if model.adapters is not None:
            model.adapters.bind(
                lambda name, dtype, shape, at: self._binding.bind_input(name, "cpu", 0, dtype, shape, at)
            )

    def run(
        self,
        tokens: np.ndarray,
        lengths: np.ndarray,
        positions: np.ndarray | None = None,
        adapters: np.ndarray | None = None,
    ) -> RunOutputs:
        """Feed ``tokens[r]`` (int64[k]) after ``lengths[r]`` cached positions of row r, for r in 0..k-1, in one Run.
        Every row's key and value land at its own length; the caller advances only the rows it stepped.
        ``positions`` (int64[k]): each row's rotary position where it is not its length (an M-RoPE row whose prompt
        held images: decoctl.model._qwen_vl), on every axis the graph's position_ids has. ``adapters`` (int64[k]):
        each row's LoRA table, on a model whose slots are stacked (0: the base model)."""
        spec, caps = self.model.spec, self.model.capabilities
        k = len(tokens)
        total = int(lengths.max()) + 1
        binding = self._binding
        self._ids[:k, 0] = tokens
        embedder = self.model.vision.embedder if self.model.vision is not None and caps.inputs_embeds else None
        if embedder is None:
            binding.bind_input(spec.input_ids_name, "cpu", 0, np.int64, [k, 1], self._ids.ctypes.data)
        else:  # a vision-language decoder: decode steps carry no image features
            self._embeds = np.ascontiguousarray(embedder.embed(self._ids[:k], None), np.float32)
            shape = [k, 1, embedder.hidden]
            binding.bind_input(caps.inputs_embeds, "cpu", 0, np.float32, shape, self._embeds.ctypes.data)
        if caps.fed_lengths is not None:
            self._seqlens[:k] = lengths
            self._total[()] = total
            binding.bind_input(caps.fed_lengths.seqlens_k, "cpu", 0, np.int32, [k], self._seqlens.ctypes.data)
            binding.bind_input(caps.fed_lengths.total_sequence_length, "cpu", 0, np.int32, [], self._total.ctypes.data)
        else:
            mask = self._mask[: k * total].reshape(k, total)
            np.less_equal(np.arange(total)[None, :], lengths[:, None], out=mask, casting="unsafe")
            binding.bind_input(spec.attention_mask_name, "cpu", 0, np.int64, [k, total], self._mask.ctypes.data)
        if caps.position_ids is not None:
            self._positions[:k, 0] = lengths if positions is None else positions
            if caps.position_axes == 1:
                binding.bind_input(caps.position_ids, "cpu", 0, np.int64, [k, 1], self._positions.ctypes.data)
            else:  # M-RoPE's int64[3, k, 1]: a decode step's text position on every axis
                axes = caps.position_axes
                self._axes[: axes * k].reshape(axes, k)[:] = self._positions[:k, 0]
                binding.bind_input(caps.position_ids, "cpu", 0, np.int64, [axes, k, 1], self._axes.ctypes.data)
        if caps.attention_bias is not None:
            self._bias[: k * total] = 0.0
            shape = [k, 1, 1, total]
            binding.bind_input(caps.attention_bias, "cpu", 0, np.float32, shape, self._bias.ctypes.data)
            for window, buffer in zip(caps.windows, self._windows, strict=True):
                # a query at position p sees keys at positions p - window + 1 .. p (decoctl.model.graph._window_bias)
                cut = (lengths - (window.window - 1))[:, None]
                block = buffer[: k * total].reshape(k, total)
                block[:] = np.where(np.arange(total)[None, :] < cut, np.float32(-np.inf), np.float32(0.0))
                binding.bind_input(window.name, "cpu", 0, np.float32, shape, buffer.ctypes.data)
        if self.model.adapters is not None:
            self._adapters[:k] = 0 if adapters is None else adapters
            binding.bind_input(self.model.adapters.index_input, "cpu", 0, np.int64, [k], self._adapters.ctypes.data)
        self.rows.bind(binding, k)
        vocab = spec.vocab_size
        binding.bind_output(spec.logits_name, "cpu", 0, np.float32, [k, 1, vocab], self._logits.ctypes.data)
        for name, rows in ((caps.hidden_states, self._hidden), (caps.aux_hidden_states, self._aux)):
            if name is not None and rows is not None:
                binding.bind_output(name, "cpu", 0, np.float32, [k, 1, rows.shape[1]], rows.ctypes.data)
        try:
            self.model.session.run_with_iobinding(binding)
        except Exception as exc:  # onnxruntime's own error types
            raise kernel_failure(self.model, exc, f"a batched one-token step over {k} rows") from exc
        hidden = None if self._hidden is None else self._hidden[:k]
        aux = None if self._aux is None else self._aux[:k]
        return RunOutputs(self._logits[:k], hidden, aux)
