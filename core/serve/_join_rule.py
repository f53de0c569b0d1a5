"""When a speculating row should draft and when it should step in the batched one-token step: the engine's cost rule.

A row whose controller drafts and verifies steps alone: while its draft and verify forwards run, every batched row
waits. Alone, that is the speedup the controller's own rule (decoctl.draft_length) measured; under load it may cost
the batch more than it gains. Each engine step, for each speculating row whose output is greedy's, the rule compares
the engine's throughput (tokens over the step's seconds) both ways, from costs measured as the engine runs:

    stay:  (B + c) / (t(S) + s)        join:  (B + 1) / t(S')

B is the rows stepped in the batched Run; S its span, the rows it computes (one Run computes rows 0 to the highest
it steps: decoctl.host.Rows), and S' the span with this row in; t(n) the seconds of a Run spanning n rows (its mean,
measured; an n not yet measured is priced on the line through the nearest two measured, or proportionally from
one), s the row's mean seconds per step and c its mean tokens per step (over its last ``WINDOW`` steps, once it
has ``MIN_STEPS``). A row joins when joining gives more; a lone row (B = 0) joins only against a Run of its span
actually measured to beat its own steps, which its controller's rule already avoids: alone it keeps its full
speedup.

Each step the engine asks ``choose`` about every speculating row at once, those drafting and those the batched Run
stepped last step alike: several rows that all draft stall each other as much as the batch (16 rows verifying one
after the other make a step of 16 verify forwards), so the rule weighs the rows together. It ranks them by their
drafting's tokens a second and takes the split, the best m drafting and the others in the Run, that gives the step
the most tokens a second:

    (B + J + sum of c over the m) / (t(S_J) + sum of s over the m)

J the rows in the Run and S_J the span with them in. The decision is per step and goes both ways: a row joins when
the batch grows and drafts again when it shrinks (the engine keeps its drafting controller aside, which takes the
row back with ``resume``). A split other than the rows' present one must give ``SWITCH_GAIN`` times more, so
estimates a few percent apart do not move rows back and forth; one that joins a row whose controller cannot take
it back (no ``resume``: that join is for good) must give ``JOIN_GAIN`` times more.

A row with fewer than ``MIN_STEPS`` steps of its own is judged by the steps of every row of its kind (the same
controller and options) the engine has seen, so that under load a new request joins at its first step. While
nothing of its kind is measured, one row of the kind drafts (its steps measure the kind) and the others join the
Run where that costs less than their plain steps alone would (t(S_J) - t(S) under J one-row Runs: no drafting step
costs less than one). A Run of a size never measured is priced, before any Run was measured, by a prompt forward
over as many tokens (the same weights read once, one row a token; optimistic, as that forward computes only its
last logits: the first Runs measured correct it).

Joining and resuming are exact: the engine feeds the row's pending token in the batched Run and steps it with greedy,
which commits the tokens the speculating controller would have (it verified greedily); resuming, the controller
rebuilds its context from the prompt and the output and makes the last committed token pending again. A row's
estimate is what it measured while drafting: while it is in the Run nothing new is measured for it.

Prompts: a prompt's forward stalls the batched rows as a drafting step does. With rows decoding, each step has a
budget of prompt work (``prefill_budget``) that the waiting prompts' chunks spend in turn, the first at least one
token: ``prefill_share`` (``PREFILL_SHARE`` by default) of the batched Run's measured seconds, and at least
``MIN_CHUNK`` one-row steps (one-token forwards with their logits: a forward's fixed cost, reading the weights,
would make smaller chunks mostly waste); while the batch is not full, what keeps the step within a full batch's step
with its share (the rows wait no longer than they would beside a full batch, and prompts behind a few rows go in
large chunks, several a step, rather than a token a step). Chunks are priced on a line fitted to the recent prompt
forwards (a fixed cost and a cost a token, robust to stalls), apart by whether the forward computes its last row's
logits: a chunk before a prompt's last skips the LM head, on a large vocabulary most of a short chunk's cost (a row
stepped by a batched controller feeds its prompt's last token in the batched Run, so none of its chunks computes
logits). With no row decoding, the prompts go in whole.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Collection, Hashable, Mapping

__all__ = ["JoinRule"]

#: a speculating row's steps the rule averages over
WINDOW = 16
#: steps a speculating row takes before the rule judges it
MIN_STEPS = 4
#: batched Runs per size the rule averages over
RUNS_KEPT = 32
#: prompt forwards of each kind (with logits, without) the rule fits its price line to
PREFILLS_KEPT = 32
#: steps of every row of a kind the rule averages over, for the rows with too few steps of their own
KIND_WINDOW = 64
#: kinds (controller and options) whose steps are kept; past it the least recently seen kind is forgotten, so that
#: requests naming ever new options cannot grow the table
KINDS_KEPT = 64
#: the share of a batched Run's seconds a step may add to it with prompt chunks (the default: JoinRule's
#: ``prefill_share``, decoctl serve's --prefill-share): more admits prompts faster and keeps the batch fuller, less
#: holds the inter-token latency of the rows decoding closer to the batched Run's
PREFILL_SHARE = 0.5
#: a step's prompt work may take up to this many one-row steps (a one-token forward with its logits) however small
#: the batched Run: a forward's fixed cost, reading the weights, would make smaller chunks mostly waste
MIN_CHUNK = 1.2
#: a split of the speculating rows other than their present one must give this many times the tokens a second (the
#: rule's hysteresis: estimates a few percent apart do not move rows back and forth, and a lone row whose plain steps
#: cost about what a one-row Run does keeps drafting)
SWITCH_GAIN = 1.1
#: a split that joins a row for good (its controller cannot take the row back) must give this many times more
JOIN_GAIN = 1.2


class JoinRule:
    """Measured costs of the batched Run by its rows and of each speculating row's steps; ``joins`` decides."""

    def __init__(self, *, prefill_share: float = PREFILL_SHARE) -> None:
        if prefill_share <= 0:
            raise ValueError(f"prefill_share={prefill_share} must be above 0")
        self.prefill_share = prefill_share
        self._runs: dict[int, collections.deque[float]] = {}
        #: prompt forwards by whether they computed their last row's logits, then by size
        self._prefills: dict[bool, collections.deque[tuple[int, float]]] = {
            kind: collections.deque(maxlen=PREFILLS_KEPT) for kind in (True, False)
        }
        #: the means of _runs by size and the prefills' price lines, while no new one was observed (the rule prices
        #: many a step)
        self._run_means: dict[int, float] | None = None
        self._prefill_lines: dict[bool, tuple[float, float] | None] = {}
        self._steps: dict[Hashable, collections.deque[tuple[int, float]]] = {}
        #: by recency of use, the oldest first (at most KINDS_KEPT)
        self._kinds: collections.OrderedDict[Hashable, collections.deque[tuple[int, float]]] = collections.OrderedDict()

    def observe_run(self, rows: int, seconds: float) -> None:
        """A batched Run spanning ``rows`` rows took ``seconds``."""
        self._runs.setdefault(rows, collections.deque(maxlen=RUNS_KEPT)).append(seconds)
        self._run_means = None

    def observe_prefill(self, tokens: int, seconds: float, *, logits: bool = True) -> None:
        """A prompt's forward over ``tokens`` tokens took ``seconds``; ``logits``: it computed its last row's logits
        (the prompt's last chunk), else none (a chunk before the last skips the LM head)."""
        self._prefills[logits].append((tokens, seconds))
        self._prefill_lines.pop(logits, None)

    def observe_step(self, row: Hashable, tokens: int, seconds: float, kind: Hashable = None) -> None:
        """Speculating row ``row`` (of ``kind``: its controller and options) committed ``tokens`` in a step of
        ``seconds``."""
        self._steps.setdefault(row, collections.deque(maxlen=WINDOW)).append((tokens, seconds))
        self._kinds.setdefault(kind, collections.deque(maxlen=KIND_WINDOW)).append((tokens, seconds))
        self._kinds.move_to_end(kind)
        while len(self._kinds) > KINDS_KEPT:
            self._kinds.popitem(last=False)

    def forget(self, row: Hashable) -> None:
        self._steps.pop(row, None)

    def run_seconds(self, rows: int) -> float | None:
        """t(rows): measured, or priced from the nearest measured sizes; before any Run was measured, a prompt
        forward over ``rows`` tokens; None before either."""
        if rows <= 0:
            return 0.0
        return _priced(self._runs_by_size(), rows) or self.prefill_seconds(rows)

    def prefill_seconds(self, tokens: int, *, logits: bool = True) -> float | None:
        """A prompt forward over ``tokens`` tokens, with its last row's logits or with none, priced on the line
        fitted to the last ``PREFILLS_KEPT`` forwards of its kind (of the other kind while none of its own is
        measured; see ``_line``); None before any was measured. A line rather than a mean by size: the rule
        chooses the sizes, and a size once measured slow (a stall) would otherwise never be chosen, so never
        measured again."""
        if tokens <= 0:
            return 0.0
        line = self._prefill_line(logits) or self._prefill_line(not logits)
        if line is None:
            return None
        fixed, per_token = line
        return max(0.0, fixed + per_token * tokens)

    def _runs_by_size(self) -> dict[int, float]:
        if self._run_means is None:
            self._run_means = _means(self._runs)
        return self._run_means

    def _prefill_line(self, logits: bool) -> tuple[float, float] | None:
        if logits not in self._prefill_lines:
            self._prefill_lines[logits] = _line(self._prefills[logits])
        return self._prefill_lines[logits]

    def prefill_budget(self, span: int, capacity: int | None = None) -> float | None:
        """The seconds of prompt work a step whose batched Run spans ``span`` rows of ``capacity`` may add (see the
        module docstring); None before a Run and a prompt forward were measured (prompts then go in whole)."""
        runs = self._runs_by_size()
        run = _priced(runs, span)
        one = self.run_seconds(1)
        if run is None or not one or self.prefill_seconds(1) is None:
            return None
        allowance = max(self.prefill_share * run, MIN_CHUNK * one)
        if capacity is not None and capacity > span:
            # a step no longer than a full batch's, with its share: what its rows would wait beside a full batch.
            # Before a Run that wide was measured, it is priced in proportion to the widest one measured (more than
            # it will cost, a Run reading its weights once: prompts go in faster while the batch fills)
            widest = max(runs)
            full = (
                runs[capacity]
                if capacity in runs
                else max(_priced(runs, capacity) or 0.0, runs[widest] * capacity / widest)
            )
            allowance = max(allowance, (1 + self.prefill_share) * full - run)
        return allowance

    def prefill_tokens_within(self, budget: float, remaining: int, *, logits: bool = True) -> int:
        """How many of a prompt's ``remaining`` tokens fit in ``budget`` seconds (at least one); ``logits``: the
        chunk that ends the remaining tokens computes its last row's logits (a chunk before it computes none, and
        is priced so)."""
        tokens = 1
        while tokens < remaining:
            ending = logits and tokens + 1 == remaining
            if (self.prefill_seconds(tokens + 1, logits=ending) or 0.0) > budget:
                break
            tokens += 1
        return tokens

    def estimate(self, row: Hashable, kind: Hashable = None) -> tuple[float, float] | None:
        """A speculating row's mean (tokens, seconds) a step: its own, or its kind's while it has too few."""
        steps = self._steps.get(row)
        if steps is None or len(steps) < MIN_STEPS:
            steps = self._kinds.get(kind)
        if steps is None or len(steps) < MIN_STEPS:
            return None
        return sum(t for t, _ in steps) / len(steps), sum(s for _, s in steps) / len(steps)

    def choose(
        self,
        rows: Mapping[Hashable, tuple[int, Hashable]],
        batch_rows: int,
        span: int,
        *,
        batched: Collection[Hashable] = (),
        final: Collection[Hashable] = (),
        fresh: Collection[Hashable] = (),
    ) -> set[Hashable]:
        """Which speculating rows step in the batched Run this step (the others draft), beside ``batch_rows`` other
        rows spanning ``span`` rows: ``rows`` maps each to (its row index, its kind); ``batched``: those the Run
        stepped last step; ``final``: those whose join is for good (their controller cannot take its row back);
        ``fresh``: those placed for the first time (no place to keep: no hysteresis for them). See the module
        docstring."""
        judged: list[tuple[float, int, Hashable, float, float]] = []
        unmeasured: dict[Hashable, list[tuple[int, Hashable]]] = {}
        for key, (index, kind) in rows.items():
            estimate = self.estimate(key, kind)
            if estimate is not None and estimate[1] > 0:
                judged.append((estimate[0] / estimate[1], index, key, *estimate))
            else:
                unmeasured.setdefault(kind, []).append((index, key))
        chosen = self._unmeasured_joining(unmeasured, batched, final, batch_rows, span)
        batch_rows += len(chosen)
        span = max([span, *(rows[key][0] + 1 for key in chosen)])
        judged.sort(key=lambda j: (-j[0], -j[1]))  # the rows whose drafting pays most first; ties: the higher row

        def rate(joining: list[tuple[float, int, Hashable, float, float]]) -> float | None:
            keys = {j[2] for j in joining}
            drafting = [j for j in judged if j[2] not in keys]
            run = self.run_seconds(max([span, *(j[1] + 1 for j in joining)])) if batch_rows + len(joining) else 0.0
            if run is None:
                return None
            seconds = run + sum(j[4] for j in drafting)
            tokens = batch_rows + len(joining) + sum(j[3] for j in drafting)
            return tokens / seconds if seconds > 0 else 0.0

        now = [j for j in judged if j[2] in batched]
        best, joining = rate(now) or 0.0, now
        present = {j[2] for j in now}
        # m = len(judged) (every row drafting) down to 0 (every row joining); a split that moves a row from its
        # present place must give SWITCH_GAIN times more (JOIN_GAIN where it joins a row for good); a fresh row has
        # no place yet (it is counted drafting in the present split), so splits that move fresh rows only are
        # weighed as they are
        for m in range(len(judged), -1, -1):
            split = judged[m:]
            keys = {j[2] for j in split}
            moved = keys ^ present
            if not moved:
                continue
            if batch_rows == 0 and len(split) == 1 and max(span, split[0][1] + 1) not in self._runs:
                continue  # a lone row joins only against such a Run actually measured
            value = rate(split)
            if value is None:
                continue
            if any(key in final for key in keys - present):
                gain = JOIN_GAIN
            elif moved <= set(fresh):
                gain = 1.0
            else:
                gain = SWITCH_GAIN
            if value / gain > best:
                best, joining = value / gain, split
        return chosen | {j[2] for j in joining}

    def _unmeasured_joining(
        self,
        unmeasured: Mapping[Hashable, list[tuple[int, Hashable]]],
        batched: Collection[Hashable],
        final: Collection[Hashable],
        batch_rows: int,
        span: int,
    ) -> set[Hashable]:
        """The rows with nothing measured of their kind that step in the Run: one row of each kind drafts (its
        steps measure the kind, by which the others are judged after ``MIN_STEPS``); the others join where the Run
        with them in costs less than each one's plain step alone would (a one-row Run: the least a drafting step
        costs). A row whose join is for good always drafts until measured."""
        joining: set[Hashable] = set()
        for members in unmeasured.values():
            # the row that drafts: one drafting already (the lowest), else the lowest
            members = sorted(members, key=lambda m: (m[1] in batched, m[0]))
            candidates = [m for m in members[1:] if m[1] not in final]
            if not candidates:
                continue
            top = max(span, *(index + 1 for index, _ in candidates))
            run, alone, before = self.run_seconds(top), self.run_seconds(1), self.run_seconds(span)
            if run is None or alone is None or before is None:
                continue
            if run - before < len(candidates) * alone:
                joining.update(key for _, key in candidates)
                span, batch_rows = top, batch_rows + len(candidates)
        return joining

    def joins(self, row: Hashable, batch_rows: int, *, span: int | None = None, joined_span: int | None = None) -> bool:
        """Whether speculating row ``row``, the only one and drafting now, should join a batched Run stepping
        ``batch_rows`` other rows now; ``span`` and ``joined_span``: the rows that Run computes without and with it
        (default: the rows it steps)."""
        span = batch_rows if span is None else span
        joined_span = batch_rows + 1 if joined_span is None else joined_span
        return row in self.choose({row: (joined_span - 1, None)}, batch_rows, span)


def _means(measured: Mapping[int, collections.deque[float]]) -> dict[int, float]:
    return {n: sum(times) / len(times) for n, times in measured.items() if times}


def _line(points: Collection[tuple[int, float]]) -> tuple[float, float] | None:
    """(fixed seconds, seconds a token) of the Theil-Sen line through ``points`` (tokens, seconds): the median of
    the slopes between points of different sizes (at least 0), and the median intercept under it, so that a few
    stalls do not move it; through the origin where every point has the same size; None for no points."""
    if not points:
        return None
    pairs = list(points)
    slopes = [(t2 - t1) / (n2 - n1) for i, (n1, t1) in enumerate(pairs) for n2, t2 in pairs[i + 1 :] if n2 != n1]
    if not slopes:
        return 0.0, statistics.median(t for _, t in pairs) / pairs[0][0]
    slope = max(0.0, statistics.median(slopes))
    return statistics.median(t - slope * n for n, t in pairs), slope


def _priced(means: Mapping[int, float], size: int) -> float | None:
    """The mean seconds of ``size``, or priced on the line through the nearest two measured sizes (proportionally
    from one); None where nothing is measured."""
    if size in means:
        return means[size]
    if not means:
        return None
    nearest = sorted(means, key=lambda n: (abs(n - size), n))[:2]
    if len(nearest) == 1:
        n = nearest[0]
        return means[n] * size / n
    (a, ta), (b, tb) = sorted((n, means[n]) for n in nearest)
    slope = max(0.0, (tb - ta) / (b - a))
    return max(0.0, ta + slope * (size - a))
