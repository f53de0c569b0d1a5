"""A request's states in the serving engine and the moves between them, written once.

    waiting ──> prefilling ──> decoding ──> finished
       │            ▲  │            │
       │            │  │            └──> preempted ──> prefilling (its history fed again on a free row)
       │            │  └─────> drafting <──> joined
       │            │              │            │
       └────────────┴──────────────┴────────────┴──> cancelled | failed (| finished: a drain cut it)

- **waiting**: queued for rows (a Handle in the engine's queue);
- **prefilling**: on its row, its prompt going in a chunk an engine step (or whole);
- **decoding**: a batched controller's row (greedy, sample): its token goes in the step's batched Run;
- **drafting**: a controller that steps its row alone (speculative, lookahead, EAGLE), verifying in its own forward;
- **joined**: a drafting row whose tokens are greedy's, stepped by greedy in the batched Run while the join rule
  finds that cheaper (decoctl.serve._join_rule); it drafts again when the rule says so (``resume``), and a row whose
  controller cannot take it back joins for good (it is then decoding);
- **preempted**: a decoding row that gave its row to a request of a higher priority (decoctl.serve._scheduler): it
  waits in the queue again, its host, controller, chain and output kept; when it gets a row its history (prompt and
  answer so far) goes in again, copied from the prefix cache where it keeps it, and it decodes on from there;
- **finished**, **cancelled** (its client left), **failed** (its controller or chain raised, or the engine stopped):
  the row is freed and no move leaves these.

``move(current, new)`` is the one check: a move the table does not list raises IllegalMoveError, which names both
states (a bug in the engine, never a client's doing).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from decoctl.errors import DecoctlError

__all__ = ["ENDED", "LIVE", "MOVES", "IllegalMoveError", "RequestState", "move"]


class RequestState(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    DRAFTING = "drafting"
    JOINED = "joined"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


class IllegalMoveError(DecoctlError):
    """The engine moved a request between two states the table does not connect."""


_S = RequestState
#: every state a request may take next from each state (the ended states lead nowhere)
MOVES: Mapping[RequestState, frozenset[RequestState]] = {
    _S.WAITING: frozenset({_S.PREFILLING, _S.CANCELLED, _S.FAILED}),
    # a drain's time running out ends a live row with finish_reason "shutdown": finished, whatever its state
    _S.PREFILLING: frozenset({_S.DECODING, _S.DRAFTING, _S.FINISHED, _S.CANCELLED, _S.FAILED}),
    _S.DECODING: frozenset({_S.PREEMPTED, _S.FINISHED, _S.CANCELLED, _S.FAILED}),
    # DECODING: joined for good (its controller cannot take the row back)
    _S.DRAFTING: frozenset({_S.JOINED, _S.DECODING, _S.FINISHED, _S.CANCELLED, _S.FAILED}),
    # DECODING: its KV no longer in the state its controller resumes from, it stays in the Run for good
    _S.JOINED: frozenset({_S.DRAFTING, _S.DECODING, _S.FINISHED, _S.CANCELLED, _S.FAILED}),
    # PREFILLING: its history goes in again on a free row; FINISHED: a drain's time ran out while it waited
    _S.PREEMPTED: frozenset({_S.PREFILLING, _S.FINISHED, _S.CANCELLED, _S.FAILED}),
    _S.FINISHED: frozenset(),
    _S.CANCELLED: frozenset(),
    _S.FAILED: frozenset(),
}
#: the states of a request that holds rows
LIVE = frozenset({_S.PREFILLING, _S.DECODING, _S.DRAFTING, _S.JOINED})
#: the states no move leaves
ENDED = frozenset(state for state, after in MOVES.items() if not after)


def move(current: RequestState, new: RequestState) -> RequestState:
    """``new``, once the table allows the move from ``current`` (IllegalMoveError otherwise)."""
    if new not in MOVES[current]:
        allowed = ", ".join(sorted(s.value for s in MOVES[current])) or "none: it has ended"
        raise IllegalMoveError(
            f"a request cannot move from {current.value} to {new.value} (from {current.value}: {allowed})"
        )
    return new
