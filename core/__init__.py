"""decoctl: decode controllers for ONNX causal language models.

A small host runs the model and exposes step primitives; decoding strategies are plugins.

The names below are loaded on first use (PEP 562), so that importing a low layer (the model runtime) or a
plugin's hook module loads nothing above it, and ``import decoctl`` alone loads no onnxruntime.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.controllers import Controller, Greedy, Sample, sample_from_logits
    from decoctl.errors import (
        AbiError,
        CapabilityError,
        ConfigError,
        ControllerError,
        DecoctlError,
        GenerationError,
        GeneratorInUseError,
        ModelLoadError,
        PluginError,
        SequenceError,
    )
    from decoctl.generation import GenerationResult, GenerationStats, Generator, generate, stream
    from decoctl.host import Host, Sequence
    from decoctl.importers._registry import RegisteredModel, models_dir, register_role_default
    from decoctl.model._loader import load_model
    from decoctl.model.graph import tap_layers
    from decoctl.plugins import PluginRegistry, hookimpl, resolve_model
    from decoctl.processing import LogitsProcessor, ProcessContext, ProcessorChain, bound_through, from_transformers
    from decoctl.specs import CommandSpec, ControllerSpec, ModelBundle, Option, ProcessorSpec

try:
    #: the installed distribution's version (pyproject.toml is its one source)
    __version__ = importlib.metadata.version("decoctl")
except importlib.metadata.PackageNotFoundError:  # imported from a folder no installer put there
    __version__ = "0+unknown"

# public name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(("Controller", "Greedy", "Sample", "sample_from_logits"), "decoctl.controllers"),
    **dict.fromkeys(
        (
            "AbiError",
            "CapabilityError",
            "ConfigError",
            "ControllerError",
            "DecoctlError",
            "GenerationError",
            "GeneratorInUseError",
            "ModelLoadError",
            "PluginError",
            "SequenceError",
        ),
        "decoctl.errors",
    ),
    **dict.fromkeys(("GenerationResult", "GenerationStats", "Generator", "generate", "stream"), "decoctl.generation"),
    **dict.fromkeys(("Host", "Sequence"), "decoctl.host"),
    **dict.fromkeys(("RegisteredModel", "models_dir", "register_role_default"), "decoctl.importers._registry"),
    "load_model": "decoctl.model._loader",
    "tap_layers": "decoctl.model.graph",
    **dict.fromkeys(("PluginRegistry", "hookimpl"), "decoctl.plugins"),
    **dict.fromkeys(("LogitsProcessor", "ProcessContext", "ProcessorChain", "bound_through"), "decoctl.processing"),
    "resolve_model": "decoctl.plugins",
    **dict.fromkeys(("CommandSpec", "ControllerSpec", "ModelBundle", "Option", "ProcessorSpec"), "decoctl.specs"),
    "from_transformers": "decoctl.processing",
}

__all__ = [
    "AbiError",
    "CapabilityError",
    "CommandSpec",
    "ConfigError",
    "Controller",
    "ControllerError",
    "ControllerSpec",
    "DecoctlError",
    "GenerationError",
    "GenerationResult",
    "GenerationStats",
    "Generator",
    "GeneratorInUseError",
    "Greedy",
    "Host",
    "LogitsProcessor",
    "ModelBundle",
    "ModelLoadError",
    "Option",
    "PluginError",
    "PluginRegistry",
    "ProcessContext",
    "ProcessorChain",
    "ProcessorSpec",
    "RegisteredModel",
    "Sample",
    "Sequence",
    "SequenceError",
    "bound_through",
    "from_transformers",
    "generate",
    "hookimpl",
    "load_model",
    "models_dir",
    "register_role_default",
    "resolve_model",
    "sample_from_logits",
    "stream",
    "tap_layers",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
