"""What goes into the serving engine and what comes out: a request, its checked plan, its handle, its events.

A caller builds an ``EngineRequest``; the engine checks it into a ``Plan`` (decoctl.serve._plans) and queues a
``Handle``, through which the caller cancels it and receives its ``Delta``, ``Finished`` (one per completion) or
``Failed`` events, on the engine thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from decoctl.errors import DecoctlError
from decoctl.logs import get_logger
from decoctl.model._vision import ImageFeatures
from decoctl.plugins import PluginRegistry, parse_processor_chain
from decoctl.processing import ProcessorChain
from decoctl.specs import ControllerSpec

__all__ = [
    "Delta",
    "EngineClosedError",
    "EngineRequest",
    "Event",
    "Failed",
    "Finished",
    "Handle",
    "Plan",
    "QueueFullError",
    "TokenLogprob",
]

log = get_logger(__name__)


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
    #: the table of the target's stacked LoRA slots the request runs (0: the base model; decoctl.model._adapters)
    adapter: int = 0
    #: lower runs first: queued ahead of higher values, and a request of a higher value that decodes may be
    #: preempted for it (decoctl.serve._scheduler); 0 by default
    priority: int = 0


@attrs.frozen(kw_only=True)
class Plan:
    """A checked choice of controller, options and processors, shared by every request that makes it."""

    spec: ControllerSpec
    options: Mapping[str, Any]
    processors: str | list[dict[str, Any]] | None
    roles: tuple[str, ...]
    #: the controller steps one row among many (its rows step together in one Run); else it steps its row alone
    batched: bool
    #: the logits chain, built (and its grammars compiled) once for the plan: each completion runs a clone of it
    chain: ProcessorChain
    #: the controller and options as one bounded key: the join rule judges a new row by the steps of its kind
    kind: tuple[str, str]

    def new_chain(self, registry: PluginRegistry) -> ProcessorChain:
        """The chain for one completion: the plan's own where it keeps no state, else a clone (its processors'
        compiled parts shared, their state per completion); built afresh only where a processor that keeps state
        cannot be cloned."""
        if self.chain.unclonable:
            return parse_processor_chain(self.processors, registry)
        return self.chain.clone()


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
    #: the request's own fault found while it ran (ConfigError: processors that exclude each other): HTTP 400
    invalid: bool = False


Event = Delta | Finished | Failed


class Handle:
    """A submitted request: ``cancel()`` ends its completions at the next step and frees their rows."""

    def __init__(self, request: EngineRequest, on_event: Callable[[Event], None], plan: Plan) -> None:
        self.request = request
        self.plan = plan
        self._on_event = on_event
        self._cancelled = threading.Event()
        self.submitted = time.perf_counter()
        #: its place among requests of its priority (the engine's queue keeps (priority, arrival) order)
        self.arrival = 0
        #: its completions while preempted (they wait with it, to be resumed on the rows it gets next)
        self.preempted: list[Any] = []

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
