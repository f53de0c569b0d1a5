"""OpenAI's sampling fields as decoctl's choices: a controller, its options and a logits chain.

- ``temperature`` 0 is the greedy controller; otherwise (OpenAI's default is 1) the sample controller draws from
  the processed distribution. ``"decoctl": {"controller": ...}`` names the controller instead.
- The chain, in the order OpenAI's samplers apply them: ``logit_bias``, ``presence_penalty``,
  ``frequency_penalty`` (counted over the completion, not the prompt, as OpenAI counts them), then decoctl's own
  ``processors``, a ``response_format`` grammar (llguidance through the logits chain's ``grammar`` processor),
  ``temperature`` and ``top_p``.

So a request is what ``decoctl generate -c sample -p "temperature=0.7,top_p=0.9" --seed S`` runs, token for token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from decoctl.errors import ConfigError
from decoctl.plugins import PluginRegistry
from decoctl.serve._protocol import ChatRequest, CompletionRequest, DecoctlChoice
from decoctl.specs import normalise_name

__all__ = ["choice_for", "processor_tables"]


def choice_for(
    body: CompletionRequest | ChatRequest, registry: PluginRegistry, vocab_size: int, *, tool_grammar: str | None = None
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """(controller, options, processor tables) for ``body``; ConfigError for values decoctl cannot run.
    ``tool_grammar``: the Lark grammar of the request's tool calls (decoctl.serve._tool_calls), first in the chain."""
    choice = body.decoctl or DecoctlChoice()
    temperature = 1.0 if body.temperature is None else body.temperature
    if choice.controller is not None:
        controller = choice.controller
    elif choice.options:
        raise ConfigError('"decoctl.options" are a controller\'s options: name it in "decoctl.controller" too')
    else:
        controller = "greedy" if temperature == 0 else "sample"
    tables = processor_tables(body, registry, vocab_size, sampling=temperature != 0, tool_grammar=tool_grammar)
    return controller, dict(choice.options), tables


def processor_tables(
    body: CompletionRequest | ChatRequest,
    registry: PluginRegistry,
    vocab_size: int,
    *,
    sampling: bool,
    tool_grammar: str | None = None,
) -> list[dict[str, Any]]:
    tables: list[dict[str, Any]] = []
    schema = _response_schema(body) if isinstance(body, ChatRequest) else None
    if tool_grammar is not None:
        if schema is not None:
            raise ConfigError(
                "response_format asks for JSON and tool_choice constrains the answer to tool calls: one request takes "
                'one grammar (drop response_format, or send tool_choice "none")'
            )
        tables.append({"name": "grammar", "lark": tool_grammar})
    if schema is not None:
        # first in the chain: every other processor (top_k, a bias, penalties) works among the tokens it allows.
        # JSON as OpenAI writes it: ", " and ": " between items, no other whitespace (llguidance's default lets a
        # model pad with whitespace it was never trained to stop)
        schema = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}, **schema}
        tables.append({"name": "grammar", "json_schema": json.dumps(schema)})
    if body.logit_bias:
        biases = {}
        for key, bias in body.logit_bias.items():
            if not key.lstrip("-").isdigit() or not 0 <= int(key) < vocab_size:
                raise ConfigError(f"logit_bias: {key!r} is not a token id of this model (0..{vocab_size - 1})")
            biases[str(int(key))] = bias
        tables.append({"name": "logit_bias", "biases": json.dumps(biases)})
    if body.presence_penalty:
        tables.append({"name": "presence_penalty", "penalty": body.presence_penalty})
    if body.frequency_penalty:
        tables.append({"name": "frequency_penalty", "penalty": body.frequency_penalty})
    if body.decoctl is not None and body.decoctl.processors:
        chain = _chain_tables(body.decoctl.processors, registry)
        if schema is not None and any(normalise_name(str(t["name"])) == "grammar" for t in chain):
            raise ConfigError(
                "decoctl.processors names a grammar and response_format asks for JSON: one request takes one grammar "
                "(drop the grammar from processors, or response_format)"
            )
        if tool_grammar is not None and any(normalise_name(str(t["name"])) == "grammar" for t in chain):
            raise ConfigError(
                "decoctl.processors names a grammar and tool_choice constrains the answer to tool calls: one request "
                'takes one grammar (drop the grammar from processors, or send tool_choice "none")'
            )
        tables.extend(chain)
    if sampling and body.temperature is not None and body.temperature != 1:
        tables.append({"name": "temperature", "temperature": body.temperature})
    if sampling and body.top_p is not None and body.top_p < 1:
        tables.append({"name": "top_p", "top_p": body.top_p})
    return tables


def _response_schema(body: ChatRequest) -> Mapping[str, Any] | None:
    form = body.response_format
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return {"type": "object"}
    if form.json_schema is None or form.json_schema.schema_ is None:
        raise ConfigError('response_format: type "json_schema" needs "json_schema": {"name": ..., "schema": {...}}')
    return form.json_schema.schema_


def _chain_tables(text: str, registry: PluginRegistry) -> list[dict[str, Any]]:
    """A chain string ("dry=0.8,top_k=40") as tables; ``name=value`` sets the processor's main option (the first of
    its schema), as in ``decoctl generate -p``. Unknown names stay as they are, for the chain's own error."""
    specs = registry.processors()
    tables = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = (part.strip() for part in item.partition("="))
        spec = specs.get(normalise_name(name))
        if not sep or spec is None or not spec.options:
            tables.append({"name": name} if not sep else {"name": name, "value": value})
            continue
        tables.append({"name": name, spec.options[0].name: value})
    return tables
