"""LoRA adapters in the server: ``base:NAME`` model names in /v1/models and in requests, rows of different adapters
decoding in one batched Run, each answer equal to its offline twin (a one-row Generator with the same adapter)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import Generator, load_model
from decoctl.cli import main
from decoctl.model._adapters import with_adapters, write_adapter
from decoctl.testing import build_genai_model

from .conftest import API_KEY, Live, openai, plugin_registry, start_server

pytest.importorskip("onnx")
from test_adapters import with_lora_slots  # tests/ is on the path: the helper that adds LoRA slots

BASE = "base"
ADAPTERS = ("a1", "a2", "a3", "a4")
PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:", "x = [1, 2, 3]\ny = ["]


@pytest.fixture(scope="module")
def lora_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny base model with LoRA slots and four random adapters of ranks 2, 4, 4 and 8."""
    root = tmp_path_factory.mktemp("lora-serve")
    plain = build_genai_model(root / "plain", seed=3, max_length=1024, tree_inputs=True)
    slots = with_lora_slots(plain, root / BASE)
    files = {BASE: root / BASE}
    for seed, (name, rank) in enumerate(zip(ADAPTERS, (2, 4, 4, 8), strict=True), start=11):
        rng = np.random.default_rng(seed)
        parameters = {
            key: rng.normal(0, 0.3, (a, rank) if b == 4 else (rank, b)).astype(np.float32)
            for key, (a, b) in slots.items()
        }
        files[name] = write_adapter(root / f"{name}.onnx_adapter", parameters)
    return files


@pytest.fixture(scope="module")
def lora_live(lora_files: dict[str, Path]) -> Iterator[Live]:
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    registry = plugin_registry()
    model = with_adapters(
        load_model(lora_files[BASE], name=BASE, threads=1, lora_stacks=True), {n: lora_files[n] for n in ADAPTERS}
    )
    engine = Engine({"target": model}, registry=registry, max_rows=8, max_queue=256)
    app = create_app(engine, model_name=BASE, chat_template=None, api_key=API_KEY)
    url, thread, server = start_server(app)
    yield Live(url=url, folder=lora_files[BASE], registry=registry, engine=engine)
    server.should_exit = True
    thread.join()


@pytest.fixture
def lora_client(lora_live: Live) -> Any:
    return openai.OpenAI(base_url=f"{lora_live.url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def offline(lora_files: dict[str, Path], lora_live: Live) -> Generator:
    """The offline twin: one row, the same adapters."""
    adapters = {n: lora_files[n] for n in ADAPTERS}
    return Generator(
        {"target": str(lora_files[BASE])}, "greedy", threads=1, registry=lora_live.registry, adapters=adapters
    )


def _model(number: int) -> str:
    """Request ``number``'s model: the base model, then each adapter, by turns."""
    names = [BASE, *(f"{BASE}:{a}" for a in ADAPTERS)]
    return names[number % len(names)]


def _twin(offline: Generator, number: int, max_tokens: int) -> str:
    adapter = _model(number).partition(":")[2] or None
    return offline.generate(PROMPTS[number % len(PROMPTS)], adapter=adapter, max_new_tokens=max_tokens).text


def test_models_lists_the_base_model_and_each_adapter(lora_client: Any) -> None:
    listed = [entry.id for entry in lora_client.models.list().data]
    assert listed == [BASE, *(f"{BASE}:{a}" for a in ADAPTERS)]
    assert lora_client.models.retrieve(f"{BASE}:a3").id == f"{BASE}:a3"


def test_16_concurrent_requests_over_4_adapters_and_the_base_model_equal_their_offline_twins(
    lora_client: Any, lora_live: Live, offline: Generator
) -> None:
    count, max_tokens = 40, 12
    before = lora_live.engine.batched_runs  # type: ignore[attr-defined]

    def served(number: int) -> str:
        answer = lora_client.completions.create(
            model=_model(number), prompt=PROMPTS[number % len(PROMPTS)], max_tokens=max_tokens, temperature=0
        )
        return str(answer.choices[0].text)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(served, range(count)))
    expected = [_twin(offline, number, max_tokens) for number in range(count)]
    assert [n for n in range(count) if answers[n] != expected[n]] == []
    assert len(set(expected)) > 1  # the adapters change the answers
    assert lora_live.engine.batched_runs > before  # type: ignore[attr-defined]


def test_an_answer_names_the_model_its_request_named(lora_client: Any) -> None:
    answer = lora_client.completions.create(model=f"{BASE}:a2", prompt="x = 1", max_tokens=2, temperature=0)
    assert answer.model == f"{BASE}:a2"
    chunks = lora_client.completions.create(
        model=f"{BASE}:a3", prompt="x = 1", max_tokens=2, temperature=0, stream=True
    )
    assert {chunk.model for chunk in chunks} == {f"{BASE}:a3"}


def test_switching_adapters_between_requests_leaves_no_state_behind(lora_client: Any, offline: Generator) -> None:
    for number in (1, 0, 2, 1, 4, 0, 3):  # a1, base, a2, a1, a4, base, a3: one after another on the same rows
        answer = lora_client.completions.create(
            model=_model(number), prompt=PROMPTS[number % len(PROMPTS)], max_tokens=10, temperature=0
        )
        assert answer.choices[0].text == _twin(offline, number, 10)


def test_an_adapter_not_loaded_is_a_400_naming_those_loaded(lora_client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        lora_client.completions.create(model=f"{BASE}:a9", prompt="x", max_tokens=2)
    message = str(caught.value)
    assert "adapter 'a9' is not loaded here (loaded: ['a1', 'a2', 'a3', 'a4'])" in message
    with pytest.raises(openai.NotFoundError):
        lora_client.completions.create(model="other:a1", prompt="x", max_tokens=2)


def test_an_adapter_on_a_server_without_adapters_is_a_400(client: Any) -> None:
    with pytest.raises(openai.BadRequestError, match=r"adapter 'a1' is not loaded here \(loaded: none\)"):
        client.completions.create(model="tiny:a1", prompt="x", max_tokens=2)


def test_a_served_prefix_cache_keeps_each_adapters_blocks_apart(
    lora_files: dict[str, Path], offline: Generator
) -> None:
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    model = with_adapters(
        load_model(lora_files[BASE], name=BASE, threads=1, lora_stacks=True), {n: lora_files[n] for n in ADAPTERS}
    )
    engine = Engine({"target": model}, registry=plugin_registry(), max_rows=2, prefix_cache_mb=4)
    url, thread, server = start_server(create_app(engine, model_name=BASE, chat_template=None, api_key=API_KEY))
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
        prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
        for name in ("a1", "a2", None, "a1", "a2", None):
            model_name = BASE if name is None else f"{BASE}:{name}"
            answer = client.completions.create(model=model_name, prompt=prompt, max_tokens=8, temperature=0)
            assert answer.choices[0].text == offline.generate(prompt, adapter=name, max_new_tokens=8).text
        assert engine.prefix_cache is not None
        stats = engine.prefix_cache.stats()
        assert stats.hits == 3  # each name's second request only: no block crosses adapters
    finally:
        server.should_exit = True
        thread.join()


def test_bench_serve_spreads_requests_over_the_models_named(
    lora_live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from decoctl.serve import _bench

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n', encoding="utf-8")
    measured = _bench.measure
    sent: list[str] = []

    def measure(url: str, bodies: list[dict[str, Any]], concurrency: int, **kwargs: Any) -> Any:
        sent.extend(body["model"] for body in bodies)
        return measured(url, bodies, concurrency, **kwargs)

    monkeypatch.setattr(_bench, "measure", measure)
    arguments = ["bench-serve", "--url", f"lora={lora_live.url}", "--api-key", API_KEY, "--prompts", str(prompts)]
    arguments += ["--concurrency", "4", "--requests", "8", "--max-tokens", "4", "--models", "base:a1,base:a2,base"]
    assert main(arguments) == 0
    assert sent == ["base:a1", "base:a2", "base"] * 2 + ["base:a1", "base:a2"]


def test_serve_loads_each_adapter_flag_beside_the_target(lora_files: dict[str, Path]) -> None:
    from decoctl.cli import build_parser
    from decoctl.serve._command import load_roles

    flags = ["serve", "-m", str(lora_files[BASE]), "--threads", "1"]
    flags += [f"--adapter={name}={lora_files[name]}" for name in ("a2", "a1")]
    models = load_roles(build_parser().parse_args(flags), plugin_registry())
    assert models["target"].adapters.names == ("a2", "a1")
    plain = load_roles(build_parser().parse_args(flags[:5]), plugin_registry())
    assert plain["target"].adapters is None  # no adapter given: the graph as exported


def test_a_ray_replica_loads_the_adapters_it_is_given(lora_files: dict[str, Path]) -> None:
    from decoctl.ray._serve import REPLICA_ARGS, Replica, _checked

    adapters = {name: str(lora_files[name]) for name in ADAPTERS}
    given = {"model": str(lora_files[BASE]), "threads": "1", "max_rows": "2", "adapters": json.dumps(adapters)}
    replica = Replica(_checked(given, REPLICA_ARGS))
    assert replica.engine.models["target"].adapters.names == ADAPTERS
