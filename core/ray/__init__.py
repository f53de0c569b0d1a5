"""decoctl.ray: past one machine, on Ray (the ray extra: pip install 'decoctl[ray]').

batch.py     generate_dataset: a Ray Data dataset's prompts on a pool of actors, each a Generator batching its rows
command.py   ``decoctl generate --prompts FILE --ray-actors N``
serve.py     ``decoctl serve --ray-replicas N``: the server's engine and app as Ray Serve replicas behind one endpoint;
             application() and build_app (for ``serve run decoctl.ray.serve:build_app``)
cluster.py   Ray imported only when asked for, a cluster joined or started, its CPUs counted before anything loads

Names load on first use (PEP 562), and none imports Ray until it runs: importing this package loads neither Ray nor
a model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from decoctl.ray.batch import generate_dataset, prompt_dataset
    from decoctl.ray.serve import application, build_app

_EXPORTS = {
    "generate_dataset": "decoctl.ray.batch",
    "prompt_dataset": "decoctl.ray.batch",
    "application": "decoctl.ray.serve",
    "build_app": "decoctl.ray.serve",
}

__all__ = ["application", "build_app", "generate_dataset", "prompt_dataset"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'decoctl.ray' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
