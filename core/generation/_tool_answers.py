"""Tool calls read out of answers: whole (``parse_answer``) or as they stream (``CallStream``), in a family's format
(decoctl.generation._tool_formats).

answer = parse_answer(fmt, text, names={"get_weather"})   # ParsedAnswer: content, calls, error
text = marked_text(tokenizer, tokens, fmt)                # the answer's text with the format's special-token markers

Output that starts a call (its marker) but does not parse into calls of the given tools is not a call: it is the
answer's content, and ``ParsedAnswer.error`` says why. A marker that is one special token of the tokenizer is left
out of decoded text, so calls are read from the tokens. A call's arguments are the text the model wrote for them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

from decoctl.generation._tool_formats import ToolFormat, new_call_id

__all__ = [
    "CallArguments",
    "CallName",
    "CallStream",
    "ParsedAnswer",
    "StreamPiece",
    "ToolCall",
    "marked_text",
    "parse_answer",
]


@attrs.frozen(kw_only=True)
class ToolCall:
    """One call: its id, the function's name and its arguments as JSON text (OpenAI's ``function.arguments``)."""

    id: str
    name: str
    arguments: str


@attrs.frozen(kw_only=True)
class ParsedAnswer:
    """An answer read for calls: the text before them (trailing whitespace left out; None when there is none) and the
    calls; an
    answer that started a call which does not parse keeps its whole text as content and ``error`` says why."""

    content: str | None
    calls: tuple[ToolCall, ...] = ()
    error: str | None = None


class _NotCalls(ValueError):
    """What follows a format's trigger is not calls of the request's tools."""


def _start(fmt: ToolFormat, text: str) -> int:
    """Where the calls of ``text`` start, or -1."""
    if fmt.anywhere:
        return text.find(fmt.trigger)
    stripped = text.lstrip()
    for mark in (fmt.trigger, *fmt.markers):
        if stripped.startswith(mark):
            return len(text) - len(stripped)
    return -1


def _objects(fmt: ToolFormat, body: str) -> list[Any]:
    """The call objects of ``body`` (the text from the trigger on)."""
    decoder = json.JSONDecoder()
    if fmt.listed:
        rest = body[len(fmt.opener) :].strip()
        try:
            calls, end = decoder.raw_decode(rest)
        except ValueError as exc:
            raise _NotCalls(f"the calls after {fmt.opener} are not JSON ({exc})") from None
        if rest[end:].strip():
            raise _NotCalls(f"text follows the calls' list: {rest[end:].strip()[:40]!r}")
        if not isinstance(calls, list) or not calls:
            raise _NotCalls(f"{fmt.opener} is not followed by a list of calls")
        return calls
    objects, rest = [], body.strip()
    while rest:
        if fmt.closer:
            if not rest.startswith(fmt.opener):
                raise _NotCalls(f"text follows the calls: {rest[:40]!r}")
            inner, closed, rest = rest[len(fmt.opener) :].partition(fmt.closer)
            if not closed and fmt.opener in inner:
                raise _NotCalls(f"a call is not closed with {fmt.closer}")
            try:
                objects.append(json.loads(inner))
            except ValueError as exc:
                raise _NotCalls(f"a call is not JSON ({exc})") from None
        else:
            for marker in fmt.markers:
                rest = rest.removeprefix(marker).lstrip()
            try:
                value, end = decoder.raw_decode(rest)
            except ValueError as exc:
                raise _NotCalls(f"the call is not JSON ({exc})") from None
            objects.append(value)
            rest = rest[end:].lstrip()
            if rest.startswith(";"):
                rest = rest[1:]
        rest = rest.strip()
    return objects


@attrs.define
class _Found:
    """One call object met by a _Scanner: its name once read, and where its arguments' value is in the text
    (``kind``: "object" for an object, "string" for JSON text in a string, "other" for anything else)."""

    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    kind: str = ""


class _Scanner:
    """The calls' text (from the trigger on, a listed format's after its opener) read as it grows: where each call
    object starts, its name, and the raw text of its arguments' value. Resumable: ``feed`` reads only what is new."""

    def __init__(self, fmt: ToolFormat) -> None:
        self._keys = {fmt.arguments_key, "arguments", "parameters"}
        self._level = 1 if fmt.listed else 0  # how deep the call objects sit (in the list, or at the top)
        self._stack: list[str] = []
        self._string_from = -1
        self._escape = False
        self._key: str | None = None  # the current call's key whose value comes next (after its ":")
        self._value = False
        self._at = 0
        self.calls: list[_Found] = []
        self._open: _Found | None = None

    def feed(self, text: str) -> None:
        for index in range(self._at, len(text)):
            self._read(text, index)
        self._at = len(text)

    def _read(self, text: str, index: int) -> None:
        char = text[index]
        inside = len(self._stack) == self._level + 1 and self._open is not None  # among the call's keys
        if self._string_from >= 0:
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == '"':
                begun, self._string_from = self._string_from, -1
                if inside:
                    self._string(text[begun : index + 1], begun, index + 1)
            return
        if char == '"':
            self._string_from = index
        elif char in "{[":
            if char == "{" and len(self._stack) == self._level:
                self._open = _Found()
                self.calls.append(self._open)
                self._key, self._value = None, False
            elif inside and self._arguments() and self._open is not None and self._open.args_start is None:
                self._open.args_start, self._open.kind = index, "object" if char == "{" else "other"
            self._stack.append(char)
        elif char in "}]":
            if inside and self._arguments() and self._open is not None and self._open.kind == "other":
                self._end(text, index)
            if self._stack:
                self._stack.pop()
            depth = len(self._stack)
            closes = self._open is not None and depth == self._level + 1 and self._arguments()
            if closes and self._open is not None and self._open.args_end is None:  # the arguments' object or list
                self._open.args_end = index + 1
            if depth == self._level + 1 and self._open is not None:
                self._key, self._value = None, False  # the value ended: a "," or the object's end follows
            if depth <= self._level:
                self._open = None
        elif inside:
            if char == ":":
                self._value = True
            elif char == ",":
                if self._arguments() and self._open is not None and self._open.kind == "other":
                    self._end(text, index)
                self._key, self._value = None, False
            elif not char.isspace() and self._arguments() and self._open is not None and self._open.args_start is None:
                self._open.args_start, self._open.kind = index, "other"

    def _arguments(self) -> bool:
        return self._value and self._key in self._keys

    def _end(self, text: str, index: int) -> None:
        assert self._open is not None and self._open.args_start is not None
        if self._open.args_end is None:
            self._open.args_end = self._open.args_start + len(text[self._open.args_start : index].rstrip())

    def _string(self, raw: str, start: int, end: int) -> None:
        assert self._open is not None
        if not self._value:
            self._key = _decoded(raw)
            return
        if self._key == "name" and self._open.name is None:
            self._open.name = _decoded(raw)
        elif self._key in self._keys and self._open.args_start is None:
            self._open.args_start, self._open.args_end, self._open.kind = start, end, "string"


def _decoded(raw: str) -> str:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw[1:-1]
    return value if isinstance(value, str) else raw[1:-1]


def _body_from(fmt: ToolFormat, start: int) -> int:
    """Where the scanned calls' text begins: after a listed format's opener (its brackets are not JSON)."""
    return start + len(fmt.opener) if fmt.listed else start


def _call(
    fmt: ToolFormat, value: Any, found: _Found, body: str, names: Collection[str] | None, new_id: Callable[[], str]
) -> ToolCall:
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
        raise _NotCalls('a call is not an object with a "name"')
    name = value["name"]
    if names is not None and name not in names:
        raise _NotCalls(f"the call names {name!r}, which is not one of the request's tools")
    arguments: Any = next((value[key] for key in (fmt.arguments_key, "arguments", "parameters") if key in value), {})
    text = body[found.args_start : found.args_end] if found.kind == "object" else None
    if isinstance(arguments, str):
        text = arguments
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise _NotCalls(f"the arguments of {name!r} are not JSON") from None
    if not isinstance(arguments, Mapping):
        raise _NotCalls(f"the arguments of {name!r} are not an object")
    # the arguments as the model wrote them (what a stream sent); a call without them: an empty object
    return ToolCall(id=new_id(), name=name, arguments=text if text is not None else "{}")


def parse_answer(
    fmt: ToolFormat,
    text: str,
    *,
    names: Collection[str] | None = None,
    new_id: Callable[[], str] | None = None,
) -> ParsedAnswer:
    """The calls ``text`` makes in ``fmt`` (of the functions ``names``, when given) and the text before them. A
    call's ``arguments`` are the text the model wrote for them (JSON text written as a string: that string)."""
    ident = new_id or (lambda: new_call_id(fmt))
    start = _start(fmt, text)
    if start < 0:
        return ParsedAnswer(content=text)
    body = text[_body_from(fmt, start) :]
    scanner = _Scanner(fmt)
    scanner.feed(body)
    try:
        values = _objects(fmt, text[start:])
        if len(values) != len(scanner.calls):
            raise _NotCalls(f"{len(values)} calls parse but {len(scanner.calls)} call objects were found")
        calls = tuple(
            _call(fmt, value, found, body, names, ident) for value, found in zip(values, scanner.calls, strict=True)
        )
    except _NotCalls as exc:
        return ParsedAnswer(content=text, error=f"the answer starts a {fmt.name} tool call that does not parse: {exc}")
    before = text[:start].rstrip()
    return ParsedAnswer(content=before or None, calls=calls)


def marked_text(tokenizer: Any, tokens: Sequence[int], fmt: ToolFormat, text: str | None = None) -> str:
    """``tokens`` decoded (special tokens left out, as the answer's text is) with the format's markers kept where
    they are one special token. ``text``: the answer's text as its generation gave it, where a stop string may have
    cut the tokens' text short: the marked text ends where it ends."""
    marked = _marked(tokenizer, tokens, fmt)
    if text is None:
        return marked
    plain: str = tokenizer.decode(list(tokens))
    if plain != text and plain.startswith(text):  # what a stop string took from the end
        return marked[: len(marked) - (len(plain) - len(text))]
    return marked


def _marked(tokenizer: Any, tokens: Sequence[int], fmt: ToolFormat) -> str:
    marks = {}
    for marker in fmt.markers:
        ident = tokenizer.token_to_id(marker)
        if ident is not None:
            marks[int(ident)] = marker
    if not marks:
        text: str = tokenizer.decode(list(tokens))
        return text
    pieces: list[str] = []
    run: list[int] = []
    for token in tokens:
        if int(token) in marks:
            pieces.extend((tokenizer.decode(run), marks[int(token)]))
            run = []
        else:
            run.append(int(token))
    pieces.append(tokenizer.decode(run))
    return "".join(pieces)


@attrs.frozen(kw_only=True)
class CallName:
    """A streamed call begins: its place among the answer's calls, its id and its function's name."""

    index: int
    id: str
    name: str


@attrs.frozen(kw_only=True)
class CallArguments:
    """More of a streamed call's arguments (JSON text; the pieces of one call join to its ``arguments``)."""

    index: int
    text: str


StreamPiece = str | CallName | CallArguments
"""What a CallStream gives: content text, a call's start, or more of its arguments."""


class CallStream:
    """One streamed answer read for calls: ``feed`` takes each step's tokens and gives the content that can no
    longer be the start of a call, then, once calls start, each call's name as soon as it is read and its arguments
    as they are written; ``finish`` gives the rest and ``error`` says why calls that started did not parse. The
    content and calls given join to what ``parse_answer`` reads from the whole answer, when it parses; an answer cut
    inside a call keeps what was sent of it (a stream cannot take it back) and the error."""

    def __init__(
        self,
        fmt: ToolFormat,
        tokenizer: Any,
        *,
        names: Collection[str] | None = None,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self._fmt, self._tokenizer, self._names = fmt, tokenizer, names
        self._new_id = new_id or (lambda: new_call_id(fmt))
        self._tokens: list[int] = []
        self._sent = 0
        self._body: int | None = None  # where the calls' text starts, once the trigger is read
        self._scanner = _Scanner(fmt)
        self._ids: list[str] = []  # the announced calls' ids
        self._given: list[int] = []  # how much of each announced call's arguments went out
        self._shown: int | None = None  # how much text the generation gave, where the caller says
        self.error: str | None = None

    def feed(self, tokens: Sequence[int], text: str | None = None) -> list[StreamPiece]:
        """``text``: the text the generation gave with these tokens (it holds back what a stop string may claim):
        content never runs ahead of it."""
        self._tokens.extend(int(t) for t in tokens)
        if text is not None:
            self._shown = (self._shown or 0) + len(text)
        marked = marked_text(self._tokenizer, self._tokens, self._fmt).rstrip("\ufffd")  # a character's first bytes
        if self._body is not None:
            return self._calls(marked)
        start = _start(self._fmt, marked)
        if start >= 0:
            self._body = _body_from(self._fmt, start)
            return [*self._give(marked, len(marked[:start].rstrip()), bounded=True), *self._calls(marked)]
        # whitespace before a call is not content: it waits for the text that follows it
        return self._give(marked, len(marked[: len(marked) - self._held(marked)].rstrip()), bounded=True)

    def finish(self, tokens: Sequence[int] | None = None, text: str | None = None) -> list[StreamPiece]:
        """The rest; ``tokens``: the whole answer's tokens where they are at hand (else those fed); ``text``: its
        text as the generation gave it (stop strings applied)."""
        if tokens is not None:
            self._tokens = [int(t) for t in tokens]
        text = marked_text(self._tokenizer, self._tokens, self._fmt, text)
        announced = iter(self._ids)
        answer = parse_answer(
            self._fmt, text, names=self._names, new_id=lambda: next(announced, None) or self._new_id()
        )
        self.error = answer.error
        if not answer.calls:
            return [] if self._ids else self._give(text, len(text))
        pieces = self._give(text, len(answer.content or ""))
        for index, call in enumerate(answer.calls):
            if index >= len(self._ids):
                pieces.append(CallName(index=index, id=call.id, name=call.name))
                self._ids.append(call.id)
                self._given.append(0)
            if call.arguments[self._given[index] :]:
                pieces.append(CallArguments(index=index, text=call.arguments[self._given[index] :]))
                self._given[index] = len(call.arguments)
        return pieces

    @property
    def called(self) -> bool:
        """Whether the finished answer made calls (all of them parsed)."""
        return bool(self._ids) and self.error is None

    def _calls(self, text: str) -> list[StreamPiece]:
        """Each call's name once read (of one of the tools), then its arguments' object as it is written."""
        assert self._body is not None
        body = text[self._body :]
        self._scanner.feed(body)
        pieces: list[StreamPiece] = []
        for index, found in enumerate(self._scanner.calls):
            if index == len(self._ids):
                if found.name is None or (self._names is not None and found.name not in self._names):
                    break
                self._ids.append(self._new_id())
                self._given.append(0)
                pieces.append(CallName(index=index, id=self._ids[index], name=found.name))
            if found.kind == "object" and found.args_start is not None:
                end = found.args_end if found.args_end is not None else len(body)
                more = body[found.args_start + self._given[index] : end]
                if more:
                    pieces.append(CallArguments(index=index, text=more))
                    self._given[index] += len(more)
        return pieces

    def _held(self, text: str) -> int:
        """How many characters at the end of ``text`` could begin a call."""
        fmt = self._fmt
        if not fmt.anywhere:
            stripped = text.lstrip()
            if any(mark.startswith(stripped) for mark in (fmt.trigger, *fmt.markers)):
                return len(text)
            return 0
        for size in range(min(len(text), len(fmt.trigger) - 1), 0, -1):
            if fmt.trigger.startswith(text[-size:]):
                return size
        return 0

    def _give(self, text: str, upto: int, *, bounded: bool = False) -> list[StreamPiece]:
        if bounded and self._shown is not None:
            upto = min(upto, self._shown)
        if upto <= self._sent:
            return []
        piece, self._sent = text[self._sent : upto], upto
        return [piece]
