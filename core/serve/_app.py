"""The HTTP side: a Starlette app with OpenAI's endpoints over one Engine.

app = create_app(engine, model_name="pycode", chat_template=template, api_key=None)
uvicorn.run(app, host="127.0.0.1", port=8000)

The HTTP side only checks requests, queues them on the engine and reads their events; the engine thread owns the
models. A client that goes away cancels its request (its rows are freed at the engine's next step); a full queue
answers 429 with Retry-After; every error is OpenAI's error shape with a message, never a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import contextvars
import hmac
import importlib.resources
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
import attrs
import pydantic
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from decoctl.errors import ConfigError
from decoctl.generation import ChatTemplate
from decoctl.logs import get_logger
from decoctl.model._image_processor import MAX_IMAGES, MAX_PIXELS
from decoctl.model._vision import ImageFeatures
from decoctl.serve._engine import (
    Delta,
    Engine,
    EngineClosedError,
    EngineRequest,
    Failed,
    Finished,
    Handle,
    QueueFullError,
    TokenLogprob,
)
from decoctl.serve._metrics import CONTENT_TYPE_LATEST, Metrics
from decoctl.serve._protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatDelta,
    ChatLogprobs,
    ChatRequest,
    ChatResponse,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DecoctlDelta,
    DecoctlStats,
    TopLogprob,
    Usage,
    error_body,
    validation_message,
)
from decoctl.serve._protocol import TokenLogprob as ChatTokenLogprob
from decoctl.serve._translate import choice_for

__all__ = ["create_app"]

#: how deeply a request's JSON may nest (OpenAI's requests nest a few levels; JSON schemas a few more)
MAX_JSON_DEPTH = 64
#: images decoded and encoded at once, on worker threads
IMAGE_WORKERS = 2

log = get_logger(__name__)

#: what a client waits before retrying a request the full queue refused (Retry-After)
RETRY_AFTER_SECONDS = 1
#: the largest request body read (a chat of about a million words): more is refused (413) before it is kept
MAX_BODY_BYTES = 8 << 20
#: how long a client may take to send a request's body (a body trickling in holds a connection): then 408
BODY_SECONDS = 30.0
#: how long one event of a stream may wait for its client to take it (a client that stops reading holds a row):
#: then the completion is cancelled, its row freed and the connection closed
SEND_SECONDS = 30.0


class _Stalled(Exception):
    """A streaming client took none of its stream for the send timeout."""


#: set in the task of a stream given up on because its client stopped reading (decoctl.serve._server reads it)
STREAM_STALLED: contextvars.ContextVar[bool] = contextvars.ContextVar("decoctl_stream_stalled", default=False)


class _TimedStream(StreamingResponse):
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


class _Refusal(Exception):
    """A request refused with an HTTP status and OpenAI's error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, kind, extra.pop("param", None), extra.pop("code", None))
        self.headers: dict[str, str] = extra.pop("headers", {})


@attrs.define(eq=False)
class _Choice:
    """One choice of a response while its events arrive."""

    text: list[str] = attrs.field(factory=list)
    logprobs: list[TokenLogprob] = attrs.field(factory=list)
    finished: Finished | None = None


@attrs.define(eq=False)
class _Submitted:
    """A request's engine submissions (one per prompt) and the queue their events arrive on."""

    handles: list[Handle]
    events: asyncio.Queue[tuple[int, Any]]
    started: float
    controller: str
    choices: int

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()


def _depth(value: Any) -> int:
    """How deeply JSON ``value`` nests objects and arrays (a scalar is 0), without recursion."""
    deepest = 0
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            break
        todo.extend((child, depth + 1) for child in children)
    return deepest


def _image_bytes(url: str) -> bytes:
    """An image_url part's image: the bytes of a data: URL (the server fetches nothing); a 400 otherwise."""
    head, comma, data = url.partition(",")
    if not url.startswith("data:") or not comma or ";base64" not in head:
        raise _Refusal(
            400,
            f"image_url {url[:40]!r}: the server takes images as data: URLs only (data:image/png;base64,...); it "
            "fetches nothing",
            param="messages",
        )
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise _Refusal(400, f"image_url: its base64 data does not decode ({exc})", param="messages") from None


def create_app(
    engine: Engine,
    *,
    model_name: str,
    chat_template: ChatTemplate | None = None,
    api_key: str | None = None,
    max_images: int = MAX_IMAGES,
    max_image_pixels: int = MAX_PIXELS,
    image_workers: int = IMAGE_WORKERS,
    body_seconds: float = BODY_SECONDS,
    send_seconds: float = SEND_SECONDS,
) -> Starlette:
    """The server's ASGI app over ``engine`` (started at the app's start-up, drained at its shutdown). A chat request
    carries at most ``max_images`` images of at most ``max_image_pixels`` pixels each (as sent, read from the header
    before decoding, and once resized); images are decoded and encoded before the request is queued, at most
    ``image_workers`` at a time, on worker threads (never the event loop or the engine thread); prompts are
    tokenized and chat templates rendered on as many worker threads of their own. A request body must arrive within
    ``body_seconds`` (else 408), and each event of a stream must be taken by its client within ``send_seconds``
    (else the completion is cancelled, its row freed, and the connection closed)."""
    metrics = Metrics(engine)
    image_work = anyio.CapacityLimiter(image_workers)
    # tokenizing and rendering chat templates: on worker threads too, so that a long prompt never holds the event loop
    text_work = anyio.CapacityLimiter(image_workers)
    tokenizer = engine.models["target"].tokenizer
    vocab_size = engine.models["target"].spec.vocab_size
    created = int(time.time())

    def authorised(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise _Refusal(401, "incorrect API key: send it as 'Authorization: Bearer KEY'", code="invalid_api_key")

    async def parsed(request: Request, shape: type[CompletionRequest] | type[ChatRequest]) -> Any:
        authorised(request)
        chunks, size = [], 0
        try:
            async with asyncio.timeout(body_seconds):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise _Refusal(
                            413, f"the request body is over {MAX_BODY_BYTES >> 20} MiB: send a shorter prompt"
                        )
                    chunks.append(chunk)
        except TimeoutError:
            raise _Refusal(408, f"the request body took over {body_seconds:g} s to arrive: send it at once") from None
        body = b"".join(chunks)
        too_deep = _Refusal(400, f"the request body nests JSON more than {MAX_JSON_DEPTH} levels deep: flatten it")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Refusal(400, f"the request body is not valid JSON ({exc})") from None
        except RecursionError:  # nested deeper than Python's parser goes
            raise too_deep from None
        if _depth(data) > MAX_JSON_DEPTH:
            raise too_deep
        if not isinstance(data, dict):
            raise _Refusal(400, "the request body must be a JSON object")
        try:
            value = shape.model_validate(data)
        except pydantic.ValidationError as exc:
            message, param = validation_message(exc)
            raise _Refusal(400, message, param=param) from None
        if value.model != model_name:
            raise _Refusal(
                404,
                f"model {value.model!r} is not served here: this server serves {model_name!r}",
                code="model_not_found",
            )
        return value

    async def submit(
        body: CompletionRequest | ChatRequest,
        prompts: list[tuple[int, ...]],
        max_tokens: int | None,
        logprobs: Any,
        images: ImageFeatures | None = None,
    ) -> _Submitted:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        try:
            controller, options, tables = choice_for(body, engine.registry, vocab_size)
        except ConfigError as exc:
            raise _Refusal(400, str(exc)) from None
        requests = [
            EngineRequest(
                ids=ids,
                max_new_tokens=max_tokens if max_tokens is not None else max(1, engine.max_length - len(ids)),
                stop=body.stop_strings(),
                seed=body.seed,
                n=body.n,
                controller=controller,
                options=options,
                processors=tables or None,
                logprobs=logprobs,
                images=images,
            )
            for ids in prompts
        ]
        try:
            # a new choice's chain is built here (its JSON schema compiled): on a worker thread, never the event loop
            plans = await anyio.to_thread.run_sync(lambda: [engine.check(r) for r in requests], limiter=text_work)
        except ConfigError as exc:
            raise _Refusal(400, str(exc)) from None
        handles: list[Handle] = []
        for number, (request, plan) in enumerate(zip(requests, plans, strict=True)):

            def on_event(event: Any, number: int = number) -> None:
                loop.call_soon_threadsafe(events.put_nowait, (number, event))

            try:
                handles.append(engine.submit(request, on_event, plan=plan))
            except QueueFullError as exc:
                for handle in handles:
                    handle.cancel()
                raise _Refusal(
                    429, str(exc), "rate_limit_error", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
                ) from None
            except EngineClosedError as exc:
                for handle in handles:
                    handle.cancel()
                raise _Refusal(503, str(exc), "server_error") from None
            # the installed controller's name, never the request's spelling of it: labels stay a bounded set
            metrics.prompt_tokens.labels(handles[-1].plan.spec.name).inc(len(request.ids))
        return _Submitted(
            handles=handles,
            events=events,
            started=time.perf_counter(),
            controller=handles[0].plan.spec.name,
            choices=len(prompts) * body.n,
        )

    async def events_of(submitted: _Submitted, request: Request) -> AsyncIterator[tuple[int, Any]]:
        """(choice index, event) until every choice finished; the request cancelled when its client leaves."""

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            submitted.cancel()

        watcher = asyncio.create_task(watch())
        left, first = submitted.choices, True
        n = submitted.choices // len(submitted.handles)
        try:
            while left:
                number, event = await submitted.events.get()
                if isinstance(event, Failed):
                    submitted.cancel()
                    if event.invalid:
                        raise _Refusal(400, event.message)
                    raise _Refusal(503 if event.unavailable else 500, event.message, "server_error")
                index = number * n + event.index
                if isinstance(event, Delta) and first and event.tokens:
                    first = False
                    metrics.first_token.observe(time.perf_counter() - submitted.started)
                if isinstance(event, Finished):
                    left -= 1
                    controller = submitted.controller
                    metrics.generated_tokens.labels(controller).inc(len(event.tokens))
                    metrics.drafted_tokens.labels(controller).inc(event.drafted)
                    if event.tokens:
                        metrics.tokens_per_forward.labels(controller).observe(event.tokens_per_target_forward)
                yield index, event
            metrics.request_seconds.observe(time.perf_counter() - submitted.started)
        finally:
            watcher.cancel()
            submitted.cancel()  # a no-op for finished requests; frees the rows of a stream left early

    def usage(finished: list[Finished], prompts: list[tuple[int, ...]]) -> Usage:
        prompt = sum(len(ids) for ids in prompts)
        completion = sum(len(f.tokens) for f in finished)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def stats(finished: list[Finished], controller: str) -> DecoctlStats:
        tokens = sum(len(f.tokens) for f in finished)
        forwards = sum(f.target_forwards for f in finished)
        return DecoctlStats(
            controller=controller,
            target_forwards=forwards,
            drafted_tokens=sum(f.drafted for f in finished),
            tokens_per_target_forward=round(tokens / forwards, 4) if forwards else float(tokens),
        )

    def token_text(token: int) -> str:
        text: str = tokenizer.decode([token])
        return text

    def completion_logprobs(items: Sequence[TokenLogprob]) -> CompletionLogprobs:
        offsets, at = [], 0
        for item in items:
            offsets.append(at)
            at += len(token_text(item.token))
        return CompletionLogprobs(
            tokens=[token_text(i.token) for i in items],
            token_logprobs=[i.logprob for i in items],
            top_logprobs=[{token_text(t): lp for t, lp in i.top} for i in items],
            text_offset=offsets,
        )

    def chat_logprobs(items: Sequence[TokenLogprob]) -> ChatLogprobs:
        def top(token: int, logprob: float) -> TopLogprob:
            text = token_text(token)
            return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

        return ChatLogprobs(
            content=[
                ChatTokenLogprob(**top(i.token, i.logprob).model_dump(), top_logprobs=[top(t, lp) for t, lp in i.top])
                for i in items
            ]
        )

    async def respond(
        request: Request,
        body: CompletionRequest | ChatRequest,
        prompts: list[tuple[int, ...]],
        max_tokens: int | None,
        logprobs: int | None,
        chat: bool,
        images: ImageFeatures | None = None,
    ) -> Response:
        submitted = await submit(body, prompts, max_tokens, logprobs, images)
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return _TimedStream(
                _sse(stream(request, submitted, ident, prompts, chat, include_usage)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                seconds=send_seconds,
                stalled=submitted.cancel,
            )
        choices = [_Choice() for _ in range(submitted.choices)]
        try:
            async for index, event in events_of(submitted, request):
                if isinstance(event, Delta):
                    choices[index].text.append(event.text)
                    if event.logprobs:
                        choices[index].logprobs.extend(event.logprobs)
                else:
                    choices[index].finished = event
        except _Refusal as refusal:
            # nothing is lost: the text each choice had generated before the failure comes with the error
            refusal.body["decoctl"] = {"generated": ["".join(choice.text) for choice in choices]}
            raise
        finished = [c.finished for c in choices if c.finished is not None]
        common = {
            "id": ident,
            "created": int(time.time()),
            "model": model_name,
            "usage": usage(finished, prompts),
            "decoctl": stats(finished, submitted.controller),
        }
        answer: CompletionResponse | ChatResponse
        if chat:
            answer = ChatResponse(
                choices=[
                    ChatChoice(
                        index=index,
                        message=AssistantMessage(content="".join(item.text)),
                        finish_reason=_reason(item.finished),
                        logprobs=chat_logprobs(item.logprobs) if logprobs is not None else None,
                    )
                    for index, item in enumerate(choices)
                ],
                **common,
            )
        else:
            answer = CompletionResponse(
                choices=[
                    CompletionChoice(
                        index=index,
                        text="".join(item.text),
                        finish_reason=_reason(item.finished),
                        logprobs=completion_logprobs(item.logprobs) if logprobs is not None else None,
                    )
                    for index, item in enumerate(choices)
                ],
                **common,
            )
        return JSONResponse(answer.model_dump(mode="json"))

    async def stream(
        request: Request,
        submitted: _Submitted,
        ident: str,
        prompts: list[tuple[int, ...]],
        chat: bool,
        include_usage: bool,
    ) -> AsyncIterator[dict[str, Any]]:
        common = {"id": ident, "created": int(time.time()), "model": model_name}

        def chunk(
            index: int | None,
            text: str | None = None,
            *,
            finish: Finished | None = None,
            role: bool = False,
            logprobs: Sequence[TokenLogprob] | None = None,
            **more: Any,
        ) -> dict[str, Any]:
            reason = None if finish is None else _reason(finish)
            record: ChatChunk | CompletionChunk
            if chat:
                choices = []
                if index is not None:
                    delta = ChatDelta(role="assistant", content="") if role else ChatDelta(content=text)
                    shown = chat_logprobs(logprobs) if logprobs is not None else None
                    choices.append(ChatChunkChoice(index=index, delta=delta, finish_reason=reason, logprobs=shown))
                record = ChatChunk(choices=choices, **common, **more)
            else:
                listed = []
                if index is not None:
                    given = completion_logprobs(logprobs) if logprobs is not None else None
                    listed.append(CompletionChoice(index=index, text=text or "", finish_reason=reason, logprobs=given))
                record = CompletionChunk(choices=listed, **common, **more)
            return record.model_dump(mode="json", exclude_none=False)

        if chat:
            for index in range(submitted.choices):
                yield chunk(index, role=True)
        finished: list[Finished] = []
        try:
            async for index, event in events_of(submitted, request):
                if isinstance(event, Delta):
                    if not event.text and not event.tokens:
                        continue
                    drafted_chars = 0
                    if event.drafted:  # how much of the text the drafted tokens wrote (they come first)
                        drafted_chars = min(len(event.text), len(tokenizer.decode(event.tokens[: event.drafted])))
                    extension = DecoctlDelta(
                        tokens=len(event.tokens), drafted=event.drafted, drafted_chars=drafted_chars
                    )
                    yield chunk(index, event.text, logprobs=event.logprobs, decoctl=extension)
                else:
                    finished.append(event)
                    yield chunk(index, None if chat else "", finish=event, decoctl=stats([event], submitted.controller))
        except _Refusal as refusal:
            yield refusal.body
            return
        if include_usage:
            yield chunk(None, usage=usage(finished, prompts))

    async def completions(request: Request) -> Response:
        body: CompletionRequest = await parsed(request, CompletionRequest)
        prompt = body.prompt
        if isinstance(prompt, str):
            texts: list[Any] = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            texts = [prompt]
        else:
            texts = list(prompt)
        if not texts:
            raise _Refusal(
                400, "prompt is an empty list: give a string, a list of strings or token ids", param="prompt"
            )
        prompts = await anyio.to_thread.run_sync(
            lambda: [tuple(tokenizer.encode(p)) if isinstance(p, str) else tuple(p) for p in texts],
            limiter=text_work,
        )
        return await respond(request, body, prompts, body.max_tokens, body.logprobs, chat=False)

    async def chat_completions(request: Request) -> Response:
        body: ChatRequest = await parsed(request, ChatRequest)
        if chat_template is None:
            raise _Refusal(
                400,
                f"model {model_name!r} has no chat template: use /v1/completions, or start the server with "
                "--chat-template FILE",
            )
        template = chat_template
        try:
            prompt = await anyio.to_thread.run_sync(lambda: template.prompt(body.chat()), limiter=text_work)
        except ConfigError as exc:
            raise _Refusal(400, str(exc), param="messages") from None
        if body.top_logprobs is not None and not body.logprobs:
            raise _Refusal(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        urls = body.image_urls()
        if not urls:
            return await respond(request, body, [prompt.ids], max_tokens, logprobs, chat=True)
        vision = engine.models["target"].vision
        if vision is None:
            raise _Refusal(400, f"model {model_name!r} has no vision encoder: send text parts only", param="messages")
        if len(urls) > max_images:
            raise _Refusal(
                400,
                f"the request carries {len(urls)} images, more than this server's limit of {max_images} "
                "(decoctl serve --max-images): send fewer",
                param="messages",
            )

        def encode() -> tuple[list[int], ImageFeatures]:
            pictures = [_image_bytes(url) for url in urls]
            # once per image, beside the engine thread's decoder
            features = vision.encode(pictures, max_pixels=max_image_pixels)
            # the chat's ids were encoded without adding special tokens; Gemma 3 expands its marks in the text
            ids = vision.prompt_ids(tokenizer, prompt, list(prompt.ids), features, add_special_tokens=False)
            return ids, features

        try:
            ids, features = await anyio.to_thread.run_sync(encode, limiter=image_work)
        except ConfigError as exc:
            raise _Refusal(400, str(exc), param="messages") from None
        return await respond(request, body, [tuple(ids)], max_tokens, logprobs, chat=True, images=features)

    def model_entry() -> dict[str, Any]:
        about = {
            "roles": sorted(engine.models),
            "controllers": sorted(engine.registry.controllers()),
            "chat_template": chat_template is not None,
        }
        return {"id": model_name, "object": "model", "created": created, "owned_by": "decoctl", "decoctl": about}

    async def models(request: Request) -> Response:
        authorised(request)
        return JSONResponse({"object": "list", "data": [model_entry()]})

    async def model(request: Request) -> Response:
        authorised(request)
        name = request.path_params["name"]
        if name != model_name:
            raise _Refusal(
                404, f"model {name!r} is not served here: this server serves {model_name!r}", code="model_not_found"
            )
        return JSONResponse(model_entry())

    async def health(request: Request) -> Response:
        """200 while the engine runs and takes requests; 503 once it failed (``error`` says why), while it drains
        or when it stopped."""
        state = "ok" if engine.running else "stopped"
        if engine.failure is not None:
            state = "failed"
        elif engine.draining:
            state = "draining"
        body: dict[str, Any] = {
            "status": state,
            "model": model_name,
            "rows": engine.live_rows,
            "max_rows": engine.max_rows,
            "queued": engine.queued,
        }
        if engine.failure is not None:
            body["error"] = engine.failure
        return JSONResponse(body, status_code=200 if state == "ok" else 503)

    async def metrics_text(request: Request) -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    async def page(request: Request) -> Response:
        html = importlib.resources.files("decoctl.serve").joinpath("page/index.html").read_text(encoding="utf-8")
        return HTMLResponse(html.replace("{{MODEL}}", json.dumps(model_name)))

    def counted(endpoint: Callable[[Request], Any], name: str) -> Callable[[Request], Any]:
        async def run(request: Request) -> Response:
            try:
                response: Response = await endpoint(request)
            except _Refusal as refusal:
                response = JSONResponse(refusal.body, status_code=refusal.status, headers=refusal.headers)
            except Exception as exc:  # never a traceback to the client: the message names the failure only
                log.error("decoctl.serve.internal_error", endpoint=name, error=f"{type(exc).__name__}: {exc}")
                response = JSONResponse(error_body("internal server error", "server_error"), status_code=500)
            metrics.requests.labels(name, str(response.status_code)).inc()
            return response

        return run

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        body = error_body(message.get(status, "internal server error"), "invalid_request_error")
        return JSONResponse(body, status_code=status)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(engine.close)

    routes = [
        Route("/", counted(page, "/"), methods=["GET"]),
        Route("/health", counted(health, "/health"), methods=["GET"]),
        Route("/metrics", metrics_text, methods=["GET"]),
        Route("/v1/models", counted(models, "/v1/models"), methods=["GET"]),
        Route("/v1/models/{name:path}", counted(model, "/v1/models/{name}"), methods=["GET"]),
        Route("/v1/completions", counted(completions, "/v1/completions"), methods=["POST"]),
        Route("/v1/chat/completions", counted(chat_completions, "/v1/chat/completions"), methods=["POST"]),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: not_found, Exception: not_found}
    )


def _reason(finished: Finished | None) -> Any:
    return None if finished is None else finished.finish_reason


async def _sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """Server-sent events: one ``data:`` line per chunk, then ``data: [DONE]``."""
    async for item in chunks:
        yield f"data: {json.dumps(item, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
