"""Faults: a logits processor that raises mid-stream fails only its own request; the engine thread dying turns
/health red, answers every request it held with an error (a 503, or an error event in a stream), refuses new ones
and stops the server, and ``decoctl serve`` then exits non-zero. Every fault is injected (a processor that raises
on its third call, a controller held in its third step, a monkeypatched engine step), none is waited for by time."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import Generator, ProcessorSpec, hookimpl, load_model

from .conftest import API_KEY, MODEL, GatedPlugin, openai, plugin_registry, start_server, wait_until
from .test_refusals import post


class Failing:
    """A logits processor that passes the logits through and raises on its ``at``-th call (the third)."""

    stateless = True

    def __init__(self, at: int = 3) -> None:
        self.calls, self.at = 0, at

    def __call__(self, rows: np.ndarray, context: object) -> np.ndarray:
        self.calls += 1
        if self.calls == self.at:
            raise ZeroDivisionError("the processor's bug")
        return rows


class FailingPlugin:
    @hookimpl
    def decoctl_logits_processors(self) -> list[ProcessorSpec]:
        return [
            ProcessorSpec(name="failing", summary="raises on its third call", factory=lambda o: Failing()),
            ProcessorSpec(name="failing_late", summary="raises on its 20th call", factory=lambda o: Failing(20)),
        ]


@pytest.fixture
def served(tiny_model: Path) -> Iterator[tuple[str, Any, Any, GatedPlugin]]:
    """A server of two rows (decoctl's own Server) with the "gated" controller and the "failing" processor."""
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine
    from decoctl.serve._server import Server

    gated = GatedPlugin()
    registry = plugin_registry()
    registry.register(gated, "gated")
    registry.register(FailingPlugin(), "failing")
    engine = Engine({"target": load_model(tiny_model, name=MODEL)}, registry=registry, max_rows=2, max_queue=4)
    app = create_app(engine, model_name=MODEL, api_key=API_KEY)
    url, thread, server = start_server(app, server=Server(app, engine, drain_seconds=10))
    yield url, thread, server, gated
    gated.gate.set()
    server.should_exit = True
    thread.join(60)


def test_a_processor_raising_mid_stream_fails_only_its_request(served: tuple[str, Any, Any, GatedPlugin]) -> None:
    url, _, server, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    good = client.completions.create(model=MODEL, prompt="import os", max_tokens=40, temperature=0, stream=True)
    bad = client.completions.create(
        model=MODEL,
        prompt="import os",
        max_tokens=40,
        temperature=0,
        stream=True,
        extra_body={"decoctl": {"processors": "failing"}},
    )
    with pytest.raises(openai.APIError, match="ZeroDivisionError: the processor's bug"):
        list(bad)
    assert list(good)[-1].choices[0].finish_reason == "length"
    status, health, _ = get(url + "/health")
    assert status == 200 and health["status"] == "ok" and health["rows"] == 0
    assert server.engine.running


def test_a_failed_request_returns_the_text_it_generated_before_the_failure(
    served: tuple[str, Any, Any, GatedPlugin], tiny_model: Path
) -> None:
    url, _, _, _ = served
    body = {
        "model": MODEL,
        "prompt": "import os",
        "max_tokens": 40,
        "temperature": 0,
        "decoctl": {"processors": "failing_late"},
    }
    status, answer, _ = post(url + "/v1/completions", body)
    assert status == 500 and "ZeroDivisionError: the processor's bug" in answer["error"]["message"]
    (generated,) = answer["decoctl"]["generated"]
    offline = Generator({"target": str(tiny_model)}, "greedy").generate("import os", max_new_tokens=40).text
    assert generated and offline.startswith(generated)  # the tokens before the 20th processor call


def get(url: str) -> tuple[int, dict[str, Any], Any]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers


def test_the_engine_dying_fails_its_requests_turns_health_red_and_stops_the_server(
    served: tuple[str, Any, Any, GatedPlugin], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, thread, server, gated = served
    engine = server.engine
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    running = client.completions.create(
        model=MODEL,
        prompt="def f(x):",
        max_tokens=50,
        temperature=0,
        stream=True,
        n=2,
        extra_body={"decoctl": {"controller": "gated"}},
    )
    chunks = iter(running)
    next(chunks)
    assert gated.reached.wait(60)  # its rows (both) are taken, its controller held in its third step
    waiting: list[tuple[int, dict[str, Any], Any]] = []
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4}
    queued = threading.Thread(target=lambda: waiting.append(post(url + "/v1/completions", body)))
    queued.start()
    wait_until(lambda: engine.queued == 1, "the second request waits for a row")

    def broken(*args: Any) -> None:
        raise RuntimeError("the rows cannot be reset")

    # the next step fails outside any one completion, and so does the recovery: the loop itself breaks
    monkeypatch.setattr(engine, "_iteration", broken)
    monkeypatch.setattr(engine, "_fail_all", broken)
    gated.gate.set()
    with pytest.raises(openai.APIError, match="engine stopped"):
        list(chunks)
    queued.join(60)
    [(status, answer, _)] = waiting
    assert status == 503 and "the rows cannot be reset" in answer["error"]["message"]
    assert engine.failure is not None and "RuntimeError: the rows cannot be reset" in engine.failure
    thread.join(60)  # the server stopped by itself
    assert not thread.is_alive()


def test_the_engine_dying_turns_health_red_and_refuses_new_requests(tiny_model: Path) -> None:
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    engine = Engine({"target": load_model(tiny_model, name=MODEL)}, registry=plugin_registry(), max_rows=1)
    died = threading.Event()
    engine.on_failure(lambda reason: died.set())

    def broken() -> None:
        raise MemoryError("no memory for the step")

    engine._loop = broken  # type: ignore[method-assign]  # before the engine thread starts (at the app's start)
    app = create_app(engine, model_name=MODEL, api_key=API_KEY)
    url, thread, server = start_server(app)  # uvicorn's own Server: it keeps serving, so /health tells
    try:
        assert died.wait(60)
        status, answer, _ = post(url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4})
        assert status == 503 and "MemoryError: no memory for the step" in answer["error"]["message"]
        status, health, _ = get(url + "/health")
        assert status == 503 and health["status"] == "failed" and "no memory for the step" in health["error"]
    finally:
        server.should_exit = True
        thread.join(60)


BROKEN_SERVE = """
import sys
from decoctl.cli import main
from decoctl.serve._engine import Engine

def broken(self, *args):
    raise RuntimeError("the rows cannot be reset")

Engine._iteration = broken  # the first step fails, and so does the recovery: the engine thread dies
Engine._fail_all = broken
sys.exit(main(sys.argv[1:]))
"""


def test_decoctl_serve_exits_non_zero_when_its_engine_dies(tiny_model: Path) -> None:
    command = [sys.executable, "-c", BROKEN_SERVE, "serve", "-m", str(tiny_model), "--name", MODEL]
    command += ["--port", "0", "--max-rows", "1", "--api-key", API_KEY, "--no-huge-pages"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        banner = process.stderr.readline()
        found = re.search(r"on http://127\.0\.0\.1:(\d+)", banner)
        assert found, banner
        url = f"http://127.0.0.1:{found.group(1)}"
        status, answer, _ = post(url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4})
        assert status == 503 and "the rows cannot be reset" in answer["error"]["message"]
        _, rest = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1
    assert "engine stopped (RuntimeError: the rows cannot be reset)" in rest and "Traceback" not in rest
