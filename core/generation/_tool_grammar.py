"""The grammar of tool calls: llguidance's Lark (the logits chain's ``grammar`` processor runs it) for answers that
call a request's tools in their family's format.

lark = tool_grammar(fmt, tools, choice="required", parallel=True, token_id=tokenizer.token_to_id)

Each call's JSON is a ``%json`` schema (the function's name as a constant, its parameters' schema for the arguments);
a marker that is one token of the tokenizer is that token (``<[id]>``). ``required`` and a named function make the
whole answer calls; ``auto`` lets the model write text freely until it writes the format's trigger, and from there on
only calls (a lazy grammar).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from decoctl.errors import ConfigError
from decoctl.generation._tool_formats import ToolFormat

__all__ = ["check_tool_schema", "tool_grammar"]

#: JSON as the templates write it (``tojson``): ", " and ": " between items, no other whitespace
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


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
