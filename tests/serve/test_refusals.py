"""Bad requests get a clear 4xx in OpenAI's error shape, never a traceback, and leave no row behind."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from decoctl import load_model

from .conftest import API_KEY, MODEL, Live, openai, plugin_registry, start_server


def post(url: str, body: bytes | dict[str, Any], key: str | None = API_KEY) -> tuple[int, dict[str, Any], Any]:
    """(status, JSON body, headers) of a POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers


def refused(live: Live, body: bytes | dict[str, Any], path: str = "/v1/completions", **kwargs: Any) -> tuple[int, str]:
    status, answer, _ = post(live.url + path, body, **kwargs)
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in error["message"]
    return status, error["message"]


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "def f(x):", "max_tokens": 4, **fields}


def test_malformed_json_is_a_400(live: Live) -> None:
    status, message = refused(live, b'{"model": "tiny", "prompt": ')
    assert status == 400 and "not valid JSON" in message


def test_a_body_that_is_not_an_object_is_a_400(live: Live) -> None:
    assert refused(live, b"[1, 2]")[0] == 400


def test_an_unknown_field_is_a_400_naming_it(live: Live) -> None:
    status, message = refused(live, completion(frequency=0.5))
    assert status == 400 and "'frequency'" in message


def test_an_unsupported_openai_field_is_a_400_naming_it_and_why(live: Live) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "functions": []}
    status, message = refused(live, body, "/v1/chat/completions")
    assert status == 400 and "'functions'" in message and "not supported: send tools" in message


def test_tools_with_a_template_that_never_renders_them_are_a_400_saying_so(live: Live) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    status, message = refused(live, body, "/v1/chat/completions")
    assert status == 400 and "never uses the variable 'tools'" in message


def test_an_unknown_field_inside_the_extension_is_a_400_naming_it(live: Live) -> None:
    status, message = refused(live, completion(decoctl={"controller": "greedy", "plugin": "x"}))
    assert status == 400 and "'decoctl.plugin'" in message


def test_an_invalid_value_is_a_400_naming_the_field(live: Live) -> None:
    status, message = refused(live, completion(temperature=3))
    assert status == 400 and "'temperature'" in message


def test_an_oversized_prompt_is_a_400_naming_both_lengths(live: Live) -> None:
    status, message = refused(live, completion(prompt=[5] * 2000))
    assert status == 400 and "2000 tokens" in message and "1024 positions" in message


def test_an_unknown_controller_is_a_400_listing_the_installed_ones(live: Live) -> None:
    status, message = refused(live, completion(decoctl={"controller": "turbo"}))
    assert status == 400 and "'turbo'" in message and "greedy" in message


@pytest.mark.parametrize("reference", ["controller.py:Mine", "os:system", "/tmp/libmine.so", "libmine.so:fast"])
def test_a_controller_path_or_library_is_a_400_and_loads_nothing(live: Live, reference: str) -> None:
    status, message = refused(live, completion(decoctl={"controller": reference}))
    assert status == 400 and "never a path or a library" in message


def test_an_unknown_processor_is_a_400(live: Live) -> None:
    status, message = refused(live, completion(decoctl={"processors": "warp_speed=9"}))
    assert status == 400 and "warp_speed" in message


def test_a_controller_needing_an_unloaded_role_is_a_400_naming_it(live: Live) -> None:
    status, message = refused(live, completion(decoctl={"controller": "speculative"}))
    assert status == 400 and "'draft'" in message and "--draft" in message


def test_a_wrong_api_key_is_a_401(live: Live) -> None:
    status, message = refused(live, completion(), key="wrong")
    assert status == 401 and "API key" in message
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{live.url}/v1", api_key="wrong", max_retries=0).models.list()


def test_a_missing_api_key_is_a_401(live: Live) -> None:
    assert refused(live, completion(), key=None)[0] == 401


def test_another_model_is_a_404(live: Live) -> None:
    status, message = refused(live, completion(model="gpt-4"))
    assert status == 404 and "'gpt-4'" in message


def test_a_chat_the_template_refuses_is_a_400(live: Live) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    assert refused(live, body, "/v1/chat/completions")[0] == 400


def test_an_unknown_route_is_a_404_in_openais_shape(live: Live) -> None:
    assert refused(live, completion(), "/v1/embeddings")[0] == 404


def test_health_and_metrics_answer(live: Live) -> None:
    with urllib.request.urlopen(live.url + "/health") as response:
        assert json.loads(response.read())["status"] == "ok"
    with urllib.request.urlopen(live.url + "/metrics") as response:
        text = response.read().decode()
    assert "decoctl_rows_live" in text and "decoctl_requests_total" in text


def test_a_client_leaving_mid_stream_frees_its_row(live: Live, client: Any) -> None:
    engine: Any = live.engine
    cancelled = engine.cancelled
    stream = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=1000, temperature=0, stream=True)
    next(iter(stream))  # the completion runs
    stream.close()
    # a request for every row is admitted only once the left completion's row is free
    answer = client.completions.create(model=MODEL, prompt="x", max_tokens=1, n=engine.max_rows, temperature=0)
    assert len(answer.choices) == engine.max_rows
    assert engine.cancelled == cancelled + 1
    assert engine.live_rows == 0


@pytest.fixture
def stalled(tiny_model: Path) -> Iterator[tuple[str, Any]]:
    """A server whose engine never starts (lifespan off), so its queue of one is full after one request."""
    import uvicorn

    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    engine = Engine({"target": load_model(tiny_model, name=MODEL)}, registry=plugin_registry(), max_rows=1, max_queue=1)
    app = create_app(engine, model_name=MODEL, api_key=API_KEY)
    url, thread, server = start_server(app, config=uvicorn.Config(app, lifespan="off", log_level="warning"))
    yield url, engine
    server.should_exit = True
    thread.join()


def test_a_full_queue_is_a_429_with_retry_after(stalled: tuple[str, Any]) -> None:
    from decoctl.serve._engine import EngineRequest

    url, engine = stalled
    engine.submit(EngineRequest(ids=(5, 6), max_new_tokens=1), lambda event: None)
    status, answer, headers = post(url + "/v1/completions", completion())
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert "--max-queue 1" in answer["error"]["message"]


def test_logprobs_from_a_drafting_controller_are_refused_by_name(live: Live) -> None:
    extension = {"controller": "speculative", "options": {"drafter": "prompt-lookup"}}
    status, message = refused(live, completion(logprobs=2, decoctl=extension))
    assert status == 400 and message.startswith("logprobs:") and "'speculative'" in message


def test_a_body_over_the_limit_is_a_413(live: Live) -> None:
    from decoctl.serve._edge import MAX_BODY_BYTES

    status, message = refused(live, completion(prompt="x" * (MAX_BODY_BYTES + 1)))
    assert status == 413 and "MiB" in message


def test_echo_is_refused_by_name(live: Live) -> None:
    status, message = refused(live, completion(echo=True))
    assert status == 400 and "'echo'" in message and "not supported" in message


def test_metric_labels_are_installed_controller_names_whatever_the_request_spells(live: Live) -> None:
    for spelling in ("greedy", "GREEDY", "Greedy", "gReEdY", "sample", "SAMPLE", "Sample"):
        options = {"temperature": 0.5} if spelling.lower() == "sample" else {}
        body = completion(seed=1, decoctl={"controller": spelling, "options": options})
        status, answer, _ = post(live.url + "/v1/completions", body)
        assert status == 200, answer
    with urllib.request.urlopen(live.url + "/metrics") as response:
        text = response.read().decode()
    labels = {
        line.split('controller="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith(("decoctl_prompt_tokens_total{", "decoctl_generated_tokens_total{"))
    }
    assert labels <= {"greedy", "sample"} and labels


@pytest.mark.parametrize("levels", [65, 100_000])
def test_json_nested_past_the_limit_is_a_400_naming_it(live: Live, levels: int) -> None:
    nested = "[" * levels + "]" * levels
    body = f'{{"model": "{MODEL}", "prompt": "x", "decoctl": {{"options": {{"deep": {nested}}}}}}}'.encode()
    status, message = refused(live, body)
    assert status == 400 and "more than 64 levels deep" in message


def test_a_logit_bias_past_the_limit_is_a_400_naming_it(live: Live) -> None:
    status, message = refused(live, completion(logit_bias={str(token): 1.0 for token in range(100_000)}))
    assert status == 400 and "logit_bias" in message and "1024" in message


def test_thousands_of_stop_strings_are_a_400_naming_the_limit(live: Live) -> None:
    status, message = refused(live, completion(stop=[f"s{n}" for n in range(5000)]))
    assert status == 400 and "stop" in message


def test_a_body_that_is_not_utf8_is_a_400(live: Live) -> None:
    status, message = refused(live, b'{"model": "tiny", "prompt": "\xff\xfe"}')
    assert status == 400 and "not valid JSON" in message


def test_a_grammar_in_processors_beside_response_format_is_a_400(live: Live) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "response_format": {"type": "json_object"},
        "decoctl": {"processors": "Grammar=[0-9]+"},
    }
    status, message = refused(live, body, "/v1/chat/completions")
    assert status == 400 and "one request takes one grammar" in message


def test_top_k_works_among_the_tokens_response_format_allows(live: Live) -> None:
    # the grammar goes first in the chain: top_k=1 keeps the best token the grammar allows, never none
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 6,
        "temperature": 0,
        "response_format": {"type": "json_object"},
        "decoctl": {"processors": "top_k=1"},
    }
    status, answer, _ = post(live.url + "/v1/chat/completions", body)
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"].startswith("{")
