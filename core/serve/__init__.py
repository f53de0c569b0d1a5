"""decoctl.serve: the OpenAI-compatible server (``decoctl serve``) and the engine under it.

``create_app`` builds the Starlette app over an ``Engine``: one thread owns the models, and every live completion is
a row of the target's KV buffer. A request is queued as an ``EngineRequest`` and read through its ``Handle`` as
``Delta`` events until ``Finished`` (or ``Failed``).

Private modules: ``_engine`` (the engine: its queue, thread and events; each step ``_scheduler`` plans, pure policy,
and ``_executor`` runs the plan on the models), ``_requests`` (a request, its checked plan, handle and events),
``_states`` (a request's states and their moves), ``_plans`` (requests checked into plans, their chains built once),
``_completion`` (one completion on its row), ``_app`` (the app: its routes and service endpoints), ``_edge``
(requests authorised, read and validated; ``Refusal``), ``_completions`` (the generating endpoints), ``_answers``
(events in OpenAI's shapes), ``_streams`` (server-sent events, streams their clients must keep reading),
``_protocol`` (OpenAI's request shapes, validated at the edge; its error shape), ``_translate`` (OpenAI's sampling
fields as a controller, options and a logits chain), ``_metrics`` (the Prometheus metrics, a registry of the app's
own), ``_join_rule`` (the engine's cost rule), ``_worker`` (the lifecycle the engine and the transcriber share),
``_command`` (``decoctl serve`` and ``decoctl chat``), ``_server``
(the uvicorn server: drain on SIGTERM, stop when the engine dies), ``_bench`` (``decoctl bench-serve``); ``page/``:
the chat page served at ``/``.

Names load on first use (PEP 562): importing this package loads neither Starlette nor the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.serve._app import create_app
    from decoctl.serve._engine import (
        Delta,
        Engine,
        EngineClosedError,
        EngineRequest,
        Failed,
        Finished,
        Handle,
        QueueFullError,
        TokenLogprob,
    )

# public name -> the module that defines it
_EXPORTS = {
    "create_app": "decoctl.serve._app",
    **dict.fromkeys(
        (
            "Delta",
            "Engine",
            "EngineClosedError",
            "EngineRequest",
            "Failed",
            "Finished",
            "Handle",
            "QueueFullError",
            "TokenLogprob",
        ),
        "decoctl.serve._engine",
    ),
}

__all__ = [
    "Delta",
    "Engine",
    "EngineClosedError",
    "EngineRequest",
    "Failed",
    "Finished",
    "Handle",
    "QueueFullError",
    "TokenLogprob",
    "create_app",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
