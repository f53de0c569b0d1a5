"""Registers the bundled demo models through ``decoctl_models()``; "pycode" is every command's default.

Only folders that are present are registered: a bundle built without one of its models simply does not offer it
(and `decoctl generate` then says the default model is not installed).
"""

from __future__ import annotations

from pathlib import Path

from decoctl import ModelBundle, hookimpl

HERE = Path(__file__).parent

MODELS = {
    "pycode": (
        "the demo target: 6 layers, hidden 384, trained on the CPython stdlib",
        {"draft": "pycode-draft", "eagle": "pycode-eagle"},
    ),
    "pycode-small": ("a 4-layer, hidden-256 target for fast integration tests", {}),
    "pycode-draft": ("a 2-layer, hidden-128 draft distilled from pycode", {}),
    "pycode-eagle": ("an EAGLE-1 draft head trained on pycode's features (tools/train_eagle.py)", {}),
}


@hookimpl
def decoctl_models() -> list[ModelBundle]:
    return [
        ModelBundle(name=name, path=HERE / name, summary=summary, roles=roles)
        for name, (summary, roles) in MODELS.items()
        if (HERE / name / "genai_config.json").is_file()
    ]
