"""The uvicorn server ``decoctl serve`` runs its app in: it drains on SIGTERM or Ctrl-C and stops when the engine dies.

server = Server(app, engine, drain_seconds=30)
server.run(sockets=[sock])        # returns once drained; engine.failure says whether the engine died

On SIGTERM (or Ctrl-C) uvicorn stops accepting connections; before it waits for the open ones, the engine begins
its drain (``Engine.drain``): new requests are a 503, the live completions run for ``drain_seconds`` and are then
cut (finish_reason "shutdown"), and uvicorn waits that long and a margin more for their last events to reach their
clients. When the engine thread dies the server shuts down the same way (every request it held already failed) and
the command exits non-zero, so that a supervisor restarts it rather than leaving a server that accepts and never
answers.

A slow or idle client holds a connection for stated times only: a request's head must arrive within
``HEAD_SECONDS`` of connecting (or of the last response) and be at most ``HEAD_BYTES``; an idle keep-alive
connection closes after ``KEEP_ALIVE_SECONDS``; past ``CONNECTIONS`` connections and requests at once uvicorn answers
503. The app bounds the rest: a body must arrive within its ``body_seconds``, and a stream whose client stops reading
is cancelled after its ``send_seconds`` (decoctl.serve._app).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from decoctl.serve._command import DRAIN_SECONDS
from decoctl.serve._engine import Engine
from decoctl.serve._streams import STREAM_STALLED
from decoctl.serve._transcriber import Transcriber

__all__ = ["Server"]
#: how long past the drain uvicorn waits for the cut completions' last events to reach their clients
DRAIN_MARGIN_SECONDS = 5.0
#: how long a connection may take to send a whole request head
HEAD_SECONDS = 10.0
#: the largest request head (request line and headers) read
HEAD_BYTES = 64 << 10
#: how long an idle keep-alive connection stays open
KEEP_ALIVE_SECONDS = 5
#: what uvicorn logs when an app returns before its response is complete
INCOMPLETE_RESPONSE = "ASGI callable returned without completing response."
#: connections and requests at once; more are answered 503 (1,000 idle clients fit)
CONNECTIONS = 2048


def _not_a_stall(record: logging.LogRecord) -> bool:
    """A filter for uvicorn's error logger: its error for a response left incomplete goes where decoctl's app left
    it so on purpose (a stream whose client stopped reading: the app logged ``decoctl.serve.client_stalled``)."""
    return not (record.msg == INCOMPLETE_RESPONSE and STREAM_STALLED.get())


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's head: a connection that has not sent a whole head
    ``head_seconds`` after it connected or got its last response is closed (uvicorn's own keep-alive timeout stops
    counting at the head's first byte, so a head that trickles in would hold the connection for ever)."""

    head_seconds = HEAD_SECONDS
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_seconds, self._head_late)

    def _head_late(self) -> None:
        waiting = self.cycle is None or self.cycle.response_complete  # no request under way: its head is late
        if waiting and not self.transport.is_closing():
            self.transport.close()


class Server(uvicorn.Server):
    """uvicorn's Server over ``app`` whose shutdown begins with the engine's drain, and which shuts down when the
    engine dies; the timeouts and limits of the module docstring (``head_seconds`` for a request's head).
    ``config``: more of uvicorn.Config's settings, or others."""

    def __init__(
        self,
        app: Any,
        engine: Engine | Transcriber,
        *,
        drain_seconds: float = DRAIN_SECONDS,
        head_seconds: float = HEAD_SECONDS,
        **config: Any,
    ) -> None:
        protocol = type("Protocol", (_Protocol,), {"head_seconds": head_seconds})
        settings: dict[str, Any] = {
            "log_level": "warning",
            "timeout_graceful_shutdown": int(drain_seconds + DRAIN_MARGIN_SECONDS + 0.999),
            "http": protocol,
            "h11_max_incomplete_event_size": HEAD_BYTES,
            "timeout_keep_alive": KEEP_ALIVE_SECONDS,
            "limit_concurrency": CONNECTIONS,
        }
        settings.update(config)
        super().__init__(uvicorn.Config(app, **settings))
        errors = logging.getLogger("uvicorn.error")
        if _not_a_stall not in errors.filters:
            errors.addFilter(_not_a_stall)
        self.engine = engine
        self.drain_seconds = drain_seconds
        engine.on_failure(self._engine_failed)

    def handle_exit(self, sig: int, frame: Any) -> None:
        """uvicorn's handler, but a SIGTERM is not raised again once the server has drained (uvicorn re-raises
        the signals it caught, so that the process would die of SIGTERM after draining): ``decoctl serve`` ends
        with its own exit status, 0 after a drain, for a supervisor to read."""
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:
            self._captured_signals.remove(sig)

    def _engine_failed(self, reason: str) -> None:
        self.should_exit = True  # uvicorn's main loop sees it within its tick, as it sees a signal

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.engine.drain(self.drain_seconds)
        await super().shutdown(sockets=sockets)
