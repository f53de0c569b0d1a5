"""A clock that counts forwards instead of reading the machine's time, for the tests of cost-aware controllers.

A controller that takes a ``clock`` (speculative, lookahead, EAGLE: their draft-length rules learn what steps cost
from it) decides the same way on every machine when its clock is a cost model::

    clock = ForwardCostClock(per_token=0.48, role_ms={"draft": 0.3})
    controller = Speculative(options, clock=clock)   # and clock.start(host) from the controller's start

A target forward costs ``base_ms`` (1) plus ``per_token`` ms for every token it feeds past its first; a forward of a
role named in ``role_ms`` costs that many ms. ``per_token`` may be a function of the target forwards so far (a
machine whose load changes): each forward is priced when the clock first sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from decoctl.host import Host

__all__ = ["ForwardCostClock"]


class ForwardCostClock:
    """Seconds a generation's forwards would have taken under the cost model (see the module docstring)."""

    def __init__(
        self,
        per_token: float | Callable[[int], float],
        *,
        base_ms: float = 1.0,
        role_ms: Mapping[str, float] | None = None,
    ) -> None:
        self.per_token = per_token
        self.base_ms = base_ms
        self.role_ms = dict(role_ms or {})
        self._host: Host | None = None
        self._spent = 0.0
        self._seen = (0, 0)

    def start(self, host: Host) -> None:
        """Count ``host``'s forwards, its prompt's included (a controller's ``start`` calls it)."""
        self._host, self._spent, self._seen = host, 0.0, (0, 0)

    def __call__(self) -> float:
        host = self._host
        assert host is not None, "the clock counts a generation's forwards: call start(host) first"
        target = host.target.stats
        forwards, fed = target.forwards - self._seen[0], target.tokens_fed - self._seen[1]
        per_token = self.per_token(target.forwards) if callable(self.per_token) else self.per_token
        self._spent += self.base_ms * forwards + per_token * (fed - forwards)
        self._seen = (target.forwards, target.tokens_fed)
        roles = sum(ms * host[role].stats.forwards for role, ms in self.role_ms.items() if role in host.roles)
        return (self._spent + roles) / 1000
