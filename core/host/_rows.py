"""Several rows of one role: fork, reorder, release, and a one-token step over many rows in one Run.

rows = host.rows("target")        # row 0 is host["target"] itself
r = rows.fork(0)                  # a new row with row 0's tokens and KV (copied, not recomputed)
logits = rows.step([t0, t1])      # one token for each live row, one onnxruntime Run: float32[2, vocab]
rows.reorder([1, 1])              # beam search: rows 0 and 1 both continue what row 1 was
rows.release(r)
rows[r].forward(tokens)           # any single-sequence primitive on one row (trees, keep, rewind, ...)

Each row is a Sequence of its own over its slice of the role's batched KV buffer (decoctl.model._kv_rows), so
every single-sequence primitive works per row unchanged, multi-token forwards included (they run one row at a
time: GroupQueryAttention refuses them at batch > 1). Only the one-token step is batched.

On a model with a concatenated KV cache (Optimum's layout, encoder-decoder models included) each row is a Sequence
with a cache of its own: fork copies the row's KV (and an encoder-decoder row's encoder output and cross-attention
KV: the encoder never runs again), reorder hands the rows' caches round and copies only those that several rows
continue, and step runs each row's one-token forward in turn, one onnxruntime Run per row (``batched`` is False;
``stepping`` says so in a trace). The logits are those of the batched step; only the Runs are more.

The buffer is allocated whole when the rows are made (a concatenated-cache model's rows get their caches as they
are forked, the room for all of them checked at once), and only if it fits in the memory the system has available
now (MemAvailable): a batch or a beam width that does not fit is a ConfigError naming how many rows would, instead
of an allocation that succeeds lazily and gets the process killed half-way through a generation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq

import numpy as np

from decoctl.errors import CapabilityError, ConfigError, SequenceError
from decoctl.host._host import Sequence
from decoctl.model import _kv_rows as kv_rows
from decoctl.model._batch_step import BatchStep
from decoctl.model._capabilities import FEATURES
from decoctl.model._kv_cache import ConcatKVCache, kv_dtype
from decoctl.model._kv_rows import SharedKVRows
from decoctl.model._loader import LoadedModel
from decoctl.model._runner import RunOutputs

__all__ = ["ONE_RUN_PER_ROW", "Rows"]

ONE_RUN_PER_ROW = "one Run per row (concatenated KV cache)"
"""How rows of a model with a concatenated KV cache step (Rows.stepping), for traces."""


class Rows:
    """The rows of one role (see the module docstring). Row ids are stable until released; the lowest free id
    is reused first. ``capacity`` rows at most."""

    def __init__(
        self, role: str, model: LoadedModel, *, capacity: int, max_length: int | None = None, debug: bool | None = None
    ) -> None:
        spec = model.spec
        length = min(max_length or spec.max_length, spec.context_length)
        self.role = role
        self.model = model
        self.capacity = capacity
        dtype = kv_dtype(model.session, spec)
        rings = model.capabilities.rings
        # a split export's prefill graph writes whole padded chunks: room for the padding past the last position
        room = model.prefill.chunk if model.prefill is not None else 0
        if capacity > 1:
            row_bytes = (
                SharedKVRows.row_bytes(spec, dtype, length + room, rings)
                if spec.share_buffer
                else ConcatKVCache.row_bytes(spec, dtype, length)
            )
            _check_memory(role, model, capacity, row_bytes, length)
        #: the batched buffer of a shared-buffer model's rows; None where each row keeps a cache of its own
        self._kv = (
            SharedKVRows(spec, dtype, length + room, capacity, rings) if capacity > 1 and spec.share_buffer else None
        )
        #: the positions of each row's cache (None for a single row: the sequence's own default, as before rows)
        self._length = length if capacity > 1 else None
        self._debug = debug
        self._rows: list[Sequence | None] = [self._new_row(0)] + [None] * (capacity - 1)
        self._step: BatchStep | None = None
        #: rows whose current outputs are views of the batched step's output buffer
        self._aliased: set[int] = set()

    def _new_row(self, row: int) -> Sequence:
        kv = None if self._kv is None else self._kv.caches[row]
        return Sequence(self.role, self.model, max_length=self._length, debug=self._debug, kv=kv)

    # -- queries ------------------------------------------------------------------------------------------
    def __getitem__(self, row: int) -> Sequence:
        sequence = self._rows[row] if 0 <= row < self.capacity else None
        if sequence is None:
            raise SequenceError(
                f"role {self.role!r} has no row {row}: its live rows are {list(self.ids)} of {self.capacity} "
                "(fork one to add a row)"
            )
        return sequence

    def __len__(self) -> int:
        return sum(r is not None for r in self._rows)

    def __iter__(self) -> Iterator[Sequence]:
        return (r for r in self._rows if r is not None)

    @property
    def ids(self) -> tuple[int, ...]:
        """The live row ids, in increasing order."""
        return tuple(i for i, r in enumerate(self._rows) if r is not None)

    @property
    def batched(self) -> bool:
        """Whether step() feeds every row it is given in one onnxruntime Run (a shared-buffer model), rather than
        one Run per row (a model with a concatenated KV cache, where each row keeps a cache of its own)."""
        return self.model.spec.share_buffer

    @property
    def stepping(self) -> str:
        """How step() runs, in words for a trace ("one Run per row (concatenated KV cache)")."""
        return "one Run for every row (shared KV buffer)" if self.batched else ONE_RUN_PER_ROW

    # -- primitives -----------------------------------------------------------------------------------------
    def fork(self, row: int = 0) -> int:
        """A new row holding row ``row``'s tokens and KV cache (copied); returns its id."""
        source = self[row]
        free = next((i for i, r in enumerate(self._rows) if r is None), None)
        if free is None:
            raise SequenceError(
                f"fork({row}) on role {self.role!r}: all {self.capacity} rows are live; release one first, or ask "
                "for more rows (the controller's rows option sizes the buffer)"
            )
        source.check_batchable(f"fork({row})")
        sequence = self._new_row(free)
        self._copy_into(row, free, sequence)
        self._rows[free] = sequence
        return free

    def copy(self, source: int, destination: int) -> None:
        """Live row ``destination`` becomes a copy of live row ``source``: its tokens and KV cache, as fork gives a
        new row (a server sharing one prompt's prefill among a request's completions)."""
        from_row, to_row = self[source], self[destination]
        if source == destination:
            return
        from_row.check_batchable(f"copy({source}, {destination})")
        to_row.check_batchable(f"copy({source}, {destination})")
        self._copy_into(source, destination, to_row)

    def _copy_into(self, source: int, destination: int, sequence: Sequence) -> None:
        """Row ``destination``'s sequence takes row ``source``'s tokens and KV cache (fork, copy)."""
        sequence.runner.adapter = self[source].runner.adapter  # a copy runs its source's LoRA adapter
        if self._kv is None:
            sequence.copy_row_from(self[source])
        else:
            self._kv.copy_row(source, destination)
            sequence.adopt_tokens(self[source].tokens, self[source].images)

    def release(self, row: int) -> None:
        """Free row ``row`` (not row 0, which is the role itself); its id may be reused by the next fork."""
        self[row]
        if row == 0:
            raise SequenceError(f"release(0) on role {self.role!r}: row 0 is the role's own sequence; rewind it")
        self._rows[row] = None

    def reorder(self, parents: Seq[int] | np.ndarray) -> None:
        """Rows 0..k-1 (k = len(parents)) continue rows ``parents`` as they are now: row i takes row parents[i]'s
        tokens and KV cache (beam search). Every row named must be live; outputs of rows 0..k-1 are dropped."""
        given = np.asarray(parents).reshape(-1)
        if given.size and given.dtype.kind not in "iu":
            raise SequenceError(f"reorder({given.tolist()}): parents are row ids, whole numbers (not {given.dtype})")
        order = given.astype(np.int64)
        live = self.ids
        for row, parent in enumerate(order.tolist()):
            if parent not in live:
                raise SequenceError(
                    f"reorder({order.tolist()}) on role {self.role!r}: parent {parent} (of row {row}) is not a live "
                    f"row; the live rows are {list(live)} of {self.capacity}: name live rows only"
                )
        missing = [row for row in range(len(order)) if row not in live]
        if missing:
            raise SequenceError(
                f"reorder({order.tolist()}) on role {self.role!r}: {len(order)} parents reorder rows "
                f"0..{len(order) - 1}, but row {missing[0]} is not live (live rows: {list(live)} of {self.capacity}): "
                "fork rows until those are live, or give one parent per live row"
            )
        sources = [self[int(p)] for p in order]
        rows = [self[i] for i in range(len(order))]
        for sequence in (*sources, *rows):
            sequence.check_batchable("reorder()")
        tokens = [source.tokens.copy() for source in sources]
        images = [source.images for source in sources]
        adapters = [source.runner.adapter for source in sources]  # each row continues its parent's LoRA adapter
        if self._kv is None:
            self._hand_round(order.tolist(), tokens)
        else:
            self._kv.gather_rows(order)
            for sequence, kept, held in zip(rows, tokens, images, strict=True):
                sequence.adopt_tokens(kept, held)
        for i, adapter in enumerate(adapters):
            self[i].runner.adapter = adapter

    def _hand_round(self, parents: list[int], tokens: list[np.ndarray]) -> None:
        """reorder() where each row keeps a cache of its own, by handing runners round: a parent among rows 0..k-1
        hands its runner to one row that continues it (itself, where it continues itself); every other row takes the
        runner of a row among 0..k-1 that no row continues, and a copy of its parent's state. A runner handed on or
        copied from is never written, so each row gets its parent's state from before the call."""
        k = len(parents)
        runners = {row: self[row].runner for row in {*parents, *range(k)}}
        given = {i: runners[i] for i, parent in enumerate(parents) if parent == i}
        moved = set(given)
        for i, parent in enumerate(parents):
            if i not in given and parent < k and parent not in moved:
                given[i] = runners[parent]
                moved.add(parent)
        spare = [runners[row] for row in range(k) if row not in parents]
        for i, parent in enumerate(parents):
            if i not in given:
                given[i] = spare.pop()
                given[i].copy_from(runners[parent])
        for i, kept in enumerate(tokens):
            self[i].take_runner(given[i], kept)

    def step(self, tokens: Seq[int] | np.ndarray, rows: Seq[int] | None = None) -> np.ndarray:
        """Feed ``tokens[i]`` to row ``rows[i]`` (default: every live row in id order) in one onnxruntime Run (one
        Run per row, in that order, where ``batched`` is False); return float32[k, vocab], row i predicting the token
        after tokens[i] (host-owned; each row's slice is also, by value, that row's ``logits()`` until its next
        forward or rewind)."""
        ids = np.asarray(self.ids if rows is None else rows, dtype=np.int64).reshape(-1)
        fed = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if len(ids) != len(fed):
            raise SequenceError(f"step() got {len(fed)} tokens for {len(ids)} rows: give one token per row")
        if len(set(ids.tolist())) != len(ids):
            raise SequenceError(f"step(): rows {ids.tolist()} name a row twice")
        sequences = [self[int(r)] for r in ids]
        vocab = self.model.spec.vocab_size
        for row, sequence, token in zip(ids, sequences, fed, strict=True):
            if not 0 <= token < vocab:
                raise SequenceError(
                    f"step(): token {int(token)} for row {int(row)} is outside the vocabulary 0..{vocab - 1}"
                )
            _check_steppable(sequence, int(row))
        if len(sequences) == 1 and self._kv is None:  # one row: the row's own one-token forward
            return np.asarray(sequences[0].forward((int(fed[0]),)))
        if self._kv is None:  # each row keeps a cache of its own: one Run per row
            return np.concatenate([np.asarray(s.forward((int(t),))) for s, t in zip(sequences, fed, strict=True)])
        span = int(ids.max()) + 1
        lengths = np.array([self._kv.caches[r].length for r in range(span)], np.int64)
        every = np.zeros(span, np.int64)
        every[ids] = fed
        if self._step is None:
            self._step = BatchStep(self.model, self._kv)
        # a row stepped before holds views of the step's output rows, which this run rewrites for every row below
        # `span`: rows that this step passes over keep their outputs as copies of their own
        stepped = {int(r) for r in ids}
        for passed in self._aliased - stepped:
            other = self._rows[passed] if passed < span else None
            if other is not None:
                other.detach_outputs()
        self._aliased = stepped
        begin = time.perf_counter()
        self._kv.before_step(span)
        positions = None
        if self.model.capabilities.position_axes != 1:  # M-RoPE: a row's position is its length plus its delta
            positions = lengths.copy()
            for index, sequence in zip(ids, sequences, strict=True):
                positions[index] = sequence.runner.next_position()
        if self.model.adapters is None:
            outputs = self._step.run(every, lengths, positions)
        else:  # each row's LoRA table (a row not stepped: any, its output is ignored)
            adapters = np.array([r.runner.adapter if r is not None else 0 for r in self._rows[:span]], np.int64)
            outputs = self._step.run(every, lengths, positions, adapters)
        self._kv.after_step(span, stepped)
        seconds = time.perf_counter() - begin
        for row, sequence, token in zip(ids, sequences, fed, strict=True):
            r = int(row)
            hidden = None if outputs.hidden is None else outputs.hidden[r : r + 1]
            aux = None if outputs.aux is None else outputs.aux[r : r + 1]
            sequence.record_step(int(token), RunOutputs(outputs.logits[r : r + 1], hidden, aux), seconds / len(ids))
        return outputs.logits[ids] if not np.array_equal(ids, np.arange(span)) else outputs.logits


def _check_steppable(sequence: Sequence, row: int) -> None:
    """Refuse a batched step of row ``row``: one holding a whole tree, a full one, or one of a draft head (which
    takes features per token, which batched steps do not feed)."""
    sequence.check_batchable(f"step() on row {row}")
    if sequence.length >= sequence.max_length:
        raise SequenceError(
            f"step() on role {sequence.role!r} row {row}: its KV cache is full ({sequence.max_length} positions); "
            "release or rewind it"
        )
    if sequence.model.capabilities.feature_input is not None:
        raise CapabilityError(
            f"step() over several rows of role {sequence.role!r}: model {sequence.model.name} takes {FEATURES} per "
            "token, which batched steps do not feed; forward each row with its features instead"
        )


def _check_memory(role: str, model: LoadedModel, capacity: int, row_bytes: int, length: int) -> None:
    """Refuse rows whose KV buffer would not fit in the memory available now (ConfigError naming the rows that do)."""
    available = kv_rows.available_memory()
    if available is None or capacity * row_bytes <= available:
        return
    fit = available // row_bytes
    room = f"use at most {fit} rows" if fit > 1 else "even two rows do not fit"
    raise ConfigError(
        f"role {role!r} needs {capacity} rows of {length} positions, {_size(capacity * row_bytes)} of KV cache for "
        f"model {model.name} ({_size(row_bytes)} a row), but only {_size(available)} of memory is available: {room} "
        "(a smaller batch_size or num_beams), or fewer positions (shorter prompts, a smaller max_new_tokens)"
    )


def _size(count: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.1f} {unit}"
    return f"{count} bytes"
