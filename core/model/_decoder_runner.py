"""The runner of an encoder-decoder model (T5, BART, Marian): the encoder once per source, then a decoder that
forwards, rewinds and keeps like any decoder-only model's.

``encode(source)`` runs the encoder over the source's tokens into a buffer of this runner and empties the decoder's
cache. The first forward after it runs the first-pass decoder (Optimum's decoder_model.onnx, or the merged
decoder's no-past branch): it reads the encoder's output and writes the cross-attention KV (its
``present.N.encoder.*`` outputs) straight into this runner's cross buffers, besides the first self-attention KV.
Every other forward runs the stepping decoder (decoder_with_past_model.onnx, or the merged decoder's with-past
branch) with those buffers bound as its ``past_key_values.N.encoder.*`` inputs: bound once per source, never
copied. The self-attention KV is the ConcatKVCache every Optimum model has, so rewind and keep work unchanged.

The cross-attention KV depends on the source alone, so it outlives every rewind: a forward from an empty cache
after a rewind to 0 (speculative decoding's verifier and draft do that at the start of a generation) runs the
stepping decoder with an empty self-attention past and the bound cross-attention KV, which is the first pass's
computation without the cross-attention projections (the same logits: the with-past graph concatenates its new
keys and values to an empty past). The encoder and the cross-attention projections run once per source
(``encoder_runs``, ``cross_passes`` count them).

Several rows of one role (decoctl.host.Rows: beams, parallel samples, batched prompts) are runners of their own:
``copy_from`` gives a forked row the other row's self-attention KV, and its encoder output and cross-attention KV
where it does not hold them already (the same source: copied once, the encoder never run again).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

from decoctl.errors import CapabilityError, SequenceError
from decoctl.model._encoder_decoder import Encoder
from decoctl.model._kv_cache import ConcatKVCache, KVCache, binding_type, graph_dtype
from decoctl.model._loader import LoadedModel
from decoctl.model._runner import Runner, RunOutputs, binding_calls

__all__ = ["DecoderRunner", "SourceState"]

#: a decoder graph's input for its own tokens' mask (decoder_attention_mask in transformers)
DECODER_MASK = "attention_mask"
#: the source length the encoder's and the cross-attention buffers are first allocated for (they double as needed)
MIN_SOURCE = 64


class _Binding:
    """One IOBinding of a session, and what each name is bound to now (re-bound only when that changes)."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.binding = session.io_binding()
        self._calls = binding_calls(session, self.binding)
        self.run = self._calls.run
        self._bound: dict[str, tuple[int, tuple[int, ...]]] = {}

    def bind(self, name: str, dtype: Any, shape: tuple[int, ...], pointer: int, *, output: bool = False) -> None:
        if self._bound.get(name) == (pointer, shape):
            return
        bind = self._calls.bind_output if output else self._calls.bind_input
        bind(name, dtype, list(shape), pointer)
        self._bound[name] = (pointer, shape)


class SourceState:
    """The encoder's output for one source, copied out of a runner (``DecoderRunner.source_state``): ``encoded``,
    [length, hidden]. ``nbytes``: what it holds."""

    __slots__ = ("encoded", "length", "nbytes")

    def __init__(self, encoded: np.ndarray) -> None:
        self.length = int(encoded.shape[0])
        self.encoded = encoded
        self.nbytes = int(encoded.nbytes)


class DecoderRunner(Runner):
    """Runs an encoder-decoder model for one sequence (see the module docstring). ``source_length`` is the length
    of the source encoded last, 0 before the first ``encode``. ``encoder_runs`` and ``cross_passes`` count the
    encoder's runs and the first-pass decoder's (the passes that compute the cross-attention KV) over the runner's
    life: one each per source, whatever the rewinds."""

    def __init__(self, model: LoadedModel, max_length: int | None = None, kv: KVCache | None = None) -> None:
        encoder = model.encoder
        if encoder is None:
            raise CapabilityError(f"model {model.name} has no encoder: run it with decoctl.model._runner.Runner")
        if kv is not None:
            raise CapabilityError(
                f"model {model.name} is an encoder-decoder model, whose decoder runs one row (its self-attention KV "
                "is concatenated, Optimum's layout): it cannot take a row of a batched buffer"
            )
        super().__init__(model, max_length)
        if not isinstance(self.kv, ConcatKVCache):
            raise CapabilityError(f"model {model.name}: an encoder-decoder decoder keeps a concatenated KV cache")
        self._self_kv = self.kv
        self._encoder: Encoder = encoder
        self._parts = encoder.parts
        self._run_encoder = _Binding(encoder.session)
        self._first = _Binding(encoder.first)
        self._step = _Binding(model.session)
        spec = model.spec
        step_inputs = {i.name: i.type for i in model.session.get_inputs()}
        cross_dtype = graph_dtype(step_inputs[self._parts.past_cross_names(0)[0]])
        self._cross_dtype = self.kv.dtype if cross_dtype is None else cross_dtype
        self._cross_type = binding_type(self._cross_dtype)
        self._hidden_type = binding_type(encoder.hidden_dtype)
        self._cross_names = [
            (self._parts.past_cross_names(layer), self._parts.present_cross_names(layer))
            for layer in range(spec.num_layers)
        ]
        self.source_length = 0
        self.encoder_runs = 0
        self.cross_passes = 0
        #: what identifies the source encoded last (a new object per encode, shared by the runners copied from this
        #: one), and whether the cross-attention KV of that source is in this runner's buffers yet
        self._source_key: object | None = None
        self._cross_ready = False
        self._capacity = 0
        # a speech encoder's output always has source_length positions (one 30 s window)
        self._allocate(self._parts.source_length if encoder.audio is not None else MIN_SOURCE)
        self._false = np.zeros(1, np.bool_)
        self._true = np.ones(1, np.bool_)
        # the decoder's own mask over its past and new tokens, which a few exports take (optimum maps
        # decoder_attention_mask to it): all ones, a slice of the runner's ones buffer
        self._own_mask = (
            DECODER_MASK in encoder.first_inputs,
            DECODER_MASK in encoder.step_inputs,
        )

    def _allocate(self, capacity: int) -> None:
        """Buffers for a source of up to ``capacity`` tokens: its ids and mask, the encoder's output and the
        cross-attention KV (one key and one value per decoder layer)."""
        encoder = self._encoder
        self._capacity = capacity
        self._source_ids = np.zeros((1, capacity), np.int64)
        self._source_mask = np.ones((1, capacity), np.int64)
        self._encoded = np.zeros((1, capacity, encoder.hidden_size), encoder.hidden_dtype)
        size = encoder.cross_heads * capacity * encoder.cross_head_size
        self._cross = [
            (np.zeros(size, self._cross_dtype), np.zeros(size, self._cross_dtype)) for _ in self._cross_names
        ]

    def encode(self, source: np.ndarray) -> None:
        """Run the encoder over ``source`` (int64[s], 1 <= s <= the model's source length; for a speech encoder one
        window's features, float32[1, mel, frames]) and empty the decoder's cache; the next forward (from length 0)
        computes the cross-attention KV, which every later forward of this source reads (after a rewind to 0 too)."""
        parts, encoder = self._parts, self._encoder
        if encoder.audio is not None:
            self._encode_features(source)
            return
        n = len(source)
        if not 1 <= n <= parts.source_length:
            raise SequenceError(
                f"encode() got {n} source tokens; the encoder of {self.model.name} takes 1 to {parts.source_length}"
            )
        if n > self._capacity:
            capacity = self._capacity
            while capacity < n:
                capacity *= 2
            self._allocate(min(capacity, parts.source_length))
        self._source_ids[0, :n] = source
        ids, mask, encoded = self._source_ids.ctypes.data, self._source_mask.ctypes.data, self._encoded.ctypes.data
        width = encoder.hidden_size
        run = self._run_encoder
        run.bind(parts.encoder_ids_name, np.int64, (1, n), ids)
        run.bind(parts.encoder_mask_name, np.int64, (1, n), mask)
        run.bind(parts.encoder_output_name, self._hidden_type, (1, n, width), encoded, output=True)
        run.run()
        self.encoder_runs += 1
        self.kv.truncate(0)
        self._source_key = object()
        self._cross_ready = False
        self._bind_source(n)

    def source_state(self) -> SourceState | None:
        """A copy of the encoder's output for the source encoded last (None before the first ``encode``): what
        ``restore_source`` gives any runner of the same model."""
        n = self.source_length
        return None if n == 0 else SourceState(self._encoded[0, :n].copy())

    def restore_source(self, state: SourceState) -> None:
        """Hold ``state``'s encoder output as ``encode`` leaves it, without running the encoder: the decoder's cache
        empty, and the next forward (from length 0) runs the first-pass decoder over it, which computes the
        cross-attention KV as after ``encode`` (so every logit is what it would have been)."""
        n = state.length
        if n > self._capacity:
            self._allocate(self._parts.source_length)
        self._encoded[0, :n] = state.encoded
        self.kv.truncate(0)
        self._source_key = object()
        self._cross_ready = False
        self._bind_source(n)

    def _encode_features(self, features: np.ndarray) -> None:
        """The speech encoder over one window's log-mel features (float32[1, mel, frames])."""
        parts, encoder = self._parts, self._encoder
        audio = encoder.audio
        assert audio is not None
        expected = (1, audio.feature_size, audio.frames)
        if features.dtype != np.float32 or features.shape != expected:
            raise SequenceError(
                f"encode() got {features.dtype}{list(features.shape)}; the speech encoder of {self.model.name} takes "
                f"float32{list(expected)}: one window's features (decoctl.model._audio_features.AudioFeatures)"
            )
        self._features = np.ascontiguousarray(features)
        n = parts.source_length
        run = self._run_encoder
        run.bind(parts.encoder_ids_name, np.float32, expected, self._features.ctypes.data)
        shape = (1, n, encoder.hidden_size)
        run.bind(parts.encoder_output_name, self._hidden_type, shape, self._encoded.ctypes.data, output=True)
        run.run()
        self.encoder_runs += 1
        self.kv.truncate(0)
        self._source_key = object()
        self._cross_ready = False
        self._bind_source(n)

    def _bind_source(self, n: int) -> None:
        """Bind what the decoders read of a source of ``n`` tokens (its mask, the encoder's output, the cross-attention
        KV buffers), once for every pass until the next encode or copy."""
        parts, encoder = self._parts, self._encoder
        self.source_length = n
        mask, encoded = self._source_mask.ctypes.data, self._encoded.ctypes.data
        width = encoder.hidden_size
        for binding, takes in ((self._first, encoder.first_inputs), (self._step, encoder.step_inputs)):
            if parts.mask_input_name in takes:
                binding.bind(parts.mask_input_name, np.int64, (1, n), mask)
            if parts.hidden_input_name in takes:
                binding.bind(parts.hidden_input_name, self._hidden_type, (1, n, width), encoded)
        shape = (1, encoder.cross_heads, n, encoder.cross_head_size)
        empty = (1, encoder.cross_heads, 0, encoder.cross_head_size)
        for (past, present), pair in zip(self._cross_names, self._cross, strict=True):
            for past_name, present_name, buffer in zip(past, present, pair, strict=True):
                pointer = buffer.ctypes.data
                self._first.bind(present_name, self._cross_type, shape, pointer, output=True)
                self._step.bind(past_name, self._cross_type, shape, pointer)
                if parts.merged:  # the no-past branch reads no cross KV: an empty one, never the buffer it writes
                    self._first.bind(past_name, self._cross_type, empty, pointer)
        branch = self.model.capabilities.use_cache_branch
        if branch is not None:
            self._first.bind(branch, np.bool_, (1,), self._false.ctypes.data)
            self._step.bind(branch, np.bool_, (1,), self._true.ctypes.data)

    def run(
        self,
        tokens: np.ndarray,
        positions: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        features: np.ndarray | None = None,
        bias_positions: np.ndarray | None = None,
        *,
        keep: int | None = None,
    ) -> RunOutputs:
        """Feed ``tokens`` (int64[n]) after the current length: the first-pass decoder when the source's
        cross-attention KV is not computed yet (the first forward after ``encode``), the stepping decoder otherwise,
        from an empty cache too. The decoder takes no positions, bias or features (its capabilities say so)."""
        del positions, bias, features, bias_positions
        if self.source_length == 0:
            raise SequenceError(
                f"a forward of {self.model.name}'s decoder before its encoder ran: encode the source first "
                "(Sequence.encode; the Generator encodes the prompt)"
            )
        n = len(tokens)
        spec = self.model.spec
        self._ids[0, :n] = tokens
        # the cache is empty after an encode; _cross_ready says the cross KV outlived a rewind to 0
        first = not self._cross_ready
        binding = self._first if first else self._step
        binding.bind(spec.input_ids_name, np.int64, (1, n), self._ids_pointer)
        if self._own_mask[0 if first else 1]:
            binding.bind(DECODER_MASK, np.int64, (1, self.kv.length + n), self._mask_pointer)
        if first and not self._parts.merged:
            self._self_kv.bind_present(binding.binding, n)
        else:
            self.kv.bind(binding.binding, n)
        rows = n if self.model.capabilities.logits_all_positions else 1
        logits = self._logits.rows(rows)
        binding.bind(
            spec.logits_name, self._logits.bind_type, (1, rows, spec.vocab_size), self._logits.pointer, output=True
        )
        binding.run()
        if self._narrow:
            self._widen(rows, n)
        self.kv.advance(n)
        if first:
            self.cross_passes += 1
            self._cross_ready = True
        return RunOutputs(logits, None, None)

    def copy_from(self, other: Runner) -> None:
        """Hold a copy of ``other``'s decoder state (a runner of the same model; ``other`` unchanged): its
        self-attention KV, and its source's encoder output and cross-attention KV unless this runner holds them
        already (copied from the same encode). The encoder does not run."""
        if not isinstance(other, DecoderRunner):
            raise CapabilityError(f"copy_from() on model {self.model.name}: the other runner has no encoder")
        super().copy_from(other)
        n = other.source_length
        if n == 0:  # nothing encoded there: a forward raises until an encode, as on a new runner
            self.source_length, self._source_key, self._cross_ready = 0, None, False
            return
        if self._source_key is not other._source_key:
            if self._capacity < n:
                self._allocate(other._capacity)
            self._encoded[0, :n] = other._encoded[0, :n]
            self._source_key, self._cross_ready = other._source_key, False
            self._bind_source(n)
        if other._cross_ready and not self._cross_ready:
            size = self._encoder.cross_heads * n * self._encoder.cross_head_size
            for mine, theirs in zip(self._cross, other._cross, strict=True):
                for target, source in zip(mine, theirs, strict=True):
                    target[:size] = source[:size]
            self._cross_ready = True
