"""A chat request's tools in the server: checked at the edge, rendered through the model's template, its calls'
grammar, and the answer read for calls (whole, or as it streams) in OpenAI's shapes.

plan = tool_plan(body, template, tool_parser=None)    # None when the request has no tools; ToolError (a 400) if bad
prompt = template.prompt(chat_messages(body), **plan.variables())
lark = plan.grammar(tokenizer.token_to_id)            # the logits chain's grammar, or None ("none")
message, reason, note = plan.answer(tokenizer, finished.tokens, finished.finish_reason, finished.text)

``tool_choice``: "none" renders the tools and reads no calls (the answer is content); "auto" (the default with tools)
lets the model answer freely and constrains it only once it starts a call (decoctl.generation._tool_grammar's lazy
grammar);
"required" and a named function constrain the whole answer to calls that parse and validate against the tools'
schemas. ``parallel_tool_calls`` false (or a family whose template renders one call per message) allows one call.
A stream gives the content as it comes, holding back only what could be the start of a call, then each call as
OpenAI streams one: its id and name as soon as they are read, then its arguments as the model writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from decoctl.errors import ConfigError
from decoctl.generation import ChatTemplate
from decoctl.generation._tool_answers import (
    CallArguments,
    CallName,
    CallStream,
    StreamPiece,
    ToolCall,
    marked_text,
    parse_answer,
)
from decoctl.generation._tool_formats import ToolFormat, template_messages, tool_format_for
from decoctl.generation._tool_grammar import check_tool_schema, tool_grammar
from decoctl.serve._protocol import (
    AssistantMessage,
    CalledFunctionOut,
    ChatDelta,
    ChatRequest,
    ChoiceNote,
    FunctionDelta,
    NamedToolChoice,
    ToolCallDelta,
    ToolCallOut,
)

__all__ = ["ToolError", "ToolPlan", "ToolStream", "chat_messages", "tool_plan", "with_calls"]


class ToolError(ConfigError):
    """A request's tools, tool_choice or tool messages that decoctl cannot run: a 400 naming ``param``."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@attrs.frozen(kw_only=True)
class ToolPlan:
    """What a request's tools make of it: the family's call format, the tools as OpenAI sends them, the choice
    ("none", "auto", "required" or a function's name) and whether several calls may come at once."""

    fmt: ToolFormat
    tools: tuple[dict[str, Any], ...]
    choice: str
    parallel: bool

    @property
    def reads_calls(self) -> bool:
        """Whether answers are read for calls: not under "none", whose answers are content as they are."""
        return self.choice != "none"

    @property
    def names(self) -> frozenset[str]:
        return frozenset(tool["function"]["name"] for tool in self.tools)

    def variables(self) -> dict[str, Any]:
        """What the chat template is given beside the messages (apply_chat_template's ``tools=``)."""
        return {"tools": [dict(tool) for tool in self.tools]}

    def grammar(self, token_id: Callable[[str], int | None]) -> str | None:
        """The Lark grammar of the answer (decoctl.generation._tools.tool_grammar), None for "none"."""
        if self.choice == "none":
            return None
        return tool_grammar(self.fmt, self.tools, choice=self.choice, parallel=self.parallel, token_id=token_id)

    def answer(
        self, tokenizer: Any, tokens: Sequence[int], finish_reason: str, text: str | None = None
    ) -> tuple[AssistantMessage, str, ChoiceNote | None]:
        """The assistant's message for an answer's ``tokens`` (and its ``text``, stop strings applied), its finish
        reason ("tool_calls" when it made calls) and decoctl's note when output that started a call did not parse."""
        text = marked_text(tokenizer, tokens, self.fmt, text)
        parsed = parse_answer(self.fmt, text, names=self.names)
        note = None if parsed.error is None else ChoiceNote(tool_call_error=parsed.error)
        if not parsed.calls:
            return AssistantMessage(content=parsed.content), finish_reason, note
        message = AssistantMessage(content=parsed.content, tool_calls=[_out(call) for call in parsed.calls])
        return message, _called(finish_reason), None

    def stream(self, tokenizer: Any) -> ToolStream:
        return ToolStream(self, tokenizer)


def _out(call: ToolCall) -> ToolCallOut:
    return ToolCallOut(id=call.id, function=CalledFunctionOut(name=call.name, arguments=call.arguments))


def _called(finish_reason: str) -> str:
    return "tool_calls" if finish_reason in ("stop", "length") else finish_reason


class ToolStream:
    """One streamed choice read for calls: ``feed`` turns a step's tokens into content deltas; ``finish`` gives the
    rest as deltas (content, or each call's id and name, then its arguments), the finish reason and the note."""

    def __init__(self, plan: ToolPlan, tokenizer: Any) -> None:
        self._plan = plan
        self._calls = CallStream(plan.fmt, tokenizer, names=plan.names)

    def feed(self, tokens: Sequence[int], text: str) -> list[ChatDelta]:
        return self._deltas(self._calls.feed(tokens, text))

    def finish(
        self, tokens: Sequence[int], finish_reason: str, text: str
    ) -> tuple[list[ChatDelta], str, ChoiceNote | None]:
        deltas = self._deltas(self._calls.finish(tokens, text))
        note = None if self._calls.error is None else ChoiceNote(tool_call_error=self._calls.error)
        return deltas, _called(finish_reason) if self._calls.called else finish_reason, note

    @staticmethod
    def _deltas(pieces: Sequence[StreamPiece]) -> list[ChatDelta]:
        deltas = []
        for piece in pieces:
            if isinstance(piece, str):
                deltas.append(ChatDelta(content=piece))
            elif isinstance(piece, CallName):
                function = FunctionDelta(name=piece.name, arguments="")
                call = ToolCallDelta(index=piece.index, id=piece.id, type="function", function=function)
                deltas.append(ChatDelta(tool_calls=[call]))
            else:
                assert isinstance(piece, CallArguments)
                call = ToolCallDelta(index=piece.index, function=FunctionDelta(arguments=piece.text))
                deltas.append(ChatDelta(tool_calls=[call]))
        return deltas


def tool_plan(body: ChatRequest, template: ChatTemplate, *, tool_parser: str | None = None) -> ToolPlan | None:
    """The request's ToolPlan, None when it has no tools; ToolError naming the field that is wrong."""
    choice = body.tool_choice
    if not body.tools:
        if choice is not None and choice != "none":
            raise ToolError(
                'tool_choice needs tools: send the functions in "tools", or drop tool_choice', "tool_choice"
            )
        return None
    names: set[str] = set()
    for index, tool in enumerate(body.tools):
        name = tool.function.name
        if name in names:
            raise ToolError(f"tools: two functions are named {name!r}: give each its own name", f"tools.{index}")
        names.add(name)
        try:
            check_tool_schema(tool.function.parameters)
        except ConfigError as exc:
            raise ToolError(
                f"tools[{index}].function.parameters ({name!r}): {exc}", f"tools.{index}.function.parameters"
            ) from None
    if isinstance(choice, NamedToolChoice):
        chosen = choice.function.name
        if chosen not in names:
            raise ToolError(
                f"tool_choice names the function {chosen!r}, which is not among the tools ({', '.join(sorted(names))})",
                "tool_choice",
            )
    else:
        chosen = choice or "auto"
    try:
        fmt = tool_format_for(template.source, tool_parser, origin=f"the chat template from {template.origin}")
    except ConfigError as exc:
        raise ToolError(str(exc), "tools") from None
    tools = tuple(tool.model_dump(exclude_none=True) for tool in body.tools)
    parallel = body.parallel_tool_calls is not False
    return ToolPlan(fmt=fmt, tools=tools, choice=chosen, parallel=parallel)


def chat_messages(body: ChatRequest) -> list[dict[str, Any]]:
    """The request's messages as the chat template takes them (each call's arguments as an object); ToolError for a
    tool message that answers no call of an earlier assistant message, or arguments that are not a JSON object."""
    messages = body.chat()
    called: set[str] = set()
    for index, message in enumerate(body.messages):
        if message.role == "assistant" and message.tool_calls:
            called.update(call.id for call in message.tool_calls)
        if message.role != "tool":
            continue
        if message.tool_call_id is None:
            raise ToolError(
                f"messages[{index}] is a tool message without tool_call_id: give the id of the call it answers",
                f"messages.{index}.tool_call_id",
            )
        if message.tool_call_id not in called:
            raise ToolError(
                f"messages[{index}].tool_call_id {message.tool_call_id!r} answers no call of an earlier assistant "
                "message: give the id of the call it answers",
                f"messages.{index}.tool_call_id",
            )
    try:
        return template_messages(messages)
    except ConfigError as exc:
        where = str(exc).split(" ", 1)[0].replace("[", ".").replace("]", "")
        raise ToolError(str(exc), where) from None


def with_calls(answer: Any, plan: ToolPlan, tokenizer: Any, finished: Sequence[Any]) -> None:
    """``answer`` (a whole ChatResponse of a plan that reads calls) with each finished choice's message read for
    calls, its finish reason and decoctl's note: in place."""
    for choice, done in zip(answer.choices, finished, strict=True):
        if done is not None:
            choice.message, choice.finish_reason, choice.decoctl = plan.answer(
                tokenizer, done.tokens, done.finish_reason, done.text
            )
