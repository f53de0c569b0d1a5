"""The deterministic engine under load: 64 concurrent requests (greedy, seeded sampling, prompt lookup with a fixed
draft length), prompts short and long beside decoding rows, each answer its offline twin's (decoctl generate's, with
the server's --prefill-chunk), on the demo model (float32) and on tiny int8 exports (MatMulNBits). Texts agree unless
a near-tie goes the other way, which the last bits rarely decide: so the greedy and sampled requests also ask for their
tokens' log-probabilities, which the engine computes from the row's logits, and each must equal, bitwise, the one
computed from the logits of the twin's own forwards (the prompt as generate feeds it, then one token a step)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from decoctl import Generator, load_model
from decoctl.host import Sequence
from decoctl.testing import build_genai_model, quantize_int8

from .conftest import API_KEY, openai, plugin_registry, start_server

REQUESTS = 64


@attrs.frozen
class Served:
    url: str
    name: str
    target: Any
    registry: Any
    #: the server's --prefill-chunk, which the twins take too
    chunk: int | None


CODE = (
    "def read_config(path):\n    with open(path) as handle:\n        return json.load(handle)\n\n\n"
    "class Cache:\n    def __init__(self, size):\n        self.size = size\n        self.items = {}\n\n"
    "    def get(self, key):\n        return self.items.get(key)\n"
)
PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
    CODE,
    CODE * 3 + "    def put(self, key, value):\n",
    "x = [1, 2, 3]\ny = [",
    CODE * 2 + "def main():\n",
]
LOOKUP = {"controller": "speculative", "options": {"drafter": "prompt-lookup", "k": 3, "adaptive": False}}


def request(number: int) -> dict[str, Any]:
    """Request ``number``: greedy, seeded sampling or prompt lookup by turns, prompts of 4 to 200 tokens."""
    prompt = PROMPTS[number % len(PROMPTS)]
    max_tokens = 6 + number % 11
    kind = ("greedy", "sample", "lookup")[number % 3]
    spec: dict[str, Any] = {"kind": kind, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if kind == "sample":
        spec |= {"temperature": 1.0, "seed": number}
    if kind == "lookup":
        spec["decoctl"] = LOOKUP
    else:
        spec["logprobs"] = 0
    return spec


def twins(target: Any, registry: Any, chunk: int | None) -> list[tuple[str, list[float] | None]]:
    """Every request's offline answer, one at a time (decoctl generate's, its prompt in chunks of ``chunk``), and
    where asked its tokens' log-probabilities under the logits of the twin's forwards."""
    greedy = Generator({"target": target}, "greedy", registry=registry, prefill_chunk=chunk)
    sample = Generator({"target": target}, "sample", registry=registry, prefill_chunk=chunk)
    lookup = Generator(
        {"target": target}, "speculative", options=LOOKUP["options"], registry=registry, prefill_chunk=chunk
    )
    answers = []
    for number in range(REQUESTS):
        spec = request(number)
        generator = {"greedy": greedy, "sample": sample, "lookup": lookup}[spec["kind"]]
        result = generator.generate(spec["prompt"], max_new_tokens=spec["max_tokens"], seed=spec.get("seed"))
        logprobs = None if "logprobs" not in spec else offline_logprobs(target, spec["prompt"], result.tokens, chunk)
        answers.append((result.text, logprobs))
    return answers


def offline_logprobs(target: Any, prompt: str, tokens: tuple[int, ...], chunk: int | None) -> list[float]:
    """Each token's log-probability as the engine computes it, from the logits that generate's forwards give: the
    prompt in chunks of ``chunk`` (None: whole), then one token a step."""
    from decoctl.serve._executor import _logprob

    sequence = Sequence("target", target, max_length=target.spec.max_length)
    ids = np.asarray(target.tokenizer.encode(prompt), np.int64)
    rows = [np.asarray(sequence.prefill(ids, chunk))[0].copy()]
    for token in tokens[:-1]:
        rows.append(np.asarray(sequence.forward((token,)))[0].copy())
    return [_logprob(row, token, 0).logprob for row, token in zip(rows, tokens, strict=True)]


def served(url: str, name: str) -> list[tuple[str, list[float] | None]]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)

    def ask(number: int) -> tuple[str, list[float] | None]:
        spec = request(number)
        spec.pop("kind")
        extension = spec.pop("decoctl", None)
        extra = {"extra_body": {"decoctl": extension}} if extension else {}
        choice = client.completions.create(model=name, **spec, **extra).choices[0]
        logprobs = None if choice.logprobs is None else list(choice.logprobs.token_logprobs)
        return str(choice.text), logprobs

    with ThreadPoolExecutor(REQUESTS) as pool:
        return list(pool.map(ask, range(REQUESTS)))


def _demo_folder() -> Path:
    decoctl_models = pytest.importorskip("decoctl_models")
    return Path(decoctl_models.__file__).parent / "pycode"


@pytest.fixture(scope="module")
def tiny_fp32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("fp32"), seed=3, max_length=1024, tree_inputs=True)


#: the models served, each with its --prefill-chunk: the demo model; tiny int8 exports whose batched step gives each
#: row its one-row step's logits (int8 activations, the builder's CPU default) and whose does not (float32
#: activations: rows then step alone); a tiny model with sliding windows in ring caches (Gemma 3's layout)
MODELS = [
    pytest.param(("demo", None), marks=pytest.mark.demo),
    ("int8", 16),
    ("int8-level0", None),
    ("ring", 24),
]


@pytest.fixture(scope="module", params=MODELS, ids=["demo", "int8-chunk16", "int8-level0", "ring-chunk24"])
def deterministic_server(request: pytest.FixtureRequest, tiny_fp32: Path) -> Iterator[Served]:
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    name, chunk = request.param
    if name == "demo":
        folder = _demo_folder()
    elif name == "ring":
        folder = build_genai_model(
            tiny_fp32.parent / name, seed=4, max_length=1024, local_window_size=32, ring_cache=True
        )
    else:
        level = 0 if name == "int8-level0" else 4
        folder = quantize_int8(tiny_fp32, tiny_fp32.parent / name, accuracy_level=level)
    registry = plugin_registry()
    target = load_model(folder, name=name, threads=1)
    engine = Engine(
        {"target": target},
        registry=registry,
        max_rows=16,
        max_queue=REQUESTS,
        prefill_chunk=chunk,
        deterministic=True,
    )
    assert engine.rows_alone == (name == "int8-level0")
    url, thread, server = start_server(create_app(engine, model_name=name, api_key=API_KEY))
    yield Served(url=url, name=name, target=target, registry=registry, chunk=chunk)
    server.should_exit = True
    thread.join()


def test_64_concurrent_requests_each_equal_their_offline_twin(deterministic_server: Served) -> None:
    live = deterministic_server
    answers = served(live.url, live.name)
    expected = twins(live.target, live.registry, live.chunk)
    assert [number for number in range(REQUESTS) if answers[number][0] != expected[number][0]] == []
    assert [number for number in range(REQUESTS) if answers[number][1] != expected[number][1]] == []


def test_a_model_whose_batched_step_differs_from_a_one_row_step_steps_its_rows_alone(tmp_path: Path) -> None:
    from decoctl.serve._engine import Engine

    tiny = build_genai_model(tmp_path / "fp32", seed=3, max_length=64)
    variant = load_model(quantize_int8(tiny, tmp_path / "level0", accuracy_level=0), threads=1)
    invariant = load_model(quantize_int8(tiny, tmp_path / "level4", accuracy_level=4), threads=1)
    assert Engine({"target": variant}, max_rows=4, deterministic=True, warm=False).rows_alone
    assert not Engine({"target": invariant}, max_rows=4, deterministic=True, warm=False).rows_alone
    assert not Engine({"target": variant}, max_rows=4, warm=False).rows_alone


def test_decoctl_serve_deterministic_answers_with_the_twins_logits(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path / "tiny", seed=3, max_length=256, tree_inputs=True)
    command = [sys.executable, "-m", "decoctl.cli", "serve", "-m", str(folder), "--name", "tiny", "--port", "0"]
    command += ["--max-rows", "2", "--threads", "1", "--deterministic", "--prefill-chunk", "4", "--no-huge-pages"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        found = re.search(r"on http://127\.0\.0\.1:(\d+)", process.stderr.readline())
        assert found
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{found.group(1)}/v1", api_key="unused", max_retries=0)
        choice = client.completions.create(
            model="tiny", prompt=PROMPTS[2], max_tokens=8, temperature=0, logprobs=0
        ).choices[0]
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    target = load_model(folder, threads=1)
    twin = Generator({"target": target}, "greedy", prefill_chunk=4).generate(PROMPTS[2], max_new_tokens=8)
    assert choice.text == twin.text
    assert choice.logprobs.token_logprobs == offline_logprobs(target, PROMPTS[2], twin.tokens, 4)


def test_a_requests_n_samples_equal_the_sample_controllers_n_offline(tiny_fp32: Path) -> None:
    # the samples' rows prefill one each, their prompts' last tokens in the prompts' own forwards
    from decoctl.serve._engine import Delta, Engine, EngineRequest, Finished

    registry = plugin_registry()
    target = load_model(tiny_fp32, threads=1)
    chain = [{"name": "temperature", "temperature": 1.0}]
    engine = Engine({"target": target}, registry=registry, max_rows=4, deterministic=True)
    texts: dict[int, str] = {}
    logprobs: dict[int, list[float]] = {index: [] for index in range(3)}
    finished = threading.Event()

    def on_event(event: object) -> None:
        if isinstance(event, Delta) and event.logprobs:
            logprobs[event.index] += [item.logprob for item in event.logprobs]
        if isinstance(event, Finished):
            texts[event.index] = event.text
            if len(texts) == 3:
                finished.set()

    engine.start()
    ids = target.tokenizer.encode(PROMPTS[0])
    engine.submit(
        EngineRequest(ids=ids, max_new_tokens=12, n=3, seed=7, controller="sample", processors=chain, logprobs=0),
        on_event,
    )
    assert finished.wait(60)
    engine.close()
    offline = Generator({"target": target}, "sample", options={"n": 3}, processors=chain, registry=registry)
    result = offline.generate(PROMPTS[0], max_new_tokens=12, seed=7)
    assert [texts[index] for index in range(3)] == [completion.text for completion in result.completions]
    expected = [offline_logprobs(target, PROMPTS[0], c.tokens, None) for c in result.completions]
    assert [logprobs[index] for index in range(3)] == expected
