"""The uvicorn server ``decoctl serve`` runs its app in: it drains on SIGTERM or Ctrl-C and stops when the engine dies.

server = Server(app, engine, drain_seconds=30)
server.run(sockets=[sock])        # returns once drained; engine.failure says whether the engine died

On SIGTERM (or Ctrl-C) uvicorn stops accepting connections; before it waits for the open ones, the engine begins
its drain (``Engine.drain``): new requests are a 503, the live completions run for ``drain_seconds`` and are then
cut (finish_reason "shutdown"), and uvicorn waits that long and a margin more for their last events to reach their
clients. When the engine thread dies the server shuts down the same way (every request it held already failed) and
the command exits non-zero, so that a supervisor restarts it rather than leaving a server that accepts and never
answers.
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn

from decoctl.serve._command import DRAIN_SECONDS
from decoctl.serve._engine import Engine

__all__ = ["Server"]
#: how long past the drain uvicorn waits for the cut completions' last events to reach their clients
DRAIN_MARGIN_SECONDS = 5.0


class Server(uvicorn.Server):
    """uvicorn's Server over ``app`` whose shutdown begins with the engine's drain, and which shuts down when the
    engine dies. ``config``: more of uvicorn.Config's settings."""

    def __init__(self, app: Any, engine: Engine, *, drain_seconds: float = DRAIN_SECONDS, **config: Any) -> None:
        settings: dict[str, Any] = {
            "log_level": "warning",
            "timeout_graceful_shutdown": int(drain_seconds + DRAIN_MARGIN_SECONDS + 0.999),
        }
        settings.update(config)
        super().__init__(uvicorn.Config(app, **settings))
        self.engine = engine
        self.drain_seconds = drain_seconds
        engine.on_failure(self._engine_failed)

    def _engine_failed(self, reason: str) -> None:
        self.should_exit = True  # uvicorn's main loop sees it within its tick, as it sees a signal

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.engine.drain(self.drain_seconds)
        await super().shutdown(sockets=sockets)
