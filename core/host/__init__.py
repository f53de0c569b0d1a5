"""The host: a controller's view of the loaded models.

``Host`` gives a controller the step primitives (forward, logits, hidden states, rewind, commit/append, EOS and
length queries) over one ``Sequence`` per role; ``Rows`` holds several rows of one role in one batched KV buffer
(beams, parallel samples, batched prompts); ``Output`` turns committed tokens into text and applies the
``StopRules``.

Private modules: ``_host`` (Host and Sequence), ``_rows`` (rows), ``_output`` (text and stop rules).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.host._host import (
        TREE_TRANSFORM_HINT,
        ForwardSizes,
        Host,
        Sequence,
        SequenceStats,
        debug_default,
        role_flag,
    )
    from decoctl.host._output import Output, StopRules
    from decoctl.host._rows import ONE_RUN_PER_ROW, Rows

# public name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(
        ("ForwardSizes", "Host", "Sequence", "SequenceStats", "TREE_TRANSFORM_HINT", "debug_default", "role_flag"),
        "decoctl.host._host",
    ),
    **dict.fromkeys(("ONE_RUN_PER_ROW", "Rows"), "decoctl.host._rows"),
    **dict.fromkeys(("Output", "StopRules"), "decoctl.host._output"),
}

__all__ = [
    "ONE_RUN_PER_ROW",
    "TREE_TRANSFORM_HINT",
    "ForwardSizes",
    "Host",
    "Output",
    "Rows",
    "Sequence",
    "SequenceStats",
    "StopRules",
    "debug_default",
    "role_flag",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
