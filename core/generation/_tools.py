"""Tool calls in a model's own format: which format a chat template's family writes, the calls read out of
generated text (whole or as it streams), and the grammar that makes a model write them.

fmt = tool_format_for(template)                      # from the template's text, or tool_format_for(template, "hermes")
answer = parse_answer(fmt, text, names={"get_weather"})   # ParsedAnswer: content, calls, error
lark = tool_grammar(fmt, tools, choice="required", parallel=True, token_id=tokenizer.token_to_id)

The formats (the same names as vLLM's parsers where they agree):

- ``hermes`` (Qwen 2.5, Qwen 3, Hermes 2 Pro): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call, after any text;
- ``llama3_json`` (Llama 3.1, 3.2, 3.3): the answer is ``{"name": ..., "parameters": {...}}`` and nothing else;
- ``mistral`` (Mistral 7B v0.3, Mistral Nemo): ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` after any text;
- ``granite`` (Granite 3): ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`` after any text.

Output that starts a call (its marker) but does not parse into calls of the given tools is not a call: it is the
answer's content, and ``ParsedAnswer.error`` says why. A marker that is one special token of the tokenizer is left
out of decoded text, so calls are read from the tokens (``marked_text`` decodes them with the markers kept).

The grammar is llguidance's Lark (the logits chain's ``grammar`` processor runs it): each call's JSON is a
``%json`` schema (the function's name as a constant, its parameters' schema for the arguments), markers that are one
token of the tokenizer are that token (``<[id]>``). ``required`` and a named function make the whole answer calls;
``auto`` lets the model write text freely until it writes the format's marker, and from there on only calls (a lazy
grammar: the marker is its trigger).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

from decoctl.errors import ConfigError

__all__ = [
    "TOOL_FORMATS",
    "CallArguments",
    "CallName",
    "CallStream",
    "ParsedAnswer",
    "ToolCall",
    "ToolFormat",
    "check_tool_schema",
    "marked_text",
    "new_call_id",
    "parse_answer",
    "template_messages",
    "tool_format_for",
    "tool_grammar",
]

#: JSON as the templates write it (``tojson``): ", " and ": " between items, no other whitespace
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@attrs.frozen(kw_only=True)
class ToolFormat:
    """How one template family writes tool calls.

    ``trigger``: the text that starts the calls; ``anywhere``: whether calls may follow text (else the answer is
    calls from its start); ``opener``/``closer``: markers around each call (hermes) or before the calls' list;
    ``listed``: the calls are one JSON array after ``opener`` (``array_prefix`` between them); ``arguments_key``:
    the key of a call's arguments; ``parallel``: whether the family's template renders several calls in one
    message; ``id_length``: the length of the alphanumeric call ids its template insists on (None: OpenAI's
    ``call_...``); ``marks``: template text that identifies the family; ``markers``: the marker strings that may be
    special tokens (kept when calls are read from tokens)."""

    name: str
    families: str
    trigger: str
    anywhere: bool
    opener: str
    closer: str
    listed: bool
    array_prefix: str = ""
    separator: str = ""
    arguments_key: str = "arguments"
    parallel: bool = True
    id_length: int | None = None
    marks: tuple[str, ...]
    markers: tuple[str, ...]


TOOL_FORMATS: Mapping[str, ToolFormat] = {
    fmt.name: fmt
    for fmt in (
        ToolFormat(
            name="hermes",
            families="Qwen 2.5, Qwen 3, Hermes 2 Pro",
            trigger="<tool_call>",
            anywhere=True,
            opener="<tool_call>",
            closer="</tool_call>",
            listed=False,
            separator="\n",
            marks=("<tool_call>",),
            markers=("<tool_call>", "</tool_call>"),
        ),
        ToolFormat(
            name="mistral",
            families="Mistral 7B v0.3, Mistral Nemo",
            trigger="[TOOL_CALLS]",
            anywhere=True,
            opener="[TOOL_CALLS]",
            closer="",
            listed=True,
            array_prefix=" ",
            id_length=9,
            marks=("[TOOL_CALLS]",),
            markers=("[TOOL_CALLS]",),
        ),
        ToolFormat(
            name="granite",
            families="Granite 3",
            trigger="<|tool_call|>",
            anywhere=True,
            opener="<|tool_call|>",
            closer="",
            listed=True,
            marks=("<|tool_call|>",),
            markers=("<|tool_call|>",),
        ),
        ToolFormat(
            name="llama3_json",
            families="Llama 3.1, 3.2, 3.3",
            trigger='{"name"',
            anywhere=False,
            opener="",
            closer="",
            listed=False,
            arguments_key="parameters",
            parallel=False,
            marks=("<|python_tag|>", '"parameters"'),
            markers=("<|python_tag|>",),
        ),
    )
}
"""The tool-call formats by name (``--tool-parser``): hermes, mistral, granite, llama3_json."""


def tool_format_for(template_source: str, name: str | None = None, *, origin: str = "the chat template") -> ToolFormat:
    """The tool-call format ``name`` (``--tool-parser``), else the one whose marks the template's text holds.
    ConfigError naming the formats when ``name`` is unknown, when the template renders no tools, or when no family's
    marks are in it."""
    if name is not None:
        fmt = TOOL_FORMATS.get(name.strip().lower().replace("-", "_"))
        if fmt is None:
            raise ConfigError(f"--tool-parser {name!r} is not a tool-call format: use one of {', '.join(TOOL_FORMATS)}")
        return fmt
    if "tools" not in template_source:
        raise ConfigError(
            f"{origin} never uses the variable 'tools', so the model would not see the tools: start the server with "
            "--chat-template FILE, a template of the model's family that renders them"
        )
    for fmt in TOOL_FORMATS.values():
        if all(mark in template_source for mark in fmt.marks):
            return fmt
    raise ConfigError(
        f"{origin} writes tool calls in no format decoctl knows by its text: name the model's format with "
        f"--tool-parser ({', '.join(TOOL_FORMATS)})"
    )


def new_call_id(fmt: ToolFormat) -> str:
    """A fresh call id: OpenAI's ``call_`` and 24 hex digits, or ``id_length`` letters and digits where the family's
    template insists on them (Mistral's nine)."""
    if fmt.id_length is None:
        return "call_" + secrets.token_hex(12)
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(fmt.id_length))


# -- schemas and grammars -------------------------------------------------------------------------------------------
def check_tool_schema(parameters: Any) -> dict[str, Any]:
    """A function's ``parameters``: a JSON schema of an object (a missing one: any object) that llguidance compiles.
    ConfigError saying what is wrong (the caller names the field)."""
    if parameters is None:
        return {"type": "object"}
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"a function's parameters are a JSON schema object, not {type(parameters).__name__}")
    schema = dict(parameters)
    kind = schema.get("type", "object")
    if kind != "object":
        raise ConfigError(f'a function\'s parameters describe an object ("type": "object"), not {kind!r}')
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping) or not all(isinstance(v, Mapping | bool) for v in properties.values()):
        raise ConfigError('"properties" must be an object mapping each parameter to its schema')
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ConfigError('"required" must be a list of parameter names')
    try:
        import llguidance
    except ImportError:
        return schema  # nothing compiles it here; a constrained request is refused by the chain, naming the extra
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema({**schema, "x-guidance": _JSON_STYLE})
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"the schema does not compile ({exc})") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConfigError(f"the schema does not compile: {messages[0].strip()}")
    return schema


def _call_schema(fmt: ToolFormat, tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    options = []
    for tool in tools:
        function = tool["function"]
        parameters = check_tool_schema(function.get("parameters"))
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, fmt.arguments_key: parameters},
                "required": ["name", fmt.arguments_key],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


def _literal(text: str, token_id: Callable[[str], int | None]) -> str:
    """A marker in Lark: the tokenizer's one token for it, else its text."""
    ident = token_id(text)
    return f"<[{ident}]>" if ident is not None else json.dumps(text)


def _excluding(trigger: str, anywhere: bool) -> str:
    """A Lark lexeme: any text without ``trigger`` (``anywhere``) or not starting with it."""
    escaped = re.escape(trigger).replace("/", "\\/").replace('"', '\\"')
    if anywhere:
        return f"/(.|\\n)*/ & ~/(.|\\n)*{escaped}(.|\\n)*/"
    return f"/(.|\\n)*/ & ~/[ \\t\\r\\n]*{escaped}(.|\\n)*/"


def tool_grammar(
    fmt: ToolFormat,
    tools: Sequence[Mapping[str, Any]],
    *,
    choice: str,
    parallel: bool,
    token_id: Callable[[str], int | None],
) -> str:
    """llguidance Lark for answers to ``tools`` (OpenAI's ``{"type": "function", "function": {...}}``) in ``fmt``.

    ``choice``: "required" (the answer is one call or, with ``parallel``, several, of any of the tools), "auto"
    (free text, and once the model writes the format's trigger only calls) or a function's name (a call of it).
    ``token_id``: the tokenizer's id for a text that is one token, else None."""
    if choice not in ("required", "auto"):
        parallel = False  # a named function is called once, as OpenAI calls it
        tools = [tool for tool in tools if tool["function"]["name"] == choice]
        if not tools:
            raise ConfigError(f"tool_choice names {choice!r}, which is not one of the request's tools")
    schema = {**_call_schema(fmt, tools), "x-guidance": _JSON_STYLE}
    several = parallel and fmt.parallel
    call_json = "%json " + json.dumps(schema)
    if fmt.listed:
        array = {"type": "array", "items": schema, "minItems": 1, "x-guidance": _JSON_STYLE}
        if not several:
            array["maxItems"] = 1
        calls = f"{_literal(fmt.opener, token_id)} {json.dumps(fmt.array_prefix)} %json {json.dumps(array)}"
        calls = calls.replace(' "" ', " ")
    elif fmt.opener:
        one = f'{_literal(fmt.opener, token_id)} "\\n" {call_json} "\\n" {_literal(fmt.closer, token_id)}'
        calls = f"call ({json.dumps(fmt.separator)} call)*" if several else "call"
        calls = f"{calls}\ncall: {one}"
    else:
        calls = call_json
    if choice == "auto":
        start = "start: TEXT calls?" if fmt.anywhere else "start: TEXT | calls"
        return f"{start}\ncalls: {calls}\nTEXT: {_excluding(fmt.trigger, fmt.anywhere)}\n"
    return f"start: calls\ncalls: {calls}\n"


# -- reading calls ------------------------------------------------------------------------------------------------
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


def marked_text(tokenizer: Any, tokens: Sequence[int], fmt: ToolFormat) -> str:
    """``tokens`` decoded (special tokens left out, as the answer's text is) with the format's markers kept where
    they are one special token."""
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
        self.error: str | None = None

    def feed(self, tokens: Sequence[int]) -> list[StreamPiece]:
        self._tokens.extend(int(t) for t in tokens)
        text = marked_text(self._tokenizer, self._tokens, self._fmt).rstrip("\ufffd")  # a character's first bytes
        if self._body is not None:
            return self._calls(text)
        start = _start(self._fmt, text)
        if start >= 0:
            self._body = _body_from(self._fmt, start)
            return [*self._give(text, len(text[:start].rstrip())), *self._calls(text)]
        # whitespace before a call is not content: it waits for the text that follows it
        return self._give(text, len(text[: len(text) - self._held(text)].rstrip()))

    def finish(self, tokens: Sequence[int] | None = None) -> list[StreamPiece]:
        """The rest; ``tokens``: the whole answer's tokens where they are at hand (else those fed)."""
        if tokens is not None:
            self._tokens = [int(t) for t in tokens]
        text = marked_text(self._tokenizer, self._tokens, self._fmt)
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

    def _give(self, text: str, upto: int) -> list[StreamPiece]:
        if upto <= self._sent:
            return []
        piece, self._sent = text[self._sent : upto], upto
        return [piece]


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's messages as chat templates take them (transformers' convention): each call's ``arguments`` JSON text
    as the object it encodes. ConfigError naming the message for arguments that are not a JSON object."""
    converted = []
    for index, message in enumerate(messages):
        item = dict(message)
        calls = item.get("tool_calls")
        if calls:
            item["tool_calls"] = [_template_call(index, number, call) for number, call in enumerate(calls)]
        converted.append(item)
    return converted


def _template_call(index: int, number: int, call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ConfigError(
                f"messages[{index}].tool_calls[{number}].function.arguments is not a JSON object's text: send the "
                "arguments as the call gave them"
            )
        function["arguments"] = arguments
    return {**call, "function": function}
