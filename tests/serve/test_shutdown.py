"""Shutting the server down drains: a stream under way runs to its end before the engine stops."""

from __future__ import annotations

from pathlib import Path

from decoctl import load_model

from .conftest import API_KEY, MODEL, openai, plugin_registry, start_server


def test_shutdown_lets_a_stream_under_way_finish(tiny_model: Path) -> None:
    from decoctl.generation import ChatTemplate
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import Engine

    engine = Engine({"target": load_model(tiny_model, name=MODEL)}, registry=plugin_registry(), max_rows=2)
    app = create_app(engine, model_name=MODEL, chat_template=ChatTemplate.from_folder(tiny_model), api_key=API_KEY)
    url, thread, server = start_server(app)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    stream = client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=300, temperature=0, stream=True)
    chunks = iter(stream)
    first = next(chunks)
    server.should_exit = True  # as SIGTERM does: stop accepting, finish what is under way, then the lifespan's end
    rest = list(chunks)
    thread.join()
    assert rest[-1].choices[0].finish_reason == "length"
    assert sum(len(c.choices[0].text) for c in [first, *rest]) > 0
    assert not engine.running and engine.live_rows == 0
