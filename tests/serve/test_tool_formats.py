"""Tool calls in each template family's format: rendered as transformers renders them (token ids equal), read out of
answers (whole and streamed alike), and constrained by a grammar whose every call parses and validates, token for
token the same under greedy, prompt lookup, a draft model and lookahead."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from decoctl import load_model
from decoctl.errors import ConfigError
from decoctl.generation import ChatTemplate, Generator
from decoctl.generation._tool_answers import CallArguments, CallName, CallStream, ToolCall, marked_text, parse_answer
from decoctl.generation._tool_formats import TOOL_FORMATS, template_messages, tool_format_for, tool_format_named
from decoctl.generation._tool_grammar import tool_grammar
from decoctl.testing import build_eagle_head

from .conftest import plugin_registry
from .tool_families import FAMILIES, TOOLS, conversation, model_folder

transformers = pytest.importorskip("transformers")
jsonschema = pytest.importorskip("jsonschema")

NAMES = {"get_weather", "get_time"}
TOOL_SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tool-families")
    return {name: model_folder(root / name, family, hidden_states=True) for name, family in FAMILIES.items()}


@pytest.fixture(scope="module")
def heads(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An EAGLE head per family's model (one that imitates the target's first layer: its drafts are often right)."""
    root = tmp_path_factory.mktemp("tool-heads")
    return {
        name: build_eagle_head(root / name, folder, copy_layer=0, feature_mix=0.1, tree_inputs=True)
        for name, folder in folders.items()
    }


@pytest.fixture(scope="module")
def models(folders: dict[str, Path]) -> dict[str, Any]:
    return {name: load_model(folder) for name, folder in folders.items()}


def transformers_ids(folder: Path, messages: list[dict[str, Any]], **variables: Any) -> list[int]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **variables
    )
    return [int(i) for i in ids]


# -- rendering ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_tool_round_renders_to_transformers_token_ids(name: str, folders: dict[str, Path]) -> None:
    messages = template_messages(conversation(FAMILIES[name]))
    ours = ChatTemplate.from_folder(folders[name]).encode(messages, tools=TOOLS)
    assert ours == transformers_ids(folders[name], messages, tools=TOOLS)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_question_with_tools_renders_to_transformers_token_ids(name: str, folders: dict[str, Path]) -> None:
    ours = ChatTemplate.from_folder(folders[name]).encode(QUESTION, tools=TOOLS)
    assert ours == transformers_ids(folders[name], QUESTION, tools=TOOLS)
    assert ours != ChatTemplate.from_folder(folders[name]).encode(QUESTION)  # the tools are in the prompt


@pytest.mark.parametrize("variables", [{}, {"enable_thinking": False}])
def test_qwen3_reasoning_and_its_thinking_switch_render_to_transformers_token_ids(
    variables: dict[str, Any], folders: dict[str, Path]
) -> None:
    messages = [
        *template_messages(conversation(FAMILIES["qwen3"])),
        {"role": "assistant", "content": "<think>\nIt is cold there.\n</think>\n\nIt is 3 degrees in Oslo."},
        {"role": "user", "content": "And in Lima?"},
    ]
    ours = ChatTemplate.from_folder(folders["qwen3"]).encode(messages, tools=TOOLS, **variables)
    assert ours == transformers_ids(folders["qwen3"], messages, tools=TOOLS, **variables)


def test_call_arguments_given_as_json_text_reach_the_template_as_objects() -> None:
    messages = template_messages(conversation(FAMILIES["qwen2.5"]))
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo", "unit": "celsius"}


def test_arguments_that_are_not_a_json_object_are_refused_naming_the_message() -> None:
    messages = conversation(FAMILIES["qwen2.5"])
    messages[1]["tool_calls"][0]["function"]["arguments"] = "[1, 2]"
    with pytest.raises(ConfigError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"):
        template_messages(messages)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_format_is_found_from_the_template(name: str) -> None:
    assert tool_format_for(FAMILIES[name].template).name == FAMILIES[name].tool_format


def test_a_template_without_tools_is_refused_saying_the_model_would_not_see_them() -> None:
    with pytest.raises(ConfigError, match="never uses the variable 'tools'"):
        tool_format_for("{% for m in messages %}{{ m.content }}{% endfor %}")


def test_a_template_of_no_known_format_asks_for_tool_parser() -> None:
    with pytest.raises(ConfigError, match="--tool-parser"):
        tool_format_for("{{ tools | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}")


def test_a_named_format_still_needs_a_template_that_renders_the_tools() -> None:
    with pytest.raises(ConfigError, match="never uses the variable 'tools'"):
        tool_format_for("{% for m in messages %}{{ m.content }}{% endfor %}", "hermes")
    assert tool_format_for("{{ tools | tojson }}", "hermes").name == "hermes"


def test_tool_parser_names_a_format_or_is_refused_listing_them() -> None:
    assert tool_format_named("llama3-json").name == "llama3_json"
    with pytest.raises(ConfigError, match="hermes, mistral, granite, llama3_json"):
        tool_format_named("pythonic")


# -- reading answers ----------------------------------------------------------------------------------------------
ANSWERS = {
    "hermes": (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    ),
    "mistral": (
        'Let me look.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}, '
        '{"name": "get_time", "arguments": {"zone": "CET"}}]'
    ),
    "granite": (
        'Let me look.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}, '
        '{"name": "get_time", "arguments": {"zone": "CET"}}]'
    ),
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}',
}


@pytest.mark.parametrize("fmt", sorted(ANSWERS))
def test_an_answer_is_read_into_calls_and_the_text_before_them(fmt: str) -> None:
    answer = parse_answer(TOOL_FORMATS[fmt], ANSWERS[fmt], names=NAMES, new_id=lambda: "id")
    weather = ToolCall(id="id", name="get_weather", arguments='{"city": "Oslo", "unit": "celsius"}')
    expected = (
        (weather,)
        if fmt == "llama3_json"
        else (weather, ToolCall(id="id", name="get_time", arguments='{"zone": "CET"}'))
    )
    assert answer.calls == expected
    assert answer.content == (None if fmt == "llama3_json" else "Let me look.")
    assert answer.error is None


@pytest.mark.parametrize("fmt", sorted(ANSWERS))
def test_an_answer_without_a_call_is_content(fmt: str) -> None:
    assert parse_answer(TOOL_FORMATS[fmt], "It is 3 degrees.", names=NAMES) == parse_answer(
        TOOL_FORMATS[fmt], "It is 3 degrees."
    )
    assert parse_answer(TOOL_FORMATS[fmt], "It is 3 degrees.").content == "It is 3 degrees."


@pytest.mark.parametrize("fmt", sorted(ANSWERS))
def test_a_call_that_does_not_parse_is_content_and_says_why(fmt: str) -> None:
    broken = ANSWERS[fmt][: len(ANSWERS[fmt]) - 20]
    answer = parse_answer(TOOL_FORMATS[fmt], broken, names=NAMES)
    assert answer.calls == () and answer.content == broken
    assert answer.error is not None and "does not parse" in answer.error


def test_a_call_of_a_function_not_among_the_tools_is_content_and_says_so() -> None:
    answer = parse_answer(TOOL_FORMATS["llama3_json"], ANSWERS["llama3_json"], names={"get_time"})
    assert answer.calls == () and "'get_weather', which is not one of the request's tools" in str(answer.error)


def test_mistral_call_ids_are_nine_letters_and_digits_as_its_template_insists() -> None:
    (call, *_) = parse_answer(TOOL_FORMATS["mistral"], ANSWERS["mistral"]).calls
    assert len(call.id) == 9 and call.id.isalnum()
    (call, *_) = parse_answer(TOOL_FORMATS["hermes"], ANSWERS["hermes"]).calls
    assert call.id.startswith("call_")


FAMILY_OF = {family.tool_format: name for name, family in FAMILIES.items()}


def streamed(fmt: str, tokenizer: Any, tokens: list[int]) -> tuple[CallStream, list[Any], list[Any]]:
    """The pieces a CallStream gives token by token (``fed``) and at the end (``ended``)."""
    stream = CallStream(TOOL_FORMATS[fmt], tokenizer, names=NAMES, new_id=lambda: "id")
    fed: list[Any] = []
    for token in tokens:
        fed.extend(stream.feed([token]))
    return stream, fed, stream.finish()


def assembled(pieces: list[Any]) -> tuple[str, tuple[ToolCall, ...]]:
    """The content and the calls that streamed pieces join to."""
    calls: dict[int, ToolCall] = {}
    for piece in pieces:
        if isinstance(piece, CallName):
            calls[piece.index] = ToolCall(id=piece.id, name=piece.name, arguments="")
        elif isinstance(piece, CallArguments):
            call = calls[piece.index]
            calls[piece.index] = attrs.evolve(call, arguments=call.arguments + piece.text)
    return "".join(p for p in pieces if isinstance(p, str)), tuple(calls.values())


@pytest.mark.parametrize("fmt", sorted(ANSWERS))
@pytest.mark.parametrize("cut", [0, 6, 20])
def test_a_streamed_answer_gives_what_the_whole_answer_gives(fmt: str, cut: int, models: dict[str, Any]) -> None:
    tokenizer = models[FAMILY_OF[fmt]].tokenizer
    text = ANSWERS[fmt] if not cut else ANSWERS[fmt][:-cut]
    tokens = _tokens(tokenizer, text, TOOL_FORMATS[fmt])
    assert marked_text(tokenizer, tokens, TOOL_FORMATS[fmt]) == text
    stream, fed, ended = streamed(fmt, tokenizer, tokens)
    whole = parse_answer(TOOL_FORMATS[fmt], text, names=NAMES, new_id=lambda: "id")
    content, calls = assembled(fed + ended)
    assert stream.error == whole.error
    if whole.error is None:
        assert (content or None) == whole.content and calls == whole.calls
        assert stream.called
    else:  # a call cut short: what went out of it stays out, the rest of the text too when none did
        assert not stream.called
        if not calls:
            assert content == whole.content


@pytest.mark.parametrize("fmt", sorted(ANSWERS))
def test_a_streamed_call_gives_its_name_then_its_arguments_as_they_are_written(
    fmt: str, models: dict[str, Any]
) -> None:
    tokenizer = models[FAMILY_OF[fmt]].tokenizer
    _, fed, ended = streamed(fmt, tokenizer, _tokens(tokenizer, ANSWERS[fmt], TOOL_FORMATS[fmt]))
    first = [p for p in fed if isinstance(p, CallName | CallArguments) and p.index == 0]
    assert isinstance(first[0], CallName) and first[0].name == "get_weather"
    assert sum(isinstance(p, CallArguments) for p in first) >= 3  # token by token, before the answer ended
    assert not any(isinstance(p, CallName) for p in ended)


def test_arguments_are_the_text_the_model_wrote() -> None:
    text = '<tool_call>\n{"name": "get_time", "arguments": {"zone":"CET" , "n": 1.50}}\n</tool_call>'
    (call,) = parse_answer(TOOL_FORMATS["hermes"], text).calls
    assert call.arguments == '{"zone":"CET" , "n": 1.50}'
    quoted = '<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}\n</tool_call>'
    (call,) = parse_answer(TOOL_FORMATS["hermes"], quoted).calls
    assert call.arguments == '{"zone": "CET"}'


def test_a_stream_holds_back_only_what_could_start_a_call(models: dict[str, Any]) -> None:
    tokenizer = models["qwen2.5"].tokenizer
    stream = CallStream(TOOL_FORMATS["hermes"], tokenizer, names=NAMES)
    assert stream.feed(tokenizer.encode("Hello <tool")) == ["Hello"]  # the space waits for what follows it
    assert stream.feed(tokenizer.encode("box>")) == [" <toolbox>"]


def _tokens(tokenizer: Any, text: str, fmt: Any) -> list[int]:
    """``text`` tokenized with each marker as its one token."""
    tokens: list[int] = []
    pattern = "|".join(map(re.escape, fmt.markers))
    for piece in re.split(f"({pattern})", text):
        if piece in fmt.markers and tokenizer.token_to_id(piece) is not None:
            tokens.append(tokenizer.token_to_id(piece))
        elif piece:
            tokens.extend(tokenizer.encode(piece))
    return tokens


# -- constrained calls --------------------------------------------------------------------------------------------
CONTROLLERS = [
    ("greedy", {}),
    ("speculative", {"drafter": "prompt-lookup"}),
    ("speculative", {"drafter": "draft-model"}),
    ("lookahead", {}),
    ("eagle", {"drafting": "chain"}),
    ("eagle", {"drafting": "tree", "depth": 3, "topk": 2, "nodes": 6}),
]


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("choice", ["required", "get_time", "auto"])
def test_a_constrained_answer_is_greedys_own_under_every_drafting_controller(
    name: str, choice: str, folders: dict[str, Path], models: dict[str, Any], heads: dict[str, Path]
) -> None:
    registry = plugin_registry()
    registry.register(pytest.importorskip("decoctl_eagle.plugin"), "eagle")
    model = models[name]
    fmt = tool_format_for(FAMILIES[name].template)
    lark = tool_grammar(fmt, TOOLS, choice=choice, parallel=False, token_id=model.tokenizer.token_to_id)
    prompt = ChatTemplate.from_folder(folders[name]).prompt(QUESTION, tools=TOOLS)
    answers = []
    for controller, options in CONTROLLERS:
        roles = {"target": model}
        if options.get("drafter") == "draft-model":
            roles["draft"] = model  # the target's own weights: its drafts are accepted until the grammar forbids one
        if controller == "eagle":
            roles["eagle"] = heads[name]
        generator = Generator(
            roles, controller, options=options, processors=[{"name": "grammar", "lark": lark}], registry=registry
        )
        result = generator.generate(prompt, max_new_tokens=96)
        answers.append(result.tokens)
        if controller != "greedy":  # drafts were accepted: the grammar ran over drafted rows, not only the target's
            assert result.stats.tokens_per_target_forward > 1.0, (controller, options)
    assert all(tokens == answers[0] for tokens in answers[1:])
    if choice != "auto":
        answer = parse_answer(fmt, marked_text(model.tokenizer, answers[0], fmt), names=NAMES)
        assert answer.error is None and len(answer.calls) == 1
        assert choice == "required" or answer.calls[0].name == choice


SAMPLING = [
    ("sample", {}),
    ("speculative", {"drafter": "prompt-lookup", "sampling": True}),
    ("speculative", {"drafter": "draft-model", "sampling": True}),
    ("lookahead", {"sampling": True}),
    ("eagle", {"drafting": "chain", "sampling": True}),
    ("eagle", {"drafting": "tree", "sampling": True}),
]


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize(("controller", "options"), SAMPLING, ids=lambda value: str(value))
def test_a_sampled_required_answer_is_one_valid_call_under_every_controller(
    name: str,
    controller: str,
    options: dict[str, Any],
    folders: dict[str, Path],
    models: dict[str, Any],
    heads: dict[str, Path],
) -> None:
    registry = plugin_registry()
    registry.register(pytest.importorskip("decoctl_eagle.plugin"), "eagle")
    model = models[name]
    fmt = tool_format_for(FAMILIES[name].template)
    lark = tool_grammar(fmt, TOOLS, choice="required", parallel=False, token_id=model.tokenizer.token_to_id)
    roles = {"target": model}
    if options.get("drafter") == "draft-model":
        roles["draft"] = model
    if controller == "eagle":
        roles["eagle"] = heads[name]
    generator = Generator(
        roles, controller, options=options, processors=[{"name": "grammar", "lark": lark}], registry=registry
    )
    prompt = ChatTemplate.from_folder(folders[name]).prompt(QUESTION, tools=TOOLS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a row no verifier reaches is no NaN either
        for seed in range(3):
            result = generator.generate(prompt, max_new_tokens=96, seed=seed)
            answer = parse_answer(fmt, marked_text(model.tokenizer, result.tokens, fmt, result.text), names=NAMES)
            assert answer.error is None and len(answer.calls) == 1
            jsonschema.validate(json.loads(answer.calls[0].arguments), TOOL_SCHEMAS[answer.calls[0].name])


def test_auto_leaves_text_free_until_the_trigger_then_allows_only_calls(models: dict[str, Any]) -> None:
    import llguidance

    tokenizer = models["qwen2.5"].tokenizer
    fmt = TOOL_FORMATS["hermes"]
    lark = tool_grammar(fmt, TOOLS, choice="auto", parallel=True, token_id=tokenizer.token_to_id)
    llg_tokenizer = llguidance.LLTokenizer(tokenizer.to_json(), n_vocab=512, eos_token=[385])

    def accepts(text: str) -> bool:
        matcher = llguidance.LLMatcher(llg_tokenizer, llguidance.LLMatcher.grammar_from_lark(lark))
        tokens = _tokens(tokenizer, text, fmt)
        return matcher.validate_tokens(tokens) == len(tokens)

    assert accepts("Any text at all { ] ")
    assert accepts(ANSWERS["hermes"])
    assert not accepts('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"')
    assert not accepts('<tool_call>\n{"name": "send_mail"')


# -- every required call validates ---------------------------------------------------------------------------------
KEYS = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
LEAVES = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(
        lambda low, span: {"type": "integer", "minimum": low, "maximum": low + span},
        st.integers(-99, 99),
        st.integers(0, 500),
    ),
    st.builds(lambda low: {"type": "number", "minimum": low, "maximum": low + 10}, st.integers(-5, 5)),
    st.builds(lambda size: {"type": "string", "maxLength": size}, st.integers(0, 6)),
    st.lists(st.text(alphabet="xyz é", min_size=1, max_size=4), min_size=1, max_size=3, unique=True).map(
        lambda values: {"enum": values}
    ),
)


def objects(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def shape(properties: dict[str, Any], draw_required: list[bool]) -> dict[str, Any]:
        required = [key for key, flag in zip(properties, draw_required, strict=False) if flag]
        return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}

    return st.builds(
        shape, st.dictionaries(KEYS, children, max_size=3), st.lists(st.booleans(), min_size=3, max_size=3)
    )


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        objects(children),
        st.builds(lambda items, most: {"type": "array", "items": items, "maxItems": most}, children, st.integers(0, 2)),
    ),
    max_leaves=5,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(
    schemas=st.lists(objects(SCHEMAS), min_size=1, max_size=3),
    seed=st.integers(0, 2**31 - 1),
    family=st.sampled_from(sorted(FAMILIES)),
    parallel=st.booleans(),
)
def test_every_required_call_parses_and_validates_against_its_schema(
    schemas: list[dict[str, Any]],
    seed: int,
    family: str,
    parallel: bool,
    models: dict[str, Any],
    folders: dict[str, Path],
) -> None:
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": schema}}
        for i, schema in enumerate(schemas)
    ]
    model = models[family]
    fmt = tool_format_for(FAMILIES[family].template)
    lark = tool_grammar(fmt, tools, choice="required", parallel=parallel, token_id=model.tokenizer.token_to_id)
    # sampling at a high temperature wanders the grammar's paths; the prompt is short, the tools are in the grammar
    generator = Generator(
        {"target": model},
        "sample",
        processors=[{"name": "grammar", "lark": lark}, {"name": "temperature", "temperature": 1.5}],
        registry=plugin_registry(),
    )
    result = generator.generate(
        ChatTemplate.from_folder(folders[family]).prompt(QUESTION), max_new_tokens=200, seed=seed
    )
    assume(result.stats.stop_reason == "eos")  # a call cut off by max_new_tokens is not a whole call
    answer = parse_answer(
        fmt, marked_text(model.tokenizer, result.tokens, fmt), names={t["function"]["name"] for t in tools}
    )
    assert answer.error is None and answer.calls
    by_name = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    for call in answer.calls:
        jsonschema.validate(json.loads(call.arguments), by_name[call.name])


def test_generator_chat_renders_the_tools_and_reads_the_calls(folders: dict[str, Path], models: dict[str, Any]) -> None:
    from decoctl.generation import TOOL_FORMATS as PUBLIC_FORMATS
    from decoctl.generation import tool_grammar as public_grammar

    model = models["mistral-v0.3"]
    lark = public_grammar(
        PUBLIC_FORMATS["mistral"], TOOLS, choice="required", parallel=False, token_id=model.tokenizer.token_to_id
    )
    generator = Generator(
        {"target": model}, "greedy", processors=[{"name": "grammar", "lark": lark}], registry=plugin_registry()
    )
    result = generator.chat(QUESTION, tools=TOOLS, max_new_tokens=96)
    assert result.tool_call_error is None and len(result.tool_calls) == 1
    assert result.tool_calls[0].name in NAMES and len(result.tool_calls[0].id) == 9
    assert result.stats.prompt_tokens == len(transformers_ids(folders["mistral-v0.3"], QUESTION, tools=TOOLS))
    assert generator.chat(QUESTION, max_new_tokens=4).tool_calls == ()
