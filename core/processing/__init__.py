"""Logits processors: what shapes the target's logits before a token is chosen.

``LogitsProcessor`` is the protocol (``__call__(rows, context) -> rows``, optional ``clone()``), ``ProcessorChain``
runs several in order, ``bound_through`` tells a controller how far a chain's output can be trusted, and
``from_transformers`` runs a transformers LogitsProcessor unchanged inside a chain.

Private modules: ``_chain`` (the protocol and the chain), ``_transformers`` (the transformers adapter; torch is
imported there only), ``_native`` (the compiled one-pass argmax and runner-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.processing._chain import (
        LogitsProcessor,
        ProcessContext,
        ProcessorChain,
        bound_through,
        checked_processor,
        fuse,
        processor_name,
    )
    from decoctl.processing._native import top2
    from decoctl.processing._transformers import TransformersProcessor, from_transformers

# public name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(
        (
            "LogitsProcessor",
            "ProcessContext",
            "ProcessorChain",
            "bound_through",
            "checked_processor",
            "fuse",
            "processor_name",
        ),
        "decoctl.processing._chain",
    ),
    **dict.fromkeys(("TransformersProcessor", "from_transformers"), "decoctl.processing._transformers"),
    **dict.fromkeys(("top2",), "decoctl.processing._native"),
}

__all__ = [
    "LogitsProcessor",
    "ProcessContext",
    "ProcessorChain",
    "TransformersProcessor",
    "bound_through",
    "checked_processor",
    "from_transformers",
    "fuse",
    "processor_name",
    "top2",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
