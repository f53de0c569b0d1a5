"""The server's prefix cache (--prefix-cache-mb): requests that share a prompt prefix copy its KV at admission and
prefill the rest, chat turns reuse the conversation so far, /metrics counts it, and every answer equals its offline
twin's without the cache."""

from __future__ import annotations

import queue
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from decoctl import ConfigError, Generator, load_model
from decoctl.generation._prefix_cache import BLOCK_TOKENS
from decoctl.serve._engine import Engine, EngineRequest, Finished

from .conftest import API_KEY, MODEL, openai, plugin_registry, start_server

SYSTEM = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n" * 3
QUESTIONS = ("print(fib(10))", "x = fib(3)", "class A:\n    pass", "import os")


@pytest.fixture
def engine(tiny_model: Path) -> Iterator[Engine]:
    made = Engine(
        {"target": load_model(tiny_model, name=MODEL)}, registry=plugin_registry(), max_rows=4, prefix_cache_mb=8
    )
    yield made
    made.close(drain=False)


def _finished(events: queue.Queue[Any]) -> Finished:
    while True:
        event = events.get(timeout=120)
        if isinstance(event, Finished):
            return event


def _run(engine: Engine, prompts: list[str], **given: Any) -> list[Finished]:
    inbox = []
    for prompt in prompts:
        inbox.append(queue.Queue[Any]())
        ids = tuple(engine.models["target"].tokenizer.encode(prompt))
        engine.submit(EngineRequest(ids=ids, max_new_tokens=16, **given), inbox[-1].put)
    return [_finished(q) for q in inbox]


def test_requests_after_a_shared_prompt_copy_it_and_answer_as_offline(engine: Engine) -> None:
    engine.start()
    first = _run(engine, [SYSTEM + QUESTIONS[0]])  # its prompt is kept as it starts decoding
    rest = _run(engine, [SYSTEM + q for q in QUESTIONS[1:]])
    offline = Generator({"target": engine.models["target"]}, registry=engine.registry)
    assert [f.tokens for f in first + rest] == [
        offline.generate(SYSTEM + q, max_new_tokens=16).tokens for q in QUESTIONS
    ]
    assert engine.prefix_cache is not None
    stats = engine.prefix_cache.stats()
    assert stats.hits == 3 and stats.tokens_saved == 3 * 8 * BLOCK_TOKENS  # the system prompt's 8 whole blocks


def test_requests_that_arrive_together_with_one_prefix_answer_as_offline(engine: Engine) -> None:
    # all four are admitted in the engine's first step, before any of them wrote a block: none copies anything,
    # then the next four find the blocks the first four wrote (the same blocks, written once)
    prompts = [SYSTEM + q for q in QUESTIONS]
    engine.start()
    together = _run(engine, prompts)
    again = _run(engine, prompts, controller="speculative", options={"drafter": "prompt-lookup"})
    offline = Generator({"target": engine.models["target"]}, registry=engine.registry)
    expected = [offline.generate(p, max_new_tokens=16).tokens for p in prompts]
    assert [f.tokens for f in together] == expected and [f.tokens for f in again] == expected
    assert engine.prefix_cache is not None and engine.prefix_cache.stats().hits >= 4


def test_n_completions_and_beams_answer_as_offline_with_the_cache(engine: Engine) -> None:
    engine.start()
    _run(engine, [SYSTEM + QUESTIONS[0]])
    sampled = []
    events = queue.Queue[Any]()
    ids = tuple(engine.models["target"].tokenizer.encode(SYSTEM + QUESTIONS[1]))
    engine.submit(EngineRequest(ids=ids, max_new_tokens=12, n=2, seed=4, controller="sample"), events.put)
    sampled = sorted((_finished(events) for _ in range(2)), key=lambda f: f.index)
    offline = Generator({"target": engine.models["target"]}, "sample", options={"n": 2}, registry=engine.registry)
    expected = offline.generate(SYSTEM + QUESTIONS[1], max_new_tokens=12, seed=4)
    assert [f.tokens for f in sampled] == [c.tokens for c in expected.completions]
    assert engine.prefix_cache is not None and engine.prefix_cache.stats().hits >= 1


def test_a_budget_below_one_block_is_refused_when_the_engine_is_made(tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match="holds no block"):
        Engine({"target": load_model(tiny_model)}, registry=plugin_registry(), max_rows=2, prefix_cache_mb=0.0001)


def test_chat_turns_through_the_server_reuse_the_conversation_and_metrics_count_it(tiny_model: Path) -> None:
    from decoctl.generation import ChatTemplate
    from decoctl.serve._app import create_app

    engine = Engine(
        {"target": load_model(tiny_model, name=MODEL)}, registry=plugin_registry(), max_rows=2, prefix_cache_mb=8
    )
    app = create_app(engine, model_name=MODEL, chat_template=ChatTemplate.from_folder(tiny_model), api_key=API_KEY)
    url, thread, server = start_server(app)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
        offline = Generator({"target": engine.models["target"]}, registry=engine.registry)
        template = ChatTemplate.from_folder(tiny_model)
        messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        for turn in ("def fact(n):", "and fib?", "in one line"):
            messages.append({"role": "user", "content": turn})
            answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
            text = answer.choices[0].message.content or ""
            assert text == offline.generate(template.prompt(messages), max_new_tokens=12).text
            messages.append({"role": "assistant", "content": text})
        with urllib.request.urlopen(f"{url}/metrics") as response:
            metrics = response.read().decode()
    finally:
        server.should_exit = True
        thread.join()
    assert engine.prefix_cache is not None
    stats = engine.prefix_cache.stats()
    assert stats.hits == 2 and stats.tokens_saved >= 2 * 8 * BLOCK_TOKENS
    assert f"decoctl_prefix_cache_hits {float(stats.hits)}" in metrics
    assert f"decoctl_prefix_cache_tokens_saved {float(stats.tokens_saved)}" in metrics
    assert f"decoctl_prefix_cache_bytes {float(stats.bytes)}" in metrics and stats.bytes > 0


def test_a_deterministic_engine_refuses_the_prefix_cache(tiny_model: Path) -> None:
    with pytest.raises(ConfigError, match="use one of --deterministic and --prefix-cache-mb"):
        Engine(
            {"target": load_model(tiny_model)},
            registry=plugin_registry(),
            max_rows=2,
            deterministic=True,
            prefix_cache_mb=8,
        )


def test_decoctl_chat_with_the_cache_copies_the_history_and_answers_the_same(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    from decoctl.cli import main
    from decoctl.generation._prefix_cache import PrefixCache

    copied: list[int] = []
    restore = PrefixCache.restore

    def recorded(self: PrefixCache, *args: Any, **kwargs: Any) -> int:
        copied.append(restore(self, *args, **kwargs))
        return copied[-1]

    monkeypatch.setattr(PrefixCache, "restore", recorded)
    system = ["--system", SYSTEM]
    transcripts = []
    for flags in ([], ["--prefix-cache-mb", "8"]):
        monkeypatch.setattr("sys.stdin", io.StringIO("def f(x):\nand g?\nand h?\n/quit\n"))
        assert main(["chat", "-m", str(tiny_model), "-n", "8", "--no-huge-pages", *system, *flags]) == 0
        transcripts.append(capsys.readouterr().out.splitlines()[1:])
    assert transcripts[0] == transcripts[1]
    # the second and third turns copy the system prompt and the turns before them
    assert len(copied) == 3 and copied[0] == 0 and copied[2] > copied[1] >= 8 * BLOCK_TOKENS


@pytest.mark.parametrize("chunk", [None, 40])
def test_a_ring_cache_model_keeps_and_copies_the_prefix_its_rings_hold(tmp_path: Path, chunk: int | None) -> None:
    from decoctl.testing import build_genai_model

    # windowed layers of 32 positions in rings of 96 (the window and the rewind slack); the prompts run past them
    folder = build_genai_model(tmp_path / "ring", seed=4, max_length=512, local_window_size=32, ring_cache=True)
    engine = Engine(
        {"target": load_model(folder)}, registry=plugin_registry(), max_rows=2, prefix_cache_mb=8, prefill_chunk=chunk
    )
    engine.start()
    try:
        answers = [_run(engine, [SYSTEM + q])[0] for q in QUESTIONS]
        chunked = _run(engine, [SYSTEM + QUESTIONS[0]], controller="speculative", options={"drafter": "prompt-lookup"})
    finally:
        engine.close(drain=False)
    offline = Generator({"target": engine.models["target"]}, registry=engine.registry)
    expected = [offline.generate(SYSTEM + q, max_new_tokens=16).tokens for q in QUESTIONS]
    assert [a.tokens for a in answers] == expected and chunked[0].tokens == expected[0]
    assert engine.prefix_cache is not None
    stats = engine.prefix_cache.stats()
    assert stats.hits == 4 and stats.tokens_saved == 4 * 96  # every prompt after the first copies the rings' 96
