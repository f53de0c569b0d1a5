"""decoctl serve through the official openai client: every answer is what decoctl's Generator gives offline."""

from __future__ import annotations

import json
from typing import Any

import pytest

from decoctl import Generator
from decoctl.generation import ChatPrompt

from .conftest import MODEL, Live, openai

CHAT = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fibonacci(n):"}]


def offline(live: Live, controller: str = "greedy", **kwargs: Any) -> Generator:
    return Generator({"target": str(live.folder)}, controller, registry=live.registry, **kwargs)


def test_models_lists_the_served_model(client: Any) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_a_greedy_completion_is_what_generate_gives(client: Any, live: Live) -> None:
    answer = client.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=24, temperature=0)
    expected = offline(live).generate("def fibonacci(n):", max_new_tokens=24)
    assert answer.choices[0].text == expected.text
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == len(expected.tokens)
    assert answer.usage.prompt_tokens == expected.stats.prompt_tokens


def test_a_greedy_chat_is_what_generator_chat_gives(client: Any, live: Live) -> None:
    answer = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=20, temperature=0)
    expected = offline(live).chat(CHAT, max_new_tokens=20)
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == expected.text
    assert answer.usage.prompt_tokens == expected.stats.prompt_tokens


def test_a_stream_joins_to_the_whole_answer_and_ends_with_the_usage(client: Any) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


def test_a_completion_stream_joins_to_the_whole_text(client: Any) -> None:
    whole = client.completions.create(model=MODEL, prompt="import os", max_tokens=12, temperature=0)
    pieces = client.completions.create(model=MODEL, prompt="import os", max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in pieces) == whole.choices[0].text


def test_n_seeded_samples_are_the_sample_controllers_n(client: Any, live: Live) -> None:
    answer = client.completions.create(
        model=MODEL, prompt="class Stack:", max_tokens=16, n=3, seed=11, temperature=0.8, top_p=0.95
    )
    chain = [{"name": "temperature", "temperature": 0.8}, {"name": "top_p", "top_p": 0.95}]
    expected = offline(live, "sample", options={"n": 3}, processors=chain).generate(
        "class Stack:", max_new_tokens=16, seed=11
    )
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert [c.text for c in answer.choices] == [c.text for c in expected.completions]


def test_the_same_seed_gives_the_same_text(client: Any) -> None:
    first, second = (
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, seed=5, temperature=1.2)
        for _ in range(2)
    )
    assert first.choices[0].message.content == second.choices[0].message.content


def test_stop_ends_the_text_before_the_stop_string(client: Any, live: Live) -> None:
    free = offline(live).generate("def fibonacci(n):", max_new_tokens=40).text
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    answer = client.completions.create(
        model=MODEL, prompt="def fibonacci(n):", max_tokens=40, temperature=0, stop=[stop]
    )
    expected = offline(live).generate("def fibonacci(n):", max_new_tokens=40, stop=[stop])
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].text == expected.text == free[: free.index(stop)]


def test_penalties_and_logit_bias_are_the_logits_chains(client: Any, live: Live) -> None:
    answer = client.completions.create(
        model=MODEL,
        prompt="for i in range(10):",
        max_tokens=20,
        temperature=0,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        logit_bias={"40": 5.0},
    )
    chain = [
        {"name": "logit_bias", "biases": '{"40": 5.0}'},
        {"name": "presence_penalty", "penalty": 1.5},
        {"name": "frequency_penalty", "penalty": 0.5},
    ]
    expected = offline(live, processors=chain).generate("for i in range(10):", max_new_tokens=20)
    assert answer.choices[0].text == expected.text


def test_a_json_schema_response_is_json_of_that_schema(client: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]}},
        "required": ["ok", "level"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "state", "schema": schema}},
    )
    value = json.loads(answer.choices[0].message.content)
    assert isinstance(value["ok"], bool) and value["level"] in ("low", "high") and set(value) == {"ok", "level"}
    assert answer.choices[0].finish_reason == "stop"


def test_a_drafting_controller_chosen_in_the_extension_gives_greedys_text(client: Any, live: Live) -> None:
    extension = {"controller": "speculative", "options": {"drafter": "prompt-lookup"}}
    prompt = "def f(x):\n    return x + 1\n\n\ndef f(x):\n"
    answer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=24, temperature=0, extra_body={"decoctl": extension}
    )
    assert answer.choices[0].text == offline(live).generate(prompt, max_new_tokens=24).text
    assert answer.model_extra["decoctl"]["controller"] == "speculative"


def test_completion_logprobs_name_each_token_and_its_alternatives(client: Any) -> None:
    answer = client.completions.create(model=MODEL, prompt="import os", max_tokens=6, temperature=0, logprobs=3)
    logprobs = answer.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 6
    # (tokens that decode to the same text, such as halves of one character, share a key of top_logprobs)
    for logprob, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert 1 <= len(top) <= 3 and logprob <= 0


def test_chat_logprobs_come_with_top_logprobs(client: Any) -> None:
    answer = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == 5 and all(len(entry.top_logprobs) == 2 for entry in content)
    for entry in content:  # greedy takes the most probable token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob


def test_a_list_of_prompts_gives_n_choices_each_in_prompt_order(client: Any, live: Live) -> None:
    prompts = ["import os", "class A:"]
    answer = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, n=2, temperature=0)
    greedy = offline(live)
    expected = [greedy.generate(p, max_new_tokens=6).text for p in prompts]
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    assert [c.text for c in answer.choices] == [expected[0], expected[0], expected[1], expected[1]]


def test_a_prompt_of_token_ids_is_taken_as_it_is(client: Any, live: Live) -> None:
    ids = [5, 40, 41, 42]
    answer = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert answer.usage.prompt_tokens == 4
    assert answer.choices[0].text == offline(live).generate(ChatPrompt("", ids), max_new_tokens=6).text
