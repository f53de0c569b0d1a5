"""The HTTP side: a Starlette app with OpenAI's endpoints over one Engine.

app = create_app(engine, model_name="pycode", chat_template=template, api_key=None)
uvicorn.run(app, host="127.0.0.1", port=8000)

The HTTP side only checks requests, queues them on the engine and reads their events; the engine thread owns the
models. A client that goes away cancels its request (its rows are freed at the engine's next step); a full queue
answers 429 with Retry-After; every error is OpenAI's error shape with a message, never a traceback.

Its parts, each a module: ``_edge`` (authorisation, the body read within limits, validated into OpenAI's shapes, and
``Refusal``), ``_completions`` (the generating endpoints: slow work on worker threads, the engine's events read),
``_answers`` (events rendered in OpenAI's shapes), ``_streams`` (server-sent events, a stream whose client must keep
reading), ``_metrics`` (Prometheus); this module wires them with the service endpoints (models, health, metrics, the
chat page) into routes.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from decoctl.generation import ChatTemplate
from decoctl.logs import get_logger
from decoctl.model._image_processor import MAX_IMAGES, MAX_PIXELS
from decoctl.serve._completions import Completions
from decoctl.serve._edge import BODY_SECONDS, Edge, Refusal
from decoctl.serve._engine import Engine
from decoctl.serve._metrics import CONTENT_TYPE_LATEST, Metrics
from decoctl.serve._protocol import error_body
from decoctl.serve._streams import SEND_SECONDS
from decoctl.serve._transcriber import Transcriber
from decoctl.serve._transcriptions import MAX_AUDIO_BYTES, MAX_AUDIO_SECONDS, Transcriptions, audio_only, no_audio

__all__ = ["create_app"]

#: images decoded and encoded at once, on worker threads (and as many prompts tokenized at once, on their own)
IMAGE_WORKERS = 2

log = get_logger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]


def create_app(
    engine: Engine | Transcriber,
    *,
    model_name: str,
    chat_template: ChatTemplate | None = None,
    api_key: str | None = None,
    max_images: int = MAX_IMAGES,
    max_image_pixels: int = MAX_PIXELS,
    image_workers: int = IMAGE_WORKERS,
    body_seconds: float = BODY_SECONDS,
    send_seconds: float = SEND_SECONDS,
    tool_parser: str | None = None,
    max_audio_bytes: int = MAX_AUDIO_BYTES,
    max_audio_seconds: float = MAX_AUDIO_SECONDS,
) -> Starlette:
    """The server's ASGI app over ``engine`` (started at the app's start-up, drained at its shutdown). A chat request
    carries at most ``max_images`` images of at most ``max_image_pixels`` pixels each (as sent, read from the header
    before decoding, and once resized); images are decoded and encoded before the request is queued, at most
    ``image_workers`` at a time, on worker threads (never the event loop or the engine thread); prompts are
    tokenized and chat templates rendered on as many worker threads of their own. A request body must arrive within
    ``body_seconds`` (else 408), and each event of a stream must be taken by its client within ``send_seconds``
    (else the completion is cancelled, its row freed, and the connection closed). ``tool_parser``: the format the
    model writes tool calls in (hermes, llama3_json, mistral, granite); None: the one the chat template's text shows
    (decoctl.serve._tool_calls). Over a ``Transcriber`` (a speech model) the app serves /v1/audio/transcriptions
    (uploads of at most ``max_audio_bytes``, audio of at most ``max_audio_seconds``) and answers the generating
    endpoints with a 400 naming it; over an engine, the other way round."""
    metrics = Metrics(engine)
    tables = getattr(getattr(engine, "models", {}).get("target"), "adapters", None)  # LoRA adapters beside the model
    adapters = tables.names if tables is not None else ()
    edge = Edge(model_name=model_name, api_key=api_key, body_seconds=body_seconds, adapters=adapters)
    if isinstance(engine, Transcriber):
        speech = Transcriptions(
            engine,
            edge=edge,
            metrics=metrics,
            max_audio_bytes=max_audio_bytes,
            max_audio_seconds=max_audio_seconds,
            body_seconds=body_seconds,
        )
        completions = chat_completions = _refused(edge, audio_only(model_name))
        transcriptions = speech.transcriptions
    else:
        generating = Completions(
            engine,
            edge=edge,
            metrics=metrics,
            chat_template=chat_template,
            text_workers=image_workers,
            image_workers=image_workers,
            max_images=max_images,
            max_image_pixels=max_image_pixels,
            send_seconds=send_seconds,
            tool_parser=tool_parser,
        )
        completions, chat_completions = generating.completions, generating.chat_completions
        transcriptions = _refused(edge, no_audio(model_name))
    service = _Service(engine, edge, metrics, chat_template is not None)

    def counted(endpoint: Endpoint, name: str) -> Endpoint:
        """``endpoint`` with its refusals answered in OpenAI's error shape, any other exception a 500 without a
        traceback, and every answer counted by route and status."""

        async def run(request: Request) -> Response:
            try:
                response: Response = await endpoint(request)
            except Refusal as refusal:
                response = JSONResponse(refusal.body, status_code=refusal.status, headers=refusal.headers)
            except Exception as exc:  # never a traceback to the client: the message names the failure only
                log.error("decoctl.serve.internal_error", endpoint=name, error=f"{type(exc).__name__}: {exc}")
                response = JSONResponse(error_body("internal server error", "server_error"), status_code=500)
            metrics.requests.labels(name, str(response.status_code)).inc()
            return response

        return run

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(engine.close)

    routes = [
        Route("/", counted(service.page, "/"), methods=["GET"]),
        Route("/health", counted(service.health, "/health"), methods=["GET"]),
        Route("/metrics", service.metrics_text, methods=["GET"]),
        Route("/v1/models", counted(service.models, "/v1/models"), methods=["GET"]),
        Route("/v1/models/{name:path}", counted(service.model, "/v1/models/{name}"), methods=["GET"]),
        Route("/v1/completions", counted(completions, "/v1/completions"), methods=["POST"]),
        Route("/v1/chat/completions", counted(chat_completions, "/v1/chat/completions"), methods=["POST"]),
        Route("/v1/audio/transcriptions", counted(transcriptions, "/v1/audio/transcriptions"), methods=["POST"]),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _not_found, Exception: _not_found}
    )


def _refused(edge: Edge, refusal: Refusal) -> Endpoint:
    """An endpoint this server's model has no use for: ``refusal`` (naming the one to use), once authorised."""

    async def refuse(request: Request) -> Response:
        edge.authorise(request)
        raise refusal

    return refuse


class _Service:
    """The endpoints about the server: the model it serves, its health, its metrics and its chat page."""

    def __init__(self, engine: Engine | Transcriber, edge: Edge, metrics: Metrics, chat_template: bool) -> None:
        self.engine = engine
        self.edge = edge
        self._metrics = metrics
        self._chat_template = chat_template
        self._created = int(time.time())

    def _entry(self, name: str) -> dict[str, Any]:
        about = {
            "roles": sorted(self.engine.models),
            "controllers": sorted(self.engine.registry.controllers()),
            "chat_template": self._chat_template,
        }
        if name != self.edge.model_name:  # a LoRA adapter loaded beside the base model (docs/ADAPTERS.md)
            about["adapter"] = name[len(self.edge.model_name) + 1 :]
        return {"id": name, "object": "model", "created": self._created, "owned_by": "decoctl", "decoctl": about}

    async def models(self, request: Request) -> Response:
        self.edge.authorise(request)
        return JSONResponse({"object": "list", "data": [self._entry(name) for name in self.edge.served]})

    async def model(self, request: Request) -> Response:
        self.edge.authorise(request)
        name, served = request.path_params["name"], self.edge.served
        if name not in served:
            shown = served if len(served) > 1 else repr(served[0])
            raise Refusal(404, f"model {name!r} is not served here: this server serves {shown}", code="model_not_found")
        return JSONResponse(self._entry(name))

    async def health(self, request: Request) -> Response:
        """200 while the engine runs and takes requests; 503 once it failed (``error`` says why), while it drains
        or when it stopped."""
        engine = self.engine
        state = "ok" if engine.running else "stopped"
        if engine.failure is not None:
            state = "failed"
        elif engine.draining:
            state = "draining"
        body: dict[str, Any] = {
            "status": state,
            "model": self.edge.model_name,
            "rows": engine.live_rows,
            "max_rows": engine.max_rows,
            "queued": engine.queued,
        }
        if engine.failure is not None:
            body["error"] = engine.failure
        return JSONResponse(body, status_code=200 if state == "ok" else 503)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self._metrics.text(), media_type=CONTENT_TYPE_LATEST)

    async def page(self, request: Request) -> Response:
        html = importlib.resources.files("decoctl.serve").joinpath("page/index.html").read_text(encoding="utf-8")
        return HTMLResponse(html.replace("{{MODEL}}", json.dumps(self.edge.model_name)))


async def _not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    body = error_body(message.get(status, "internal server error"), "invalid_request_error")
    return JSONResponse(body, status_code=status)
