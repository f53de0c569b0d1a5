"""decoctl.serve: the OpenAI-compatible server (``decoctl serve``) and the engine under it.

engine.py     Engine: one thread owns the models; every live completion is a row of the target's KV buffer
protocol.py   OpenAI's request shapes, validated at the edge; its error shape
translate.py  OpenAI's sampling fields as a controller, options and a logits chain
app.py        the Starlette app: endpoints, server-sent events, API key, errors
metrics.py    the Prometheus metrics (a registry of the app's own)
command.py    ``decoctl serve`` and ``decoctl chat``
page/         the chat page served at ``/``

Names load on first use (PEP 562): importing this package loads neither Starlette nor the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from decoctl.serve.app import create_app
    from decoctl.serve.engine import Engine, EngineRequest

_EXPORTS = {
    "create_app": "decoctl.serve.app",
    "Engine": "decoctl.serve.engine",
    "EngineRequest": "decoctl.serve.engine",
}

__all__ = ["Engine", "EngineRequest", "create_app"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'decoctl.serve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
