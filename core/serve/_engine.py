"""The engine: one thread owns the models, every live completion is a row of the target's batched KV buffer.

engine = Engine({"target": load_model(folder)}, max_rows=8, max_queue=64)
engine.start()
handle = engine.submit(EngineRequest(ids=(...), max_new_tokens=64), on_event=print)   # Delta, Finished, Failed
handle.cancel()                                                                        # frees its rows next step
engine.close()                                                                         # drains, then stops

Faults: a completion whose controller or logits chain raises fails alone (a Failed event, its rows freed, the
others untouched); a step that fails outside one completion (the batched Run) fails the live requests and the
engine goes on with empty rows; an exception that escapes the loop itself ends the engine: ``failure`` says why,
every live and waiting request gets a Failed event (``unavailable``: HTTP 503), new ones EngineClosedError, and the
callbacks given to ``on_failure`` run (``decoctl serve`` ends the process). ``drain(seconds)`` stops taking requests
and lets the live and queued ones run for ``seconds``; then it cuts what still runs (finish_reason "shutdown") and
fails what still waits, and logs ``decoctl.serve.drained`` with how many it cut.

Each iteration of the engine's loop is three parts, each with one job:
1. the scheduler (decoctl.serve._scheduler, pure policy) plans the step from the live completions' states, the
   waiting requests and the join rule's measured costs (decoctl.serve._join_rule): who is cancelled, dropped or
   admitted (each completion a row of its own, a Host, controller and logits chain of its own over it; a request's n
   completions of a batched controller share one prefill), which prompt chunks go in with how many tokens (prompts
   whole while no row decodes, else chunks within a budget of prompt work priced from the measured costs, so that
   they add a bounded share to the batched step), which rows decode in the batched Run, which draft and verify on
   their own, which speculating rows join the Run or leave it;
2. the executor (decoctl.serve._executor) runs the plan on the models: the chunks, the controllers' steps, one
   ``Rows.step`` feeding the picked tokens of every row still running in one onnxruntime Run, and reports which
   completions finished and which failed;
3. the engine applies the report: finished and failed completions free their rows (the next waiting request takes
   them), and what each completion committed goes to its request's ``on_event``.
A request's states (decoctl.serve._states) move only as its table allows.

What a row computes, and so its answer, depends on what else a step runs only through the shapes of its own
forwards (tools/batch_invariance_probe.py measures it): on onnxruntime's CPU kernels a batched one-token step gives
each row its one-row step's logits, but a position's logits and KV differ in the last bits with the forward that
computes it: a one-token forward (a decode step, the prompt's last token fed in the batched Run) against the same
position inside a prompt's forward (GroupQueryAttention's one-query kernel), and one prompt chunk against another
(a 385-token chunk after 55 cached tokens against the 440-token prompt whole). Some exports' batched step also
differs from a one-row step (MatMulNBits at accuracy level 0). By default, with chunks sized by the load, a near-tie
may therefore go another way than ``decoctl generate`` goes. With ``deterministic`` every completion's logits are
bitwise those of its offline twin, whatever else the engine runs: its prompt goes in the forwards ``decoctl generate``
feeds it in (whole, or with ``prefill_chunk`` C the chunks at positions 0, C, 2C, ... as ``generate --prefill-chunk
C`` feeds them; the step's budget chooses which prompts go, never where a chunk ends), its last token among them; a
request's n completions prefill one each; speculating rows keep their own controllers (no joins); and on a model
whose batched step differs from a one-row step (found at start) each row steps in a Run of its own. Greedy is then
``generate``'s token for token and sampling its text for the seed; a drafting controller equals its own offline run
where its draft lengths do not follow measured time (``adaptive`` false).

Requests choose only among what the operator installed and loaded: a registered controller by name (never a path
or a shared library), registered logits processors, and the roles the engine was given. A request's completions
draw from their own seeded streams: completion 0 from ``default_rng(seed)``, completion i from the i-th stream its
``spawn`` gives, as the sample controller's ``n`` draws.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Mapping

from decoctl.errors import ConfigError, DecoctlError
from decoctl.generation._prefix_cache import PrefixCache
from decoctl.host import Rows
from decoctl.logs import get_logger
from decoctl.model._loader import LoadedModel
from decoctl.plugins import PluginRegistry
from decoctl.serve._completion import Completion
from decoctl.serve._executor import Executor
from decoctl.serve._join_rule import JoinRule
from decoctl.serve._plans import Plans
from decoctl.serve._requests import (
    Delta,
    EngineClosedError,
    EngineRequest,
    Event,
    Failed,
    Finished,
    Handle,
    Plan,
    QueueFullError,
    TokenLogprob,
)
from decoctl.serve._scheduler import Scheduler, WaitingView
from decoctl.serve._states import RequestState
from decoctl.serve._worker import Worker

__all__ = [
    "Delta",
    "Engine",
    "EngineClosedError",
    "EngineRequest",
    "Failed",
    "Finished",
    "Handle",
    "QueueFullError",
    "TokenLogprob",
]

log = get_logger(__name__)

#: Output.stop_reason -> OpenAI's finish_reason
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length", "max_length": "length"}


class Engine(Worker):
    """One thread that owns the models and runs every request's completions as rows (see the module docstring):
    it queues requests, runs the loop (scheduler, executor, report), emits the events and shuts down.

    :param models: role -> LoadedModel; "target" at least (a decoder-only model). Requests may use these roles only.
    :param registry: where controllers and processors are looked up by name (default: entry points autoloaded).
    :param max_rows: rows of the target's KV buffer: completions that run at once.
    :param max_queue: requests that may wait for rows; one more is refused with QueueFullError.
    :param max_length: positions of each row (default: the model's).
    :param join_rule: when a speculating row joins the batched step (decoctl.serve._join_rule; default its cost rule).
    :param clock: what the join rule's costs are measured with (seconds).
    :param warm: run a token through every row once at start (see ``Executor.warm``).
    :param prefill_chunk: feed prompts in chunks of at most this many tokens, one chunk a prompt an engine step
        (None: the chunks the join rule's measured costs allow while rows decode, prompts whole while none does).
    :param deterministic: every completion's logits bitwise its offline twin's under any load (see the module
        docstring); its costs are in docs/BENCHMARKS.md (Serving).
    :param prefix_cache_mb: keep prompts and answers in a prefix cache of this many MiB
        (decoctl.generation._prefix_cache): a request whose prompt starts with a kept one copies that KV into its row
        at admission and prefills only the rest. None: off.
    """

    thread_name = "decoctl-engine"
    stopped = "the server's engine stopped"
    failed_event = "engine_failed"

    def __init__(
        self,
        models: Mapping[str, LoadedModel],
        *,
        registry: PluginRegistry | None = None,
        max_rows: int = 8,
        max_queue: int = 64,
        max_length: int | None = None,
        prefill_chunk: int | None = None,
        warm: bool = True,
        deterministic: bool = False,
        debug: bool | None = None,
        join_rule: JoinRule | None = None,
        clock: Callable[[], float] = time.perf_counter,
        prefix_cache_mb: float | None = None,
    ) -> None:
        if "target" not in models:
            raise ConfigError("the engine needs a 'target' model")
        target = models["target"]
        if target.encoder is not None:
            raise ConfigError(
                f"model {target.name} is an encoder-decoder model and the engine steps decoder-only rows: a speech "
                "model (Whisper) is served by decoctl.serve._transcriber.Transcriber (decoctl serve picks it by "
                "itself); run other encoder-decoder models with decoctl generate"
            )
        if max_rows < 1 or max_queue < 0:
            raise ConfigError(f"max_rows={max_rows} must be at least 1 and max_queue={max_queue} at least 0")
        super().__init__(max_queue)
        self.models = dict(models)
        self.registry = registry or PluginRegistry()
        # collected now, once: requests look them up from the server's threads and the engine's
        self.registry.controllers()
        self.registry.processors()
        self.max_rows = max_rows
        self.prefill_chunk = prefill_chunk
        self.deterministic = deterministic
        self.join_rule = join_rule or JoinRule()
        if deterministic and prefix_cache_mb is not None:
            raise ConfigError(
                "--deterministic promises each answer bitwise decoctl generate's, but a prefix cache copies KV that "
                "another request's forwards computed (an answer's in one-token steps), which differs from a whole "
                "prompt's forward in the last bits: use one of --deterministic and --prefix-cache-mb"
            )
        #: the target's prompts and answers kept for the requests that continue them (None: off)
        self.prefix_cache = None if prefix_cache_mb is None else PrefixCache.for_model(target, prefix_cache_mb)
        self.executor = Executor(
            self.models,
            registry=self.registry,
            max_rows=max_rows,
            max_length=max_length,
            costs=self.join_rule,
            clock=clock,
            prefill_chunk=prefill_chunk,
            deterministic=deterministic,
            debug=debug,
            prefix_cache=self.prefix_cache,
        )
        self.max_length = self.executor.max_length
        if warm:
            self.executor.warm()
        #: deterministic, on a model whose batched step's rows differ from one-row steps: each row steps alone
        self.executor.rows_alone = deterministic and max_rows > 1 and not self.executor.batch_invariant()
        self.scheduler = Scheduler(
            self.join_rule, max_rows=max_rows, prefill_chunk=prefill_chunk, deterministic=deterministic
        )
        self.plans = Plans(self.models, self.registry, max_rows=max_rows, max_length=self.max_length)
        self._free = list(range(max_rows))
        #: the live completions by row, in the order they were admitted (the order their prompts go in)
        self._slots: dict[int, Completion] = {}
        #: the waiting requests by priority, then arrival (a preempted request keeps its arrival)
        self._queue: list[Handle] = []
        self._arrivals = itertools.count()
        #: counters for /metrics and /health (read from any thread)
        self.steps = 0
        self.completions = 0
        self.cancelled = 0

    @property
    def rows(self) -> Rows:
        return self.executor.rows

    @property
    def rows_alone(self) -> bool:
        return self.executor.rows_alone

    @property
    def batched_runs(self) -> int:
        return self.executor.batched_runs

    @property
    def joined(self) -> int:
        return self.executor.joined

    @property
    def resumed(self) -> int:
        return self.executor.resumed

    @property
    def preempted(self) -> int:
        return self.executor.preempted

    # -- the caller's side (any thread) ------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def live_rows(self) -> int:
        return self.max_rows - len(self._free)

    def check(self, request: EngineRequest) -> Plan:
        """The request's checked plan; ConfigError naming what it asks for that this engine cannot give. The first
        request of a choice builds its logits chain (compiling its grammars): call it off the event loop."""
        return self.plans.check(request)

    def submit(self, request: EngineRequest, on_event: Callable[[Event], None], *, plan: Plan | None = None) -> Handle:
        """Queue ``request``; ``on_event`` receives its Delta, Finished (one per completion) or Failed events from
        the engine thread. ConfigError for a request it cannot run, QueueFullError when ``max_queue`` wait already,
        EngineClosedError while shutting down. ``plan``: the request's, from ``check`` (else checked here)."""
        handle = Handle(request, on_event, plan if plan is not None else self.check(request))
        with self._wake:
            self._refuse_unless_open(
                len(self._queue),
                full=f"{len(self._queue)} requests are waiting for rows (--max-queue {self.max_queue}): retry later",
            )
            handle.arrival = next(self._arrivals)
            self._enqueue(handle)
            self._wake.notify()
        return handle

    def _enqueue(self, handle: Handle) -> None:
        """Into the queue at its priority, after the requests of its priority that arrived before it (call with
        the lock held)."""
        bisect.insort(self._queue, handle, key=lambda h: (h.request.priority, h.arrival))

    def _cancel_all(self) -> None:
        for handle in self._queue:
            handle.cancel()
        for slot in tuple(self._slots.values()):
            slot.handle.cancel()

    # -- the engine thread -----------------------------------------------------------------------------------------
    def _loop(self) -> None:
        cut = refused = 0
        while True:
            with self._wake:
                while not self._slots and not self._queue and not self._closing:
                    self._wake.wait()
                if self._closing and not self._slots and not self._queue:
                    break
                past = self._deadline is not None and time.monotonic() >= self._deadline
                waiting = list(self._queue) if past else []
                if past:
                    self._queue.clear()
            if past:
                cut += self._cut(waiting)
                refused += len(waiting)
                continue
            try:
                self._iteration()
            except Exception as exc:  # a failure outside one completion's step: fail every live request
                self._fail_all(exc)  # where even that fails (the rows cannot be reset), the engine dies
        if self._drain_called:
            (log.warning if cut or refused else log.info)("decoctl.serve.drained", cut=cut, refused=refused)

    def _cut(self, waiting: list[Handle]) -> int:
        """The drain's time is up: end every live completion where it is (finish_reason "shutdown") and fail the
        requests that never got a row; how many completions were cut."""
        live = list(self._slots.values()) + [slot for handle in waiting for slot in handle.preempted]
        for slot in live:
            self._flush(slot)
            self._end(slot, "shutdown")
        for handle in waiting:
            if not handle.preempted:
                handle._emit(Failed(message="the server shut down before the request got a row", unavailable=True))
            handle.preempted = []
        return len(live)

    def _fail_everything(self, reason: str) -> None:
        """The engine thread died: every live and waiting request fails (503: not theirs) and the rows are free."""
        with self._wake:
            waiting = list(self._queue)
            self._queue.clear()
        handles = {id(s.handle): s.handle for s in self._slots.values()}
        handles.update((id(h), h) for h in waiting)
        self._slots.clear()
        self._free = list(range(self.max_rows))
        for handle in handles.values():
            handle._emit(Failed(message=f"{reason}: retry on another replica", unavailable=True))

    def _iteration(self) -> None:
        """One step: the scheduler plans, the executor runs the plan, the engine applies what it reports."""
        with self._wake:
            # the queue's head: no step admits more requests than there are rows
            waiting = self._queue[: self.max_rows]
        cached: dict[Handle, int] = {}
        plan = self.scheduler.plan(
            [slot.view() for slot in self._slots.values()],
            [self._waiting_view(handle, cached) for handle in waiting],
            self._free,
        )
        for row in plan.cancel:
            self._end(self._slots[row], "cancelled")
        preempted = [self._preempt(self._slots[row]) for row in plan.preempt]
        taken = len(plan.drop) + len(plan.admit)
        with self._wake:  # the scheduler took (dropped or admitted) the queue's first ``taken`` requests
            del self._queue[:taken]
            for handle in {id(h): h for h in preempted}.values():
                self._enqueue(handle)
        for key in plan.drop:
            self._drop(key)
        for admission in plan.admit:
            self._admit(admission.key, admission.rows, admission.shared, cached[admission.key])
        for row in plan.placed:
            self._slots[row].placed = True
        report = self.executor.run(plan, self._slots)
        for slot in report.finished:
            self._finish(slot)
        for slot, exc in report.failed:
            self._fail_request(slot.handle, exc)
        self.steps += 1
        for slot in list(self._slots.values()):
            self._flush(slot)

    def _waiting_view(self, handle: Handle, cached: dict[Handle, int]) -> WaitingView:
        """What the scheduler sees of a queued request (a preempted one: its completion's history as its prompt)."""
        history = handle.preempted[0].history if handle.preempted else None
        return WaitingView(
            key=handle,
            prompt=len(handle.request.ids) if history is None else len(history),
            completions=len(handle.preempted) or handle.request.n,
            batched=handle.plan.batched,
            images=handle.request.images is not None,
            cancelled=handle.cancelled,
            cached=cached.setdefault(handle, self.executor.cached(handle, history)),
            priority=handle.request.priority,
            resumed=history is not None,
        )

    def _preempt(self, slot: Completion) -> Handle:
        """The scheduler gave the slot's row to a request of a higher priority: its state kept with its request,
        which waits again (it is queued back after this step's admissions are taken from the queue)."""
        self._flush(slot)
        self._slots.pop(slot.row)
        row = slot.row
        self.executor.preempt(slot)
        self._free.append(row)
        self._free.sort()
        slot.handle.preempted.append(slot)
        log.debug("decoctl.serve.preempted", row=row, priority=slot.handle.request.priority)
        return slot.handle

    def _drop(self, handle: Handle) -> None:
        """A waiting request whose client left: a preempted one's completions end as cancelled, as a live row's do."""
        parked, handle.preempted = handle.preempted, []
        for slot in parked:
            self._end(slot, "cancelled")

    def _admit(self, handle: Handle, rows: tuple[int, ...], shared: bool, cached: int) -> None:
        """Open ``handle``'s completions on ``rows`` (a preempted request's: resume them there); ``shared``:
        completion 0's prompt is copied into the others' rows (one prefill); ``cached``: the prompt's tokens the
        prefix cache copies into each row that feeds its own. A completion that cannot be opened fails the request."""
        if handle.preempted:
            self._resume(handle, rows, cached)
            return
        started: list[Completion] = []
        try:
            for index, row in enumerate(rows):
                self._free.remove(row)
                try:
                    started.append(self.executor.open(handle, index, row, cached=0 if shared and index else cached))
                except BaseException:
                    self._free.append(row)
                    self._free.sort()
                    raise
        except Exception as exc:
            for slot in started:
                self._release(slot)
            self._fail_request(handle, exc)
            return
        if shared:
            started[0].followers = started[1:]
            for slot in started[1:]:
                slot.leader = started[0]
        for slot in started:
            self._slots[slot.row] = slot
            self._flush(slot)

    def _resume(self, handle: Handle, rows: tuple[int, ...], cached: int) -> None:
        """Resume a preempted request's completions on ``rows``: each feeds its history as a prompt, then decodes
        on. A completion that cannot be resumed fails the request."""
        parked, handle.preempted = handle.preempted, []
        for slot, row in zip(parked, rows, strict=True):
            self._free.remove(row)
            try:
                self.executor.reopen(slot, row, cached=cached)
            except Exception as exc:
                self._free.append(row)
                self._free.sort()
                handle.preempted = [s for s in parked if s.row < 0]
                self._fail_request(handle, exc)
                return
            self._slots[row] = slot

    def _release(self, slot: Completion) -> None:
        """Give the completion's row and sequences back (a preempted completion holds none)."""
        if slot.row < 0:
            return
        self._slots.pop(slot.row, None)
        if slot.row not in self._free:
            self.executor.release(slot)
            self._free.append(slot.row)
            self._free.sort()

    def _flush(self, slot: Completion) -> None:
        if not slot.committed:
            return
        tokens = [t for chunk, _ in slot.committed for t in chunk]
        text = "".join(piece for _, piece in slot.committed)
        logprobs = tuple(slot.logprobs) if slot.handle.request.logprobs is not None else None
        drafted = min(slot.drafted_now, len(tokens))
        slot.committed, slot.logprobs, slot.drafted_now = [], [], 0
        slot.handle._emit(Delta(index=slot.index, text=text, tokens=tuple(tokens), drafted=drafted, logprobs=logprobs))

    def _finish(self, slot: Completion) -> None:
        self._flush(slot)
        self._end(slot, None)

    def _end(self, slot: Completion, cancelled: str | None) -> None:
        """End a completion (``cancelled``: "cancelled" or "shutdown", else by its stop rules) and free its row."""
        host = slot.host
        output_tokens = tuple(int(t) for t in host.output_tokens)
        first = host.completions()[0][0]
        stop_reason = cancelled or first.stop_reason
        forwards = slot.stats.forwards - slot.forwards_at_decode
        slot.moves_to(RequestState.CANCELLED if cancelled == "cancelled" else RequestState.FINISHED)
        if cancelled is None:
            self.executor.keep(slot)  # the prompt and its answer: the next chat turn's prefix
        self._release(slot)
        self.completions += 1
        self.cancelled += cancelled is not None
        slot.handle._emit(
            Finished(
                index=slot.index,
                finish_reason=cancelled or FINISH_REASONS.get(stop_reason or "", "stop"),
                stop_reason=stop_reason,
                text=first.text,
                tokens=output_tokens,
                prompt_tokens=len(slot.handle.request.ids),
                target_forwards=forwards,
                drafted=slot.drafted,
                seconds=time.perf_counter() - slot.started,
            )
        )

    def _fail_request(self, handle: Handle, exc: BaseException) -> None:
        """End every completion of ``handle`` and tell it why (the message only: never a traceback)."""
        for slot in [s for s in self._slots.values() if s.handle is handle] + handle.preempted:
            slot.moves_to(RequestState.FAILED)
            self._release(slot)
        handle.preempted = []
        if isinstance(exc, DecoctlError):
            message = str(exc)
        else:
            message = f"controller {handle.plan.spec.name!r} failed ({type(exc).__name__}: {exc})"
        log.warning("decoctl.serve.request_failed", error=message)
        handle._emit(Failed(message=message, invalid=isinstance(exc, ConfigError)))

    def _fail_all(self, exc: Exception) -> None:
        log.warning("decoctl.serve.step_failed", error=f"{type(exc).__name__}: {exc}")
        for handle in {id(s.handle): s.handle for s in self._slots.values()}.values():
            self._fail_request(handle, exc)
        # a batched step may have stopped half-way: the rows start again empty
        self._slots.clear()
        self.executor.empty()
        self._free = list(range(self.max_rows))
