"""How many drafted tokens to verify: a fixed k, HF transformers' schedule, or the length that pays most.

A drafting controller asks its rule before each verify how many tokens to draft (``choose``) and tells it afterwards
what the step cost and what the target kept (``observe``); ``draft_length(options, controller=...)`` builds the rule
that the options ``k``, ``adaptive``, ``length_rule``, ``k_min`` and ``k_max`` ask for. The speculative and EAGLE
controllers draft with it.

On a CPU a verify forward over n tokens is far from free (measured on Gemma 3 270M int8, one thread: c(2) = 1.2,
c(5) = 2.2, c(9) = 3.6 one-token forwards), so drafting more than the target will accept costs real time. The
``cost`` rule picks, before each verify, the k that maximises the expected tokens per unit of cost

    E(k) / C(k),   E(k) = (1 - a^(k+1)) / (1 - a),   C(0) = c(1) = 1,   C(k) = c(k + 1) + u(b) + (k - s) * d

where a is the per-token acceptance probability, c(n) the cost of a target forward over n tokens in one-token
forwards, d the cost of one draft step (0 for prompt lookup), u(b) the cost of catching the drafter up on the b
committed tokens it has not been fed yet (0 for a drafter that reports no catch-ups), and s = 1 when the catch-up's
last row already gives the first draft (an EAGLE head: k drafts take k - 1 head forwards after it; the catch-up's
time then includes drafting that first token), else 0.
Everything is learnt online from this generation's own steps, in the seconds its controller measured:

- a per *bucket* (prompt lookup buckets by the length of the n-gram it matched; a draft model or head has one
  bucket) as the maximum-likelihood estimate of a geometric acceptance, with one accepted and one rejected
  pseudo-draft as prior;
- c(n) as the mean of the measured verify times over n tokens divided by the one-token time (the first step of a
  generation verifies no draft, to time a one-token forward), sizes not yet measured priced on a straight line
  through what was (optimistically, at first, so they get tried: see ``PRIOR_SLOPE``);
- d as the measured drafting seconds per draft step, u(b) like c(n) from the catch-ups measured by their rows
  (both 0, optimistically, until measured).

Drafting nothing: with ``k_min`` 0 the rule chooses k = 0, a plain target step, whenever no length pays, and a
:class:`DraftGate` holds it to what the steps really cost: it compares the seconds per committed token of the steps
that drafted with the seconds of a plain step, both measured in this generation, and stops drafting (plain steps
only) as soon as drafting turns out slower, whatever the cost model says (a machine where a multi-token forward is
dear, a drafter that the target keeps overruling, host work the model does not see). Stopped, it probes: after
``PROBE_AFTER`` plain steps in a row it drafts once anyway, and only while what drafting has lost so far in the
generation is within ``PROBE_BUDGET`` of its time; the wait doubles after each probe (and is at least the plain steps
whose time, at ``PROBE_BUDGET``, pays for what the probe lost), up to ``PROBE_AFTER_MOST``,
and starts again from ``PROBE_AFTER`` once drafting pays. A probe that pays resumes drafting on trial: the next
``JUDGE_AFTER`` steps draft whatever the cost model says, and their time decides again. So drafting costs at
most a few percent more than greedy decoding where it never pays, and pays where it does. A drafter that stands
still while nothing is drafted (an EAGLE head, a draft model) catches up when drafting resumes, and u(b) prices that
catch-up: the rule sees what resuming costs.

The one-token forward every cost is priced in is timed on plain steps: the first two steps of a generation verify no
draft (the first, which runs cold and costs up to a third more, is left out once the second is in), and a plain step
every ``REFRESH_EVERY`` drafting steps keeps the figure current. Acceptance is weighed towards recent steps
(``ACCEPTANCE_DECAY`` per step of the bucket), so that the rule follows text that changes.

The rule changes only which tokens are proposed, never how they are verified: it is lossless like the rest. Its
choices follow measured time, so a sampling controller's random draws, and with them the exact tokens a seed gives,
can differ from run to run (the distribution never does); a fixed k (``adaptive`` false) repeats them.
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Protocol, TypeVar

import attrs

from decoctl.errors import ConfigError

__all__ = [
    "ACCEPTANCE_DECAY",
    "JUDGE_AFTER",
    "PRIOR_SLOPE",
    "PROBE_AFTER",
    "PROBE_AFTER_MOST",
    "PROBE_BUDGET",
    "REFRESH_EVERY",
    "TIMING_DECAY",
    "WARM_STEPS",
    "CostAwareLength",
    "DraftGate",
    "DraftLength",
    "PlainRun",
    "ScheduledLength",
    "draft_length",
    "remembered",
]

PRIOR_SLOPE = 0.1
"""The slope of c(n) (and of u(b), relative to its one measured point) before two sizes are measured: optimistic for
a CPU (0.2-0.3 measured), so longer drafts get tried and then priced on what they really cost."""
PROBE_AFTER = 8
"""Zero-draft choices in a row before the cost rule probes drafting again; the wait doubles after every probe."""
PROBE_AFTER_MOST = 1024
"""The longest wait between probes."""
PROBE_BUDGET = 0.01
"""A probe waits while what drafting has lost so far is above this fraction of the time measured."""
JUDGE_AFTER = 8
"""Drafting steps the gate judges by (the latest ones, at least this many, at most twice as many)."""
REFRESH_EVERY = 32
"""Drafting steps in a row after which one plain step re-times the one-token forward."""
WARM_STEPS = 4
"""A generation's first steps run slower than its later ones (2.1, 1.8, 1.8, 1.7 ms, then 1.6 ms for pycode): plain
steps among the first this many time the unit only while there is no other measurement."""
ACCEPTANCE_DECAY = 0.95
"""The weight a bucket's earlier drafts keep at each new step (recent acceptance counts most)."""
TIMING_DECAY = 0.95
"""The weight earlier timings of a size keep at each new one."""


class PlainRun:
    """Plain steps a rule granted at once (``plain_now``), so that a controller takes them as lean as greedy's steps:
    for each it takes ``left -= 1``, runs ``Verifier.plain`` and adds the step's seconds to ``seconds``, and asks the
    rule nothing until ``left`` is 0. The rule reads the steps taken and their seconds back (``granted - left``) at its
    next call, as if it had been told of each: what it measures and decides stays the same, its calls do not run per
    token. Mutable, owned by the rule; a controller keeps a reference for the generation."""

    __slots__ = ("granted", "left", "seconds")

    def __init__(self) -> None:
        self.left = 0  # plain steps still granted
        self.granted = 0  # the steps granted that the rule has not read back
        self.seconds = 0.0  # the seconds of those taken so far

    def taken(self) -> tuple[int, float]:
        """The steps taken since the rule last read them and their seconds, now read (the rest stays granted)."""
        steps, seconds = self.granted - self.left, self.seconds
        self.granted, self.seconds = self.left, 0.0
        return steps, seconds


class DraftLength:
    """A fixed k within [low, high]; the base of the adaptive rules. ``controller`` names the options in errors.
    ``run``: the plain steps ``plain_now`` granted (none, for a fixed length or a schedule)."""

    def __init__(self, start: int, low: int, high: int, *, controller: str = "draft length") -> None:
        if low > high:
            raise ConfigError(f"{controller} option k_min={low} is above k_max={high}: make k_min <= k_max")
        self.value = start
        self.low, self.high = low, high
        self.run = PlainRun()

    def choose(self, bucket: int, cap: int, backlog: int = 0) -> int:
        """How many of up to ``cap`` available drafts to verify. ``bucket``: what the drafter matched; ``backlog``:
        the committed tokens the drafter would have to be fed before it drafts."""
        del bucket, backlog
        return min(self.value, cap)

    def observe(
        self,
        *,
        bucket: int,
        drafted: int,
        accepted: int,
        verify_seconds: float,
        draft_seconds: float,
        catch_up_rows: int = 0,
        catch_up_seconds: float = 0.0,
    ) -> None:
        """One verify step: ``drafted`` tokens verified in ``verify_seconds`` (a forward over drafted + 1),
        ``accepted`` of them kept; ``draft_seconds`` spent drafting them after a catch-up that fed the drafter
        ``catch_up_rows`` committed tokens in ``catch_up_seconds`` (0 rows: none). For a drafter whose catch-up gives
        its first draft, ``catch_up_seconds`` include drafting that one and ``draft_seconds`` cover the rest."""

    def plain_now(self, bucket: int | None = None) -> bool:
        """Whether the next step is plain without asking ``choose`` (then ``run`` holds it and the plain steps after
        it that are certain too): never, for a fixed length or a schedule. ``bucket``: the drafter's one bucket, for a
        drafter whose backlog only grows while it drafts nothing (a draft model, a head; not prompt lookup, whose
        bucket is what the next lookup matches)."""
        del bucket
        return False

    def restart(self) -> None:
        """A new generation on the same model (an adaptive rule keeps what it measured)."""

    def stats(self) -> dict[str, object]:
        """What the rule ends a generation with, for the controller's stats()."""
        return {"k_final": self.value}


class ScheduledLength(DraftLength):
    """k grows by 2 after a step that accepted every draft and shrinks by 1 after one that accepted fewer than
    half, within [max(low, 1), high] (the schedule of HF transformers' assisted generation; it learns from drafts
    only, so it never stops drafting)."""

    def __init__(self, start: int, low: int, high: int, *, controller: str = "draft length") -> None:
        super().__init__(start, low, high, controller=controller)
        self.low = max(low, 1)
        self.value = min(max(start, self.low), high)

    def observe(
        self,
        *,
        bucket: int,
        drafted: int,
        accepted: int,
        verify_seconds: float,
        draft_seconds: float,
        catch_up_rows: int = 0,
        catch_up_seconds: float = 0.0,
    ) -> None:
        if drafted == 0:
            return
        if accepted == drafted:
            self.value = min(self.high, self.value + 2)
        elif 2 * accepted < drafted:
            self.value = max(self.low, self.value - 1)


@attrs.define
class _Acceptance:
    accepted: float = 1.0  # the prior: one accepted and one rejected pseudo-draft
    rejected: float = 1.0

    @property
    def rate(self) -> float:
        return self.accepted / (self.accepted + self.rejected)


class _Timings:
    """Seconds measured by size (tokens a forward fed, rows a catch-up fed): their mean per size, each earlier
    measurement of a size weighing ``TIMING_DECAY`` times the next (costs follow a machine whose load changes)."""

    def __init__(self) -> None:
        self._totals: dict[int, list[float]] = {}  # size -> [total seconds, count]
        self._sizes: list[int] = []  # sorted

    def add(self, size: int, seconds: float) -> None:
        totals = self._totals.get(size)
        if totals is None:
            totals = self._totals[size] = [0.0, 0.0]
            self._sizes = sorted(self._totals)
        totals[0] = TIMING_DECAY * totals[0] + seconds
        totals[1] = TIMING_DECAY * totals[1] + 1

    def add_many(self, size: int, seconds: float, times: int) -> None:
        """``add(size, seconds)`` ``times`` times over, at once."""
        self.add(size, seconds)
        if times > 1:
            totals, kept = self._totals[size], TIMING_DECAY ** (times - 1)
            added = (1.0 - kept) / (1.0 - TIMING_DECAY)  # the weights of the later times - 1 additions
            totals[0] = kept * totals[0] + seconds * added
            totals[1] = kept * totals[1] + added

    def mean(self, size: int) -> float:
        total, count = self._totals.get(size, (0.0, 0))
        return total / count if count else 0.0

    @property
    def sizes(self) -> list[int]:
        return self._sizes


def _priced(sizes: list[int], value: Callable[[int], float], n: int) -> float:
    """The cost at n of the line through the measured points (size, value(size)), ``sizes`` sorted and not empty:
    a measured size as measured; one between two measured sizes on the straight line through them; one beyond the
    largest (below the smallest) on the slope of the last (first) two, never falling with size nor below 0; with one
    point only, on the prior line 1 + PRIOR_SLOPE * (n - 1) scaled through it."""
    at = bisect_left(sizes, n)
    if at < len(sizes) and sizes[at] == n:
        return value(n)
    if len(sizes) == 1:
        (m,) = sizes
        return value(m) * (1.0 + PRIOR_SLOPE * (n - 1)) / (1.0 + PRIOR_SLOPE * (m - 1))
    if 0 < at < len(sizes):
        n1, n2 = sizes[at - 1], sizes[at]
        c1 = value(n1)
        return c1 + (value(n2) - c1) * (n - n1) / (n2 - n1)
    n1, n2 = (sizes[-2], sizes[-1]) if at else (sizes[0], sizes[1])
    c1, c2 = value(n1), value(n2)
    slope = max((c2 - c1) / (n2 - n1), 0.0)
    return max(c2 + slope * (n - n2), 0.0) if at else max(c1 - slope * (n1 - n), 0.0)


class DraftGate:
    """Whether a step drafts at all, held to measured time: drafting steps against plain (one-token) steps.

    Before each step, ``drafts(wanted)`` says whether to draft (``wanted``: whether the caller's own rule would);
    after it, ``observe(drafted=, committed=, seconds=)`` gives the step's seconds, measured the same way for both
    kinds of step, and the tokens it committed. The gate wants two plain steps first (their seconds are the unit;
    the first, cold one is dropped once the second is in); it stops drafting when the latest drafting steps
    (``JUDGE_AFTER`` to twice as many) took more seconds per committed token than a plain step, probes after runs
    of plain steps within ``PROBE_BUDGET`` of the generation's time, and after a probe that paid drafts on trial
    (whatever ``wanted`` says) until ``JUDGE_AFTER`` drafting steps judge it again; it asks for a plain step after
    ``REFRESH_EVERY`` drafting steps in a row (module docstring). Lookahead drafts through one
    directly; CostAwareLength through its own.
    """

    def __init__(self) -> None:
        self.cold = True  # the generation's first step is plain and left out of the unit: the model runs cold
        self._steps = 0  # steps of this generation so far
        self._plain: deque[float] = deque(maxlen=4 * JUDGE_AFTER)
        self._recent: deque[tuple[float, int]] = deque(maxlen=2 * JUDGE_AFTER)  # drafting steps: (seconds, tokens)
        self.stopped = False  # measured drafting did not pay: plain steps and probes only
        self.stops = self.probes = 0
        self._probing = False
        self._trial = 0  # drafting steps still owed to a trial after a probe that paid
        self._zeros = 0  # plain choices since the last draft
        self._wait = PROBE_AFTER
        self._in_a_row = 0  # drafting steps since the last plain step
        self._lost = 0.0  # seconds drafting steps took beyond a plain step per token they committed (< 0: gained)
        self._total = 0.0
        self._lost_here = 0.0  # the same in this generation
        self.run = PlainRun()  # plain steps granted at once (plain_now)

    @property
    def unit(self) -> float:
        """The seconds of a plain step (0.0 until one is measured)."""
        return sum(self._plain) / len(self._plain) if self._plain else 0.0

    @property
    def ready(self) -> bool:
        """Whether the plain step is timed (a plain step after a generation's cold first one seen)."""
        return bool(self._plain) and not self.cold

    @property
    def times_plain(self) -> bool:
        """Whether a plain step now would time the unit: not the cold first step of a generation, nor one of its
        first WARM_STEPS unless nothing else has been measured."""
        return not self.cold and (self._steps >= WARM_STEPS or not self._plain)

    def restart(self) -> None:
        """A new generation on the same model: its first step runs cold again; what was measured stays (costs
        belong to the machine and the model, and a drafter that did not pay is not tried again before a probe).
        Plain steps granted and not taken are dropped."""
        self.settle()
        self.run.left = self.run.granted = 0
        self.cold = True
        self._steps = 0
        self._probing = False
        self.stops = self.probes = 0
        self._lost_here = 0.0

    def plain_now(self, wanted: bool = True) -> bool:
        """Whether the next step is plain: the caller's rule does not want a draft (``wanted`` false) or drafting
        stopped, and no trial or probe is due, the unit timed. Then ``run`` holds that step and every later one that is
        plain for certain: the steps until a probe could be due (its wait, or while drafting's losses are above the
        budget, the plain steps whose time at the unit brings them within it). The caller takes them without asking
        (``PlainRun``) and prices nothing; they count as ``drafts()`` and ``observe`` would count them, when the gate
        is next asked."""
        self.settle()
        if (wanted and not self.stopped) or self._trial or self.cold or not self._plain:
            return False
        steps = self._wait - self._zeros
        if steps <= 0:
            over = self._lost / PROBE_BUDGET - self._total
            if over <= 0:
                return False  # a probe is due
            steps = int(over / self.unit) if self.unit else 1
        # a run is read back at once, so its steps must time the unit alike: one at a time while the warm steps'
        # do not (times_plain)
        self.run.left = self.run.granted = max(steps, 1) if self.times_plain else 1
        return True

    def settle(self) -> tuple[int, float, bool]:
        """Count the plain steps taken of ``run`` since the gate was last asked, as ``drafts()`` and ``observe``
        would have counted each (their seconds shared alike). Returns how many, their seconds and whether they
        timed the unit."""
        steps, seconds = self.run.taken()
        if not steps:
            return 0, 0.0, False
        timed = self.times_plain
        self._zeros += steps
        self._total += seconds
        self._steps += steps
        self._in_a_row = 0
        if timed:
            self._plain.extend([seconds / steps] * min(steps, self._plain.maxlen or steps))
        return steps, seconds, timed

    def drafts(self, wanted: bool = True) -> bool:
        """Whether the next step drafts: ``wanted`` and not stopped; or a probe that is due."""
        self.settle()
        if not self.ready or self._in_a_row >= REFRESH_EVERY:
            return False
        if self._trial or (wanted and not self.stopped):
            return True
        if self._zeros >= self._wait and self._lost <= PROBE_BUDGET * self._total:
            self._probing = True
            self.probes += 1
            return True
        self._zeros += 1
        return False

    def observe(self, *, drafted: bool, committed: int, seconds: float) -> None:
        """One step: whether it drafted, how many tokens it committed and its seconds."""
        self.settle()
        self._total += seconds
        timed = self.times_plain
        self._steps += 1
        if not drafted:
            self._in_a_row = 0
            self.cold = False
            if timed:
                self._plain.append(seconds)
            return
        self._in_a_row += 1
        self._zeros = 0
        lost = seconds - committed * self.unit
        self._lost += lost
        self._lost_here += lost
        if self._probing:
            self._probing = False
            # the next probe waits twice as long, and at least the plain steps whose time the budget would give
            # to losing what this one lost
            priced = int(lost / (PROBE_BUDGET * self.unit)) if self.unit and lost > 0 else 0
            self._wait = min(max(2 * self._wait, priced), PROBE_AFTER_MOST)
            if lost >= 0:
                return
            # drafting pays again, here at least: draft on trial until the latest steps can judge it afresh
            self.stopped = False
            self._recent.clear()
            self._trial = JUDGE_AFTER
        self._trial = max(0, self._trial - 1)
        self._recent.append((seconds, committed))
        if len(self._recent) < JUDGE_AFTER:
            return
        spent = sum(s for s, _ in self._recent)
        tokens = sum(n for _, n in self._recent)
        if spent > tokens * self.unit:
            self.stopped = True
            self.stops += 1
            self._recent.clear()
        else:
            self._wait = PROBE_AFTER

    def stats(self) -> dict[str, object]:
        """What the gate measured and decided, for the controller's stats()."""
        self.settle()
        unit = self.unit
        return {
            "probes": self.probes,
            "drafting_stops": self.stops,
            "drafting_stopped": self.stopped,
            "drafting_loss": round(self._lost_here / unit, 2) if unit else 0.0,
        }


class CostAwareLength(DraftLength):
    """The k in [low, min(high, cap)] that maximises expected tokens per unit of cost; with low 0, held to measured
    time by a DraftGate (module docstring). ``first_from_catch_up``: the drafter's catch-up also gives its first
    draft (s)."""

    def __init__(
        self, start: int, low: int, high: int, *, controller: str = "draft length", first_from_catch_up: bool = False
    ) -> None:
        super().__init__(min(max(start, low), high), low, high, controller=controller)
        self._shared = int(first_from_catch_up)
        self._acceptance: dict[int, _Acceptance] = {}
        self._verify = _Timings()  # tokens fed -> verify seconds (the generation's first step apart)
        self._catch_up = _Timings()  # rows fed -> catch-up seconds
        self._draft_step: list[float] = [0.0, 0.0]  # [seconds, draft steps]
        self.chosen: dict[int, int] = {}
        self.gate = DraftGate()
        self.run = self.gate.run
        #: bucket -> the backlog at which the cost model last chose 0, while no drafting step has been seen since:
        #: plain steps only move the unit a little and a longer backlog only costs more, so the answer stands
        self._zero_at: dict[int, int] = {}

    @property
    def probes(self) -> int:
        return self.gate.probes

    def plain_now(self, bucket: int | None = None) -> bool:
        """Whether the next step is plain without asking ``choose`` (its gate has stopped drafting, or the cost model
        chose 0 for ``bucket`` and nothing was drafted since, so that its answer stands; and no probe is due): a
        drafting controller then takes the plain steps ``run`` holds (DraftGate.plain_now) and prices nothing."""
        self._settle()
        if self.low == 0 and self.gate.plain_now(wanted=bucket not in self._zero_at):
            self.value = 0
            return True
        return False

    def _settle(self) -> None:
        """Count the plain steps taken of ``run`` as ``observe`` would have counted each."""
        steps, seconds, timed = self.gate.settle()
        if steps:
            self.chosen[0] = self.chosen.get(0, 0) + steps
            if timed:
                self._verify.add_many(1, seconds / steps, steps)

    def restart(self) -> None:
        """A new generation: its first step is plain again (cold); costs, acceptance and the gate's verdict stay,
        so a controller that keeps its rule pays for learning them once, not once a generation."""
        self._settle()
        self.gate.restart()
        self._zero_at.clear()
        self.chosen = {}

    def choose(self, bucket: int, cap: int, backlog: int = 0) -> int:
        self._settle()
        high = min(self.high, cap)
        if high <= 0 or not self.gate.ready:
            # the first two steps verify no draft: they time the one-token forward every cost is priced in
            return 0
        if self.low == 0 and backlog >= self._zero_at.get(bucket, backlog + 1):
            best = 0  # as the model last said: a plain step costs no pricing of every length
        else:
            best = self._best(bucket, min(self.low, high), high, backlog)
            if not best:
                self._zero_at[bucket] = backlog
        if self.low == 0:
            if not self.gate.drafts(wanted=best > 0):
                best = 0
            elif not best:  # a probe, or a trial after one that paid: only drafts can tell whether drafting pays
                best = self._best(bucket, 1, high, backlog)
        self.value = best
        self.chosen[best] = self.chosen.get(best, 0) + 1
        return best

    def _best(self, bucket: int, low: int, high: int, backlog: int) -> int:
        a = self._acceptance.setdefault(bucket, _Acceptance()).rate
        unit = self._unit()
        d = self._draft_cost(unit)
        resume = self._catch_up_cost(backlog, unit)
        sizes = self._verify.sizes

        def c(n: int) -> float:
            return self._verify.mean(n) / unit

        best, best_rate = low, -1.0
        expected = sum(a**i for i in range(low + 1))
        for k in range(low, high + 1):
            if k > low:
                expected += a**k
            cost = _priced(sizes, c, k + 1)
            if k:
                cost += resume + (k - self._shared) * d
            rate = expected / cost
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def observe(
        self,
        *,
        bucket: int,
        drafted: int,
        accepted: int,
        verify_seconds: float,
        draft_seconds: float,
        catch_up_rows: int = 0,
        catch_up_seconds: float = 0.0,
    ) -> None:
        self._settle()
        # a drafting step's verify is timed unless it ran cold; a plain one only where it would time the gate's unit
        if (drafted and not self.gate.cold) or (not drafted and self.gate.times_plain):
            self._verify.add(drafted + 1, verify_seconds)
        if catch_up_rows:
            self._catch_up.add(catch_up_rows, catch_up_seconds)
        self.gate.observe(
            drafted=drafted > 0, committed=accepted + 1, seconds=verify_seconds + draft_seconds + catch_up_seconds
        )
        if drafted == 0:
            return
        self._zero_at.clear()
        record = self._acceptance.setdefault(bucket, _Acceptance())
        record.accepted = ACCEPTANCE_DECAY * record.accepted + accepted
        record.rejected = ACCEPTANCE_DECAY * record.rejected + (accepted < drafted)
        if drafted > self._shared:  # drafts beyond the one the catch-up gave, each a drafter step
            self._draft_step[0] += draft_seconds
            self._draft_step[1] += drafted - self._shared

    def _unit(self) -> float:
        """The seconds of a one-token verify forward (0.0 before any)."""
        return self._verify.mean(1)

    def cost(self, n: int) -> float:
        """c(n): a forward over n tokens in one-token forwards, from what was measured (module docstring)."""
        self._settle()
        unit = self._unit()
        if not unit:
            return 1.0 + PRIOR_SLOPE * (n - 1)
        if not self._verify.sizes:
            return 1.0 if n == 1 else 1.0 + PRIOR_SLOPE * (n - 1)
        return _priced(self._verify.sizes, lambda size: self._verify.mean(size) / unit, n)

    def _draft_cost(self, unit: float) -> float:
        seconds, steps = self._draft_step
        return seconds / steps / unit if steps and unit else 0.0

    def _catch_up_cost(self, rows: int, unit: float) -> float:
        """u(rows) in one-token forwards (0: no rows, or no catch-up measured yet)."""
        if not rows or not self._catch_up.sizes or not unit:
            return 0.0
        return _priced(self._catch_up.sizes, lambda size: self._catch_up.mean(size) / unit, rows)

    def stats(self) -> dict[str, object]:
        """What the cost rule measured and chose, for the controller's stats()."""
        self._settle()
        unit = self._unit()
        out: dict[str, object] = {
            "k_final": self.value,
            "k_chosen": dict(sorted(self.chosen.items())),
            "acceptance_by_bucket": {b: round(r.rate, 3) for b, r in sorted(self._acceptance.items())},
            "verify_cost_seen": {n: round(self.cost(n), 3) for n in self._verify.sizes},
            "draft_step_cost": round(self._draft_cost(unit), 3),
        }
        if self.low == 0:
            out.update(self.gate.stats())
        return out


def draft_length(
    options: Mapping[str, Any],
    *,
    controller: str,
    first_from_catch_up: bool = False,
    model: object | None = None,
    drafter: Hashable = None,
) -> DraftLength:
    """The rule a controller's options ask for: ``k`` drafts every step when ``adaptive`` is false, else
    ``length_rule``'s ("schedule": HF's, "cost": the cost-aware rule) within [``k_min``, ``k_max``], starting at
    ``k``. ``controller`` names the options in errors; ``first_from_catch_up``: see CostAwareLength. With ``model``
    (the target's LoadedModel) the cost rule is the one this thread's earlier generations of the same controller,
    options and ``drafter`` (what drafts: a draft model's or head's name) on that model measured (``remembered``)."""
    k, low, high = options["k"], options["k_min"], options["k_max"]
    if not options["adaptive"]:
        return DraftLength(k, min(low, k), max(high, k), controller=controller)
    if options["length_rule"] == "schedule":
        return ScheduledLength(k, low, high, controller=controller)

    def make() -> CostAwareLength:
        return CostAwareLength(k, low, high, controller=controller, first_from_catch_up=first_from_catch_up)

    if model is None:
        return make()
    key = (controller, first_from_catch_up, drafter, tuple(sorted((str(n), repr(v)) for n, v in options.items())))
    return remembered(model, key, make)


class _Restartable(Protocol):
    def restart(self) -> None: ...


_R = TypeVar("_R", bound=_Restartable)
_kept = threading.local()


def remembered(model: object, key: Hashable, make: Callable[[], _R]) -> _R:
    """The rule (or gate) that this thread's earlier generations on ``model`` (the target's LoadedModel, which a
    Generator keeps for its life) left under ``key`` (the controller, its options, its other roles' models),
    restarted for a new generation; a new one from ``make()`` the first time. Costs belong to the machine and the
    model, so a controller that takes its rule from here pays for learning them once per Generator, not once per
    generation. Held per thread and weakly per model: nothing outlives the model, and two threads never share one."""
    kept: dict[int, tuple[weakref.ref[object], dict[Hashable, Any]]] | None = getattr(_kept, "rules", None)
    if kept is None:
        kept = _kept.rules = {}
    at = id(model)  # by identity: a model's fields need not be hashable
    entry = kept.get(at)
    if entry is None or entry[0]() is not model:
        forget = kept.pop
        entry = kept[at] = (weakref.ref(model, lambda _: forget(at, None)), {})
    rules = entry[1]
    rule = rules.get(key)
    if rule is None:
        rule = rules[key] = make()
    else:
        rule.restart()
    return rule
