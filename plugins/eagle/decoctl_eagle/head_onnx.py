"""The EAGLE head writer under the names the plugin's training and checkpoint modules import: core's public
``decoctl.model.eagle_graph``, which writes every head (imported, trained, and decoctl.testing's random ones) and
whose module docstring describes both architectures' forwards and the folder it writes.
"""

from __future__ import annotations

from decoctl.model.eagle_graph import EAGLE1, EAGLE3, LAYER, HeadDims, write_head

__all__ = ["EAGLE1", "EAGLE3", "LAYER", "HeadDims", "write_head"]
