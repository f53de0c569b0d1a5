"""Ring caches: the KV of sliding-window layers kept in window-sized buffers (GroupQueryAttention's
``sliding_window_cache=1``).

The kernel owns the layout. With capacity C and kernel window Wk (the node's ``local_window_size``), after T tokens
rows ``[0, L(T))`` hold positions ``T - L(T) .. T - 1`` in order, where ``L(T) = T`` up to C and beyond it drops
by ``G = C - Wk + 1`` positions at a time (onnxruntime's GroupQueryAttention documentation, "Windowed KV Cache").
The layout depends on T alone, not on how the tokens were split into runs.

Rewinding is what a speculative controller does after every verification, and the kernel can only honour it
while no eviction happened since: an eviction drops positions that the shorter sequence still needs. So every
ring layer keeps a *spill*: the ``slack`` positions most recently evicted, copied out of the rows just before
the run that evicts them (an eviction comes once every G tokens). A rewind or a tree's ``keep`` lays the rows out
for the new length from the rows and the spill. The next query at position t reads positions ``t - Wk + 1 .. t``
only, so a rewind by up to ``slack + 1`` tokens is always exact; a deeper one is exact while what it needs is
still held, and otherwise refused by name (SequenceError), never approximated.

Tree forwards: the loader widens the kernel window of ring layers that read a tree's attention bias by ``slack``
positions and puts the model's own window into the bias (decoctl.model.graph._window_bias), so a tree of up to
``slack + 1`` tokens gives every row the plain forward of its path; a larger one is refused (CapabilityError).
"""

from __future__ import annotations

import attrs
import numpy as np

from decoctl.errors import CapabilityError, SequenceError

__all__ = ["DEFAULT_SLACK", "RingGroup", "RingLayer", "RingLayers", "resident_count", "ring_groups"]

#: positions a ring layer holds beyond its kernel window (C - Wk), the spill's size, and the kernel window's
#: widening for trees: rewinds by up to DEFAULT_SLACK + 1 tokens and trees of up to DEFAULT_SLACK + 1 tokens
#: stay exact (speculative decoding verifies at most k_max + 1 = 9 tokens at a time; lookahead's and EAGLE's
#: default trees are smaller than 65). On Gemma 3 (window 512) it keeps the KV at 8,192 tokens under a quarter
#: of the full-length cache's.
DEFAULT_SLACK = 64


@attrs.frozen(kw_only=True)
class RingLayer:
    """A layer whose GroupQueryAttention keeps a window-sized cache. ``window``: the model's window (a query at
    position p sees keys p - window + 1 .. p); ``kernel_window``: the node's local_window_size as the graph runs
    (wider than ``window`` where the loader moved the window into a tree bias)."""

    layer: int
    window: int
    kernel_window: int
    slack: int = DEFAULT_SLACK

    def capacity(self, max_length: int) -> int:
        """The rows its buffer gets for a sequence of at most ``max_length`` positions: the kernel window plus the
        slack (never less than the kernel window, never more than the sequence needs)."""
        return max(self.kernel_window, min(self.kernel_window + self.slack, max_length))


def resident_count(length: int, capacity: int, kernel_window: int) -> int:
    """L(T): how many positions the kernel keeps after ``length`` tokens (the newest, from row 0)."""
    if length <= capacity:
        return length
    step = capacity - kernel_window + 1
    return length - step * -(-(length - capacity) // step)


class RingGroup:
    """The ring layers of one sequence that share a kernel window and a capacity (one layout), with their spill.

    ``tensors``: the key and value buffers, each [1, kv_heads, capacity, head_size] (views into someone's memory
    or its own); ``spills``: one [1, kv_heads, slack, head_size] buffer per tensor (position p in slot p % slack).
    State, in positions: the spill holds ``[spill_lo, spill_hi)``; the rows hold valid data from ``rows_from``.
    """

    def __init__(
        self,
        *,
        layers: tuple[RingLayer, ...],
        capacity: int,
        slack: int,
        tensors: list[np.ndarray],
        spills: list[np.ndarray],
    ) -> None:
        self.layers = layers
        self.window = min(r.window for r in layers)
        self.kernel_window = layers[0].kernel_window
        self.capacity = capacity
        self.slack = slack
        self.tensors = tensors
        self.spills = spills
        self.spill_lo = 0
        self.spill_hi = 0
        self.rows_from = 0

    def lo(self, length: int) -> int:
        """The position in row 0 after ``length`` tokens."""
        return length - resident_count(length, self.capacity, self.kernel_window)

    def available_from(self, length: int) -> int:
        """The lowest position p such that every position p .. length - 1 is held (rows or spill)."""
        rows = max(self.lo(length), self.rows_from)
        if self.spill_hi >= rows and self.spill_lo < self.spill_hi:
            return min(self.spill_lo, rows)
        return rows

    def needed_from(self, length: int) -> int:
        """The lowest position a query at position ``length`` (the next token) reads."""
        return max(0, length - self.kernel_window + 1)

    def before_run(self, length: int, n: int) -> None:
        """A run is about to feed ``n`` tokens after ``length``: keep in the spill what it will evict."""
        lo0, lo1 = self.lo(length), self.lo(length + n)
        if lo1 == lo0 or self.slack == 0:
            return
        if lo1 > length:  # the run evicts some of its own tokens: nothing below lo1 stays reachable
            self.spill_lo = self.spill_hi = self.rows_from = lo1
            return
        keep_from = max(lo1 - self.slack, self.available_from(length))
        first = max(keep_from, lo0, self.rows_from)
        if first < lo1:
            self._to_spill(first, lo1, lo0)
        self.spill_lo, self.spill_hi = keep_from, lo1

    def _to_spill(self, first: int, end: int, lo: int) -> None:
        slots = np.arange(first, end) % self.slack
        for tensor, spill in zip(self.tensors, self.spills, strict=True):
            spill[:, :, slots] = tensor[:, :, first - lo : end - lo]

    def _plan(self, old: int, new: int, sources: np.ndarray | None, start: int) -> tuple[np.ndarray, np.ndarray]:
        """The positions the rows for length ``new`` must hold and where each one's data is now (an old position),
        or SequenceError where a position the next query reads is no longer held."""
        held = self.available_from(old)
        need = self.needed_from(new)
        positions = np.arange(max(self.lo(new), held), new)
        origin = positions.copy()
        if sources is not None:
            kept = positions >= start
            origin[kept] = sources[positions[kept] - start]
        if (need < new and need < held) or (len(origin) and int(origin.min()) < held):
            raise SequenceError(self._lost(old, new, held, need))
        return positions, origin

    def moves(self, old: int, new: int, sources: np.ndarray | None) -> bool:
        """Whether going from length ``old`` to ``new`` moves rows: a tree's keep always does; a rewind does where
        the kernel's layout for ``new`` differs, or where the next query reads positions below the rows' valid
        ones (an earlier lay-out left them behind: they come from the spill, or the rewind is refused)."""
        return sources is not None or self.lo(new) != self.lo(old) or self.needed_from(new) < self.rows_from

    def check(self, old: int, new: int, sources: np.ndarray | None = None, start: int = 0) -> None:
        if self.moves(old, new, sources):
            self._plan(old, new, sources, start)

    def relayout(self, old: int, new: int, sources: np.ndarray | None = None, start: int = 0) -> None:
        """Lay the rows out for length ``new`` (from ``old``): position p < ``start`` keeps its data, position p
        >= ``start`` takes the data of old position ``sources[p - start]`` (a tree's kept path). Raises
        SequenceError (nothing changed) where a position the next query reads is no longer held."""
        cut = start if sources is not None else new
        if not self.moves(old, new, sources):  # the kernel's own layout for the shorter length: nothing moves
            self.spill_hi = min(self.spill_hi, cut)
            return
        positions, origin = self._plan(old, new, sources, start)
        lo_old, lo_new = self.lo(old), self.lo(new)
        in_rows = origin >= max(lo_old, self.rows_from)
        from_rows = origin[in_rows] - lo_old
        from_spill = origin[~in_rows] % max(self.slack, 1)
        target = positions - lo_new
        for tensor, spill in zip(self.tensors, self.spills, strict=True):
            rows = tensor[:, :, from_rows]  # fancy indexing copies: every read happens before any write
            spilled = spill[:, :, from_spill]
            tensor[:, :, target[in_rows]] = rows
            tensor[:, :, target[~in_rows]] = spilled
        self.rows_from = int(positions[0]) if len(positions) else new
        self.spill_hi = min(self.spill_hi, cut)
        if self.spill_hi <= self.spill_lo:
            self.spill_lo = self.spill_hi = 0

    def _lost(self, old: int, new: int, held: int, need: int) -> str:
        layers = ", ".join(str(r.layer) for r in self.layers)
        return (
            f"rewind from {old} to {new} tokens: the sliding-window layers {layers} (window {self.window}, ring of "
            f"{self.capacity} positions and a spill of {self.slack}) need positions from {need} on but hold only "
            f"those from {held} on; a ring cache keeps exact rewinds of up to {self.slack + 1} tokens (the slack) "
            "after the forward that moved past them: rewind less far, or load the model with a larger ring_slack "
            "(decoctl.model.load_model)"
        )


class RingLayers:
    """Every ring group of one sequence: what a SharedKVCache delegates its ring layers' bookkeeping to."""

    def __init__(self, groups: list[RingGroup]) -> None:
        self.groups = groups
        self.tree_limit = min((g.kernel_window - g.window + 1 for g in groups), default=0)

    def before_run(self, length: int, n: int) -> None:
        for group in self.groups:
            group.before_run(length, n)

    def check_tree(self, n: int, model: str) -> None:
        """Refuse a tree of ``n`` tokens that the kernel's window would cut (see the module docstring)."""
        if n > self.tree_limit:
            group = self.groups[0]
            if group.kernel_window == group.window:
                why = "its graph takes no tree bias on those layers, so the kernel's window counts slots, not positions"
            else:
                why = f"the kernel's window is widened by {group.kernel_window - group.window} for trees"
            raise CapabilityError(
                f"a tree of {n} tokens on model {model}: its sliding-window layers keep a ring cache (window "
                f"{group.window}) and {why}; trees of at most {max(self.tree_limit, 1)} tokens are exact there: "
                "draft a smaller tree, or a chain"
            )

    def relayout(self, old: int, new: int, sources: np.ndarray | None = None, start: int = 0) -> None:
        for group in self.groups:  # every group checked before any moves: a refused rewind changes nothing
            group.check(old, new, sources, start)
        for group in self.groups:
            group.relayout(old, new, sources, start)

    def state(self) -> list[tuple[int, int, int]]:
        """Each group's bookkeeping (spill range, first valid row's position): what a copy of the rows needs too."""
        return [(g.spill_lo, g.spill_hi, g.rows_from) for g in self.groups]

    def restore(self, state: list[tuple[int, int, int]]) -> None:
        """Take the bookkeeping ``state()`` gave (of this sequence or another of the same model)."""
        for group, (spill_lo, spill_hi, rows_from) in zip(self.groups, state, strict=True):
            group.spill_lo, group.spill_hi, group.rows_from = spill_lo, spill_hi, rows_from


def ring_groups(
    rings: tuple[RingLayer, ...],
    max_length: int,
    tensors: dict[int, tuple[np.ndarray, np.ndarray]],
    spills: dict[int, tuple[np.ndarray, np.ndarray]],
) -> RingLayers:
    """The ring layers grouped by (kernel window, capacity) over their buffers (``tensors``: key and value per
    ring layer, [1, kv_heads, capacity, head_size]; ``spills``: the same with ``slack`` rows)."""
    grouped: dict[tuple[int, int, int], list[RingLayer]] = {}
    for ring in rings:
        grouped.setdefault((ring.kernel_window, ring.capacity(max_length), ring.slack), []).append(ring)
    groups = [
        RingGroup(
            layers=tuple(layers),
            capacity=capacity,
            slack=slack,
            tensors=[t for r in layers for t in tensors[r.layer]],
            spills=[t for r in layers for t in spills[r.layer]],
        )
        for (_, capacity, slack), layers in sorted(grouped.items())
    ]
    return RingLayers(groups)
