"""Join rules on fixed schedules, for tests of the serving engine and of controllers that run in it.

decoctl serve's engine asks its JoinRule every step which speculating rows step in the batched Run; a rule on a
fixed schedule moves rows in and out whatever the measured costs, so a test sees joins and resumes happen::

    engine = Engine(models, join_rule=Alternating(batched=2, drafting=1))
"""

from __future__ import annotations

from typing import Any

from decoctl.serve._join_rule import JoinRule

__all__ = ["Alternating"]


class Alternating(JoinRule):
    """Every speculating row, from its first step on: ``batched`` engine steps in the batched Run, then ``drafting``
    steps drafting, and again."""

    def __init__(self, batched: int = 2, drafting: int = 1) -> None:
        super().__init__()
        self.period, self.batched = batched + drafting, batched
        self.asked: dict[Any, int] = {}

    def choose(self, rows: Any, batch_rows: int, span: int, **given: Any) -> set[Any]:
        for row in rows:
            self.asked[row] = self.asked.get(row, -1) + 1
        return {row for row in rows if self.asked[row] % self.period < self.batched}
