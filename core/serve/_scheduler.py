"""The serving engine's scheduler: pure policy. From the requests' states and the measured costs, one step's plan.

plan = Scheduler(JoinRule(), max_rows=8).plan(rows, waiting, free)   # a StepPlan; nothing has run yet

The scheduler reads no clock, runs no model and starts no thread: what it is given (``RowView`` for each live
completion, ``WaitingView`` for each queued request, the free rows) and the join rule's measured costs
(decoctl.serve._join_rule) decide everything a step does, so a plan can be tested with given states and costs. The
executor (decoctl.serve._executor) then runs the plan. What a step decides, in order:

1. the rows whose client left are ended (their rows free for this step's admissions);
2. waiting requests are admitted in order (the engine keeps its queue by priority, then arrival) while the first
   one's completions fit in the free rows (each completion a row of its own, the lowest free first); a request's n
   completions of a batched controller share one prefill: completion 0's prompt goes in, and the others' rows copy it
   before its last token (``Admission.shared``). Where the first does not fit, requests of a lower priority that
   hold one row, decoding (a batched controller's row past its prompt, without images: its whole state is the
   tokens in the row beside what its host keeps) are preempted for it (``preempt``), the lowest priority and the
   latest admitted first, but only where that frees enough rows: a preempted request waits again and is resumed
   (``WaitingView.resumed``) by feeding its history, the prompt and its answer so far, as a prompt; never when
   deterministic (its history's KV would be computed by other forwards than its offline twin's);
3. which speculating rows (drafting ones whose tokens are greedy's, and those the batched Run steps for them) step in
   the Run and which draft: the join rule weighs them together (``JoinRule.choose``);
4. the prompts' chunks: with rows decoding, the step has a budget of prompt work (``JoinRule.prefill_budget``)
   that the waiting prompts spend in turn at their priced cost (``JoinRule.prefill_seconds``), the first at least
   one token; with no row decoding, or before the costs are measured, the prompts go in whole; ``prefill_chunk``
   caps every chunk. A row stepped by a batched controller, with rows decoding (or with completions to copy its
   prompt into), feeds its prompt's last token in the batched Run (its logits cost a row of the Run instead of an
   LM head of their own), so none of its chunks computes logits. ``deterministic``: every chunk is the one
   ``decoctl generate`` feeds (the rest of the prompt, or the next ``prefill_chunk`` tokens), whatever the budget,
   which only chooses which prompts go, and the last token goes in the prompt's own forward;
5. the rest: batched rows pick their token for the Run (``decode``; a row whose prompt ends this step with its
   logits too), drafting rows step alone (``draft``; a row whose prompt ends this step takes its first step in the
   next, when the join rule can place it), speculating rows move into the Run (``join``) or back (``resume``).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence

import attrs

from decoctl.serve._join_rule import JoinRule
from decoctl.serve._states import RequestState

__all__ = ["Admission", "ChunkEnd", "PromptChunk", "RowView", "Scheduler", "StepPlan", "WaitingView"]

_S = RequestState


@attrs.frozen(kw_only=True)
class RowView:
    """One live completion as the scheduler sees it."""

    #: the completion's identity (the join rule keys its measured steps by it)
    key: Hashable
    row: int
    state: RequestState
    #: its controller steps one row among many (greedy, sample): its tokens go in the batched Run
    batched: bool = True
    #: its controller and options: the join rule judges a row by the steps of the rows of its kind
    kind: Hashable = None
    #: its prompt's tokens, and how many of them are in its row's KV
    prompt: int = 0
    fed: int = 0
    #: its prompt carries image features (their tokens go in the prompt's own forwards)
    images: bool = False
    #: completion 0's row, whose prompt this row copies before its last token (None: it feeds its own)
    leader: int | None = None
    #: the rows that copy this row's prompt
    followers: tuple[int, ...] = ()
    #: a drafting row whose tokens are greedy's (it verifies greedily): the join rule may move it into the Run
    joinable: bool = False
    #: its drafting controller can take its row back after joining (``resume``); else a join is for good
    resumable: bool = False
    #: the join rule placed it at least once (a fresh row has no place to keep)
    placed: bool = False
    cancelled: bool = False
    #: its request (all of a request's rows are preempted together) and the request's priority (lower runs first)
    request: Hashable = None
    priority: int = 0


@attrs.frozen(kw_only=True)
class WaitingView:
    """One queued request as the scheduler sees it."""

    key: Hashable
    prompt: int
    completions: int = 1
    batched: bool = True
    images: bool = False
    cancelled: bool = False
    #: its prompt's tokens the prefix cache copies into each of its rows at admission (they are not fed)
    cached: int = 0
    #: lower runs first; a request of a lower priority may be preempted for it
    priority: int = 0
    #: a preempted request coming back: its ``prompt`` is its history (prompt and answer so far), fed as a prompt,
    #: after which its controller goes on where it stopped (it does not start again)
    resumed: bool = False


@attrs.frozen(kw_only=True)
class Admission:
    """Waiting request ``key`` gets ``rows`` (completion i on ``rows[i]``); ``shared``: completion 0's prompt is
    copied into the other rows before its last token (one prefill for all)."""

    key: Hashable
    rows: tuple[int, ...]
    shared: bool = False


class ChunkEnd(enum.Enum):
    """What follows a prompt chunk."""

    #: more of the prompt is to go in, in later steps
    MORE = "more"
    #: the prompt is in, its last logits computed: the row's controller starts
    START = "start"
    #: the prompt is in but for its last token, which this step's batched Run feeds (to the row and to its followers,
    #: once they copied the prompt); the controller starts after the Run
    RUN = "run"


@attrs.frozen(kw_only=True)
class PromptChunk:
    """Feed ``size`` tokens of row ``row``'s prompt from position ``start`` (0 tokens: only its last token is left,
    for the Run); ``logits``: the chunk computes its last row's logits (only a prompt's last chunk does)."""

    row: int
    start: int
    size: int
    logits: bool
    then: ChunkEnd


@attrs.frozen(kw_only=True)
class StepPlan:
    """What one engine step does (decoctl.serve._executor runs it), in this order: ``cancel``, ``preempt``, ``drop``,
    ``admit``, ``chunks``, ``resume``, ``join``, ``draft``, ``decode``, then the batched Run."""

    #: live rows whose client left: ended ("cancelled") and freed before anything else
    cancel: tuple[int, ...] = ()
    #: live rows given up to a request of a higher priority: their requests wait again, to be resumed
    preempt: tuple[int, ...] = ()
    #: waiting requests whose client left before they got rows: dropped from the queue
    drop: tuple[Hashable, ...] = ()
    admit: tuple[Admission, ...] = ()
    chunks: tuple[PromptChunk, ...] = ()
    #: joined rows given back to their drafting controller, which then steps them alone this step
    resume: tuple[int, ...] = ()
    #: drafting rows moved into the batched Run (their pending token fed in it, or greedy's token picked)
    join: tuple[int, ...] = ()
    #: rows whose controller steps them alone, verifying in its own forward
    draft: tuple[int, ...] = ()
    #: rows whose batched controller picks the token this step's Run feeds
    decode: tuple[int, ...] = ()
    #: the speculating rows the join rule placed this step
    placed: tuple[int, ...] = ()
    #: the step's budget of prompt work in seconds (None: prompts whole, or no prompt to feed), for the record
    budget: float | None = None


class Scheduler:
    """Plans each engine step (see the module docstring).

    :param costs: the join rule: measured costs, and which speculating rows join.
    :param max_rows: the rows of the target's KV buffer.
    :param prefill_chunk: the most tokens a prompt chunk holds (None: no cap).
    :param deterministic: chunks where ``decoctl generate`` puts them, the prompt's last token in its own forward,
        one prefill per completion (see decoctl.serve._engine).
    """

    def __init__(
        self, costs: JoinRule, *, max_rows: int, prefill_chunk: int | None = None, deterministic: bool = False
    ) -> None:
        self.costs = costs
        self.max_rows = max_rows
        self.prefill_chunk = prefill_chunk
        self.deterministic = deterministic

    def plan(self, rows: Sequence[RowView], waiting: Sequence[WaitingView], free: Sequence[int]) -> StepPlan:
        """The next step's plan for the live ``rows`` (in the order they were admitted), the ``waiting`` requests (in
        queue order) and the ``free`` rows."""
        cancel = tuple(r.row for r in rows if r.cancelled)
        running = [r for r in rows if not r.cancelled]
        drop, admit, admitted, preempt = self._admissions(waiting, sorted([*free, *cancel]), running)
        live = [r for r in running if r.row not in preempt] + admitted
        decoding = [r for r in live if r.state is not _S.PREFILLING]
        speculating = [r for r in decoding if r.state is _S.JOINED or (r.state is _S.DRAFTING and r.joinable)]
        batch_rows = [r.row for r in decoding if r.state is _S.DECODING]
        span = max(batch_rows, default=-1) + 1
        joining: set[Hashable] = set()
        if speculating:
            joining = self.costs.choose(
                {r.key: (r.row, r.kind) for r in speculating},
                len(batch_rows),
                span,
                batched={r.key for r in speculating if r.state is _S.JOINED},
                final={r.key for r in speculating if not r.resumable},
                fresh={r.key for r in speculating if not r.placed},
            )
        prefilling = [r for r in live if r.state is _S.PREFILLING]
        budget = self.costs.prefill_budget(max(span, 1), self.max_rows) if decoding and prefilling else None
        chunks, starting = self._chunks(prefilling, budget)
        decode: list[int] = []
        draft: list[int] = []
        join: list[int] = []
        resume: list[int] = []
        for r in live:
            if r.state is _S.PREFILLING:
                if r.row in starting and r.batched:  # its first token comes from its prompt's logits, this step
                    decode.append(r.row)
            elif r.state is _S.DECODING:
                decode.append(r.row)
            elif r.state is _S.JOINED:
                (decode if r.key in joining else resume).append(r.row)
            elif r.joinable and r.key in joining:
                join.append(r.row)
            else:
                draft.append(r.row)
        return StepPlan(
            cancel=cancel,
            preempt=tuple(sorted(preempt)),
            drop=tuple(drop),
            admit=tuple(admit),
            chunks=tuple(chunks),
            resume=tuple(resume),
            join=tuple(join),
            draft=tuple(draft),
            decode=tuple(decode),
            placed=tuple(r.row for r in speculating),
            budget=budget,
        )

    def _admissions(
        self, waiting: Sequence[WaitingView], free: list[int], running: Sequence[RowView]
    ) -> tuple[list[Hashable], list[Admission], list[RowView], set[int]]:
        """The waiting requests dropped (their client left) and admitted, in order while the first one's
        completions fit in ``free`` (or in the rows of lower-priority requests preempted for it); the admitted
        completions as the rows they become; the preempted rows."""
        drop: list[Hashable] = []
        admit: list[Admission] = []
        admitted: list[RowView] = []
        preempt: set[int] = set()
        for request in waiting:
            if request.cancelled:
                drop.append(request.key)
                continue
            if len(free) < request.completions:
                taken = self._preemptible(request, running, preempt, request.completions - len(free))
                if not taken:
                    break
                preempt |= taken
                free = sorted([*free, *taken])
            rows, free = tuple(free[: request.completions]), free[request.completions :]
            shared = len(rows) > 1 and self._runs_last(request.batched, request.images) and not request.resumed
            admit.append(Admission(key=request.key, rows=rows, shared=shared))
            for index, row in enumerate(rows):
                admitted.append(
                    RowView(
                        key=(request.key, index),
                        row=row,
                        state=_S.PREFILLING,
                        batched=request.batched,
                        prompt=request.prompt,
                        fed=0 if shared and index else request.cached,
                        images=request.images,
                        leader=rows[0] if shared and index else None,
                        followers=rows[1:] if shared and not index else (),
                        priority=request.priority,
                    )
                )
        return drop, admit, admitted, preempt

    def _preemptible(self, request: WaitingView, running: Sequence[RowView], taken: set[int], needed: int) -> set[int]:
        """The rows of lower-priority requests to preempt so that ``request`` gets ``needed`` more rows: requests
        holding one decoding row, the lowest priority first, then the latest admitted; none where they do not free
        enough (or when deterministic)."""
        if self.deterministic:
            return set()
        by_request: dict[Hashable, list[RowView]] = {}
        for r in running:
            if r.row not in taken:
                by_request.setdefault(r.request if r.request is not None else r.key, []).append(r)
        candidates = [
            (rows[0].priority, order, rows)
            for order, rows in enumerate(by_request.values())
            if rows[0].priority > request.priority
            and len(rows) == 1
            and all(r.state is _S.DECODING and r.batched and not r.images for r in rows)
        ]
        chosen: set[int] = set()
        for _, _, rows in sorted(candidates, key=lambda c: (-c[0], -c[1])):
            if len(chosen) >= needed:
                break
            chosen.update(r.row for r in rows)
        return chosen if len(chosen) >= needed else set()

    def _runs_last(self, batched: bool, images: bool) -> bool:
        """Whether a row may feed its prompt's last token in the batched Run: a batched controller's row, with no
        image features to place, and never when deterministic (the last token then goes in the prompt's own
        forward, as generate feeds it)."""
        return batched and not images and not self.deterministic

    def _chunks(self, prefilling: list[RowView], budget: float | None) -> tuple[list[PromptChunk], set[int]]:
        """The step's prompt chunks, spending ``budget`` (see the module docstring), and the rows whose controller
        starts this step (their prompt ends in a chunk with its logits)."""
        chunks: list[PromptChunk] = []
        starting: set[int] = set()
        fed = False
        for r in prefilling:
            if r.leader is not None:
                continue  # its row copies its leader's prompt
            in_run = (budget is not None or bool(r.followers)) and self._runs_last(r.batched, r.images)
            end = r.prompt - in_run
            if budget is not None and fed and not self._affordable(r.fed, end, in_run, budget):
                continue
            fed = True
            remaining = end - r.fed
            size, logits = 0, False
            if remaining > 0:
                if self.deterministic:
                    size = self._fixed_chunk(remaining)
                else:
                    size = remaining
                    if budget is not None:
                        size = self.costs.prefill_tokens_within(budget, remaining, logits=not in_run)
                    if self.prefill_chunk is not None:
                        size = min(size, self.prefill_chunk)
                logits = not in_run and r.fed + size == end
                if budget is not None:
                    budget -= self.costs.prefill_seconds(size, logits=logits) or 0.0
            if r.fed + size < end:
                then = ChunkEnd.MORE
            elif in_run:
                then = ChunkEnd.RUN
            else:
                then = ChunkEnd.START
                starting.add(r.row)
            chunks.append(PromptChunk(row=r.row, start=r.fed, size=size, logits=logits, then=then))
        return chunks, starting

    def _affordable(self, done: int, end: int, in_run: bool, budget: float) -> bool:
        """Whether the next token of a prompt (``done`` of its ``end`` in) fits in what is left of the step's budget;
        a prompt with only its last token left, which the Run feeds, always does."""
        if done >= end:
            return True
        least = self._fixed_chunk(end - done) if self.deterministic else 1
        ending = not in_run and done + least == end
        return (self.costs.prefill_seconds(least, logits=ending) or 0.0) <= budget

    def _fixed_chunk(self, remaining: int) -> int:
        """Deterministic: the next chunk is the one ``generate`` feeds (the rest of the prompt, or with prefill_chunk
        C the next C tokens: chunks start at multiples of C), whatever the step's budget."""
        return remaining if self.prefill_chunk is None else min(self.prefill_chunk, remaining)
