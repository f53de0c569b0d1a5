"""``decoctl chat --tools FILE.json``: the tools rendered into every prompt, each answer read for calls, each call
shown and its result asked for, then the model answers again with the results.

FILE.json is a list of OpenAI tools: ``[{"type": "function", "function": {"name": ..., "parameters": {...}}}]``.
``--tool-choice`` is "auto" (default: the model writes freely until it starts a call, then only calls of the tools),
"required", "none" or a function's name; the grammar is the server's (decoctl.generation's tool_grammar).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs

from decoctl.errors import ConfigError
from decoctl.generation import ChatTemplate, Generator
from decoctl.generation._tool_answers import ToolCall, marked_text, parse_answer
from decoctl.generation._tool_formats import ToolFormat, template_messages, tool_format_for
from decoctl.generation._tool_grammar import check_tool_schema, tool_grammar

__all__ = ["ToolChat", "read_tools"]


def read_tools(path: str | Path) -> list[dict[str, Any]]:
    """The tools of ``path`` (a JSON list of OpenAI tools); ConfigError naming the file and the tool that is wrong."""
    try:
        tools = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--tools {path}: cannot read it as JSON ({exc})") from None
    if not isinstance(tools, list) or not tools:
        raise ConfigError(f'--tools {path}: give a JSON list of tools, [{{"type": "function", "function": {{...}}}}]')
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ConfigError(
                f'--tools {path}: tool {index} is not {{"type": "function", "function": {{"name": ...}}}}'
            )
        try:
            check_tool_schema(function.get("parameters"))
        except ConfigError as exc:
            raise ConfigError(f"--tools {path}: {function['name']!r}'s parameters: {exc}") from None
    return tools


@attrs.frozen(kw_only=True)
class ToolChat:
    """The tools of a terminal chat, their format and the choice."""

    tools: tuple[dict[str, Any], ...]
    fmt: ToolFormat
    choice: str
    parallel: bool = True

    @classmethod
    def of(
        cls, path: str | Path, template: ChatTemplate, *, tool_parser: str | None, choice: str, parallel: bool = True
    ) -> ToolChat:
        tools = read_tools(path)
        names = {tool["function"]["name"] for tool in tools}
        if choice not in ("auto", "required", "none") and choice not in names:
            raise ConfigError(
                f"--tool-choice {choice!r} names no function of --tools {path} ({', '.join(sorted(names))})"
            )
        fmt = tool_format_for(template.source, tool_parser, origin=f"the chat template from {template.origin}")
        return cls(tools=tuple(tools), fmt=fmt, choice=choice, parallel=parallel)

    def processors(self, generator: Generator) -> list[dict[str, Any]]:
        """The grammar table of the choice for ``generator``'s target, none for "none"."""
        if self.choice == "none":
            return []
        tokenizer = generator.models["target"].tokenizer
        lark = tool_grammar(
            self.fmt, self.tools, choice=self.choice, parallel=self.parallel, token_id=tokenizer.token_to_id
        )
        return [{"name": "grammar", "lark": lark}]

    def prompt(self, generator: Generator, history: Sequence[dict[str, Any]], template: ChatTemplate) -> Any:
        return generator.chat_prompt(template_messages(history), template=template, tools=list(self.tools))

    def answered(
        self, generator: Generator, history: list[dict[str, Any]], given_in: TextIO, out: TextIO, interactive: bool
    ) -> bool:
        """After an answer: its calls shown, each result read (one line) and the call and results added to
        ``history``; True when the model is to answer again with them. A call that does not parse is shown so."""
        last = generator.last
        if last is None or self.choice == "none":
            return False
        tokenizer = generator.models["target"].tokenizer
        answer = parse_answer(
            self.fmt,
            marked_text(tokenizer, last.tokens, self.fmt, last.text),
            names={t["function"]["name"] for t in self.tools},
        )
        if answer.error is not None:
            out.write(f"[{answer.error}]\n")
        if not answer.calls:
            return False
        history[-1] = {"role": "assistant", "content": answer.content, "tool_calls": [_call(c) for c in answer.calls]}
        for call in answer.calls:
            out.write(f"[tool call {call.name}({call.arguments})]\n")
            if interactive:
                out.write(f"result of {call.name}> ")
            out.flush()
            line = given_in.readline()
            if not line:
                return False
            history.append({"role": "tool", "tool_call_id": call.id, "content": line.rstrip("\n")})
        return True


def _call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
