"""Controllers: the protocol and the built-in ones.

``Controller`` is the protocol a decode loop implements (``step(host)``; ``start``, ``stats`` and the rest
optional); ``RowController`` steps one row per prompt for batched prompts. Built in: ``Greedy``, ``Sample`` and beam
search (``beam_spec``), registered like any plugin's controllers.

Private modules: ``_builtin`` (the protocol, greedy, sampling), ``_beam`` (beam search).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.controllers._beam import BeamSearch, beam_spec
    from decoctl.controllers._builtin import (
        Controller,
        Greedy,
        RowController,
        Sample,
        builtin_controllers,
        sample_from_logits,
        start_controller,
    )

# public name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(
        (
            "Controller",
            "Greedy",
            "RowController",
            "Sample",
            "builtin_controllers",
            "sample_from_logits",
            "start_controller",
        ),
        "decoctl.controllers._builtin",
    ),
    **dict.fromkeys(("BeamSearch", "beam_spec"), "decoctl.controllers._beam"),
}

__all__ = [
    "BeamSearch",
    "Controller",
    "Greedy",
    "RowController",
    "Sample",
    "beam_spec",
    "builtin_controllers",
    "sample_from_logits",
    "start_controller",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
