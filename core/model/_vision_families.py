"""The vision-language families decoctl runs, by the model type genai_config.json's ``model.type`` names: one table,
so that a type decoctl does not implement is refused by name at load rather than run as another family would."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from decoctl.errors import ModelLoadError

__all__ = ["VISION_FAMILIES", "vision_family"]

#: model type -> what decoctl does for it
VISION_FAMILIES: Mapping[str, str] = {
    "llava": "a vision graph over fixed-size pixel values, one image token per feature row",
    "qwen2_5_vl": "dynamic resolution: merged patches, window attention indices and M-RoPE positions from the host",
    "gemma3": (
        "fixed-size pixel values (pan-and-scan crops as more views), image marks expanded in the prompt text and an "
        "image's tokens attending to each other both ways"
    ),
}


def vision_family(config_path: Path) -> str:
    """The family of a vision-language folder: its genai_config.json's model.type, refused by name where decoctl
    does not run it."""
    try:
        named = json.loads(config_path.read_text(encoding="utf-8")).get("model", {}).get("type")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise ModelLoadError(f"{config_path} cannot be read for its model.type: {exc}") from exc
    if named not in VISION_FAMILIES:
        known = ", ".join(f"{name} ({what})" for name, what in VISION_FAMILIES.items())
        raise ModelLoadError(
            f"{config_path}: model.type {named!r} is a vision-language type decoctl does not run; it runs {known}. "
            "Its vision graph's inputs and its positions differ by family, so another type cannot be run as one of "
            "these: run it with onnxruntime-genai"
        )
    return str(named)
