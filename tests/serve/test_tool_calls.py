"""Tool calling through the server with the official openai client, on a tiny model of each template family: the
whole round (tools -> tool_calls -> a tool message -> the answer), the prompt the server renders equal to
transformers' (as many prompt tokens as apply_chat_template's), streamed calls assembled equal to the whole call, a
named function, a call cut short returned as content with decoctl's note, and the refusals (400s naming the field).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from decoctl import load_model
from decoctl.generation import ChatTemplate
from decoctl.generation._tool_formats import template_messages

from .conftest import API_KEY, MODEL, openai, plugin_registry, start_server
from .tool_families import FAMILIES, TOOLS, model_folder

transformers = pytest.importorskip("transformers")
jsonschema = pytest.importorskip("jsonschema")

QUESTION = {"role": "user", "content": "What is the weather in Oslo?"}
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
REQUIRED = {
    "tools": TOOLS,
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "temperature": 0,
    "max_tokens": 160,
}


class Served:
    def __init__(self, name: str, url: str, folder: Path) -> None:
        self.name, self.url, self.folder = name, url, folder
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)

    def prompt_tokens(self, messages: list[dict[str, Any]], **variables: Any) -> int:
        """How many tokens transformers' apply_chat_template makes of ``messages``."""
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.folder))
        ids = tokenizer.apply_chat_template(
            template_messages(messages), add_generation_prompt=True, tokenize=True, return_dict=False, **variables
        )
        return len(ids)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    name = request.param
    folder = model_folder(tmp_path_factory.mktemp(f"served-{name}"), FAMILIES[name])
    engine = Engine({"target": load_model(folder, name=MODEL)}, registry=plugin_registry(), max_rows=2, max_queue=16)
    app = create_app(engine, model_name=MODEL, chat_template=ChatTemplate.from_folder(folder), api_key=API_KEY)
    url, thread, server = start_server(app)
    yield Served(name, url, folder)
    server.should_exit = True
    thread.join()


def post(served: Served, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        served.url + "/v1/chat/completions",
        data=json.dumps({"model": MODEL, **body}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_openai_client_makes_a_whole_tool_round(served: Served) -> None:
    first = served.client.chat.completions.create(model=MODEL, messages=[QUESTION], **REQUIRED)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name in SCHEMAS
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert first.usage.prompt_tokens == served.prompt_tokens([QUESTION], tools=TOOLS)

    assistant = choice.message.model_dump(exclude_none=True)
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 3}'}
    messages = [QUESTION, assistant, result]
    final = served.client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=8
    )
    assert final.choices[0].finish_reason in ("stop", "length")
    assert isinstance(final.choices[0].message.content, str) and final.choices[0].message.tool_calls is None
    assert final.usage.prompt_tokens == served.prompt_tokens(messages, tools=TOOLS)


def test_a_streamed_call_assembles_to_the_whole_call(served: Served) -> None:
    whole = served.client.chat.completions.create(model=MODEL, messages=[QUESTION], **REQUIRED).choices[0]
    stream = served.client.chat.completions.create(model=MODEL, messages=[QUESTION], stream=True, **REQUIRED)
    calls: dict[int, dict[str, str]] = {}
    content, finish, named_first = "", None, []
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for part in delta.tool_calls or []:
                entry = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                named_first.append(part.function.name is not None)
                entry["id"] += part.id or ""
                entry["name"] += part.function.name or ""
                entry["arguments"] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and content == ""
    assert named_first[0]  # the call's name comes first, then its arguments
    (call,) = whole.message.tool_calls
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [(call.function.name, call.function.arguments)]
    assert calls[0]["id"]


def test_a_named_function_is_the_one_called(served: Served) -> None:
    named = {**REQUIRED, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    choice = served.client.chat.completions.create(model=MODEL, messages=[QUESTION], **named).choices[0]
    assert [call.function.name for call in choice.message.tool_calls] == ["get_time"]
    assert json.loads(choice.message.tool_calls[0].function.arguments)["zone"] in ("UTC", "CET")


def test_a_call_cut_short_is_content_and_the_choice_says_why(served: Served) -> None:
    cut = {**REQUIRED, "max_tokens": 12}
    choice = served.client.chat.completions.create(model=MODEL, messages=[QUESTION], **cut).choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content
    assert "does not parse" in choice.model_extra["decoctl"]["tool_call_error"]


def test_auto_answers_and_reads_the_answer_for_calls(served: Served) -> None:
    answer = served.client.chat.completions.create(
        model=MODEL, messages=[QUESTION], tools=TOOLS, temperature=0, max_tokens=6
    )
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content is not None or choice.message.tool_calls


# -- refusals: a 400 naming the field -----------------------------------------------------------------------------
def refused(served: Served, body: dict[str, Any]) -> tuple[str, str]:
    status, answer = post(served, body)
    assert status == 400, answer
    return answer["error"]["param"], answer["error"]["message"]


def test_a_malformed_schema_is_a_400_naming_the_tools_parameters(served: Served) -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
    param, message = refused(served, {"messages": [QUESTION], "tools": [TOOLS[0], bad]})
    assert param == "tools.1.function.parameters" and "'f'" in message


def test_a_schema_llguidance_cannot_compile_is_a_400_naming_it(served: Served) -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minProperties": "x"}}}
    param, _ = refused(served, {"messages": [QUESTION], "tools": [bad]})
    assert param == "tools.0.function.parameters"


def test_an_unknown_named_function_is_a_400_naming_tool_choice(served: Served) -> None:
    choice = {"type": "function", "function": {"name": "send_mail"}}
    param, message = refused(served, {"messages": [QUESTION], "tools": TOOLS, "tool_choice": choice})
    assert param == "tool_choice" and "'send_mail'" in message


def test_tool_choice_without_tools_is_a_400(served: Served) -> None:
    param, _ = refused(served, {"messages": [QUESTION], "tool_choice": "required"})
    assert param == "tool_choice"


def test_a_tool_message_answering_no_call_is_a_400_naming_its_id(served: Served) -> None:
    result = {"role": "tool", "tool_call_id": "abcdefghi", "content": "3"}
    param, message = refused(served, {"messages": [QUESTION, result], "tools": TOOLS})
    assert param == "messages.1.tool_call_id" and "'abcdefghi'" in message


def test_call_arguments_that_are_not_json_are_a_400_naming_them(served: Served) -> None:
    call = {"id": "abcdefghi", "type": "function", "function": {"name": "get_time", "arguments": "zone=UTC"}}
    messages = [QUESTION, {"role": "assistant", "tool_calls": [call]}]
    param, _ = refused(served, {"messages": messages, "tools": TOOLS})
    assert param == "messages.1.tool_calls.0.function.arguments"


def test_a_function_name_openai_would_refuse_is_a_400(served: Served) -> None:
    bad = {"type": "function", "function": {"name": "no spaces allowed"}}
    param, _ = refused(served, {"messages": [QUESTION], "tools": [bad]})
    assert param == "tools.0.function.name"


@pytest.mark.parametrize(
    "choice",
    [
        {"controller": "speculative", "options": {"drafter": "prompt-lookup"}},
        {"controller": "lookahead"},
    ],
)
def test_a_drafting_controller_makes_greedys_call(served: Served, choice: dict[str, Any]) -> None:
    greedy = served.client.chat.completions.create(model=MODEL, messages=[QUESTION], **REQUIRED)
    drafted = served.client.chat.completions.create(
        model=MODEL, messages=[QUESTION], extra_body={"decoctl": choice}, **REQUIRED
    )
    (call,), (twin,) = greedy.choices[0].message.tool_calls, drafted.choices[0].message.tool_calls
    assert (twin.function.name, twin.function.arguments) == (call.function.name, call.function.arguments)
    assert drafted.usage.completion_tokens == greedy.usage.completion_tokens
    assert drafted.model_extra["decoctl"]["controller"] == choice["controller"]


def test_a_tool_parser_that_names_no_format_is_refused_at_start(served: Served) -> None:
    from decoctl.errors import ConfigError
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    engine = Engine({"target": load_model(served.folder, name=MODEL)}, registry=plugin_registry(), max_rows=1)
    with pytest.raises(ConfigError, match="--tool-parser 'pythonic' is not a tool-call format"):
        create_app(engine, model_name=MODEL, tool_parser="pythonic")


def test_auto_constrains_the_answer_once_the_model_starts_a_call(served: Served) -> None:
    from tokenizers import Tokenizer

    from decoctl.generation import TOOL_FORMATS

    fmt = TOOL_FORMATS[FAMILIES[served.name].tool_format]
    if not fmt.anywhere:
        pytest.skip(f"{fmt.name}'s trigger is text that opens the answer, not one token a bias can start")
    trigger = Tokenizer.from_file(str(served.folder / "tokenizer.json")).token_to_id(fmt.trigger)
    # the bias makes the model start a call at once; from there the lazy grammar holds it to a whole call
    answer = served.client.chat.completions.create(
        model=MODEL,
        messages=[QUESTION],
        tools=TOOLS,
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=160,
        logit_bias={str(trigger): 100},
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_stop_string_ends_an_answer_with_tools_where_it_ends_one_without(served: Served) -> None:
    ask = {"model": MODEL, "messages": [QUESTION], "tools": TOOLS, "temperature": 0, "max_tokens": 12}
    content = served.client.chat.completions.create(**ask).choices[0].message.content
    assert content is not None and len(content) >= 6  # the tiny model answers text here: no call to cut
    stop = content[4:6]
    expected = content[: content.index(stop)]
    stopped = served.client.chat.completions.create(stop=[stop], **ask).choices[0]
    assert stopped.message.content == expected and stopped.finish_reason == "stop"
    pieces = [
        choice.delta.content or ""
        for chunk in served.client.chat.completions.create(stop=[stop], stream=True, **ask)
        for choice in chunk.choices
    ]
    assert "".join(pieces) == expected


def test_none_neither_constrains_nor_reads_calls(served: Served) -> None:
    from tokenizers import Tokenizer

    from decoctl.generation import TOOL_FORMATS

    fmt = TOOL_FORMATS[FAMILIES[served.name].tool_format]
    if not fmt.anywhere:
        pytest.skip(f"{fmt.name}'s trigger is text that opens the answer, not one token a bias can start")
    trigger = Tokenizer.from_file(str(served.folder / "tokenizer.json")).token_to_id(fmt.trigger)
    answer = served.client.chat.completions.create(
        model=MODEL,
        messages=[QUESTION],
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=8,
        logit_bias={str(trigger): 100},
    )
    choice = answer.choices[0]
    # the bias writes the trigger over and over: nothing holds it to a call, and nothing reads it as one
    assert choice.message.tool_calls is None and choice.finish_reason == "length"
    assert answer.usage.completion_tokens == 8 and choice.model_extra.get("decoctl") is None
