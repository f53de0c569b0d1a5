"""Slow clients hold a connection or a row for stated times only: a request head that trickles in is cut, a body
that trickles in is a 408, and a stream its client stops reading is cancelled and its row freed. The timeouts are
given small; each test waits on the server's doing (a closed socket, a response, the engine's counters), never on a
clock of its own."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from decoctl import load_model

from .conftest import API_KEY, MODEL, GatedPlugin, plugin_registry, wait_until
from .test_refusals import post


@pytest.fixture
def impatient(tiny_model: Path) -> Iterator[tuple[str, Any, GatedPlugin]]:
    """decoctl's Server over one row, with half-second timeouts for a head, a body and a stream's send; its
    listening socket's send buffer small, so that a stream nobody reads fills the buffers within a few kilobytes;
    the "gated" controller holds its 900th step."""
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine
    from decoctl.serve._server import Server

    gated = GatedPlugin(at=900)
    registry = plugin_registry()
    registry.register(gated, "gated")
    engine = Engine({"target": load_model(tiny_model, name=MODEL)}, registry=registry, max_rows=1)
    app = create_app(engine, model_name=MODEL, api_key=API_KEY, body_seconds=0.5, send_seconds=0.5)
    server = Server(app, engine, drain_seconds=5, head_seconds=0.5)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield f"127.0.0.1:{sock.getsockname()[1]}", engine, gated
    gated.gate.set()
    server.should_exit = True
    thread.join(60)


def connect(address: str, receive_buffer: int | None = None) -> socket.socket:
    host, port = address.split(":")
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    client.settimeout(60)  # a bound on a failing test only: the server acts within half a second
    client.connect((host, int(port)))
    return client


def head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: server\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_a_request_head_that_trickles_in_is_cut(impatient: tuple[str, Any]) -> None:
    address, _, _ = impatient
    with connect(address) as client:
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: server\r\n")  # and never the rest
        assert client.recv(1024) == b""  # the server closed the connection
    status, _, _ = post(f"http://{address}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
    assert status == 200


def test_a_thousand_idle_connections_leave_requests_answered_and_are_closed_at_the_head_timeout(
    impatient: tuple[str, Any, GatedPlugin],
) -> None:
    address, _, _ = impatient
    idle = [connect(address) for _ in range(1000)]  # connected, and never a byte sent
    try:
        status, answer, _ = post(f"http://{address}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert status == 200 and answer["usage"]["completion_tokens"] == 2
        assert all(client.recv(1024) == b"" for client in idle)  # each closed by the server, none answered
    finally:
        for client in idle:
            client.close()
    status, _, _ = post(f"http://{address}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
    assert status == 200


def test_a_body_that_trickles_in_is_a_408(impatient: tuple[str, Any]) -> None:
    address, _, _ = impatient
    with connect(address) as client:
        client.sendall(head("/v1/completions", 100) + b'{"model": ')  # 10 of its 100 bytes
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            piece = client.recv(4096)
            if not piece:
                break
            answer += piece
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"408"
    assert "took over 0.5 s to arrive" in json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["message"]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def uvicorn_errors() -> Iterator[_Records]:
    """The errors uvicorn logs while a test runs."""
    handler = _Records()
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_a_stream_nobody_reads_is_cancelled_and_frees_its_row(
    impatient: tuple[str, Any, GatedPlugin], uvicorn_errors: _Records
) -> None:
    address, engine, gated = impatient
    request = {"model": MODEL, "prompt": "x", "max_tokens": 1000, "stream": True, "decoctl": {"controller": "gated"}}
    body = json.dumps(request).encode()
    with capture_logs() as logs, connect(address, receive_buffer=4096) as client:
        client.sendall(head("/v1/completions", len(body)) + body)  # and never read a byte of the answer
        # its events fill the buffers within a few dozen steps; its 900th step waits for the gate, so that it cannot
        # finish: whichever comes first, the send's timeout or that step, only the cancellation frees its row
        wait_until(lambda: any(e["event"] == "decoctl.serve.client_stalled" for e in logs), "the send times out")
        if gated.reached.is_set():  # held at its 900th step: the stall, not an end, is what frees the row
            assert engine.live_rows == 1 and engine.cancelled == 0
        gated.gate.set()
        wait_until(lambda: engine.cancelled == 1, "the stalled stream is cancelled")
        wait_until(lambda: engine.live_rows == 0, "its row is free")
    # the one row serves the next request
    status, answer, _ = post(f"http://{address}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert status == 200 and answer["usage"]["completion_tokens"] == 2
    # the stalled stream's end is decoctl's warning only, not also uvicorn's error for an incomplete response
    assert [record.getMessage() for record in uvicorn_errors.records] == []
