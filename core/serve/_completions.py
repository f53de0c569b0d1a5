"""OpenAI's two generating endpoints, /v1/completions and /v1/chat/completions, over the engine.

A request is read at the edge (decoctl.serve._edge); its slow work runs on worker threads, never the event loop or
the engine thread: prompts tokenized and chat templates rendered (at most ``text_workers`` at a time), images decoded
and encoded (``image_workers``), the request's plan checked (its logits chain built, a JSON schema's grammar
compiled); then it is queued on the engine, and its events come back as one response or a stream
(decoctl.serve._answers renders them). A client that leaves cancels its request.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from decoctl.errors import ConfigError
from decoctl.generation import ChatTemplate
from decoctl.generation._tool_formats import tool_format_named
from decoctl.model._vision import ImageFeatures
from decoctl.serve._answers import Answers
from decoctl.serve._edge import Edge, Refusal, image_bytes
from decoctl.serve._engine import Engine
from decoctl.serve._metrics import Metrics
from decoctl.serve._protocol import ChatRequest, CompletionRequest, DecoctlDelta
from decoctl.serve._requests import (
    Delta,
    EngineClosedError,
    EngineRequest,
    Failed,
    Finished,
    Handle,
    QueueFullError,
    TokenLogprob,
)
from decoctl.serve._streams import SEND_SECONDS, TimedStream, sse
from decoctl.serve._tool_calls import ToolError, ToolPlan, chat_messages, tool_plan, with_calls
from decoctl.serve._translate import choice_for

__all__ = ["RETRY_AFTER_SECONDS", "Completions"]

#: what a client waits before retrying a request the full queue refused (Retry-After)
RETRY_AFTER_SECONDS = 1


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
    #: the model name the request gave (the base model's, or ``base:ADAPTER``), which its answer names
    model: str = ""

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()


class Completions:
    """The endpoints ``completions`` and ``chat_completions`` (see the module docstring).

    :param max_images: images a chat request may carry. :param max_image_pixels: pixels each may have.
    :param send_seconds: how long a stream's event waits for its client (then the completion is cancelled).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        edge: Edge,
        metrics: Metrics,
        chat_template: ChatTemplate | None,
        text_workers: int,
        image_workers: int,
        max_images: int,
        max_image_pixels: int,
        send_seconds: float = SEND_SECONDS,
        tool_parser: str | None = None,
    ) -> None:
        self.engine = engine
        self.edge = edge
        self.metrics = metrics
        self.chat_template = chat_template
        self.model_name = edge.model_name
        self.tokenizer = engine.models["target"].tokenizer
        self.answers = Answers(self.tokenizer, self.model_name)
        self._vocab_size = engine.models["target"].spec.vocab_size
        self._text_work = anyio.CapacityLimiter(text_workers)
        self._image_work = anyio.CapacityLimiter(image_workers)
        self._max_images = max_images
        self._max_image_pixels = max_image_pixels
        self._send_seconds = send_seconds
        #: the tool-call format the operator named (decoctl serve --tool-parser), else the template's own
        self.tool_parser = tool_parser
        if tool_parser is not None:
            tool_format_named(tool_parser)  # a name that is no format: refused at start, not per request

    # -- the endpoints ----------------------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        body = await self.edge.read(request, CompletionRequest)
        prompt = body.prompt
        if isinstance(prompt, str):
            texts: list[Any] = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            texts = [prompt]
        else:
            texts = list(prompt)
        if not texts:
            raise Refusal(400, "prompt is an empty list: give a string, a list of strings or token ids", param="prompt")
        tokenizer = self.tokenizer
        prompts = await anyio.to_thread.run_sync(
            lambda: [tuple(tokenizer.encode(p)) if isinstance(p, str) else tuple(p) for p in texts],
            limiter=self._text_work,
        )
        return await self._respond(request, body, prompts, body.max_tokens, body.logprobs, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        body = await self.edge.read(request, ChatRequest)
        template = self.chat_template
        if template is None:
            raise Refusal(
                400,
                f"model {self.model_name!r} has no chat template: use /v1/completions, or start the server with "
                "--chat-template FILE",
            )
        try:
            tools = tool_plan(body, template, tool_parser=self.tool_parser)
            messages = chat_messages(body)
        except ToolError as exc:
            raise Refusal(400, str(exc), param=exc.param) from None
        variables = tools.variables() if tools is not None else {}
        try:
            prompt = await anyio.to_thread.run_sync(
                lambda: template.prompt(messages, **variables), limiter=self._text_work
            )
        except ConfigError as exc:
            raise Refusal(400, str(exc), param="messages") from None
        if body.top_logprobs is not None and not body.logprobs:
            raise Refusal(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        urls = body.image_urls()
        if not urls:
            return await self._respond(request, body, [prompt.ids], max_tokens, logprobs, chat=True, tools=tools)
        vision = self.engine.models["target"].vision
        if vision is None:
            raise Refusal(
                400, f"model {self.model_name!r} has no vision encoder: send text parts only", param="messages"
            )
        if len(urls) > self._max_images:
            raise Refusal(
                400,
                f"the request carries {len(urls)} images, more than this server's limit of {self._max_images} "
                "(decoctl serve --max-images): send fewer",
                param="messages",
            )
        tokenizer, max_pixels = self.tokenizer, self._max_image_pixels

        def encode() -> tuple[list[int], ImageFeatures]:
            pictures = [image_bytes(url) for url in urls]
            # once per image, beside the engine thread's decoder
            cache = self.engine.prefix_cache
            if cache is None:
                features = vision.encode(pictures, max_pixels=max_pixels)
            else:  # the same images as a kept request's (each turn of a chat about a picture): run the encoder once
                features = cache.image_features(
                    pictures, lambda given: vision.encode(given, max_pixels=max_pixels), salt=f"max_pixels={max_pixels}"
                )
            # the chat's ids were encoded without adding special tokens; Gemma 3 expands its marks in the text
            ids = vision.prompt_ids(tokenizer, prompt, list(prompt.ids), features, add_special_tokens=False)
            return ids, features

        try:
            ids, features = await anyio.to_thread.run_sync(encode, limiter=self._image_work)
        except ConfigError as exc:
            raise Refusal(400, str(exc), param="messages") from None
        return await self._respond(
            request, body, [tuple(ids)], max_tokens, logprobs, chat=True, images=features, tools=tools
        )

    # -- a request's life: submitted, its events read, answered ----------------------------------------------------
    async def _submit(
        self,
        body: CompletionRequest | ChatRequest,
        prompts: list[tuple[int, ...]],
        max_tokens: int | None,
        logprobs: Any,
        images: ImageFeatures | None = None,
        tools: ToolPlan | None = None,
    ) -> _Submitted:
        engine = self.engine
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        try:
            grammar = tools.grammar(self.tokenizer.token_to_id) if tools is not None else None
            controller, options, tables = choice_for(body, engine.registry, self._vocab_size, tool_grammar=grammar)
        except ConfigError as exc:
            raise Refusal(400, str(exc)) from None
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
                adapter=self.edge.adapter_index(body.model),
                priority=body.decoctl.priority if body.decoctl is not None else 0,
            )
            for ids in prompts
        ]
        try:
            # a new choice's chain is built here (its JSON schema compiled): on a worker thread, never the event loop
            plans = await anyio.to_thread.run_sync(lambda: [engine.check(r) for r in requests], limiter=self._text_work)
        except ConfigError as exc:
            raise Refusal(400, str(exc)) from None
        handles: list[Handle] = []
        for number, (request, plan) in enumerate(zip(requests, plans, strict=True)):

            def on_event(event: Any, number: int = number) -> None:
                loop.call_soon_threadsafe(events.put_nowait, (number, event))

            try:
                handles.append(engine.submit(request, on_event, plan=plan))
            except QueueFullError as exc:
                for handle in handles:
                    handle.cancel()
                raise Refusal(
                    429, str(exc), "rate_limit_error", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
                ) from None
            except EngineClosedError as exc:
                for handle in handles:
                    handle.cancel()
                raise Refusal(503, str(exc), "server_error") from None
            # the installed controller's name, never the request's spelling of it: labels stay a bounded set
            self.metrics.prompt_tokens.labels(handles[-1].plan.spec.name).inc(len(request.ids))
        return _Submitted(
            handles=handles,
            events=events,
            started=time.perf_counter(),
            controller=handles[0].plan.spec.name,
            choices=len(prompts) * body.n,
            model=body.model,
        )

    async def _events(self, submitted: _Submitted, request: Request) -> AsyncIterator[tuple[int, Any]]:
        """(choice index, event) until every choice finished; the request cancelled when its client leaves."""

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            submitted.cancel()

        metrics = self.metrics
        watcher = asyncio.create_task(watch())
        left, first = submitted.choices, True
        n = submitted.choices // len(submitted.handles)
        try:
            while left:
                number, event = await submitted.events.get()
                if isinstance(event, Failed):
                    submitted.cancel()
                    if event.invalid:
                        raise Refusal(400, event.message)
                    raise Refusal(503 if event.unavailable else 500, event.message, "server_error")
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

    async def _respond(
        self,
        request: Request,
        body: CompletionRequest | ChatRequest,
        prompts: list[tuple[int, ...]],
        max_tokens: int | None,
        logprobs: int | None,
        chat: bool,
        images: ImageFeatures | None = None,
        tools: ToolPlan | None = None,
    ) -> Response:
        submitted = await self._submit(body, prompts, max_tokens, logprobs, images, tools)
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return TimedStream(
                sse(self._stream(request, submitted, ident, prompts, chat, include_usage, tools)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                seconds=self._send_seconds,
                stalled=submitted.cancel,
            )
        choices = [_Choice() for _ in range(submitted.choices)]
        try:
            async for index, event in self._events(submitted, request):
                if isinstance(event, Delta):
                    choices[index].text.append(event.text)
                    if event.logprobs:
                        choices[index].logprobs.extend(event.logprobs)
                else:
                    choices[index].finished = event
        except Refusal as refusal:
            # nothing is lost: the text each choice had generated before the failure comes with the error
            refusal.body["decoctl"] = {"generated": ["".join(choice.text) for choice in choices]}
            raise
        finished = [c.finished for c in choices if c.finished is not None]
        answer = self.answers.whole(
            chat=chat,
            texts=["".join(item.text) for item in choices],
            finished=[item.finished for item in choices],
            logprobs=[item.logprobs for item in choices] if logprobs is not None else None,
            id=ident,
            created=int(time.time()),
            model=submitted.model or self.model_name,
            usage=self.answers.usage(finished, prompts),
            decoctl=self.answers.stats(finished, submitted.controller),
        )
        if tools is not None and tools.reads_calls:
            with_calls(answer, tools, self.tokenizer, [item.finished for item in choices])
        return JSONResponse(answer.model_dump(mode="json"))

    async def _stream(
        self,
        request: Request,
        submitted: _Submitted,
        ident: str,
        prompts: list[tuple[int, ...]],
        chat: bool,
        include_usage: bool,
        tools: ToolPlan | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        common = {"id": ident, "created": int(time.time()), "model": submitted.model or self.model_name}
        answers = self.answers
        calls = None
        if tools is not None and tools.reads_calls:
            calls = [tools.stream(self.tokenizer) for _ in range(submitted.choices)]
        if chat:
            for index in range(submitted.choices):
                yield answers.chunk(common, chat=chat, index=index, role=True)
        finished: list[Finished] = []
        try:
            async for index, event in self._events(submitted, request):
                if isinstance(event, Delta):
                    if not event.text and not event.tokens:
                        continue
                    drafted_chars = 0
                    if event.drafted:  # how much of the text the drafted tokens wrote (they come first)
                        drafted_chars = min(len(event.text), len(self.tokenizer.decode(event.tokens[: event.drafted])))
                    extension = DecoctlDelta(
                        tokens=len(event.tokens), drafted=event.drafted, drafted_chars=drafted_chars
                    )
                    if calls is not None:  # content as it comes; what could start a call waits for the answer's end
                        for number, delta in enumerate(calls[index].feed(event.tokens, event.text) or [None]):
                            if delta is None and not event.logprobs:
                                continue
                            # the step's logprobs and counts go once, with its first delta
                            first = number == 0
                            yield answers.chunk(
                                common,
                                chat=chat,
                                index=index,
                                delta=delta,
                                logprobs=event.logprobs if first else None,
                                decoctl=extension if first else None,
                            )
                        continue
                    yield answers.chunk(
                        common, chat=chat, index=index, text=event.text, logprobs=event.logprobs, decoctl=extension
                    )
                else:
                    finished.append(event)
                    if calls is not None:
                        deltas, ended, note = calls[index].finish(event.tokens, event.finish_reason, event.text)
                        for delta in deltas:
                            yield answers.chunk(common, chat=chat, index=index, delta=delta)
                        yield answers.chunk(
                            common,
                            chat=chat,
                            index=index,
                            finish=event,
                            ended=ended,
                            note=note,
                            decoctl=answers.stats([event], submitted.controller),
                        )
                        continue
                    yield answers.chunk(
                        common,
                        chat=chat,
                        index=index,
                        text=None if chat else "",
                        finish=event,
                        decoctl=answers.stats([event], submitted.controller),
                    )
        except Refusal as refusal:
            yield refusal.body
            return
        if include_usage:
            yield answers.chunk(common, chat=chat, index=None, usage=answers.usage(finished, prompts))
