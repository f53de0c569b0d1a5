"""The ONNX model runtime: folder layouts, sessions, KV caches, tokenizer. Knows nothing of the host.

The names below load on first use (PEP 562): importing one module of the runtime (``decoctl.model.tree``) loads
neither the others nor onnxruntime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.model.capabilities import Capabilities
    from decoctl.model.loader import LoadedModel, default_threads, load_model
    from decoctl.model.runner import Runner, RunOutputs
    from decoctl.model.spec import ModelSpec, detect_layout
    from decoctl.model.tokenizer import IncrementalDetokenizer, Tokenizer

# public name -> the module that defines it
_EXPORTS = {
    "Capabilities": "decoctl.model.capabilities",
    **dict.fromkeys(("LoadedModel", "default_threads", "load_model"), "decoctl.model.loader"),
    **dict.fromkeys(("RunOutputs", "Runner"), "decoctl.model.runner"),
    **dict.fromkeys(("ModelSpec", "detect_layout"), "decoctl.model.spec"),
    **dict.fromkeys(("IncrementalDetokenizer", "Tokenizer"), "decoctl.model.tokenizer"),
}

__all__ = [
    "Capabilities",
    "IncrementalDetokenizer",
    "LoadedModel",
    "ModelSpec",
    "RunOutputs",
    "Runner",
    "Tokenizer",
    "default_threads",
    "detect_layout",
    "load_model",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
