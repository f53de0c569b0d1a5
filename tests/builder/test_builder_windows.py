"""onnxruntime-genai's builder exports of windowed models at small windows (8, 16, 32): Mistral, Gemma 2 and 3,
gpt-oss, Qwen2 (use_sliding_window) and Qwen3. Each export either gives transformers' greedy tokens past its window
and past its ring caches' evictions, or is refused at load by name with the fix; none runs silently wrong.

The window changes where the rings evict, the family which layers are windowed and how (rotary bases per kind,
sinks, q/k norms, experts). Each export is a builder run with torch (about 16 s of CPU), so by default the cases
cover every family and every window without every pair: Gemma 2 and gpt-oss at 16 are test_builder_windowed.py's,
and here each window runs on two families or more. DECOCTL_BUILDER_ALL_WINDOWS=1 runs every family at every
window (21 exports)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import builder_models
import numpy as np
import pytest
from builder_models import PROMPT, Export, greedy_continuation

from decoctl.cli import main
from decoctl.errors import ModelLoadError
from decoctl.host import Sequence
from decoctl.model import load_model

#: past every ring's capacity (window + a slack of 64 positions) after a prompt of 9 tokens, so through evictions
NEW_TOKENS = 128

BUILDERS: dict[str, Callable[[Path, int], Export]] = {
    "gemma2": builder_models.gemma2,
    "gemma3": builder_models.gemma3,
    "gpt_oss": builder_models.gpt_oss,
    "qwen2": builder_models.qwen2_windowed,
    "qwen3": builder_models.qwen3,
    "mistral+layer_types": lambda root, window: builder_models.mistral(root, window, layer_types=True),
}
WINDOWS = (8, 16, 32)
EVERY_PAIR = os.environ.get("DECOCTL_BUILDER_ALL_WINDOWS") == "1"
MATCHING = (
    [(family, window) for family in BUILDERS for window in WINDOWS]
    if EVERY_PAIR
    else [("gemma2", 8), ("gemma3", 32), ("qwen2", 8), ("qwen2", 32), ("qwen3", 16), ("mistral+layer_types", 8)]
)
#: Mistral's default export at the windows the session fixture (16) leaves
REFUSED = [8, 32] if EVERY_PAIR else [32]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Export:
    """The builder's default Mistral export (window 16): genai_config.json declares the window, no node applies it."""
    return builder_models.mistral(tmp_path_factory.mktemp("builder-mistral"))


@pytest.mark.parametrize(("family", "window"), MATCHING, ids=[f"{f}-{w}" for f, w in MATCHING])
def test_a_windowed_export_gives_transformers_greedy_past_its_window_and_evictions(
    family: str, window: int, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    exported = BUILDERS[family](tmp_path, window)
    model = load_model(exported.onnx, threads=1)
    declared = json.loads((exported.onnx / "genai_config.json").read_text())["model"]["decoder"]["sliding_window"]
    sequence = Sequence("target", model, max_length=256)
    prompt = model.tokenizer.encode(PROMPT)
    expected = greedy_continuation(AutoModelForCausalLM.from_pretrained(exported.hf).eval(), prompt, NEW_TOKENS)

    greedy = [int(np.argmax(sequence.forward(prompt)[-1]))]  # no EOS: every step runs, past every eviction
    while len(greedy) < NEW_TOKENS:
        greedy.append(int(np.argmax(sequence.forward(greedy[-1:])[-1])))

    assert [(r.layer, r.window) for r in model.capabilities.rings] == [(i, window) for i in declared["layers"]]
    assert len(prompt) + NEW_TOKENS > window + 64 + 1  # past the first eviction
    assert greedy == expected


@pytest.mark.parametrize("window", REFUSED)
def test_mistral_s_default_export_is_refused_at_load_at_every_window(window: int, tmp_path: Path) -> None:
    exported = builder_models.mistral(tmp_path, window)

    with pytest.raises(ModelLoadError, match=rf"declares a sliding window of {window} positions .* layer_types"):
        load_model(exported.onnx, threads=1)


def test_the_refusal_names_the_window_the_graph_drops_and_the_builder_fix(mistral: Export) -> None:
    with pytest.raises(ModelLoadError) as refusal:
        load_model(mistral.onnx, threads=1)

    message = str(refusal.value)
    assert "declares a sliding window of 16 positions (no layers listed)" in message
    assert "no GroupQueryAttention node" in message
    assert 'add "layer_types": ["sliding_attention", ...] (2 entries, one per layer)' in message


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "def f():", "-n", "4"],
        ["bench", "-n", "4", "--repeats", "1", "--threads", "1", "--no-huge-pages"],
    ],
    ids=["generate", "bench"],
)
def test_generate_and_bench_on_a_refused_export_say_why_in_one_line(
    mistral: Export, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status = main([command[0], *command[1:], "-m", str(mistral.onnx)])

    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("decoctl: error: ") and err.count("\n") == 1, err
    assert "declares a sliding window of 16 positions" in err
    assert "unexpected" not in err
