"""Graph rewrites of onnxruntime-genai builder models, done on the graph's protobuf bytes (weights never decoded).

Public: ``enable_tree`` / ``disable_tree`` / ``has_tree_inputs`` (position_ids and attention_bias inputs for tree
verification, ``decoctl models enable-tree``), ``enable_taps`` / ``tap_layers`` / ``default_tap_layers`` (EAGLE-3's
taps of the residual stream, ``decoctl models enable-taps``) and ``plain_twin`` / ``cache_dir`` (a tree-enabled
model's twin without those inputs, for the bench's onnxruntime contenders). The modules behind them are private:
_protowire (just enough protobuf), _fed_lengths (the attention-mask subgraph replaced by fed lengths),
_window_bias (sliding windows moved into a bias), _transform, _taps and _plain_twin.

The names load on first use (PEP 562), as decoctl.model's do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.model.graph._plain_twin import cache_dir, plain_twin
    from decoctl.model.graph._taps import TAP_LAYERS_KEY, default_tap_layers, enable_taps, tap_layers
    from decoctl.model.graph._transform import GENAI_CONFIG, disable_tree, enable_tree, has_tree_inputs

_EXPORTS = {
    **dict.fromkeys(("cache_dir", "plain_twin"), "decoctl.model.graph._plain_twin"),
    **dict.fromkeys(("TAP_LAYERS_KEY", "default_tap_layers", "enable_taps", "tap_layers"), "decoctl.model.graph._taps"),
    **dict.fromkeys(
        ("GENAI_CONFIG", "disable_tree", "enable_tree", "has_tree_inputs"), "decoctl.model.graph._transform"
    ),
}

__all__ = [
    "GENAI_CONFIG",
    "TAP_LAYERS_KEY",
    "cache_dir",
    "default_tap_layers",
    "disable_tree",
    "enable_taps",
    "enable_tree",
    "has_tree_inputs",
    "plain_twin",
    "tap_layers",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
