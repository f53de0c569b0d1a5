"""A live decoctl server on 127.0.0.1 (a free port) over a tiny model, and the official openai client."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from decoctl import ControllerSpec, hookimpl, load_model
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_genai_model

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
logits_chain = pytest.importorskip("decoctl_logits_chain.plugin")
speculative = pytest.importorskip("decoctl_speculative.plugin")
lookahead = pytest.importorskip("decoctl_lookahead.plugin")

API_KEY = "test-key"
MODEL = "tiny"
#: a chat template in the ChatML style, BOS first
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@attrs.frozen
class Live:
    url: str
    folder: Path
    registry: PluginRegistry
    engine: object


def plugin_registry() -> PluginRegistry:
    """The built-ins, the logits chain (OpenAI's samplers, grammars), speculative and lookahead decoding: no
    autoload."""
    registry = PluginRegistry(autoload=False)
    registry.register(logits_chain, "logits-chain")
    registry.register(speculative, "speculative")
    registry.register(lookahead, "lookahead")
    return registry


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = build_genai_model(tmp_path_factory.mktemp("serve-model"), seed=3, max_length=1024, tree_inputs=True)
    (folder / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    return folder


def start_server(app: object, config: object | None = None, server: Any = None) -> tuple[str, threading.Thread, Any]:
    """Serve ``app`` with uvicorn in a thread on a socket bound here first, so clients may connect at once (the
    kernel queues them until the server accepts); ``server``: a uvicorn Server of one's own over it."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    if server is None:
        server = uvicorn.Server(config or uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{port}", thread, server


@pytest.fixture(scope="module")
def live(tiny_model: Path) -> Iterator[Live]:
    from decoctl.generation import ChatTemplate
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    registry = plugin_registry()
    engine = Engine({"target": load_model(tiny_model, name=MODEL)}, registry=registry, max_rows=4, max_queue=256)
    app = create_app(engine, model_name=MODEL, chat_template=ChatTemplate.from_folder(tiny_model), api_key=API_KEY)
    url, thread, server = start_server(app)
    yield Live(url=url, folder=tiny_model, registry=registry, engine=engine)
    server.should_exit = True
    thread.join()


@pytest.fixture
def client(live: Live) -> object:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=API_KEY, max_retries=0)


class Gated:
    """Greedy, one token a step on its own row, but its step ``at`` (the third) waits for ``gate`` (``reached`` set
    first): a completion provably in flight while a test shuts the server down or breaks its engine."""

    def __init__(self, gate: threading.Event, reached: threading.Event, at: int = 3) -> None:
        self.gate, self.reached, self.at, self.steps = gate, reached, at, 0

    def start(self, host: Any) -> None:
        pass

    def step(self, host: Any) -> None:
        self.steps += 1
        if self.steps == self.at:
            self.reached.set()
            assert self.gate.wait(120), "the test never opened the gate"
        token = int(host.argmax(host.target.logits()[-1:])[0])
        host.commit((token,))
        host.target.forward((token,))


class GatedPlugin:
    """The controller "gated" (Gated over this plugin's ``gate``, ``reached`` and ``at``)."""

    def __init__(self, at: int = 3) -> None:
        self.gate, self.reached, self.at = threading.Event(), threading.Event(), at

    @hookimpl
    def decoctl_controllers(self) -> list[ControllerSpec]:
        return [ControllerSpec(name="gated", summary="waits on its third step", factory=self._make)]

    def _make(self, options: Any) -> Gated:
        return Gated(self.gate, self.reached, self.at)


def wait_until(predicate: Any, what: str, seconds: float = 60.0) -> None:
    """Wait for a state another thread reaches (polled; the deadline is only a bound on a failing test)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)
