"""When a speculating row should stop drafting and join the batched one-token step: the engine's cost rule.

A row whose controller drafts and verifies steps alone: while its draft and verify forwards run, every batched row
waits. Alone, that is the speedup the controller's own rule (decoctl.draft_length) measured; under load it may cost
the batch more than it gains. Each engine step, for each speculating row whose output is greedy's, the rule compares
the engine's throughput (tokens over the step's seconds) both ways, from costs measured as the engine runs:

    stay:  (B + c) / (t(S) + s)        join:  (B + 1) / t(S')

B is the rows stepped in the batched Run; S its span, the rows it computes (one Run computes rows 0 to the highest
it steps: decoctl.host.Rows), and S' the span with this row in; t(n) the seconds of a Run spanning n rows (its mean,
measured; an n not yet measured is priced on the line through the nearest two measured, or proportionally from
one), s the row's mean
seconds per step and c its mean tokens per step (over its last ``WINDOW`` steps, once it has ``MIN_STEPS``). A row
joins when joining gives more; a lone row (B = 0) joins only against a Run of its span actually measured to beat
its own steps, which its controller's rule already avoids: alone it keeps its full speedup.

Joining is one-way and exact: the engine feeds the row's pending token in the batched Run and steps it with greedy
from then on, which commits the tokens the speculating controller would have (it verified greedily).
"""

from __future__ import annotations

import collections
from collections.abc import Hashable

__all__ = ["JoinRule"]

#: a speculating row's steps the rule averages over
WINDOW = 16
#: steps a speculating row takes before the rule judges it
MIN_STEPS = 4
#: batched Runs per size the rule averages over
RUNS_KEPT = 32


class JoinRule:
    """Measured costs of the batched Run by its rows and of each speculating row's steps; ``joins`` decides."""

    def __init__(self) -> None:
        self._runs: dict[int, collections.deque[float]] = {}
        self._steps: dict[Hashable, collections.deque[tuple[int, float]]] = {}

    def observe_run(self, rows: int, seconds: float) -> None:
        """A batched Run spanning ``rows`` rows took ``seconds``."""
        self._runs.setdefault(rows, collections.deque(maxlen=RUNS_KEPT)).append(seconds)

    def observe_step(self, row: Hashable, tokens: int, seconds: float) -> None:
        """Speculating row ``row`` committed ``tokens`` in a step of ``seconds``."""
        self._steps.setdefault(row, collections.deque(maxlen=WINDOW)).append((tokens, seconds))

    def forget(self, row: Hashable) -> None:
        self._steps.pop(row, None)

    def run_seconds(self, rows: int) -> float | None:
        """t(rows): measured, or priced from the nearest measured sizes; None before any Run was measured."""
        if rows <= 0:
            return 0.0
        measured = {n: sum(times) / len(times) for n, times in self._runs.items() if times}
        if rows in measured:
            return measured[rows]
        if not measured:
            return None
        nearest = sorted(measured, key=lambda n: (abs(n - rows), n))[:2]
        if len(nearest) == 1:
            n = nearest[0]
            return measured[n] * rows / n
        (a, ta), (b, tb) = sorted((n, measured[n]) for n in nearest)
        slope = max(0.0, (tb - ta) / (b - a))
        return max(0.0, ta + slope * (rows - a))

    def joins(self, row: Hashable, batch_rows: int, *, span: int | None = None, joined_span: int | None = None) -> bool:
        """Whether speculating row ``row`` should join a batched Run stepping ``batch_rows`` other rows now; ``span``
        and ``joined_span``: the rows that Run computes without and with it (default: the rows it steps)."""
        steps = self._steps.get(row)
        if steps is None or len(steps) < MIN_STEPS:
            return False
        span = batch_rows if span is None else span
        joined_span = batch_rows + 1 if joined_span is None else joined_span
        if batch_rows == 0 and joined_span not in self._runs:  # alone: only against such a Run actually measured
            return False
        joined, alone = self.run_seconds(joined_span), self.run_seconds(span)
        if joined is None or alone is None or joined <= 0:
            return False
        tokens = sum(t for t, _ in steps) / len(steps)
        seconds = sum(s for _, s in steps) / len(steps)
        stay = (batch_rows + tokens) / (alone + seconds)
        join = (batch_rows + 1) / joined
        return join > stay
