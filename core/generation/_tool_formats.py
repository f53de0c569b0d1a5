"""Tool-call formats: how each chat-template family writes tool calls, which one a template shows, call ids, and
OpenAI's messages as templates take them.

fmt = tool_format_for(template.source)            # from the template's text, or tool_format_for(source, "hermes")
messages = template_messages(openai_messages)     # each call's arguments JSON text as the object it encodes

The formats (the same names as vLLM's parsers where they agree):

- ``hermes`` (Qwen 2.5, Qwen 3, Hermes 2 Pro): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call, after any text;
- ``llama3_json`` (Llama 3.1, 3.2, 3.3): the answer is ``{"name": ..., "parameters": {...}}`` and nothing else;
- ``mistral`` (Mistral 7B v0.3, Mistral Nemo): ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` after any text;
- ``granite`` (Granite 3): ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`` after any text.

Reading calls out of answers is decoctl.generation._tool_answers; the grammar that makes a model write them,
decoctl.generation._tool_grammar.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from decoctl.errors import ConfigError

__all__ = ["TOOL_FORMATS", "ToolFormat", "new_call_id", "template_messages", "tool_format_for", "tool_format_named"]


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


def tool_format_named(name: str) -> ToolFormat:
    """The tool-call format ``name`` (``--tool-parser``; ``-`` for ``_`` and any case); ConfigError listing them."""
    fmt = TOOL_FORMATS.get(name.strip().lower().replace("-", "_"))
    if fmt is None:
        raise ConfigError(f"--tool-parser {name!r} is not a tool-call format: use one of {', '.join(TOOL_FORMATS)}")
    return fmt


def tool_format_for(template_source: str, name: str | None = None, *, origin: str = "the chat template") -> ToolFormat:
    """The tool-call format of a template that renders tools: ``name`` (``--tool-parser``), else the one whose marks
    the template's text holds. ConfigError when the template never uses ``tools`` (the model would not see them),
    when ``name`` is unknown, or when no family's marks are in it."""
    if "tools" not in template_source:
        raise ConfigError(
            f"{origin} never uses the variable 'tools', so the model would not see the tools: start the server with "
            "--chat-template FILE, a template of the model's family that renders them"
        )
    if name is not None:
        return tool_format_named(name)
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
