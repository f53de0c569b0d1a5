"""`make demo`: generate with the bundled demo model, or, while none is bundled, with a model built here.

The demo models (plugins/models) are still in training (docs/MODELS.md). Until they are bundled, this builds a
small random-weight model in the onnxruntime-genai layout with decoctl.testing (so the command still shows the
whole path: loading, streaming, stats) and says so: its text is noise, not Python.
"""

from __future__ import annotations

import sys
from pathlib import Path

from decoctl.cli import main
from decoctl.plugins import PluginRegistry
from decoctl.resolve import DEFAULT_MODEL

STAND_IN = Path(__file__).resolve().parents[1] / "build" / "demo-model"


def run(prompt: str) -> int:
    if DEFAULT_MODEL in PluginRegistry().models():
        return main(["generate", prompt])
    if not (STAND_IN / "genai_config.json").is_file():
        from decoctl.testing import build_genai_model

        build_genai_model(STAND_IN, seed=0, num_layers=4, hidden=128, num_heads=4, max_length=512)
    sys.stderr.write(
        f"decoctl demo: the trained demo model {DEFAULT_MODEL!r} is not bundled yet (see docs/MODELS.md); "
        f"generating with a random-weight stand-in built at {STAND_IN}, so the text is noise\n"
    )
    return main(["generate", prompt, "--model", str(STAND_IN), "--max-new-tokens", "48"])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1] if len(sys.argv) > 1 else "def fibonacci(n):"))
