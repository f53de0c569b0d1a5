"""Shutting the server down drains: once shutdown begins new requests are a 503 and /health says "draining"; a
completion provably in flight (its controller holds its third step until the test lets it go) runs to its end
within the drain's time, or is cut with finish_reason "shutdown" once that time is up, and the engine logs how many
it cut."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from decoctl import load_model

from .conftest import API_KEY, MODEL, GatedPlugin, openai, plugin_registry, start_server, wait_until

GATED = {"decoctl": {"controller": "gated"}}


def gated_server(tiny_model: Path, drain_seconds: float) -> tuple[str, Any, Any, Any, GatedPlugin]:
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine
    from decoctl.serve._server import Server

    plugin = GatedPlugin()
    registry = plugin_registry()
    registry.register(plugin, "gated")
    engine = Engine({"target": load_model(tiny_model, name=MODEL)}, registry=registry, max_rows=2)
    app = create_app(engine, model_name=MODEL, api_key=API_KEY)
    url, thread, server = start_server(app, server=Server(app, engine, drain_seconds=drain_seconds))
    return url, thread, server, app, plugin


async def asgi(app: Any, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of one request made of the app itself, over ASGI (uvicorn has closed its listening
    socket once shutdown began)."""
    data = json.dumps(body).encode() if body is not None else b""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"authorization", f"Bearer {API_KEY}".encode())],
        "server": ("server", 80),
        "client": ("client", 1),
    }
    inbox = [{"type": "http.request", "body": data, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop() if inbox else await asyncio.Future()  # the client stays

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


async def _asked_while_draining(app: Any) -> tuple[tuple[int, Any], tuple[int, Any]]:
    health = await asgi(app, "GET", "/health")
    new = await asgi(app, "POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
    return health, new


def in_flight_at_shutdown(tiny_model: Path, drain_seconds: float, max_tokens: int) -> tuple[list[Any], Any, list[Any]]:
    """Start a gated stream, begin shutdown (as SIGTERM does) while it is held in its third step, check what a new
    request and /health get meanwhile, then let the stream go: (its chunks, its engine, the engine's log events)."""
    url, thread, server, app, plugin = gated_server(tiny_model, drain_seconds)
    engine = server.engine
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    with capture_logs() as logs:
        stream = client.completions.create(
            model=MODEL, prompt="def f(x):", max_tokens=max_tokens, temperature=0, stream=True, extra_body=GATED
        )
        chunks = iter(stream)
        first = next(chunks)
        assert plugin.reached.wait(60)  # the completion is in its third step: in flight
        server.should_exit = True  # what uvicorn's SIGTERM and SIGINT handler does
        wait_until(lambda: engine.draining, "the engine drains")
        health, new = asyncio.run(_asked_while_draining(app))
        assert health[0] == 503 and health[1]["status"] == "draining"
        assert new[0] == 503 and "shutting down" in new[1]["error"]["message"]
        assert engine.live_rows == 1
        plugin.gate.set()
        rest = list(chunks)
        thread.join(60)
    assert not thread.is_alive()
    assert not engine.running and engine.live_rows == 0
    return [first, *rest], engine, [e for e in logs if e["event"] == "decoctl.serve.drained"]


def test_a_completion_in_flight_at_shutdown_finishes_within_the_drain(tiny_model: Path) -> None:
    chunks, engine, drained = in_flight_at_shutdown(tiny_model, drain_seconds=60, max_tokens=8)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert engine.completions == 1 and engine.cancelled == 0
    assert [(e["cut"], e["refused"]) for e in drained] == [(0, 0)]


def test_a_completion_still_running_when_the_drain_ends_is_cut_and_counted(tiny_model: Path) -> None:
    # a drain of no time: the engine's first step after shutdown begins cuts what runs
    chunks, engine, drained = in_flight_at_shutdown(tiny_model, drain_seconds=0, max_tokens=500)
    assert chunks[-1].choices[0].finish_reason == "shutdown"
    # cut where it was: its three tokens, not its 500
    assert sum(c.model_extra["decoctl"].get("tokens", 0) for c in chunks[:-1]) == 3
    assert engine.cancelled == 1
    assert [(e["cut"], e["refused"], e["log_level"]) for e in drained] == [(1, 0, "warning")]


def test_decoctl_serve_exits_zero_once_sigterm_drained_it(tiny_model: Path) -> None:
    import re
    import signal
    import subprocess
    import sys

    from .test_refusals import post

    command = [sys.executable, "-c", "import sys; from decoctl.cli import main; sys.exit(main(sys.argv[1:]))"]
    command += ["serve", "-m", str(tiny_model), "--name", MODEL, "--port", "0", "--api-key", API_KEY]
    process = subprocess.Popen([*command, "--no-huge-pages"], stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        found = re.search(r"on http://127\.0\.0\.1:(\d+)", process.stderr.readline())
        assert found
        status, _, _ = post(f"http://127.0.0.1:{found.group(1)}/v1/completions", {"model": MODEL, "prompt": "x"})
        assert status == 200
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, rest  # not killed by the signal uvicorn would raise again after the drain
    assert "Traceback" not in rest
