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

Each iteration of the engine's loop (decoctl.generation's loop, with rows that come and go):
1. completions whose client left are ended and their rows freed;
2. waiting requests are admitted while rows are free (each completion a row of its own, a Host, controller and
   logits chain of its own over it); their prompts are fed whole while no row decodes, and otherwise in chunks
   that spend a budget of prompt work a step, set by the engine's cost rule (decoctl.serve._join_rule) so that it
   adds a bounded share to the batched step (``prefill_chunk`` caps every chunk); a chunk computes no logits, the
   prompt's last its last row only, and a row stepped by a batched controller (greedy, sample) feeds its prompt's
   last token in the batched Run, where its logits cost a row of the Run instead of a forward's LM head; a request's
   n completions (a batched controller's) share one prefill: the other rows copy the first's KV (``Rows.copy``);
3. each completion advances one step: a controller that can step one row among many (``ControllerSpec.batched``,
   a RowController: greedy, sample) picks its next token from its row's logits and the engine commits it; any other
   controller (a drafting one: speculative, lookahead, EAGLE) runs its own step on its row, verifying in its own
   forward; the speculating rows whose tokens are greedy's join the batched step when the cost rule, weighing them
   all together, finds that their steps stall the others more than they gain;
4. one ``Rows.step`` feeds the picked tokens of every row still running, in one onnxruntime Run;
5. what each completion committed goes to its request's ``on_event``.
A finished completion frees its row at once and the next waiting request takes it.

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

import collections
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from decoctl.controllers import Greedy, RowController
from decoctl.errors import ConfigError, ControllerError, DecoctlError
from decoctl.generation import Generator
from decoctl.host import Host, Output, Rows, Sequence, SequenceStats, StopRules, role_flag
from decoctl.logs import get_logger
from decoctl.model._loader import LoadedModel
from decoctl.model._vision import ImageFeatures
from decoctl.plugins import PluginRegistry, parse_processor_chain
from decoctl.serve._join_rule import JoinRule
from decoctl.specs import ControllerSpec, normalise_name

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

#: how many distinct (controller, options, processors) choices keep their checked plan
PLANS_KEPT = 64
#: Output.stop_reason -> OpenAI's finish_reason
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length", "max_length": "length"}


class QueueFullError(DecoctlError):
    """The engine's queue holds ``max_queue`` requests: try again later (HTTP 429)."""


class EngineClosedError(DecoctlError):
    """The engine is shutting down and takes no new requests (HTTP 503)."""


@attrs.frozen(kw_only=True)
class EngineRequest:
    """One request: its prompt's token ids, limits, seed, how many completions (``n``), and decoctl's choices: an
    installed controller by name with its options, and a logits chain of registered processors. ``logprobs``: give
    each token's log-probability and this many alternatives (0: the token's only); None: none."""

    ids: tuple[int, ...] = attrs.field(converter=tuple)
    max_new_tokens: int
    stop: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    seed: int | None = None
    n: int = 1
    controller: str = "greedy"
    options: Mapping[str, Any] = attrs.field(factory=dict)
    #: a chain string ("top_k=40,temperature=0.8") or a list of tables ({"name": "grammar", "json_schema": ...})
    processors: str | list[dict[str, Any]] | None = None
    logprobs: int | None = None
    #: a vision-language target's image features for the prompt's image tokens (decoctl.model._vision), in order;
    #: ``ids`` holds each image's tokens already expanded
    images: ImageFeatures | None = None


@attrs.frozen
class TokenLogprob:
    """A committed token's log-probability under the target's raw logits, and the ``top`` alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@attrs.frozen(kw_only=True)
class Delta:
    """What completion ``index`` committed in one engine step: ``tokens`` (the first ``drafted`` of them drafted
    and accepted by the target's verification, the rest the target's own), the ``text`` they finished (text a stop
    string may still claim is held back) and, where asked, their log-probabilities."""

    index: int
    text: str
    tokens: tuple[int, ...]
    drafted: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None


@attrs.frozen(kw_only=True)
class Finished:
    """Completion ``index`` ended: ``finish_reason`` "stop" or "length" (OpenAI's), "cancelled" (its client left) or
    "shutdown" (a drain's time ran out while it ran); its whole
    text and tokens; ``target_forwards`` the target's forwards after its prefill."""

    index: int
    finish_reason: str
    stop_reason: str | None
    text: str
    tokens: tuple[int, ...]
    prompt_tokens: int
    target_forwards: int
    drafted: int
    seconds: float

    @property
    def tokens_per_target_forward(self) -> float:
        return len(self.tokens) / self.target_forwards if self.target_forwards else float(len(self.tokens))


@attrs.frozen(kw_only=True)
class Failed:
    """The request failed inside the engine (a controller error): ``message`` says why; its other completions end
    too. ``unavailable``: not the request's fault, the engine stopped or shut down before it ran (HTTP 503)."""

    message: str
    unavailable: bool = False


Event = Delta | Finished | Failed


class Handle:
    """A submitted request: ``cancel()`` ends its completions at the next step and frees their rows."""

    def __init__(self, request: EngineRequest, on_event: Callable[[Event], None], plan: _Plan) -> None:
        self.request = request
        self.plan = plan
        self._on_event = on_event
        self._cancelled = threading.Event()
        self.submitted = time.perf_counter()

    def cancel(self) -> None:
        """Give the request up (its client left): the engine ends it at its next step and frees its rows."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _emit(self, event: Event) -> None:
        try:
            self._on_event(event)
        except Exception as exc:  # a listener's failure must not stop the engine: that request is cancelled
            log.warning("decoctl.serve.listener_failed", error=f"{type(exc).__name__}: {exc}")
            self.cancel()


@attrs.frozen(kw_only=True)
class _Plan:
    """A checked choice of controller, options and processors."""

    spec: ControllerSpec
    options: Mapping[str, Any]
    processors: str | list[dict[str, Any]] | None
    roles: tuple[str, ...]
    #: the controller steps one row among many (its rows step together in one Run); else it steps its row alone
    batched: bool


@attrs.define(eq=False)
class _Slot:
    """One completion while it runs on a row."""

    handle: Handle
    index: int
    row: int
    host: Host
    controller: Any
    batched: bool
    roles: dict[str, Sequence]
    started: float
    #: (tokens, text) the output's sink received since the last event
    committed: list[tuple[list[int], str]] = attrs.field(factory=list)
    logprobs: list[TokenLogprob] = attrs.field(factory=list)
    drafted_now: int = 0
    drafted: int = 0
    forwards_at_decode: int = 0
    #: the prompt tokens still to prefill, a chunk an engine step (with the engine's prefill_chunk); None once in
    prompt: np.ndarray | None = None
    #: a speculating row whose output is greedy's: the engine's JoinRule moves it into the batched Run and back
    joinable: bool = False
    #: while greedy steps a joined row in the batched Run: its drafting controller, kept to take the row back
    parked: Any = None
    #: its controller and options: the JoinRule judges a new row by the steps of the rows of its kind
    kind: tuple[str, str] = ("", "")
    #: the JoinRule placed it at least once (a fresh row has no place to keep)
    placed: bool = False
    #: completion 0 of a request of n: the other completions, whose rows copy its prompt's KV (one prefill for all)
    followers: list[_Slot] = attrs.field(factory=list)
    #: completion i > 0 of such a request: it waits for its leader's prompt instead of feeding its own
    leader: _Slot | None = None


class Engine:
    """One thread that owns the models and runs every request's completions as rows (see the module docstring).

    :param models: role -> LoadedModel; "target" at least (a decoder-only model). Requests may use these roles only.
    :param registry: where controllers and processors are looked up by name (default: entry points autoloaded).
    :param max_rows: rows of the target's KV buffer: completions that run at once.
    :param max_queue: requests that may wait for rows; one more is refused with QueueFullError.
    :param max_length: positions of each row (default: the model's).
    :param join_rule: when a speculating row joins the batched step (decoctl.serve._join_rule; default its cost rule).
    :param clock: what the join rule's costs are measured with (seconds).
    :param warm: run a token through every row once at start (see ``_warm``).
    :param prefill_chunk: feed prompts in chunks of at most this many tokens, one chunk a prompt an engine step
        (None: the chunks the join rule's measured costs allow while rows decode, prompts whole while none does).
    :param deterministic: every completion's logits bitwise its offline twin's under any load (see the module
        docstring); its costs are in docs/BENCHMARKS.md (Serving).
    """

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
    ) -> None:
        if "target" not in models:
            raise ConfigError("the engine needs a 'target' model")
        target = models["target"]
        if target.encoder is not None:
            raise ConfigError(
                f"model {target.name} is an encoder-decoder model: decoctl serve runs decoder-only models "
                "(use decoctl generate for it)"
            )
        if max_rows < 1 or max_queue < 0:
            raise ConfigError(f"max_rows={max_rows} must be at least 1 and max_queue={max_queue} at least 0")
        self.models = dict(models)
        self.registry = registry or PluginRegistry()
        # collected now, once: requests look them up from the server's threads and the engine's
        self.registry.controllers()
        self.registry.processors()
        self.max_rows = max_rows
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self.deterministic = deterministic
        self._debug = debug
        self.rows = Rows("target", target, capacity=max_rows, max_length=max_length, debug=debug)
        for _ in range(max_rows - 1):
            self.rows.fork(0)  # every row live from the start, empty; the engine keeps its own free list
        self.max_length = self.rows[0].max_length
        if warm:
            self._warm()
        #: deterministic, on a model whose batched step's rows differ from one-row steps: each row steps alone
        self.rows_alone = deterministic and max_rows > 1 and not self._batch_invariant()
        self._free = list(range(max_rows))
        self._slots: dict[int, _Slot] = {}
        self._spare: dict[str, list[Sequence]] = collections.defaultdict(list)
        self._queue: collections.deque[Handle] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._plans: collections.OrderedDict[tuple[str, str, str], _Plan] = collections.OrderedDict()
        self._plans_lock = threading.Lock()
        self._closing = False
        self._thread: threading.Thread | None = None
        #: why the engine thread stopped, when an exception escaped its loop (None while it is sound)
        self.failure: str | None = None
        self._on_failure: list[Callable[[str], None]] = []
        #: time.monotonic() past which a drain cuts what still runs (None: no drain asked for, or no limit)
        self._deadline: float | None = None
        self._draining = False
        #: counters for /metrics and /health (read from any thread)
        self.steps = 0
        self.batched_runs = 0
        self.completions = 0
        self.cancelled = 0
        self.joined = 0
        self.resumed = 0
        self.join_rule = join_rule or JoinRule()
        self._clock = clock

    def _warm(self) -> None:
        """Feed one token to every row, step them all in one batched Run, and empty them again. A row's first
        forward pays for the first touch of its part of the KV buffer and its outputs (Gemma 3 270M int8: about 50
        ms against 16 for the same forward after), and the first batched Run for its own buffers: paid here, at
        start, not by the steps of the first requests that use each row (a burst of requests after a quiet spell
        met it on every row at once)."""
        for row in range(self.max_rows):
            self.rows[row].prefill(np.zeros(1, np.int64))
        self.rows.step(np.zeros(self.max_rows, np.int64))
        for row in range(self.max_rows):
            self.rows[row].rewind(0)
            self.rows[row].stats = SequenceStats()

    def _batch_invariant(self) -> bool:
        """Whether a batched step gives every row, bitwise, the logits of that row's one-row step: every row is fed
        a token after the same one, in one batched Run and then each in a Run of its own, and the rows emptied
        again. The kernels that differ (MatMulNBits at accuracy level 0: one row takes a kernel of its own) differ
        at any input."""
        rows = self.max_rows
        vocab = self.models["target"].spec.vocab_size
        tokens = np.arange(1, rows + 1, dtype=np.int64) % vocab
        for row in range(rows):
            self.rows[row].rewind(0)
            self.rows[row].prefill(np.zeros(1, np.int64), logits=False)
        batched = np.array(self.rows.step(tokens), copy=True)
        same = True
        for row in range(rows):
            self.rows[row].rewind(1)
            alone = np.asarray(self.rows[row].forward((int(tokens[row]),)))[0]
            same = same and bool(np.array_equal(alone, batched[row]))
        for row in range(rows):
            self.rows[row].rewind(0)
            self.rows[row].stats = SequenceStats()
        if not same:
            log.info("decoctl.serve.rows_alone", model=self.models["target"].name)
        return same

    # -- the caller's side (any thread) ------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def live_rows(self) -> int:
        return self.max_rows - len(self._free)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def draining(self) -> bool:
        """Shutting down (``drain`` or ``close`` called): no new requests, the live ones finishing."""
        return self._closing and self.failure is None

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` (on the engine thread) if the engine thread dies."""
        self._on_failure.append(callback)

    def check(self, request: EngineRequest) -> _Plan:
        """The request's checked plan; ConfigError naming what it asks for that this engine cannot give."""
        if not request.ids:
            raise ConfigError("the prompt is empty and the model adds no BOS token: give some prompt text")
        if len(request.ids) >= self.max_length:
            raise ConfigError(
                f"the prompt has {len(request.ids)} tokens but the model's context holds {self.max_length} "
                f"positions, prompt and completion together: shorten the prompt to under {self.max_length} tokens"
            )
        if request.max_new_tokens < 1:
            raise ConfigError(f"max_tokens={request.max_new_tokens} must be at least 1")
        if not 1 <= request.n <= self.max_rows:
            raise ConfigError(f"n={request.n} must be from 1 to {self.max_rows} (the server's --max-rows)")
        vocab = self.models["target"].spec.vocab_size
        if any(not 0 <= t < vocab for t in request.ids):
            raise ConfigError(f"the prompt holds token ids outside the vocabulary 0..{vocab - 1}")
        plan = self._plan(request.controller, request.options, request.processors)
        scratch = plan.spec.scratch(dict(plan.options))
        if len(request.ids) + scratch >= self.max_length:
            raise ConfigError(
                f"the prompt has {len(request.ids)} tokens and controller {plan.spec.name!r} needs {scratch} positions "
                f"of scratch, but the model's context holds {self.max_length} positions: shorten the prompt"
            )
        if request.logprobs is not None and not plan.batched:
            raise ConfigError(
                f"logprobs: controller {plan.spec.name!r} commits tokens from its own verification, which gives no "
                "per-token log-probabilities here; use greedy or sample (the default) for logprobs"
            )
        return plan

    def submit(self, request: EngineRequest, on_event: Callable[[Event], None]) -> Handle:
        """Queue ``request``; ``on_event`` receives its Delta, Finished (one per completion) or Failed events from
        the engine thread. ConfigError for a request it cannot run, QueueFullError when ``max_queue`` wait already,
        EngineClosedError while shutting down."""
        handle = Handle(request, on_event, self.check(request))
        with self._wake:
            if self.failure is not None:
                raise EngineClosedError(f"{self.failure}: send the request to another replica")
            if self._closing:
                raise EngineClosedError("the server is shutting down: send the request to another replica")
            if len(self._queue) >= self.max_queue:
                raise QueueFullError(
                    f"{len(self._queue)} requests are waiting for rows (--max-queue {self.max_queue}): retry later"
                )
            self._queue.append(handle)
            self._wake.notify()
        return handle

    def start(self) -> None:
        """Start the engine thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="decoctl-engine", daemon=True)
            self._thread.start()

    def drain(self, seconds: float | None) -> None:
        """Begin shutting down, without waiting: take no new requests (EngineClosedError) and let the live and
        queued ones run; after ``seconds`` (None: no limit) cut the completions still running (finish_reason
        "shutdown") and fail the requests still waiting. ``close`` then waits for the engine thread."""
        with self._wake:
            self._closing = self._draining = True
            if seconds is not None:
                deadline = time.monotonic() + seconds
                self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)
            self._wake.notify()

    def close(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; with ``drain`` let the live and queued ones finish first (else cancel them); wait
        for the engine thread."""
        with self._wake:
            self._closing = True
            if not drain:
                for handle in self._queue:
                    handle.cancel()
                for slot in self._slots.values():
                    slot.handle.cancel()
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- plans ---------------------------------------------------------------------------------------------------
    def _plan(
        self, controller: str, options: Mapping[str, Any], processors: str | list[dict[str, Any]] | None
    ) -> _Plan:
        key = (
            normalise_name(controller),
            json.dumps(dict(options), sort_keys=True, default=str),
            json.dumps(processors, sort_keys=True, default=str),
        )
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                return plan
        plan = self._make_plan(controller, options, processors)
        with self._plans_lock:
            self._plans[key] = plan
            while len(self._plans) > PLANS_KEPT:
                self._plans.popitem(last=False)
        return plan

    def _make_plan(
        self, controller: str, options: Mapping[str, Any], processors: str | list[dict[str, Any]] | None
    ) -> _Plan:
        installed = self.registry.controllers()
        spec = installed.get(normalise_name(controller))
        if spec is None:
            raise ConfigError(
                f"unknown controller {controller!r}: a request chooses among the installed controllers "
                f"({', '.join(sorted(installed))}), never a path or a library"
            )
        # the Generator checks options, roles' capabilities and the chain exactly as decoctl generate does; it is
        # given loaded models only, so a request never makes the server load one
        from decoctl.specs import parse_options

        parsed = parse_options(f"controller {spec.name!r}", spec.options, options)
        roles = spec.active_roles(parsed)
        missing = [r for r in roles if r not in self.models]
        if missing:
            raise ConfigError(
                f"controller {spec.name!r} with these options needs the role(s) {missing}, which this server was not "
                f"started with (decoctl serve {role_flag(missing[0])}); its roles: {sorted(self.models)}"
            )
        checked = Generator(
            {r: self.models[r] for r in roles},
            spec.name,
            options=options,
            processors=processors,
            registry=self.registry,
            debug=self._debug,
        )
        if checked.spec.rows(checked.options) > 1:
            raise ConfigError(
                f"controller {spec.name!r} with these options holds {checked.spec.rows(checked.options)} rows per "
                "request (parallel samples or beams): ask for several completions with the request's n instead"
            )
        batched = checked.spec.batched and roles == ("target",)
        return _Plan(
            spec=checked.spec, options=checked.options, processors=processors, roles=tuple(roles), batched=batched
        )

    # -- the engine thread -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the loop itself broke: nothing answers the requests any more
            self._die(exc)

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
        if self._draining:
            (log.warning if cut or refused else log.info)("decoctl.serve.drained", cut=cut, refused=refused)

    def _cut(self, waiting: list[Handle]) -> int:
        """The drain's time is up: end every live completion where it is (finish_reason "shutdown") and fail the
        requests that never got a row; how many completions were cut."""
        live = list(self._slots.values())
        for slot in live:
            self._flush(slot)
            self._end(slot, "shutdown")
        for handle in waiting:
            handle._emit(Failed(message="the server shut down before the request got a row", unavailable=True))
        return len(live)

    def _die(self, exc: BaseException) -> None:
        """An exception escaped the engine's loop: record why, fail every live and waiting request (503: not
        theirs), refuse new ones, and tell ``on_failure``'s callbacks."""
        reason = f"the server's engine stopped ({type(exc).__name__}: {exc})"
        log.error("decoctl.serve.engine_failed", error=reason)
        with self._wake:
            self.failure = reason
            self._closing = True
            waiting = list(self._queue)
            self._queue.clear()
        handles = {id(s.handle): s.handle for s in self._slots.values()}
        handles.update((id(h), h) for h in waiting)
        self._slots.clear()
        self._free = list(range(self.max_rows))
        for handle in handles.values():
            handle._emit(Failed(message=f"{reason}: retry on another replica", unavailable=True))
        for callback in self._on_failure:
            try:
                callback(reason)
            except Exception as error:
                log.warning("decoctl.serve.listener_failed", error=f"{type(error).__name__}: {error}")

    def _iteration(self) -> None:
        for slot in list(self._slots.values()):
            if slot.handle.cancelled:
                self._end(slot, "cancelled")
        self._admit()
        stepped: list[int] = []
        tokens: list[int] = []
        #: rows whose prompt's last token this step's Run feeds: their controllers start after it
        starting: list[_Slot] = []
        decoding = [r for r, s in self._slots.items() if s.prompt is None]
        speculating = {s: (r, s.kind) for r, s in self._slots.items() if s.joinable and s.prompt is None}
        batched_rows = [r for r in decoding if self._slots[r].batched and self._slots[r] not in speculating]
        batch, span = len(batched_rows), max(batched_rows, default=-1) + 1
        joining: set[Any] = set()
        if speculating:
            joining = self.join_rule.choose(
                speculating,
                batch,
                span,
                batched={s for s in speculating if s.batched},
                final={s for s in speculating if not _resumable(s)},
                fresh={s for s in speculating if not s.placed},
            )
            for slot in speculating:
                slot.placed = True
        # with rows decoding, the prompts' chunks spend the step's budget of prompt work (the first at least one
        # token); with none, or before the costs are measured, the prompts go in whole
        budget = self.join_rule.prefill_budget(max(span, 1), self.max_rows) if decoding else None
        fed = False
        for row, slot in list(self._slots.items()):
            if self._slots.get(row) is not slot:  # ended with another completion of its request
                continue
            if slot.prompt is not None:
                if slot.leader is not None or slot in starting:
                    continue  # its row takes (or took, this step) a copy of its leader's prompt
                if budget is not None and fed and not self._affordable(slot, budget):
                    continue
                fed = True
                began = self._clock()
                try:
                    last = self._prefill(slot, budget)
                except Exception as exc:
                    self._fail_request(slot.handle, exc)
                    continue
                if budget is not None:
                    budget -= self._clock() - began
                if last is not None:  # the prompt's last token goes in this step's Run, its logits the first token's
                    for started in (slot, *self._copies(slot)):
                        stepped.append(started.row)
                        tokens.append(last)
                        starting.append(started)
                    continue
                if slot.prompt is not None or slot.joinable:
                    continue  # a speculating row's first step is the join rule's to place, with the others'
            if slot.joinable and not slot.batched and slot in joining:
                pending = self._join(slot)
                if pending is not None:
                    stepped.append(row)
                    tokens.append(pending)
                    continue
            elif slot.joinable and slot.batched and slot not in joining:
                self._resume(slot)
            try:
                token = self._advance(slot)
            except Exception as exc:
                self._fail_request(slot.handle, exc)
                continue
            if slot.host.done:
                self._finish(slot)
            elif token is not None:
                stepped.append(row)
                tokens.append(token)
        if stepped:
            began = self._clock()
            if self.rows_alone:
                for row, token in zip(stepped, tokens, strict=True):
                    self.rows[row].forward((token,))
            else:
                self.rows.step(tokens, rows=stepped)
            self.join_rule.observe_run(max(stepped) + 1, self._clock() - began)  # a Run computes rows 0..max
            self.batched_runs += 1
        for slot in starting:
            if self._slots.get(slot.row) is slot:
                self._started(slot)
        self.steps += 1
        for slot in list(self._slots.values()):
            self._flush(slot)

    def _advance(self, slot: _Slot) -> int | None:
        """One step of a completion: the token to feed in the batched Run (a batched controller's), or None (a
        controller that stepped its row itself)."""
        host = slot.host
        if slot.batched:
            token = int(slot.controller.next_token(host))
            if slot.handle.request.logprobs is not None:
                slot.logprobs.append(_logprob(host.target.logits()[-1], token, slot.handle.request.logprobs))
            host.commit((token,))
            return token
        target = host.target
        before, forwards = len(host.output_tokens), target.stats.forwards
        began = self._clock()
        slot.controller.step(host)
        committed = len(host.output_tokens) - before
        if slot.joinable:
            self.join_rule.observe_step(slot, committed, self._clock() - began, slot.kind)
        if committed == 0 and not host.done:
            raise ControllerError(
                f"controller {slot.handle.plan.spec.name!r} made a step that committed no token and did not finish"
            )
        # a verify forward commits the drafts it accepted and then the target's own token
        drafted = max(0, committed - max(1, target.stats.forwards - forwards))
        slot.drafted_now += drafted
        slot.drafted += drafted
        return None

    def _join(self, slot: _Slot) -> int | None:
        """Move a speculating row into the batched step: its pending token (committed, not yet in the target's KV,
        as a verifying controller leaves it after a verify) is fed in this step's Run, or, where the KV still holds
        it with its logits ready (``Verifier.take_over``), greedy takes the next token from them (None is returned
        and the row steps as a batched one); greedy steps it until ``_resume``; a controller without ``resume``
        joins for good. None, and the row keeps its controller for good, when its KV is in neither state."""
        host = slot.host
        output = host.output_tokens
        context = len(host.prompt_tokens) + len(output)
        cached = host.target.length == context  # the last token cached, its logits ready: greedy's own state
        if not cached and host.target.length != context - 1:
            slot.joinable = False
            self.join_rule.forget(slot)
            return None
        if _resumable(slot):
            slot.parked = slot.controller
        else:
            slot.joinable = False
            self.join_rule.forget(slot)
        slot.controller, slot.batched = Greedy(), True
        self.joined += 1
        if cached:  # greedy picks the next token from the cached logits in this step (_advance)
            return None
        return int(output[-1] if output else host.prompt_tokens[-1])

    def _resume(self, slot: _Slot) -> None:
        """Give a joined row back to its drafting controller (``resume``): the batched Run left its last committed
        token in the target's KV, which the controller makes pending again. When the KV is not in that state the
        row stays batched for good."""
        host = slot.host
        if slot.parked is None or host.target.length != len(host.prompt_tokens) + len(host.output_tokens):
            slot.joinable = False
            self.join_rule.forget(slot)
            return
        slot.parked.resume(host)
        slot.controller, slot.parked, slot.batched = slot.parked, None, False
        self.resumed += 1

    def _admit(self) -> None:
        while True:
            with self._wake:
                if not self._queue or len(self._free) < self._queue[0].request.n:
                    return
                handle = self._queue.popleft()
            if handle.cancelled:
                continue
            started: list[_Slot] = []
            try:
                for index in range(handle.request.n):
                    started.append(self._start(handle, index))
            except Exception as exc:
                for slot in started:
                    self._release(slot)
                self._fail_request(handle, exc)
                continue
            if len(started) > 1 and self._in_run(started[0]):  # one prefill, copied into the other rows
                started[0].followers = started[1:]
                for slot in started[1:]:
                    slot.leader = started[0]
            for slot in started:
                self._slots[slot.row] = slot
                self._flush(slot)

    def _start(self, handle: Handle, index: int) -> _Slot:
        """Prefill completion ``index`` of ``handle`` into a free row and start its controller."""
        request, plan = handle.request, handle.plan
        row = self._free.pop(0)
        target = self.rows[row]
        target.rewind(0)
        target.stats = SequenceStats()
        roles: dict[str, Sequence] = {"target": target}
        for role in plan.roles:
            if role != "target":
                roles[role] = self._sequence(role)
        model = self.models["target"]
        ids = np.asarray(request.ids, np.int64)
        rules = StopRules(
            eos_token_ids=model.spec.eos_token_ids,
            max_new_tokens=request.max_new_tokens,
            stop_strings=request.stop,
            # a drafting controller's scratch (positions it feeds beyond what it keeps) must fit in the row too
            capacity=target.max_length - len(ids) - plan.spec.scratch(dict(plan.options)),
        )
        chain = parse_processor_chain(plan.processors, self.registry)
        chain.reset(ids)
        slot: _Slot | None = None

        def sink(tokens: list[int], text: str) -> None:
            assert slot is not None
            slot.committed.append((tokens, text))

        output = Output(rules, model.tokenizer.detokenizer(), sink)
        host = Host(roles, output, prompt=ids, chain=chain, seed=request.seed)
        if index > 0:  # completion i draws from the i-th spawned stream, as sample's n does
            host.rng = np.random.default_rng(request.seed).spawn(request.n - 1)[index - 1]
        host.prefill_chunk = self.prefill_chunk
        factory = plan.spec.factory
        if factory is None:
            from decoctl import abi  # a shared-library controller the operator installed

            factory = abi.library_factory(plan.spec)
        controller = factory(dict(plan.options))
        batched = plan.batched and isinstance(controller, RowController)
        slot = _Slot(
            handle=handle,
            index=index,
            row=row,
            host=host,
            controller=controller,
            batched=batched,
            roles=roles,
            started=time.perf_counter(),
        )
        target.attach_images(request.images)
        slot.prompt = ids  # fed by the engine's steps (_prefill)
        slot.kind = (plan.spec.name, json.dumps(dict(plan.options), sort_keys=True, default=str))
        return slot

    def _in_run(self, slot: _Slot) -> bool:
        """Whether the row, while rows decode, feeds its prompt's last token in the batched Run (a batched
        controller's row, with no image features to place; never when deterministic, where the prompt's last token
        goes in the prompt's own forward, as generate feeds it)."""
        return slot.batched and slot.handle.request.images is None and not self.deterministic

    def _prompt_end(self, slot: _Slot, budget: float | None) -> tuple[bool, int]:
        """Whether the row feeds its prompt's last token in the batched Run (with rows decoding, ``budget`` given,
        or with followers to copy the prompt into), and so where its chunks end."""
        assert slot.prompt is not None
        in_run = (budget is not None or bool(slot.followers)) and self._in_run(slot)
        return in_run, len(slot.prompt) - in_run

    def _affordable(self, slot: _Slot, budget: float) -> bool:
        """Whether the next token of the row's prompt fits in what is left of the step's budget (with rows
        decoding); a row with only its last token left, which the Run feeds, always does."""
        in_run, end = self._prompt_end(slot, budget)
        done = slot.host.target.length
        if done >= end:
            return True
        least = self._fixed_chunk(end - done) if self.deterministic else 1
        ending = not in_run and done + least == end
        return (self.join_rule.prefill_seconds(least, logits=ending) or 0.0) <= budget

    def _fixed_chunk(self, remaining: int) -> int:
        """Deterministic: the next chunk is the one ``generate`` feeds (the rest of the prompt, or with prefill_chunk
        C the next C tokens: chunks start at multiples of C), whatever the step's budget."""
        return remaining if self.prefill_chunk is None else min(self.prefill_chunk, remaining)

    def _prefill(self, slot: _Slot, budget: float | None) -> int | None:
        """Feed the next chunk of a completion's prompt: with rows decoding, the tokens that fit in ``budget``
        seconds by the join rule's prices (at least one), else (None) the rest; at most ``prefill_chunk`` either
        way (deterministic: the chunk ``generate`` feeds, whatever the budget; see ``_fixed_chunk``). After the last,
        start its controller. A chunk computes logits only where it ends the prompt (a chunk
        before computes none: the LM head skipped). With rows decoding, a batched controller's row feeds its
        prompt's last token in the batched Run, where its logits cost a row of the Run rather than an LM head of
        their own: that token is returned once the chunks before it are in (the caller feeds it, then calls
        ``_started``)."""
        assert slot.prompt is not None
        target = slot.host.target
        done = target.length
        in_run, end = self._prompt_end(slot, budget)
        remaining = end - done
        if remaining > 0:
            logits = not in_run
            size = remaining
            if self.deterministic:
                size = self._fixed_chunk(remaining)
            else:
                if budget is not None:
                    size = self.join_rule.prefill_tokens_within(budget, remaining, logits=logits)
                if self.prefill_chunk is not None:
                    size = min(size, self.prefill_chunk)
            logits = logits and done + size == end
            began = self._clock()
            target.prefill(slot.prompt[done : done + size], logits=logits)
            self.join_rule.observe_prefill(size, self._clock() - began, logits=logits)
        if target.length < end:
            return None
        if in_run:
            return int(slot.prompt[-1])
        self._started(slot)
        return None

    def _copies(self, leader: _Slot) -> list[_Slot]:
        """The leader's prompt is in its row but for its last token: its followers' rows take a copy of it (the
        caller feeds each row that last token in the Run)."""
        copied = []
        for follower in leader.followers:
            if self._slots.get(follower.row) is follower:
                self.rows.copy(leader.row, follower.row)
                follower.leader = None
                copied.append(follower)
        leader.followers = []
        return copied

    def _started(self, slot: _Slot) -> None:
        """The whole prompt is in the row's KV, its last logits ready: start the completion's controller."""
        slot.prompt = None
        slot.controller.start(slot.host)
        slot.forwards_at_decode = slot.host.target.stats.forwards
        # deterministic: a speculating row keeps its controller, whose verify forwards compute its positions as its
        # offline run does (a joined row's one-token steps compute them otherwise, in the last bits)
        slot.joinable = _greedy_verifier(slot) and not self.deterministic

    def _sequence(self, role: str) -> Sequence:
        spare = self._spare[role]
        if spare:
            sequence = spare.pop()
        else:
            sequence = Sequence(role, self.models[role], max_length=self.max_length, debug=self._debug)
        sequence.rewind(0)
        sequence.stats = SequenceStats()
        return sequence

    def _release(self, slot: _Slot) -> None:
        """Give the slot's row and sequences back (the row emptied, so a batched step passes over it cheaply)."""
        self._slots.pop(slot.row, None)
        if slot.row not in self._free:
            self.rows[slot.row].rewind(0)
            self._free.append(slot.row)
            self._free.sort()
        for role, sequence in slot.roles.items():
            if role != "target":
                self._spare[role].append(sequence)
        slot.roles = {}
        self.join_rule.forget(slot)

    def _flush(self, slot: _Slot) -> None:
        if not slot.committed:
            return
        tokens = [t for chunk, _ in slot.committed for t in chunk]
        text = "".join(piece for _, piece in slot.committed)
        logprobs = tuple(slot.logprobs) if slot.handle.request.logprobs is not None else None
        drafted = min(slot.drafted_now, len(tokens))
        slot.committed, slot.logprobs, slot.drafted_now = [], [], 0
        slot.handle._emit(Delta(index=slot.index, text=text, tokens=tuple(tokens), drafted=drafted, logprobs=logprobs))

    def _finish(self, slot: _Slot) -> None:
        self._flush(slot)
        self._end(slot, None)

    def _end(self, slot: _Slot, cancelled: str | None) -> None:
        host = slot.host
        output_tokens = tuple(int(t) for t in host.output_tokens)
        stop_reason = cancelled or _stop_reason(host)
        forwards = host.target.stats.forwards - slot.forwards_at_decode
        text = _text(host)
        self._release(slot)
        self.completions += 1
        self.cancelled += cancelled is not None
        slot.handle._emit(
            Finished(
                index=slot.index,
                finish_reason=cancelled or FINISH_REASONS.get(stop_reason or "", "stop"),
                stop_reason=stop_reason,
                text=text,
                tokens=output_tokens,
                prompt_tokens=len(slot.handle.request.ids),
                target_forwards=forwards,
                drafted=slot.drafted,
                seconds=time.perf_counter() - slot.started,
            )
        )

    def _fail_request(self, handle: Handle, exc: BaseException) -> None:
        """End every completion of ``handle`` and tell it why (the message only: never a traceback)."""
        for slot in [s for s in self._slots.values() if s.handle is handle]:
            self._release(slot)
        if isinstance(exc, DecoctlError):
            message = str(exc)
        else:
            message = f"controller {handle.plan.spec.name!r} failed ({type(exc).__name__}: {exc})"
        log.warning("decoctl.serve.request_failed", error=message)
        handle._emit(Failed(message=message))

    def _fail_all(self, exc: Exception) -> None:
        log.warning("decoctl.serve.step_failed", error=f"{type(exc).__name__}: {exc}")
        for handle in {id(s.handle): s.handle for s in self._slots.values()}.values():
            self._fail_request(handle, exc)
        # a batched step may have stopped half-way: the rows start again empty
        self._slots.clear()
        for row in range(self.max_rows):
            self.rows[row].rewind(0)
        self._free = list(range(self.max_rows))


def _greedy_verifier(slot: _Slot) -> bool:
    """Whether a completion's controller drafts and verifies greedily (it records so in the trace, as decoctl's
    drafting controllers do): its tokens are greedy's, so greedy may take its row over."""
    return not slot.batched and slot.host.trace.get("acceptance") == "greedy-exact-match"


def _resumable(slot: _Slot) -> bool:
    """Whether a speculating row's drafting controller can take its row back after joining (it has ``resume``)."""
    controller = slot.parked if slot.parked is not None else slot.controller
    return callable(getattr(controller, "resume", None))


def _stop_reason(host: Host) -> str | None:
    reason: str | None = host.completions()[0][0].stop_reason
    return reason


def _text(host: Host) -> str:
    text: str = host.completions()[0][0].text
    return text


def _logprob(row: np.ndarray, token: int, top: int) -> TokenLogprob:
    """``token``'s log-probability under softmax(row) and the ``top`` most probable tokens' (row: float32[vocab])."""
    values = np.asarray(row, np.float64)
    shifted = values - values.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        picked = np.argpartition(-logprobs, min(top, len(logprobs) - 1))[:top]
        picked = picked[np.argsort(-logprobs[picked], kind="stable")]
        best = tuple((int(t), float(logprobs[t])) for t in picked)
    return TokenLogprob(token=token, logprob=float(logprobs[token]), top=best)
