"""The server on the bundled demo model with its bundle's roles (a draft model and an EAGLE head): every drafting
controller a request names answers with greedy's text, side by side in one engine."""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from decoctl import Generator

from .conftest import openai, start_server

pytestmark = pytest.mark.demo
pytest.importorskip("decoctl_models")
pytest.importorskip("decoctl_eagle.plugin")

PROMPT = "def parse_header(line):\n    "
CONTROLLERS = [
    None,
    {"controller": "speculative"},  # pycode's draft model
    {"controller": "speculative", "options": {"drafter": "prompt-lookup"}},
    {"controller": "lookahead"},
    {"controller": "eagle"},  # pycode's EAGLE head
]


def test_drafting_controllers_on_the_demo_model_answer_with_greedys_text() -> None:
    from decoctl.plugins import PluginRegistry
    from decoctl.serve._app import create_app
    from decoctl.serve._command import load_roles
    from decoctl.serve._engine import Engine

    registry = PluginRegistry()  # the installed plugins, the demo bundle among them
    arguments = argparse.Namespace(model="pycode", draft=None, role=[], threads=1, no_huge_pages=True, provider=[])
    models = load_roles(arguments, registry)
    assert sorted(models) == ["draft", "eagle", "target"]
    engine = Engine(models, registry=registry, max_rows=4)
    url, thread, server = start_server(create_app(engine, model_name="pycode"))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def ask(extension: dict[str, Any] | None) -> str:
        extra = {"extra_body": {"decoctl": extension}} if extension else {}
        answer = client.completions.create(model="pycode", prompt=PROMPT, max_tokens=40, temperature=0, **extra)
        return str(answer.choices[0].text)

    try:
        with ThreadPoolExecutor(len(CONTROLLERS)) as pool:
            answers = list(pool.map(ask, CONTROLLERS))
    finally:
        server.should_exit = True
        thread.join()
    expected = Generator({"target": models["target"]}, "greedy", registry=registry).generate(PROMPT, max_new_tokens=40)
    assert answers == [expected.text] * len(CONTROLLERS)
