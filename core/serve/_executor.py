"""The serving engine's executor: owns the target's rows and the other roles' sequences, runs a StepPlan on them.

executor.open(handle, index, row)                # a completion on a free row: host, chain, controller
report = executor.run(plan, completions)         # the plan's chunks, steps and one batched Run

It decides nothing (decoctl.serve._scheduler does): it feeds the chunks the plan names, starts the controllers whose
prompt is in, moves the rows the plan moves between drafting and the batched Run, steps the drafting rows, picks the
batched rows' tokens, feeds them in one onnxruntime Run, and reports which completions finished and which failed
(a controller or chain that raises fails its own request only). It measures what it runs for the join rule's costs.
"""

from __future__ import annotations

import collections
import enum
import time
from collections.abc import Callable, Mapping
from typing import Final, Literal, TypeVar

import attrs
import numpy as np

from decoctl.controllers import Greedy
from decoctl.errors import ControllerError, SequenceError
from decoctl.generation._opening import make_controller, open_host
from decoctl.generation._prefix_cache import PrefixCache, ring_split
from decoctl.host import Rows, Sequence, SequenceStats
from decoctl.logs import get_logger
from decoctl.model._kv_blocks import reuse_limit
from decoctl.model._loader import LoadedModel
from decoctl.plugins import PluginRegistry
from decoctl.serve._completion import Completion
from decoctl.serve._join_rule import JoinRule
from decoctl.serve._requests import Handle, TokenLogprob
from decoctl.serve._scheduler import ChunkEnd, PromptChunk, StepPlan
from decoctl.serve._states import LIVE, RequestState

__all__ = ["Executor", "StepReport"]

log = get_logger(__name__)

_S = RequestState


@attrs.frozen(kw_only=True)
class StepReport:
    """What a step did: the completions its stop rules ended, and those that raised (each with its exception: its
    request fails, its other completions with it)."""

    finished: tuple[Completion, ...] = ()
    failed: tuple[tuple[Completion, Exception], ...] = ()


class Executor:
    """Runs step plans on the models (see the module docstring).

    :param models: role -> LoadedModel, "target" first among them.
    :param registry: where each plan's processors were found (a chain that cannot be cloned is built again).
    :param max_rows: rows of the target's KV buffer. :param max_length: positions of each row (default: the model's).
    :param costs: the join rule, which the executor's measurements feed. :param clock: what they are measured with.
    :param prefill_chunk: the most tokens of a prompt a forward holds (a drafting controller's own prefills too).
    :param deterministic: no speculating row joins the batched Run (see decoctl.serve._engine).
    :param prefix_cache: the target's prompts and answers kept (decoctl.generation._prefix_cache); None: off.
    """

    def __init__(
        self,
        models: Mapping[str, LoadedModel],
        *,
        registry: PluginRegistry,
        max_rows: int,
        max_length: int | None,
        costs: JoinRule,
        clock: Callable[[], float],
        prefill_chunk: int | None,
        deterministic: bool,
        debug: bool | None,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.models = models
        self.prefix_cache = prefix_cache
        self.deterministic = deterministic
        self.registry = registry
        self.costs = costs
        self.prefill_chunk = prefill_chunk
        self._clock = clock
        self._debug = debug
        self.rows = Rows("target", models["target"], capacity=max_rows, max_length=max_length, debug=debug)
        for _ in range(max_rows - 1):
            self.rows.fork(0)  # every row live from the start, empty; the engine keeps its own free list
        self.max_rows = max_rows
        self.max_length = self.rows[0].max_length
        self._spare: dict[str, list[Sequence]] = collections.defaultdict(list)
        #: each row steps in a Run of its own (deterministic, on a model whose batched step differs from one-row steps)
        self.rows_alone = False
        #: counters for /metrics and /health (read from any thread)
        self.batched_runs = 0
        self.joined = 0
        self.resumed = 0
        self.preempted = 0

    # -- set-up ----------------------------------------------------------------------------------------------------
    def warm(self) -> None:
        """Feed one token to every row, step them all in one batched Run, and empty them again. A row's first
        forward pays for the first touch of its part of the KV buffer and its outputs (Gemma 3 270M int8: about 50
        ms against 16 for the same forward after), and the first batched Run for its own buffers: paid here, at
        start, not by the steps of the first requests that use each row (a burst of requests after a quiet spell
        met it on every row at once)."""
        for row in range(self.max_rows):
            self.rows[row].prefill(np.zeros(1, np.int64))
        self.rows.step(np.zeros(self.max_rows, np.int64))
        self.empty()

    def batch_invariant(self) -> bool:
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
        self.empty()
        if not same:
            log.info("decoctl.serve.rows_alone", model=self.models["target"].name)
        return same

    def empty(self) -> None:
        """Every row emptied (a batched step that stopped half-way leaves rows in no known state)."""
        for row in range(self.max_rows):
            self.rows[row].rewind(0)
            self.rows[row].stats = SequenceStats()

    # -- a completion's row ------------------------------------------------------------------------------------------
    def cached(self, handle: Handle, ids: np.ndarray | None = None) -> int:
        """How many of ``handle``'s prompt tokens (``ids``: a preempted completion's history instead) the prefix
        cache would copy into a row now."""
        if self.prefix_cache is None:
            return 0
        ids = np.asarray(handle.request.ids if ids is None else ids, np.int64)
        room = reuse_limit(self.rows[0].runner.kv)
        return self.prefix_cache.cached(ids, room, handle.request.images, handle.request.adapter)

    def preempt(self, completion: Completion) -> None:
        """Give up the decoding completion's row: what its row holds (prompt and answer so far) becomes its
        history, kept by the prefix cache where there is one (its resumption copies it back, bitwise), and the row
        is emptied. Its host, controller, chain and output stay with it."""
        target = completion.host.target
        completion.history = np.array(target.tokens, np.int64)
        completion.kept_stats = target.stats
        target.stats = SequenceStats()
        self.keep(completion)
        self.costs.forget(completion)
        target.rewind(0)
        completion.row = -1
        completion.moves_to(_S.PREEMPTED)
        self.preempted += 1

    def reopen(self, completion: Completion, row: int, *, cached: int = 0) -> None:
        """Resume preempted ``completion`` on free row ``row``: its history goes in through the plans' chunks as a
        prompt (after the ``cached`` tokens the prefix cache copies), then its controller goes on where it stopped."""
        assert completion.history is not None
        request = completion.handle.request
        target = self.rows[row]
        target.rewind(0)
        target.stats = completion.kept_stats
        completion.kept_stats = None
        if self.models["target"].adapters is not None:
            target.runner.adapter = request.adapter
        completion.host._move_role("target", target)
        completion.roles["target"] = target
        completion.row = row
        completion.prompt = completion.history
        completion.history = None
        completion.resuming = True
        completion.moves_to(_S.PREFILLING)
        if cached:
            assert self.prefix_cache is not None
            copied = self.prefix_cache.restore(target, completion.prompt, limit=cached)
            if copied != cached:
                raise SequenceError(
                    f"the prefix cache copied {copied} tokens of a preempted request's history the plan counted "
                    f"{cached} cached for: the cache changed between the plan and the admission"
                )

    def open(self, handle: Handle, index: int, row: int, *, cached: int = 0) -> Completion:
        """Completion ``index`` of ``handle`` on free row ``row``: its host, logits chain and controller (its prompt
        goes in through the plans' chunks, after the ``cached`` tokens the prefix cache copies into the row)."""
        request, plan = handle.request, handle.plan
        target = self.rows[row]
        target.rewind(0)
        target.stats = SequenceStats()
        if self.models["target"].adapters is not None:  # the row runs the request's LoRA table (0: the base model)
            target.runner.adapter = request.adapter
        roles: dict[str, Sequence] = {"target": target}
        for role in plan.roles:
            if role != "target":
                roles[role] = self._sequence(role)
        ids = np.asarray(request.ids, np.int64)
        completion: Completion | None = None

        def sink(tokens: list[int], text: str) -> None:
            assert completion is not None
            completion.committed.append((tokens, text))

        host, _ = open_host(
            self.models["target"],
            roles,
            ids,
            max_new_tokens=request.max_new_tokens,
            stop=request.stop,
            seed=request.seed,
            chain=plan.new_chain(self.registry),
            sink=sink,
            # a drafting controller's scratch (positions it feeds beyond what it keeps) must fit in the row too
            scratch=plan.spec.scratch(dict(plan.options)),
            prefill_chunk=self.prefill_chunk,
        )
        if index > 0:  # completion i draws from the i-th spawned stream, as sample's n does
            host.rng = np.random.default_rng(request.seed).spawn(request.n - 1)[index - 1]
        controller = make_controller(plan.spec, plan.options, batched=plan.batched)
        completion = Completion(
            handle=handle,
            index=index,
            row=row,
            host=host,
            controller=controller,
            batched=plan.batched,
            roles=roles,
            started=time.perf_counter(),
            prompt=ids,
            kind=plan.kind,
        )
        target.attach_images(request.images)
        if cached:
            assert self.prefix_cache is not None
            copied = self.prefix_cache.restore(target, ids, limit=cached)
            if copied != cached:
                raise SequenceError(
                    f"the prefix cache copied {copied} tokens of a prompt the plan counted {cached} cached for: the "
                    "cache changed between the plan and the admission"
                )
        return completion

    def keep(self, completion: Completion) -> None:
        """The prefix cache keeps what the completion's row holds (its prompt, or prompt and answer)."""
        if self.prefix_cache is not None:
            self.prefix_cache.store(completion.host.target)

    def _sequence(self, role: str) -> Sequence:
        spare = self._spare[role]
        if spare:
            sequence = spare.pop()
        else:
            sequence = Sequence(role, self.models[role], max_length=self.max_length, debug=self._debug)
        sequence.rewind(0)
        sequence.stats = SequenceStats()
        return sequence

    def release(self, completion: Completion) -> None:
        """Give the completion's row and sequences back (the row emptied, so a batched step passes over it
        cheaply)."""
        self.rows[completion.row].rewind(0)
        for role, sequence in completion.roles.items():
            if role != "target":
                self._spare[role].append(sequence)
        completion.roles = {}
        self.costs.forget(completion)

    # -- a step ----------------------------------------------------------------------------------------------------
    def run(self, plan: StepPlan, completions: Mapping[int, Completion]) -> StepReport:
        """Run ``plan`` over the live ``completions`` (by row); see the module docstring."""
        step = _Step(completions)
        for chunk in plan.chunks:
            completion = step.live(chunk.row)
            if completion is not None:
                step.attempt(completion, self._feed, completion, chunk, step)
        for row in plan.resume:
            completion = step.live(row)
            if completion is not None and step.attempt(completion, self._resume, completion) is not _FAILED:
                self._advance(completion, step)
        for row in plan.join:
            completion = step.live(row)
            if completion is None:
                continue
            pending = step.attempt(completion, self._join, completion)
            if pending is not None and pending is not _FAILED:
                step.feed(completion, pending)
            elif pending is None:
                self._advance(completion, step)
        for row in (*plan.draft, *plan.decode):
            completion = step.live(row)
            if completion is not None:
                self._advance(completion, step)
        # in row order: a Run over every row 0..span then hands back its logits as they are, where rows in another
        # order would copy them (a vocabulary of floats a row, every step)
        fed = sorted(((c, token) for c, token in step.run if step.running(c)), key=lambda pair: pair[0].row)
        if fed:
            stepped = [c.row for c, _ in fed]
            tokens = [token for _, token in fed]
            began = self._clock()
            if self.rows_alone:
                for row, token in zip(stepped, tokens, strict=True):
                    self.rows[row].forward((token,))
            else:
                self.rows.step(tokens, rows=stepped)
            self.costs.observe_run(max(stepped) + 1, self._clock() - began)  # a Run computes rows 0..max
            self.batched_runs += 1
        for completion in step.starting:
            if step.running(completion):
                step.attempt(completion, self._started, completion)
        return StepReport(finished=tuple(step.finished), failed=tuple(step.failed))

    def _feed(self, completion: Completion, chunk: PromptChunk, step: _Step) -> None:
        """Feed a prompt chunk; after the prompt's last, start the controller, or (``ChunkEnd.RUN``) copy the prompt
        into the followers' rows and feed them all its last token in this step's Run."""
        if chunk.size:
            began = self._clock()
            self._prefill(completion, chunk)
            self.costs.observe_prefill(chunk.size, self._clock() - began, logits=chunk.logits)
        if chunk.then is ChunkEnd.START:
            self._started(completion)
        elif chunk.then is ChunkEnd.RUN:
            last = int(completion.prompt[-1])
            for started in (completion, *self._copies(completion, step)):
                step.feed(started, last)
                step.starting.append(started)

    def _prefill(self, completion: Completion, chunk: PromptChunk) -> None:
        """Feed a prompt chunk. With the prefix cache on a ring-cache model, a chunk that would carry the prompt past
        what the rings hold from position 0 pauses there while the blocks before it are kept (the rest of the chunk
        would evict them), as the Generator's prefill does."""
        target, end = completion.host.target, chunk.start + chunk.size
        part = completion.prompt[chunk.start : end]
        split = None if self.prefix_cache is None else ring_split(self.prefix_cache, target, completion.prompt)
        if self.prefix_cache is None or split is None or split <= chunk.start:
            target.prefill(part, logits=chunk.logits)
            return
        if split < end:
            target.prefill(part[: split - chunk.start], logits=False)
            self.prefix_cache.store(target)
            target.prefill(part[split - chunk.start :], logits=chunk.logits)
            return
        target.prefill(part, logits=chunk.logits)
        self.prefix_cache.store(target)

    def _copies(self, leader: Completion, step: _Step) -> list[Completion]:
        """The leader's prompt is in its row but for its last token: its followers' rows take a copy of it."""
        copied = []
        for follower in leader.followers:
            if step.running(follower):
                self.rows.copy(leader.row, follower.row)
                follower.leader = None
                copied.append(follower)
        leader.followers = []
        return copied

    def _started(self, completion: Completion) -> None:
        """The whole prompt is in the row's KV, its last logits ready: start the completion's controller (a resumed
        completion's goes on where it stopped)."""
        host = completion.host
        if completion.resuming:
            completion.resuming = False
            completion.moves_to(_S.DECODING)
            return
        self.keep(completion)
        completion.controller.start(host)
        completion.forwards_at_decode = host.target.stats.forwards
        # deterministic: a speculating row keeps its controller, whose verify forwards compute its positions as its
        # offline run does (a joined row's one-token steps compute them otherwise, in the last bits)
        completion.joinable = (
            not completion.batched and host.trace.get("acceptance") == "greedy-exact-match" and not self.deterministic
        )
        completion.moves_to(_S.DECODING if completion.batched else _S.DRAFTING)

    def _advance(self, completion: Completion, step: _Step) -> None:
        """One step of a completion: a batched controller picks its token for the Run, any other steps its row."""
        if completion.batched:
            token = step.attempt(completion, self._pick, completion)
            if token is _FAILED:
                return
            if completion.host.done:
                step.finished.append(completion)
            else:
                step.feed(completion, token)
            return
        if step.attempt(completion, self._draft, completion) is not _FAILED and completion.host.done:
            step.finished.append(completion)

    def _pick(self, completion: Completion) -> int:
        host = completion.host
        token = int(completion.controller.next_token(host))
        top = completion.handle.request.logprobs
        if top is not None:
            completion.logprobs.append(_logprob(host.target.logits()[-1], token, top))
        host.commit((token,))
        return token

    def _draft(self, completion: Completion) -> None:
        host = completion.host
        target = host.target
        before, forwards = len(host.output_tokens), target.stats.forwards
        began = self._clock()
        completion.controller.step(host)
        committed = len(host.output_tokens) - before
        if completion.joinable:
            self.costs.observe_step(completion, committed, self._clock() - began, completion.kind)
        if committed == 0 and not host.done:
            raise ControllerError(
                f"controller {completion.handle.plan.spec.name!r} made a step that committed no token and did not "
                "finish"
            )
        # a verify forward commits the drafts it accepted and then the target's own token
        drafted = max(0, committed - max(1, target.stats.forwards - forwards))
        completion.drafted_now += drafted
        completion.drafted += drafted

    def _join(self, completion: Completion) -> int | None:
        """Move a speculating row into the batched step: its pending token (committed, not yet in the target's KV,
        as a verifying controller leaves it after a verify) is returned for this step's Run, or, where the KV still
        holds it with its logits ready (``Verifier.take_over``), greedy takes the next token from them (None is
        returned and the row steps as a batched one); greedy steps it until ``_resume``; a controller without
        ``resume`` joins for good. None, and the row keeps its controller for good, when its KV is in neither
        state."""
        host = completion.host
        output = host.output_tokens
        context = len(host.prompt_tokens) + len(output)
        cached = host.target.length == context  # the last token cached, its logits ready: greedy's own state
        if not cached and host.target.length != context - 1:
            completion.joinable = False
            self.costs.forget(completion)
            return None
        if completion.resumable:
            completion.parked = completion.controller
            completion.moves_to(_S.JOINED)
        else:
            completion.joinable = False
            self.costs.forget(completion)
            completion.moves_to(_S.DECODING)
        completion.controller, completion.batched = Greedy(), True
        self.joined += 1
        if cached:  # greedy picks the next token from the cached logits in this step
            return None
        return int(output[-1] if output else host.prompt_tokens[-1])

    def _resume(self, completion: Completion) -> None:
        """Give a joined row back to its drafting controller (``resume``): the batched Run left its last committed
        token in the target's KV, which the controller makes pending again. When the KV is not in that state the
        row stays batched for good."""
        host = completion.host
        if completion.parked is None or host.target.length != len(host.prompt_tokens) + len(host.output_tokens):
            completion.joinable = False
            self.costs.forget(completion)
            completion.moves_to(_S.DECODING)
            return
        completion.parked.resume(host)
        completion.controller, completion.parked, completion.batched = completion.parked, None, False
        completion.moves_to(_S.DRAFTING)
        self.resumed += 1


class _Outcome(enum.Enum):
    FAILED = "failed"


#: what ``_Step.attempt`` returns for a call that raised
_FAILED: Final = _Outcome.FAILED
_T = TypeVar("_T")


class _Step:
    """One step's bookkeeping: the tokens for the Run, the rows that start after it, and what finished or failed (a
    failed completion's whole request is skipped for the rest of the step)."""

    def __init__(self, completions: Mapping[int, Completion]) -> None:
        self.completions = completions
        self.run: list[tuple[Completion, int]] = []
        self.starting: list[Completion] = []
        self.finished: list[Completion] = []
        self.failed: list[tuple[Completion, Exception]] = []
        self._failed_requests: set[int] = set()

    def live(self, row: int) -> Completion | None:
        """The completion on ``row``, while it runs (not finished, and its request not failed this step)."""
        completion = self.completions.get(row)
        return completion if completion is not None and self.running(completion) else None

    def running(self, completion: Completion) -> bool:
        on_its_row = self.completions.get(completion.row) is completion
        return (
            on_its_row
            and completion.state in LIVE
            and id(completion.handle) not in self._failed_requests
            and completion not in self.finished
        )

    def feed(self, completion: Completion, token: int) -> None:
        self.run.append((completion, token))

    def attempt(self, completion: Completion, call: Callable[..., _T], *args: object) -> _T | Literal[_Outcome.FAILED]:
        """``call(*args)``; an exception fails the completion's request (``_FAILED`` is returned)."""
        try:
            return call(*args)
        except Exception as exc:
            self._failed_requests.add(id(completion.handle))
            self.failed.append((completion, exc))
            return _FAILED


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
