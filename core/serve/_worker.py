"""What the server's two workers share: one thread, a bounded queue, a drain with a deadline, and a death that
refuses every later request.

The engine (decoctl.serve._engine) and the transcriber (decoctl.serve._transcriber) each own their models on a
thread of their own and answer the questions the server's service endpoints ask (``running``, ``draining``,
``failure``; /health, /metrics and the drain on SIGTERM read them alike). ``Worker`` holds that lifecycle once:

    class Engine(Worker):
        thread_name, stopped = "decoctl-engine", "the server's engine stopped"
        def _loop(self): ...                      # runs until it returns (shut down) or raises (the worker dies)
        def _fail_everything(self, reason): ...   # a death: every live and waiting request told ``reason``

A subclass's ``submit`` calls ``_refuse_unless_open(queued, full=...)`` with its lock held; ``_cancel_all`` is what
``close(drain=False)`` does to the live and waiting work (with the lock held); ``_drain_called`` tells its loop
that ``drain`` (not only ``close``) began the shutdown.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable

from decoctl.logs import get_logger
from decoctl.serve._requests import EngineClosedError, QueueFullError

__all__ = ["Worker"]

log = get_logger(__name__)


class Worker(abc.ABC):
    """One thread that owns models and works through a queue of at most ``max_queue`` requests (see the module
    docstring)."""

    #: the thread's name
    thread_name = "decoctl-worker"
    #: how a death's reason begins ("the server's engine stopped"); the log event is ``decoctl.serve.<event>``
    stopped = "the worker stopped"
    failed_event = "worker_failed"

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        #: time.monotonic() past which a drain stops the work still running (None: no drain, or no limit)
        self._deadline: float | None = None
        #: ``drain`` was called (a subclass logs what the drain cut)
        self._drain_called = False
        self._thread: threading.Thread | None = None
        self._on_failure: list[Callable[[str], None]] = []
        #: why the thread stopped, when an exception escaped its loop (None while it is sound)
        self.failure: str | None = None

    # -- the caller's side (any thread) ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def draining(self) -> bool:
        """Shutting down (``drain`` or ``close`` called): no new requests, the live ones finishing."""
        return self._closing and self.failure is None

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` (on the worker's thread) if the thread dies."""
        self._on_failure.append(callback)

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def drain(self, seconds: float | None) -> None:
        """Begin shutting down, without waiting: take no new requests (EngineClosedError) and let the live and queued
        ones run for ``seconds`` (None: no limit); what the subclass does past the deadline is its own. ``close``
        then waits for the thread."""
        with self._wake:
            self._closing = self._drain_called = True
            if seconds is not None:
                deadline = time.monotonic() + seconds
                self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)
            self._wake.notify()

    def close(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; with ``drain`` let the live and queued ones finish first (else ``_cancel_all``);
        wait ``timeout`` seconds at most (None: no limit) for the thread."""
        with self._wake:
            self._closing = True
            if not drain:
                self._cancel_all()
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _refuse_unless_open(self, queued: int, *, full: str) -> None:
        """Raise EngineClosedError after a death or while shutting down, QueueFullError (saying ``full``) when
        ``max_queue`` requests wait already (``queued``); call with the lock held."""
        if self.failure is not None:
            raise EngineClosedError(f"{self.failure}: send the request to another replica")
        if self._closing:
            raise EngineClosedError("the server is shutting down: send the request to another replica")
        if queued >= self.max_queue:
            raise QueueFullError(full)

    # -- what a subclass does --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def _loop(self) -> None:
        """The thread's work: return to stop (shut down), raise to die."""

    @abc.abstractmethod
    def _fail_everything(self, reason: str) -> None:
        """The thread died for ``reason``: fail every live and waiting request (called on the dying thread)."""

    @abc.abstractmethod
    def _cancel_all(self) -> None:
        """``close(drain=False)``: end the live and waiting work (with the lock held)."""

    # -- the worker's thread ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the loop itself broke: nothing answers the requests any more
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        """An exception escaped the loop: record why, refuse new requests, fail every live and waiting one and tell
        ``on_failure``'s callbacks."""
        reason = f"{self.stopped} ({type(exc).__name__}: {exc})"
        log.error(f"decoctl.serve.{self.failed_event}", error=reason)
        with self._wake:
            self.failure = reason
            self._closing = True
        self._fail_everything(reason)
        for callback in self._on_failure:
            try:
                callback(reason)
            except Exception as error:
                log.warning("decoctl.serve.listener_failed", error=f"{type(error).__name__}: {error}")
