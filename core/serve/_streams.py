"""Server-sent events, and a streamed response whose client must keep taking it: a client that stops reading has its
completion cancelled (its row freed) and its connection closed after ``SEND_SECONDS``."""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

from decoctl.logs import get_logger

__all__ = ["SEND_SECONDS", "STREAM_STALLED", "TimedStream", "sse"]

log = get_logger(__name__)

#: how long one event of a stream may wait for its client to take it (a client that stops reading holds a row):
#: then the completion is cancelled, its row freed and the connection closed
SEND_SECONDS = 30.0

#: set in the task of a stream given up on because its client stopped reading (decoctl.serve._server reads it)
STREAM_STALLED: contextvars.ContextVar[bool] = contextvars.ContextVar("decoctl_stream_stalled", default=False)


class _Stalled(Exception):
    """A streaming client took none of its stream for the send timeout."""


class TimedStream(StreamingResponse):
    """A stream whose every send waits at most ``seconds`` for the client; past it ``stalled()`` runs (the request
    is cancelled) and the connection is closed without the rest."""

    def __init__(self, content: Any, *, seconds: float, stalled: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._seconds = seconds
        self._stalled = stalled

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def timed(message: Any) -> None:
            try:
                async with asyncio.timeout(self._seconds):  # no task of its own, unlike wait_for
                    await send(message)
            except TimeoutError:
                raise _Stalled from None

        try:
            await super().__call__(scope, receive, timed)
        except _Stalled:
            log.warning("decoctl.serve.client_stalled", seconds=self._seconds)
            STREAM_STALLED.set(True)  # the response stays incomplete on purpose: decoctl's Server says nothing more
            self._stalled()


async def sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """Server-sent events: one ``data:`` line per chunk, then ``data: [DONE]``."""
    async for item in chunks:
        yield f"data: {json.dumps(item, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
