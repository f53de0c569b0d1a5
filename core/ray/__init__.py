"""decoctl.ray: past one machine, on Ray (the ray extra: pip install 'decoctl[ray]').

``generate_dataset`` runs a Ray Data dataset's prompts on a pool of actors, each a Generator batching its rows
(``prompt_dataset`` makes one from a prompts file); ``application`` and ``build_app`` put the server's engine and app
as Ray Serve replicas behind one endpoint (``serve run decoctl.ray:build_app``).

Private modules: ``_batch`` (the actors), ``_serve`` (the replicas), ``_command`` (``decoctl generate --prompts FILE
--ray-actors N`` and ``decoctl serve --ray-replicas N``), ``_cluster`` (Ray imported only when asked for, a cluster
joined or started, its CPUs counted before anything loads), ``_runtime_env`` (the wheels of decoctl and of the
plugins in use, shipped to the workers through Ray's runtime environment).

Names load on first use (PEP 562), and none imports Ray until it runs: importing this package loads neither Ray nor
a model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from decoctl.ray._batch import generate_dataset, prompt_dataset
    from decoctl.ray._serve import application, build_app

_EXPORTS = {
    "generate_dataset": "decoctl.ray._batch",
    "prompt_dataset": "decoctl.ray._batch",
    "application": "decoctl.ray._serve",
    "build_app": "decoctl.ray._serve",
}

__all__ = ["application", "build_app", "generate_dataset", "prompt_dataset"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'decoctl.ray' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
