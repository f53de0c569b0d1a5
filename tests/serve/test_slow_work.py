"""Slow work a client chooses never runs where everyone waits: a request's plan (its logits chain, a JSON schema's
grammar compiled) is made on a worker thread, never on the event loop or the engine thread."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from .conftest import MODEL, Live


def test_a_json_schema_is_compiled_on_a_worker_thread_never_the_event_loop(
    client: Any, live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    where: list[str] = []
    check = live.engine.check

    def recording(request: Any) -> Any:
        try:
            asyncio.get_running_loop()
            where.append("the event loop")
        except RuntimeError:
            where.append(threading.current_thread().name)
        return check(request)

    monkeypatch.setattr(live.engine, "check", recording)
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "a number"}],
        max_tokens=20,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "number", "schema": schema}},
    )
    assert set(json.loads(answer.choices[0].message.content)) == {"n"}
    assert len(where) == 1 and where[0] not in ("the event loop", "decoctl-engine")
