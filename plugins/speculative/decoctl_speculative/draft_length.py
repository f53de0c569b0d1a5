"""How many drafted tokens to verify: a fixed k, HF transformers' schedule, or the length that pays most.

On a CPU a verify forward over n tokens is far from free (measured on Gemma 3 270M int8, one thread: c(2) = 1.2,
c(5) = 2.2, c(9) = 3.6 one-token forwards), so drafting more than the target will accept costs real time. The
``cost`` rule picks, before each verify, the k that maximises the expected tokens per unit of cost

    E(k) / C(k),   E(k) = (1 - a^(k+1)) / (1 - a),   C(k) = c(k + 1) + k * d

where a is the per-token acceptance probability, c(n) the cost of a target forward over n tokens in one-token
forwards, and d the cost of one draft step (0 for prompt lookup). Everything is learnt online from this
generation's own steps: a per *bucket* (prompt lookup buckets by the length of the n-gram it matched; a draft model
has one bucket) as the maximum-likelihood estimate of a geometric acceptance, with one accepted and one rejected
pseudo-draft as prior; c(n) as the mean of the measured forward times over n tokens divided by the one-token
time (the first step of a generation verifies no draft, to time a one-token forward), sizes not yet measured priced
on a straight line through what was (optimistically, at first, so they get tried). The rule changes only which
tokens are proposed, never how they are verified: it is lossless like the rest.
"""

from __future__ import annotations

import attrs

from decoctl import ConfigError

__all__ = ["CostAwareLength", "DraftLength", "ScheduledLength"]

#: the prior slope of c(n) before two sizes are measured: optimistic for a CPU (0.2-0.3 measured), so longer
#: drafts get tried and then priced on what they really cost
PRIOR_SLOPE = 0.1


class DraftLength:
    """A fixed k within [low, high]; the base of the adaptive rules."""

    def __init__(self, start: int, low: int, high: int) -> None:
        if low > high:
            raise ConfigError(f"speculative option k_min={low} is above k_max={high}: make k_min <= k_max")
        self.value = start
        self.low, self.high = low, high

    def choose(self, bucket: int, cap: int) -> int:
        """How many of up to ``cap`` available drafts to verify (bucket: what the drafter matched)."""
        del bucket
        return min(self.value, cap)

    def observe(self, *, bucket: int, drafted: int, accepted: int, verify_seconds: float, draft_seconds: float) -> None:
        """One verify step: ``drafted`` tokens verified in ``verify_seconds`` (a forward over drafted + 1),
        ``accepted`` of them kept; ``draft_seconds`` spent drafting them."""

    def stats(self) -> dict[str, object]:
        return {"k_final": self.value}


class ScheduledLength(DraftLength):
    """k grows by 2 after a step that accepted every draft and shrinks by 1 after one that accepted fewer than
    half, within [low, high] (the schedule of HF transformers' assisted generation)."""

    def __init__(self, start: int, low: int, high: int) -> None:
        super().__init__(min(max(start, low), high), low, high)

    def observe(self, *, bucket: int, drafted: int, accepted: int, verify_seconds: float, draft_seconds: float) -> None:
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


class CostAwareLength(DraftLength):
    """The k in [low, min(high, cap)] that maximises expected tokens per unit of cost (module docstring)."""

    def __init__(self, start: int, low: int, high: int) -> None:
        super().__init__(min(max(start, low), high), low, high)
        self._acceptance: dict[int, _Acceptance] = {}
        self._seconds: dict[int, list[float]] = {}  # forward size -> [total seconds, count]
        self._draft_step: list[float] = [0.0, 0.0]  # [seconds, draft tokens]
        self.chosen: dict[int, int] = {}

    def choose(self, bucket: int, cap: int) -> int:
        high = min(self.high, cap)
        if high <= 0 or 1 not in self._seconds:
            return 0  # the first step verifies no draft: it times the one-token forward every cost is priced in
        low = min(self.low, high)
        a = self._acceptance.setdefault(bucket, _Acceptance()).rate
        d = self._draft_cost()
        curve = self._curve(high + 1)  # once per step: the loop below prices every k on it
        best, best_rate = low, -1.0
        expected = sum(a**i for i in range(low + 1))
        for k in range(low, high + 1):
            if k > low:
                expected += a**k
            rate = expected / (curve[k] + k * d)
            if rate > best_rate:
                best, best_rate = k, rate
        self.value = best
        self.chosen[best] = self.chosen.get(best, 0) + 1
        return best

    def observe(self, *, bucket: int, drafted: int, accepted: int, verify_seconds: float, draft_seconds: float) -> None:
        totals = self._seconds.setdefault(drafted + 1, [0.0, 0])
        totals[0] += verify_seconds
        totals[1] += 1
        if drafted == 0:
            return
        record = self._acceptance.setdefault(bucket, _Acceptance())
        record.accepted += accepted
        record.rejected += accepted < drafted
        self._draft_step[0] += draft_seconds
        self._draft_step[1] += drafted

    def cost(self, n: int) -> float:
        """c(n): a forward over n tokens in one-token forwards, from what was measured (module docstring)."""
        return self._curve(n)[n - 1]

    def _curve(self, up_to: int) -> list[float]:
        """[c(1), ..., c(up_to)] in one pass: measured sizes as measured, sizes between them on the straight line
        through their neighbours, sizes beyond the largest on the last two points' slope (the prior slope while
        only the one-token forward is known)."""
        unit = self._mean(1)
        points = [(1, 1.0)]
        if unit:
            points += sorted((size, self._mean(size) / unit) for size in self._seconds if size > 1)
        curve: list[float] = []
        last = 0  # the index of the largest measured size <= n
        for n in range(1, up_to + 1):
            while last + 1 < len(points) and points[last + 1][0] <= n:
                last += 1
            n1, c1 = points[last]
            if n1 == n:
                curve.append(c1)
            elif last + 1 < len(points):
                n2, c2 = points[last + 1]
                curve.append(c1 + (c2 - c1) * (n - n1) / (n2 - n1))
            elif len(points) == 1:
                curve.append(1.0 + PRIOR_SLOPE * (n - 1))
            else:
                (m1, d1), (m2, d2) = points[-2:]
                curve.append(d2 + max((d2 - d1) / (m2 - m1), 0.0) * (n - m2))
        return curve

    def _mean(self, size: int) -> float:
        total, count = self._seconds.get(size, (0.0, 0))
        return total / count if count else 0.0

    def _draft_cost(self) -> float:
        unit = self._mean(1)
        seconds, tokens = self._draft_step
        if not unit or not tokens:
            return 0.0
        return seconds / tokens / unit

    def stats(self) -> dict[str, object]:
        return {
            "k_final": self.value,
            "k_chosen": dict(sorted(self.chosen.items())),
            "acceptance_by_bucket": {b: round(r.rate, 3) for b, r in sorted(self._acceptance.items())},
            "verify_cost_seen": {n: round(self.cost(n), 3) for n in sorted(self._seconds)},
        }
