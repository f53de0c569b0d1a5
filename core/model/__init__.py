"""The ONNX model runtime: folder layouts, sessions, KV caches, tokenizer. Knows nothing of the host.

Its public modules are this package (``load_model`` and what it gives), ``decoctl.model.graph`` (graph rewrites:
tree inputs, taps) and ``decoctl.model.eagle_graph`` (the EAGLE head writer); every other module is private.

The names below load on first use (PEP 562): importing one module of the runtime (the tree's, say) loads neither the
others nor onnxruntime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.model._capabilities import Capabilities
    from decoctl.model._loader import LoadedModel, default_threads, load_model
    from decoctl.model._runner import Runner, RunOutputs
    from decoctl.model._spec import ModelSpec, detect_layout
    from decoctl.model._tokenizer import IncrementalDetokenizer, Tokenizer
    from decoctl.model._tree import Tree

# public name -> the module that defines it
_EXPORTS = {
    "Capabilities": "decoctl.model._capabilities",
    **dict.fromkeys(("LoadedModel", "default_threads", "load_model"), "decoctl.model._loader"),
    **dict.fromkeys(("RunOutputs", "Runner"), "decoctl.model._runner"),
    **dict.fromkeys(("ModelSpec", "detect_layout"), "decoctl.model._spec"),
    **dict.fromkeys(("IncrementalDetokenizer", "Tokenizer"), "decoctl.model._tokenizer"),
    "Tree": "decoctl.model._tree",
}

__all__ = [
    "Capabilities",
    "IncrementalDetokenizer",
    "LoadedModel",
    "ModelSpec",
    "RunOutputs",
    "Runner",
    "Tokenizer",
    "Tree",
    "default_threads",
    "detect_layout",
    "load_model",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
