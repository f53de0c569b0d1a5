"""One onnxruntime Run per forward, with every input and output in preallocated buffers (IOBinding)."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from decoctl.errors import CapabilityError, ModelLoadError, SequenceError
from decoctl.logs import get_logger
from decoctl.model._kv_cache import (
    ConcatKVCache,
    KVCache,
    SharedKVCache,
    binding_type,
    dtype_name,
    graph_dtype,
    make_kv_cache,
    to_float32,
)
from decoctl.model._loader import LoadedModel
from decoctl.model._prefill import QUERY_SEQLENS
from decoctl.model._qwen_vl import MRopePositions
from decoctl.model._vision import ImageFeatures, too_many_image_tokens

__all__ = [
    "PRIVATE_ORT_VERSIONS",
    "PUBLIC_ORT_ENV",
    "RunOutputs",
    "Runner",
    "binding_calls",
    "dry_forward",
    "kernel_failure",
    "private_ort_supported",
]

log = get_logger(__name__)


class RunOutputs:
    """Views of the last run's outputs: ``logits`` float32[n, vocab], ``hidden`` / ``aux`` float32[n, h] or
    None. They alias the runner's buffers and change with its next run. They are float32 whatever the graph's
    type: a float16 or bfloat16 graph's outputs are widened once per run (every row of that run, one copy)."""

    __slots__ = ("aux", "hidden", "logits")

    def __init__(self, logits: np.ndarray, hidden: np.ndarray | None, aux: np.ndarray | None) -> None:
        self.logits = logits
        self.hidden = hidden
        self.aux = aux


class _Growable:
    """A [capacity, width] buffer that doubles when a run needs more rows (never shrinks, never per step).

    ``array`` (at ``pointer``) holds the graph's type ``dtype`` (see kv_cache.graph_dtype) and is what gets bound;
    ``rows`` returns float32 rows: ``array`` itself for a float32 graph, else a float32 twin that ``widen`` fills.
    """

    def __init__(self, width: int, dtype: np.dtype | type = np.float32, capacity: int = 16) -> None:
        self.width = width
        self.dtype = np.dtype(dtype)
        self.bind_type = binding_type(self.dtype)
        self.narrow = self.dtype != np.float32
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.array: np.ndarray = np.zeros((capacity, self.width), self.dtype)
        self.pointer: int = self.array.ctypes.data
        self.wide: np.ndarray = np.zeros((capacity, self.width), np.float32) if self.narrow else self.array

    def rows(self, n: int) -> np.ndarray:
        if n > self.array.shape[0]:
            capacity = self.array.shape[0]
            while capacity < n:
                capacity *= 2
            self._allocate(capacity)
        return self.wide[:n]

    def widen(self, n: int) -> None:
        """After a run of a float16 or bfloat16 graph: its first n rows, as float32, into what ``rows`` gave."""
        to_float32(self.array[:n], self.wide[:n])


#: onnxruntime versions (major, minor), inclusive, whose private binding objects _PrivateCalls was checked against:
#: the oldest the project supports and the newest it was measured on. Outside them the public wrappers serve.
PRIVATE_ORT_VERSIONS = ((1, 20), (1, 32))
#: set to 1 to bind and run through onnxruntime's public wrappers whatever its version
PUBLIC_ORT_ENV = "DECOCTL_ORT_PUBLIC"


def private_ort_supported(version: str) -> bool:
    """Whether onnxruntime ``version`` ("1.32.0", "1.21.0.dev2024...") lies in PRIVATE_ORT_VERSIONS."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return False
    low, high = PRIVATE_ORT_VERSIONS
    return low <= (int(match[1]), int(match[2])) <= high


class _PublicCalls:
    """Bind and run through onnxruntime's public IOBinding and InferenceSession."""

    private = False

    def __init__(self, session: ort.InferenceSession, binding: ort.IOBinding) -> None:
        self._binding = binding
        self.run: Callable[[], None] = functools.partial(session.run_with_iobinding, binding)

    def bind_input(self, name: str, dtype: type, shape: list[int], pointer: int) -> None:
        self._binding.bind_input(name, "cpu", 0, dtype, shape, pointer)

    def bind_output(self, name: str, dtype: type, shape: list[int], pointer: int) -> None:
        self._binding.bind_output(name, "cpu", 0, dtype, shape, pointer)


class _PrivateCalls:
    """Bind and run through the C++ objects under onnxruntime's Python wrappers (``_sess``, ``_iobinding``,
    ``OrtDevice._get_c_device``).

    The wrappers re-create an OrtDevice on every bind and check for WebGPU graph capture on every run; a decode
    step binds two or three names and runs once, so on a small model those checks are a visible share of the
    step. The C++ methods take the same arguments and do the same work for CPU memory. They are private, so
    binding_calls() uses them only on the onnxruntime versions in PRIVATE_ORT_VERSIONS.
    """

    private = True

    def __init__(self, session: ort.InferenceSession, binding: ort.IOBinding) -> None:
        c_session = session._sess
        self._c_binding = binding._iobinding
        self._device = ort.OrtDevice.make("cpu", 0)._get_c_device()
        # no RunOptions: with one, onnxruntime's Python wrapper looks up an unset config key on every run and
        # pays for the exception that lookup raises (~50 us a step)
        self.run: Callable[[], None] = functools.partial(c_session.run_with_iobinding, self._c_binding, None)

    def bind_input(self, name: str, dtype: type, shape: list[int], pointer: int) -> None:
        self._c_binding.bind_input(name, self._device, dtype, shape, pointer)

    def bind_output(self, name: str, dtype: type, shape: list[int], pointer: int) -> None:
        self._c_binding.bind_output(name, self._device, dtype, shape, pointer)


def binding_calls(
    session: ort.InferenceSession, binding: ort.IOBinding, *, private: bool | None = None
) -> _PublicCalls | _PrivateCalls:
    """The bind/run calls a Runner makes: through onnxruntime's private C++ objects where ``private`` (None: where
    the installed onnxruntime is a known-good version and DECOCTL_ORT_PUBLIC is not set), else, or where this
    build lacks them, through its public wrappers (the same results, a little slower)."""
    if private is None:
        private = os.environ.get(PUBLIC_ORT_ENV, "") in ("", "0") and private_ort_supported(ort.__version__)
    if private:
        try:
            return _PrivateCalls(session, binding)
        except AttributeError as exc:
            log.debug("decoctl.ort_public_calls", version=ort.__version__, reason=str(exc))
    return _PublicCalls(session, binding)


class Runner:
    """Runs one model for one sequence: owns its KV cache, its IOBinding and its output buffers.

    ``run(tokens, positions, bias, features)`` feeds tokens after the cache's current length. ``positions``
    (int64[n]) and ``bias`` (additive: float32[n, w] over the last w of the length+n positions, everything
    before them visible to all; w = n covers the new tokens only) are only used by graphs that take
    position_ids / attention_bias; plain chains pass None and get consecutive positions and a causal mask.
    ``features`` (float32[n, feature_size]) is copied into a preallocated buffer bound to the graph's features
    input; the caller checks its shape.
    """

    def __init__(self, model: LoadedModel, max_length: int | None = None, kv: KVCache | None = None) -> None:
        spec = model.spec
        self.model = model
        self.max_length = min(max_length or spec.max_length, spec.context_length)
        # ``kv``: a cache someone else allocated (one row of a role's batched buffers, decoctl.model._kv_rows)
        # a split export's prefill graph writes a whole padded chunk: the cache has room for its padding
        room = model.prefill.chunk if model.prefill is not None else 0
        self.kv: KVCache = (
            kv
            if kv is not None
            else make_kv_cache(model.session, spec, self.max_length + room, model.capabilities.rings)
        )
        self._session = model.session
        self._binding = model.session.io_binding()
        self._fast = binding_calls(model.session, self._binding)
        # what each name is bound to now, (pointer, shape): a decode step re-binds only what changed (the
        # attention mask, whose length grows), not input_ids and the output rows, which stay put
        self._bound: dict[str, tuple[int, tuple[int, ...]]] = {}
        caps = model.capabilities
        self._ids = np.zeros((1, self.max_length), np.int64)
        self._mask = np.ones((1, self.max_length), np.int64)
        self._positions = np.zeros((1, self.max_length), np.int64)
        # buffer addresses, taken once: numpy's .ctypes builds a new object on every access
        self._ids_pointer = self._ids.ctypes.data
        self._mask_pointer = self._mask.ctypes.data
        self._positions_pointer = self._positions.ctypes.data
        # outputs bound in the graph's own type; a float16 or bfloat16 graph's are widened to float32 after each run
        types = {o.name: o.type for o in model.session.get_outputs()}
        self._logits = _Growable(spec.vocab_size, _output_dtype(model, types, spec.logits_name))
        self._hidden = (
            _Growable(caps.hidden_size, _output_dtype(model, types, caps.hidden_states))
            if caps.hidden_states and caps.hidden_size
            else None
        )
        self._aux = (
            _Growable(caps.aux_hidden_size, _output_dtype(model, types, caps.aux_hidden_states))
            if caps.aux_hidden_states and caps.aux_hidden_size
            else None
        )
        self._narrow = [b for b in (self._logits, self._hidden, self._aux) if b is not None and b.narrow]
        # a merged decoder's branch switch: its no-past graph on the first run, its with-past graph after
        self._branch = np.zeros(1, np.bool_)
        self._branch_pointer = self._branch.ctypes.data
        self._features = _Growable(caps.feature_size, np.float32) if caps.feature_input and caps.feature_size else None
        self._bias = np.zeros(0, np.float32)
        self._bias_pointer = 0
        self._causal: dict[int, np.ndarray] = {}
        self._window_buffers: list[np.ndarray] = []
        self._names = spec
        self._caps = caps
        # GroupQueryAttention's lengths where the loader removed the mask subgraph: [seqlens_k, total], bound once
        # (the addresses and shapes never change) and rewritten before every run
        self._lengths = np.zeros(2, np.int32)
        if caps.fed_lengths is not None:
            pointer = self._lengths.ctypes.data
            self._fast.bind_input(caps.fed_lengths.seqlens_k, np.int32, [1], pointer)
            self._fast.bind_input(caps.fed_lengths.total_sequence_length, np.int32, [], pointer + 4)
        # a model with stacked LoRA slots (decoctl.model._adapters): the tables bound once, this row's index per Run
        self._adapter = np.zeros(1, np.int64)
        if model.adapters is not None:
            model.adapters.bind(self._fast.bind_input)
            self._fast.bind_input(model.adapters.index_input, np.int64, [1], self._adapter.ctypes.data)
        # the first position whose logits a run computes (decoctl.model.graph._logit_rows), bound once, rewritten
        # before every run: 0 (every row) but where the caller wants the last row only
        self._logits_from = np.zeros(1, np.int64)
        if caps.logits_from is not None:
            self._fast.bind_input(caps.logits_from, np.int64, [1], self._logits_from.ctypes.data)
        # a decode step feeds one token through bindings that stay put: when the graph takes nothing per step
        # but the token (and the lengths or mask), step() skips run()'s checks (see step())
        self._steppable = (
            isinstance(self.kv, SharedKVCache)
            # M-RoPE positions stay bound too ([3, 1, 1]); step() writes them (decoctl.model._qwen_vl)
            and (caps.position_ids is None or caps.position_axes == 3)
            and caps.attention_bias is None
            and caps.feature_input is None
        )
        self._one: RunOutputs | None = None
        self._masked = caps.fed_lengths is None
        # a vision-language decoder takes embeddings: the embedding stage makes them from the fed tokens and, for
        # the prompt's image tokens, the images' features (decoctl.model._vision)
        self._embedder = model.vision.embedder if model.vision is not None and caps.inputs_embeds else None
        #: the images of this sequence's prompt, their features in order (set by the host before the prefill)
        self.images: ImageFeatures | None = None
        self._blocks = model.vision.blocks if model.vision is not None and self._embedder is not None else None
        self._prefill = _PrefillRun(model, self) if model.prefill is not None else None
        if self._embedder is not None:
            # a step looks its token up in the embedding table into a bound row; without a table it runs the graph
            self._steppable = self._steppable and self._embedder.table is not None
            self._embeds = _Growable(self._embedder.hidden, np.float32)
            self._history = np.zeros(self.max_length + 1, np.int64)
            self._images_before = np.zeros(self.max_length + 2, np.int64)
        # M-RoPE decoders take three positions a token, kept per cache index (decoctl.model._qwen_vl)
        self._mrope: MRopePositions | None = None
        if caps.position_axes == 3:
            qwen = model.vision.qwen if model.vision is not None else None
            self._mrope = MRopePositions(
                self.max_length,
                self._embedder.image_token if self._embedder is not None else None,
                qwen.merge_size if qwen is not None else 1,
            )
            self._positions3 = np.zeros(3 * self.max_length, np.int64)
            self._positions3_pointer = self._positions3.ctypes.data

    @property
    def length(self) -> int:
        return self.kv.length

    @property
    def adapter(self) -> int:
        """The table of the model's stacked LoRA slots this row runs (0: the base model; decoctl.model._adapters)."""
        return int(self._adapter[0])

    @adapter.setter
    def adapter(self, index: int) -> None:
        tables = self.model.adapters
        if index and (tables is None or not 0 <= index <= len(tables.names)):
            raise SequenceError(
                f"adapter table {index} is not one of model {self.model.name}'s "
                f"({0 if tables is None else len(tables.names)} adapters loaded): pick a loaded adapter"
            )
        self._adapter[0] = index

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
        """Feed ``tokens`` (int64[n]) after the current length; return views of the outputs. ``bias_positions``
        (int64[w]): the positions of the w slots ``bias`` spans, where they differ from the slots (a tree).
        ``keep``: the caller reads the logits of the last ``keep`` positions only (1: a prompt's last row; 0: none,
        a prompt chunk before its last); a graph that can compute those rows alone (``Capabilities.logits_from``)
        then gives just them, each the one the whole forward gives, and skips the LM head for the rest. None:
        every row."""
        n = len(tokens)
        past = self.kv.length
        total = past + n
        spec, caps = self._names, self._caps
        if self._blocks is not None and positions is None and bias is None and features is None:
            # image tokens that attend to each other both ways (decoctl.model._image_blocks)
            fed = self._blocks.run(self, tokens, keep)
            if fed is not None:
                return fed
        if bias_positions is not None and self.kv.rings is not None:
            self.kv.rings.check_tree(n, self.model.name)
        if self._prefill is not None and n > 1 and positions is None and bias is None and features is None:
            self._one = None
            return self._prefill.run(tokens)
        ids = self._ids
        ids[0, :n] = tokens
        if self._embedder is None:
            self._bind(spec.input_ids_name, np.int64, (1, n), self._ids_pointer)
        else:
            self._bind_embeds(ids[:, :n], past)
        self._feed_length(total)
        if self._mrope is not None:
            if positions is not None:
                raise CapabilityError(
                    f"model {self.model.name} takes three rotary positions a token (M-RoPE): decoctl computes them "
                    "itself and takes no positions from the caller (no trees)"
                )
            self._fill_mrope(ids[0, :n], past)
            self._bind(caps.position_ids or "", np.int64, (3, 1, n), self._positions3_pointer)
        elif caps.position_ids is not None:
            pos = self._positions
            if positions is None:
                if n == 1:
                    pos[0, 0] = past
                else:
                    pos[0, :n] = np.arange(past, total)
            else:
                pos[0, :n] = positions
            self._bind(caps.position_ids, np.int64, (1, n), self._positions_pointer)
        if caps.attention_bias is not None:
            self._fill_bias(n, total, bias)
            self._fast.bind_input(caps.attention_bias, np.float32, [1, 1, n, total], self._bias_pointer)
            if caps.windows:
                chain = caps.position_ids is None or self._mrope is not None  # windows count cache slots
                fed = np.arange(past, total) if chain else self._positions[0, :n]
                self._bind_windows(n, total, fed, bias, bias_positions)
        if caps.feature_input is not None and self._features is not None:
            if features is None:
                raise SequenceError(f"{self.model.name} takes {caps.feature_input}: pass one row of features per token")
            self._features.rows(n)[:] = features
            width = self._features.width
            self._bind(caps.feature_input, np.float32, (1, n, width), self._features.pointer)
        if caps.use_cache_branch is not None:
            self._branch[0] = past > 0
            self._bind(caps.use_cache_branch, np.bool_, (1,), self._branch_pointer)
        self.kv.bind(self._binding, n)
        logit_rows = n if caps.logits_all_positions else 1
        if caps.logits_from is not None:
            skipped = 0 if keep is None else n - min(keep, n)
            self._logits_from[0] = skipped
            logit_rows -= skipped
        logits = self._logits.rows(logit_rows)
        self._bind(
            spec.logits_name,
            self._logits.bind_type,
            (1, logit_rows, spec.vocab_size),
            self._logits.pointer,
            output=True,
        )
        hidden = self._bind_rows(caps.hidden_states, self._hidden, n)
        aux = self._bind_rows(caps.aux_hidden_states, self._aux, n)
        try:
            self._fast.run()
        except Exception as exc:  # onnxruntime's own error types
            raise kernel_failure(self.model, exc, f"a forward of {n} tokens after {past}") from exc
        if self._narrow:
            self._widen(logit_rows, n)
        self.kv.advance(n)
        if self._embedder is not None:
            self._record(ids[0, :n], past)
        outputs = RunOutputs(logits, hidden, aux)
        # after a one-token run every binding is what the next one-token run needs (bar the mask's length), unless it
        # skipped its logits (a one-token prompt chunk: keep=0), which a step needs
        self._one = outputs if n == 1 and self._steppable and logit_rows == 1 else None
        return outputs

    def step(self, token: int) -> RunOutputs:
        """Feed one token: the same as ``run(np.array([token]))``, cheaper on the decode path. The outputs object
        is reused from one step to the next (its arrays alias the same buffers either way)."""
        one = self._one
        if one is None:
            return self.run(np.array((token,), np.int64))
        self._ids[0, 0] = token
        length = self.kv.length
        embedder = self._embedder
        if embedder is not None:
            if token == embedder.image_token and self.images is not None:
                return self.run(np.array((token,), np.int64))  # it may take an image's features
            assert embedder.table is not None
            self._embeds.array[0] = embedder.table[token]  # the row the last one-token run bound
        if self._mrope is not None:
            self._fill_mrope(self._ids[0, :1], length)
        if self.kv.rings is not None:
            self.kv.rings.before_run(length, 1)
        self._feed_length(length + 1)
        try:
            self._fast.run()
        except Exception as exc:  # onnxruntime's own error types
            raise kernel_failure(self.model, exc, f"a one-token step after {length}") from exc
        if self._narrow:
            self._widen(1, 1)
        self.kv.advance(1)
        if embedder is not None:
            self._history[length] = token
            self._images_before[length + 1] = self._images_before[length] + (token == embedder.image_token)
        return one

    def _widen(self, logit_rows: int, n: int) -> None:
        """After a run: the float16 or bfloat16 outputs' rows as float32, where RunOutputs has them."""
        for buffer in self._narrow:
            buffer.widen(logit_rows if buffer is self._logits else n)

    def _feed_length(self, total: int) -> None:
        """Tell the graph the sequence is ``total`` tokens long after this run: the attention mask's width, or
        GroupQueryAttention's two lengths where the loader removed the mask subgraph."""
        if self._masked:
            self._fast.bind_input(self._names.attention_mask_name, np.int64, [1, total], self._mask_pointer)
        else:
            lengths = self._lengths
            lengths[0] = total - 1
            lengths[1] = total

    def _bind(self, name: str, dtype: type, shape: tuple[int, ...], pointer: int, *, output: bool = False) -> None:
        """Bind ``name`` to host memory unless it is bound to exactly this pointer and shape already."""
        if self._bound.get(name) == (pointer, shape):
            return
        bind = self._fast.bind_output if output else self._fast.bind_input
        bind(name, dtype, list(shape), pointer)
        self._bound[name] = (pointer, shape)

    def _bind_rows(self, name: str | None, buffer: _Growable | None, n: int) -> np.ndarray | None:
        if name is None or buffer is None:
            return None
        rows = buffer.rows(n)
        self._bind(name, buffer.bind_type, (1, n, buffer.width), buffer.pointer, output=True)
        return rows

    def _fill_bias(self, n: int, total: int, bias: np.ndarray | None) -> None:
        """Write the float32[n, total] attention bias at the start of the bias buffer (``_bias_pointer``)."""
        size = n * total
        if self._bias.size < size:
            self._bias = np.zeros(max(size, 2 * self._bias.size), np.float32)
            self._bias_pointer = self._bias.ctypes.data  # taken once: .ctypes builds an object on every access
        view = self._bias[:size].reshape(n, total)
        if bias is None:
            view[:] = 0.0
            if n > 1:  # causal among the new tokens; one token sees everything
                view[:, total - n :] = self._causal_block(n)
        else:
            visible = total - bias.shape[1]
            view[:, :visible] = 0.0
            view[:, visible:] = bias

    def _bind_windows(
        self, n: int, total: int, fed: np.ndarray, bias: np.ndarray | None, bias_positions: np.ndarray | None
    ) -> None:
        """Bind each sliding window's bias input (decoctl.model.graph._window_bias): the attention bias, plus -inf where
        the key's position is ``window`` or more behind the query's. Slots before the bias's span hold the
        positions 0.. (the cached prefix); the span's slots hold ``bias_positions`` (or their own slot numbers)."""
        size = n * total
        main = self._bias[:size].reshape(n, total)
        for index, window in enumerate(self._caps.windows):
            cut = fed - (window.window - 1)  # a query at position p sees keys at positions p - window + 1 .. p
            if int(cut.max()) <= 0:  # the window hides nothing yet: the same bias serves
                self._fast.bind_input(window.name, np.float32, [1, 1, n, total], self._bias_pointer)
                continue
            buffer = self._window_buffers[index] if index < len(self._window_buffers) else None
            if buffer is None or buffer.size < size:
                buffer = np.zeros(max(size, 2 * (0 if buffer is None else buffer.size)), np.float32)
                if index < len(self._window_buffers):
                    self._window_buffers[index] = buffer
                else:
                    self._window_buffers.append(buffer)
            view = buffer[:size].reshape(n, total)
            view[:] = main
            if n == 1 and bias_positions is None:
                view[0, : int(cut[0])] = -np.inf
            else:
                columns = np.arange(total)
                if bias is not None and bias_positions is not None:
                    columns[total - bias.shape[1] :] = bias_positions
                np.copyto(view, np.float32(-np.inf), where=columns[None, :] < cut[:, None])
            self._fast.bind_input(window.name, np.float32, [1, 1, n, total], buffer.ctypes.data)

    def _causal_block(self, n: int) -> np.ndarray:
        """float32[n, n]: 0 on and below the diagonal, -inf above. Kept for the small n of decode steps (building
        one with np.triu_indices costs ~25 us a step); a prompt's block is built and dropped."""
        block = self._causal.get(n)
        if block is None:
            block = np.triu(np.full((n, n), -np.inf, np.float32), 1)
            if n <= 64:
                self._causal[n] = block
        return block

    def _bind_embeds(self, tokens: np.ndarray, past: int) -> None:
        """Bind the embeddings of ``tokens`` (int64[1, n]): image features at the prompt's image tokens that the
        sequence has not fed yet, the token embeddings elsewhere."""
        assert self._embedder is not None
        n = tokens.shape[1]
        images = self._embedder.image_token == tokens[0]
        count = int(images.sum())
        before = int(self._images_before[past])
        held = 0 if self.images is None else len(self.images.rows)
        use = max(0, min(count, held - before))
        if 0 < use < count:
            raise too_many_image_tokens(self.model.name, before + count, held)
        features = self.images.rows[before : before + use] if use and self.images is not None else None
        rows = self._embeds.rows(n)
        rows[:] = self._embedder.embed(tokens, features)[0]
        self._fast.bind_input(self._caps.inputs_embeds or "", np.float32, [1, n, rows.shape[1]], self._embeds.pointer)

    def _fill_mrope(self, tokens: np.ndarray, past: int) -> None:
        """This run's M-RoPE positions, int64[3, n], at the start of their buffer."""
        assert self._mrope is not None
        n = len(tokens)
        before = int(self._images_before[past]) if self._embedder is not None else 0
        grids = self.images.grids if self.images is not None else ()
        self._mrope.fill(tokens, past, before, grids, self._positions3[: 3 * n].reshape(3, n))

    def next_position(self) -> int:
        """The rotary position a text token fed next takes (every axis of an M-RoPE decoder): the length, plus the
        row's delta where its prompt holds images."""
        return self._mrope.next_position(self.kv.length) if self._mrope is not None else self.kv.length

    def stepped(self, token: int) -> None:
        """A batched step (decoctl.model._batch_step) fed ``token`` to this row at its length: advance the cache and
        keep what a run keeps of a fed token."""
        length = self.kv.length
        if self._mrope is not None:
            self._fill_mrope(np.array((token,), np.int64), length)
        self.kv.advance(1)
        if self._embedder is not None:
            self._record(np.array((token,), np.int64), length)

    def feature_row(self, slot: int) -> int:
        """The feature row the image token fed at cache slot ``slot`` takes (how many image tokens come before it)."""
        return int(self._images_before[slot])

    def fed_tokens(self, start: int, end: int) -> np.ndarray:
        """int64[end - start]: the tokens fed at cache slots start..end-1 (a vision-language decoder's)."""
        return self._history[start:end].copy()

    def set_feature_row(self, slot: int, row: int) -> None:
        """Feed the next image token at ``slot`` feature row ``row`` (an image block fed again as a copy)."""
        self._images_before[slot] = row

    def _record(self, tokens: np.ndarray, past: int) -> None:
        """Keep the fed tokens and the running count of image tokens (which feature row the next one takes)."""
        assert self._embedder is not None
        end = past + len(tokens)
        self._history[past:end] = tokens
        counts = np.cumsum(tokens == self._embedder.image_token)
        self._images_before[past + 1 : end + 1] = self._images_before[past] + counts

    def adopt_tokens(self, tokens: np.ndarray) -> None:
        """This runner's cache now holds ``tokens`` (a fork or reorder copied another row's): take their history."""
        if self._embedder is not None and len(tokens):
            self._record(np.asarray(tokens, np.int64), 0)
        if self._mrope is not None and len(tokens):
            self._fill_mrope(np.asarray(tokens, np.int64), 0)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions of the KV cache (a rewind)."""
        self.kv.truncate(length)

    def copy_from(self, other: Runner) -> None:
        """Hold a copy of ``other``'s KV cache (a runner of the same model; ``other`` unchanged): a row forked from
        another row of a concatenated-cache model, each row a runner of its own (decoctl.host.Rows). Shared-buffer rows
        copy inside their batched buffer instead (decoctl.model._kv_rows)."""
        mine, theirs = self.kv, other.kv
        if not isinstance(mine, ConcatKVCache) or not isinstance(theirs, ConcatKVCache):
            raise CapabilityError(
                f"copy_from() on model {self.model.name}: only concatenated KV caches are copied from runner to "
                "runner; shared-buffer rows copy inside their batched buffer (decoctl.model._kv_rows)"
            )
        mine.copy_from(theirs)
        self._one = None

    def gather(self, positions: np.ndarray, start: int) -> None:
        """Move the KV rows at ``positions`` (int64[k], ascending) to ``start``.. (a tree's kept path)."""
        self.kv.gather(positions, start)
        if self._embedder is not None:
            kept = self._history[positions].copy()
            if self._mrope is not None:
                self._fill_mrope(kept, start)
            self._record(kept, start)


_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)' Status Message: (.*)", re.S)


def kernel_failure(model: LoadedModel, exc: Exception, what: str) -> ModelLoadError:
    """The error for a Run that onnxruntime refused after decoctl bound every input as the graph declares it: the
    node and the kernel's own message, said to be onnxruntime's (its kernel does not run this export on this
    machine), not an unexpected error."""
    text = str(exc).strip()
    match = _NODE.search(text)
    where = f"its {match[1]} kernel at node {match[2]}" if match else "one of its kernels"
    message = match[3].strip() if match else text
    return ModelLoadError(
        f"model {model.name}: {what} failed inside onnxruntime {ort.__version__}, in {where}: {message}. The "
        "inputs are bound as the graph declares them, so the export uses a configuration this onnxruntime's "
        "kernel refuses: export the model again without that feature (for example a different rotary or "
        "head size, or windowed_kv_cache=false), or run it with an onnxruntime whose kernel supports it"
    )


class _PrefillRun:
    """A split export's prefill graph driven chunk by chunk over a runner's KV cache (decoctl.model._prefill): each
    chunk padded to the graph's length, ``query_seqlens`` saying how many of its tokens are real."""

    def __init__(self, model: LoadedModel, runner: Runner) -> None:
        assert model.prefill is not None
        graph = model.prefill
        self.chunk = graph.chunk
        self._runner = runner
        self._binding = graph.session.io_binding()
        self._calls = binding_calls(graph.session, self._binding)
        self._ids = np.zeros((1, graph.chunk), np.int64)
        self._mask = np.zeros((1, runner.max_length + graph.chunk), np.int64)
        self._query = np.zeros(1, np.int32)
        spec = model.spec
        self._chunk_logits = np.zeros((1, graph.chunk, spec.vocab_size), np.float32)
        self._logits = _Growable(spec.vocab_size, np.float32)
        #: Runs of the prefill graph (one per chunk)
        self.runs = 0
        self._calls.bind_input(spec.input_ids_name, np.int64, [1, graph.chunk], self._ids.ctypes.data)
        self._calls.bind_input(QUERY_SEQLENS, np.int32, [1], self._query.ctypes.data)
        self._calls.bind_output(
            spec.logits_name, np.float32, [1, graph.chunk, spec.vocab_size], self._chunk_logits.ctypes.data
        )
        self._spec = spec
        self._model = model

    def run(self, tokens: np.ndarray) -> RunOutputs:
        """Feed ``tokens`` (int64[n]) in padded chunks; float32[n, vocab] logits, one row per token."""
        kv, size = self._runner.kv, self.chunk
        n = len(tokens)
        rows = self._logits.rows(n)
        for start in range(0, n, size):
            real = tokens[start : start + size]
            q, past = len(real), kv.length
            self._ids[0, :q] = real
            self._ids[0, q:] = 0  # padding: never enters the cache (query_seqlens)
            self._mask[0, : past + q] = 1
            self._mask[0, past + q : past + size] = 0
            self._query[0] = q
            self._calls.bind_input(self._spec.attention_mask_name, np.int64, [1, past + size], self._mask.ctypes.data)
            kv.bind(self._binding, q)
            try:
                self._calls.run()
            except Exception as exc:  # onnxruntime's own error types
                raise kernel_failure(self._model, exc, f"a prefill chunk of {q} tokens after {past}") from exc
            self.runs += 1
            rows[start : start + q] = self._chunk_logits[0, :q]
            kv.advance(q)
        return RunOutputs(rows, None, None)


def _output_dtype(model: LoadedModel, types: dict[str, str], name: str) -> np.dtype:
    """The host dtype of the graph's output ``name``, or ModelLoadError where decoctl cannot bind its type."""
    dtype = graph_dtype(types.get(name, ""))
    if dtype is None:
        raise ModelLoadError(
            f"{model.spec.onnx_file} gives {name} as {types.get(name)}, which decoctl does not bind: export it as "
            "float32, float16 or bfloat16"
        )
    return dtype


#: the tokens of dry_forward's first run
DRY_TOKENS = 2


def dry_forward(model: LoadedModel) -> str:
    """Run ``model`` the way generation will: a two-token forward on an empty cache, then a one-token step on
    that cache, every input and output bound as the runner binds it (names, shapes, types). Return a line saying
    what ran; raise ModelLoadError naming the file, the run and onnxruntime's complaint where one fails or gives
    logits that are not finite."""
    spec = model.spec
    tokens = np.arange(1, DRY_TOKENS + 1, dtype=np.int64) % spec.vocab_size
    encoder = model.encoder
    encoded = ""
    if encoder is None:
        runner = Runner(model, max_length=min(spec.max_length, 8))
    else:  # an encoder-decoder model: the encoder over two source tokens first
        from decoctl.model._decoder_runner import DecoderRunner  # it builds on this module

        decoder = DecoderRunner(model, max_length=min(spec.max_length, 8))
        runner = decoder
        source = f"{DRY_TOKENS} source tokens" if encoder.audio is None else "a window of silence"
        encoded = f"the encoder over {source}, then "
        try:
            decoder.encode(encoder.dry_source(tokens))
        except Exception as exc:  # onnxruntime's own error types
            raise ModelLoadError(
                f"{encoder.parts.encoder_file} loads but a pass over {source} fails in onnxruntime "
                f"({type(exc).__name__}: {exc}): the encoder does not run as decoctl binds it; re-export it"
            ) from exc
    # an encoder-decoder model's first forward runs its first-pass decoder
    first = (encoder.parts.first_file, encoder.first) if encoder else (spec.onnx_file, model.session)
    for (graph, session), what, feed in (
        (first, f"the first forward ({DRY_TOKENS} tokens, empty cache)", tokens),
        ((spec.onnx_file, model.session), f"a one-token step after {DRY_TOKENS} tokens", tokens[:1]),
    ):
        try:
            logits = runner.run(feed).logits
        except Exception as failure:  # onnxruntime's own error types: each means the graph and the bindings disagree
            # onnxruntime's own complaint, where the runner already said which kernel refused the run
            complaint = failure.__cause__ if isinstance(failure, ModelLoadError) and failure.__cause__ else failure
            inputs = ", ".join(f"{i.name} {i.type}{i.shape}" for i in session.get_inputs())
            raise ModelLoadError(
                f"{graph} loads but {what} fails in onnxruntime ({type(complaint).__name__}: {complaint}); the graph "
                f"takes {inputs}: the graph does not run as decoctl binds it; re-export it, or report the layout"
            ) from failure
        if not np.isfinite(logits).all():
            raise ModelLoadError(
                f"{graph}: {what} gives logits that are not finite (NaN or infinity): the export is broken "
                "(a float16 overflow?); re-export it"
            )
    output = runner._logits
    widened = " (widened to float32 once per forward)" if output.narrow else ""
    return (
        f"dry forward ok: {encoded}{DRY_TOKENS} tokens, then one step on their cache; logits {dtype_name(output.dtype)}"
        f"{widened}, KV {dtype_name(runner.kv.dtype)} [{spec.num_kv_heads} heads x {spec.head_size}]"
    )
