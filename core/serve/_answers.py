"""The engine's events rendered in OpenAI's shapes: a whole response, a stream's chunks, usage, log-probabilities and
decoctl's own statistics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from decoctl.serve._protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatDelta,
    ChatLogprobs,
    ChatResponse,
    ChoiceNote,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionResponse,
    DecoctlStats,
    TopLogprob,
    Usage,
)
from decoctl.serve._protocol import TokenLogprob as ChatTokenLogprob
from decoctl.serve._requests import Finished, TokenLogprob

__all__ = ["Answers", "reason"]


class Answers:
    """Renders completions (``chat`` false) and chats for ``model_name``, token texts by ``tokenizer``."""

    def __init__(self, tokenizer: Any, model_name: str) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name

    @staticmethod
    def usage(finished: list[Finished], prompts: list[tuple[int, ...]]) -> Usage:
        prompt = sum(len(ids) for ids in prompts)
        completion = sum(len(f.tokens) for f in finished)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    @staticmethod
    def stats(finished: list[Finished], controller: str) -> DecoctlStats:
        tokens = sum(len(f.tokens) for f in finished)
        forwards = sum(f.target_forwards for f in finished)
        return DecoctlStats(
            controller=controller,
            target_forwards=forwards,
            drafted_tokens=sum(f.drafted for f in finished),
            tokens_per_target_forward=round(tokens / forwards, 4) if forwards else float(tokens),
        )

    def token_text(self, token: int) -> str:
        text: str = self.tokenizer.decode([token])
        return text

    def completion_logprobs(self, items: Sequence[TokenLogprob]) -> CompletionLogprobs:
        offsets, at = [], 0
        for item in items:
            offsets.append(at)
            at += len(self.token_text(item.token))
        return CompletionLogprobs(
            tokens=[self.token_text(i.token) for i in items],
            token_logprobs=[i.logprob for i in items],
            top_logprobs=[{self.token_text(t): lp for t, lp in i.top} for i in items],
            text_offset=offsets,
        )

    def chat_logprobs(self, items: Sequence[TokenLogprob]) -> ChatLogprobs:
        def top(token: int, logprob: float) -> TopLogprob:
            text = self.token_text(token)
            return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

        return ChatLogprobs(
            content=[
                ChatTokenLogprob(**top(i.token, i.logprob).model_dump(), top_logprobs=[top(t, lp) for t, lp in i.top])
                for i in items
            ]
        )

    def whole(
        self,
        *,
        chat: bool,
        texts: Sequence[str],
        finished: Sequence[Finished | None],
        logprobs: Sequence[Sequence[TokenLogprob]] | None,
        **common: Any,
    ) -> ChatResponse | CompletionResponse:
        """A whole (not streamed) response: choice i's ``texts[i]``, how it ``finished``, its ``logprobs`` where
        asked; ``common``: the response's id, created, model, usage and decoctl fields."""
        if chat:
            return ChatResponse(
                choices=[
                    ChatChoice(
                        index=index,
                        message=AssistantMessage(content=text),
                        finish_reason=reason(finished[index]),
                        logprobs=self.chat_logprobs(logprobs[index]) if logprobs is not None else None,
                    )
                    for index, text in enumerate(texts)
                ],
                **common,
            )
        return CompletionResponse(
            choices=[
                CompletionChoice(
                    index=index,
                    text=text,
                    finish_reason=reason(finished[index]),
                    logprobs=self.completion_logprobs(logprobs[index]) if logprobs is not None else None,
                )
                for index, text in enumerate(texts)
            ],
            **common,
        )

    def chunk(
        self,
        common: dict[str, Any],
        *,
        chat: bool,
        index: int | None,
        text: str | None = None,
        finish: Finished | None = None,
        role: bool = False,
        logprobs: Sequence[TokenLogprob] | None = None,
        delta: ChatDelta | None = None,
        ended: str | None = None,
        note: ChoiceNote | None = None,
        **more: Any,
    ) -> dict[str, Any]:
        """One chunk of a stream, as JSON: choice ``index``'s ``text`` (a chat's first chunk: its ``role``), how it
        ended, its ``logprobs``; no choice (``index`` None) for the closing usage chunk. A chat's tool calls give
        their own ``delta``, the reason it ``ended`` ("tool_calls") and decoctl's ``note`` on it
        (decoctl.serve._tool_calls)."""
        if ended is None:
            ended = None if finish is None else reason(finish)
        record: ChatChunk | CompletionChunk
        if chat:
            choices = []
            if index is not None:
                if delta is None:
                    delta = ChatDelta(role="assistant", content="") if role else ChatDelta(content=text)
                shown = self.chat_logprobs(logprobs) if logprobs is not None else None
                choices.append(
                    ChatChunkChoice(index=index, delta=delta, finish_reason=ended, logprobs=shown, decoctl=note)
                )
            record = ChatChunk(choices=choices, **common, **more)
        else:
            listed = []
            if index is not None:
                given = self.completion_logprobs(logprobs) if logprobs is not None else None
                listed.append(CompletionChoice(index=index, text=text or "", finish_reason=ended, logprobs=given))
            record = CompletionChunk(choices=listed, **common, **more)
        return record.model_dump(mode="json", exclude_none=False)


def reason(finished: Finished | None) -> Any:
    return None if finished is None else finished.finish_reason
