"""One completion while it holds a row of the serving engine: its host, controller, state and what it committed."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from decoctl.host import Host, Sequence
from decoctl.serve._requests import Handle, TokenLogprob
from decoctl.serve._scheduler import RowView
from decoctl.serve._states import RequestState, move

__all__ = ["Completion"]


@attrs.define(eq=False)
class Completion:
    """Completion ``index`` of ``handle`` on row ``row`` of the target's KV buffer (its other roles' sequences in
    ``roles``). Its ``state`` moves only through ``moves_to`` (decoctl.serve._states)."""

    handle: Handle
    index: int
    row: int
    host: Host
    controller: Any
    batched: bool
    roles: dict[str, Sequence]
    started: float
    #: the prompt's token ids (int64[n]), fed a chunk an engine step while PREFILLING
    prompt: np.ndarray
    state: RequestState = RequestState.PREFILLING
    #: (tokens, text) the output's sink received since the last event
    committed: list[tuple[list[int], str]] = attrs.field(factory=list)
    logprobs: list[TokenLogprob] = attrs.field(factory=list)
    drafted_now: int = 0
    drafted: int = 0
    forwards_at_decode: int = 0
    #: a speculating row whose output is greedy's: the engine's JoinRule moves it into the batched Run and back
    joinable: bool = False
    #: while greedy steps a joined row in the batched Run: its drafting controller, kept to take the row back
    parked: Any = None
    #: its controller and options: the JoinRule judges a new row by the steps of the rows of its kind
    kind: tuple[str, str] = ("", "")
    #: the JoinRule placed it at least once (a fresh row has no place to keep)
    placed: bool = False
    #: completion 0 of a request of n: the other completions, whose rows copy its prompt's KV (one prefill for all)
    followers: list[Completion] = attrs.field(factory=list)
    #: completion i > 0 of such a request: it waits for its leader's prompt instead of feeding its own
    leader: Completion | None = None
    #: preempted: the tokens its row held (prompt and answer so far), fed again as a prompt when it is resumed, and
    #: its target's counters, kept while it holds no row; ``resuming`` while that history goes in
    history: np.ndarray | None = None
    kept_stats: Any = None
    resuming: bool = False

    def moves_to(self, new: RequestState) -> None:
        self.state = move(self.state, new)

    @property
    def resumable(self) -> bool:
        """Whether its drafting controller can take its row back after joining (it has ``resume``)."""
        controller = self.parked if self.parked is not None else self.controller
        return callable(getattr(controller, "resume", None))

    def view(self) -> RowView:
        """What the scheduler sees of it."""
        return RowView(
            key=self,
            row=self.row,
            state=self.state,
            batched=self.batched,
            kind=self.kind,
            prompt=len(self.prompt),
            fed=self.host.target.length if self.state is RequestState.PREFILLING else len(self.prompt),
            images=self.handle.request.images is not None,
            leader=None if self.leader is None else self.leader.row,
            followers=tuple(f.row for f in self.followers),
            joinable=self.joinable,
            resumable=self.resumable,
            placed=self.placed,
            cancelled=self.handle.cancelled,
            request=self.handle,
            priority=self.handle.request.priority,
        )

    @property
    def stats(self) -> Any:
        """Its target's counters (SequenceStats), also while preempted."""
        return self.kept_stats if self.kept_stats is not None else self.host.target.stats
