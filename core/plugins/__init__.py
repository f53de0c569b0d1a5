"""Plugins: the registry and the resolution of what a user names.

``PluginRegistry`` loads plugin distributions through entry points (pluggy) and holds their controllers,
processors, models and commands; ``resolve_model``, ``resolve_controller`` and ``parse_processor_chain`` turn what a
user gives (a name, a path, a class, an object) into what the generation layer runs.

Private modules: ``_registry`` (the hook specifications and the registry), ``_resolve`` (names, paths and objects
to specs), ``_builtin`` (the host's own controllers, registered through the same door).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.plugins._registry import BUILTIN_PLUGIN, PluginRegistry, hookimpl
    from decoctl.plugins._resolve import (
        Processors,
        checked_controller,
        controller_spec_of,
        parse_processor_chain,
        resolve_controller,
        resolve_model,
    )

# public name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(("BUILTIN_PLUGIN", "PluginRegistry", "hookimpl"), "decoctl.plugins._registry"),
    **dict.fromkeys(
        (
            "Processors",
            "checked_controller",
            "controller_spec_of",
            "parse_processor_chain",
            "resolve_controller",
            "resolve_model",
        ),
        "decoctl.plugins._resolve",
    ),
}

__all__ = [
    "BUILTIN_PLUGIN",
    "PluginRegistry",
    "Processors",
    "checked_controller",
    "controller_spec_of",
    "hookimpl",
    "parse_processor_chain",
    "resolve_controller",
    "resolve_model",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
