"""EAGLE-3 heads under the eagle controller: fed ``[taps | 0]`` from the target and ``[0 | own]`` while drafting,
lossless like EAGLE-1 heads, and refused with the fix named when the target has no taps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from decoctl import CapabilityError, GenerationError, Generator
from decoctl.plugins import PluginRegistry
from decoctl.testing import build_eagle3_head, build_genai_model, reference_outputs

PROMPT = "def f(x):\n    return"


@pytest.fixture(scope="module")
def tapped_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(
        tmp_path_factory.mktemp("tapped"),
        seed=43,
        num_layers=3,
        hidden_states=True,
        tap_layers=(0, 1, 2),
        tree_inputs=True,
    )


@pytest.fixture(scope="module", params=[None, 192], ids=["full-vocab", "draft-vocab"])
def eagle3_head(request: pytest.FixtureRequest, tapped_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eagle3_head(
        tmp_path_factory.mktemp("eagle3"), tapped_target, seed=7, tree_inputs=True, draft_vocab=request.param
    )


@pytest.mark.parametrize("drafting", ["chain", "tree"])
def test_an_eagle3_head_gives_greedys_tokens(
    drafting: str, tapped_target: Path, eagle3_head: Path, registry: PluginRegistry
) -> None:
    greedy = Generator({"target": tapped_target}, "greedy", registry=registry).generate(PROMPT, max_new_tokens=24)
    eagle = Generator(
        {"target": tapped_target, "eagle": eagle3_head}, "eagle", options={"drafting": drafting}, registry=registry
    ).generate(PROMPT, max_new_tokens=24)
    assert eagle.tokens == greedy.tokens


def test_the_head_reads_the_taps_through_fc_and_its_own_rows_unchanged(tapped_target: Path, eagle3_head: Path) -> None:
    """[taps | 0] and [0 | fc(taps)] are the same feature to the head: fc is applied to the taps part only."""
    ids = [3, 17, 42, 9, 5]
    taps = reference_outputs(tapped_target, [1, *ids])["aux_hidden_states"][:-1]
    hidden = 64
    graph = onnx.load_model(str(eagle3_head / "model.onnx")).graph
    fc = next(numpy_helper.to_array(t) for t in graph.initializer if t.name == "fc.weight")  # stored [in, out]
    from_target = np.concatenate([taps, np.zeros((len(ids), hidden), np.float32)], axis=1)
    from_own = np.concatenate([np.zeros_like(taps), taps @ fc], axis=1)
    first = reference_outputs(eagle3_head, ids, features=from_target)
    second = reference_outputs(eagle3_head, ids, features=from_own)
    np.testing.assert_allclose(first["hidden_states"], second["hidden_states"], atol=1e-4)


def test_an_eagle3_head_on_a_target_without_taps_names_enable_taps(
    eagle3_head: Path, tmp_path: Path, registry: PluginRegistry
) -> None:
    untapped = build_genai_model(tmp_path / "untapped", seed=43, num_layers=3, hidden_states=True, tree_inputs=True)
    generator = Generator({"target": untapped, "eagle": eagle3_head}, "eagle", registry=registry)
    with pytest.raises(GenerationError, match="decoctl models enable-taps") as caught:
        generator.generate(PROMPT, max_new_tokens=4)
    assert isinstance(caught.value.__cause__, CapabilityError)


def test_a_random_eagle3_head_needs_a_target_with_three_taps(tmp_path: Path) -> None:
    two_taps = build_genai_model(tmp_path / "two", seed=43, num_layers=3, tap_layers=(1, 2))
    with pytest.raises(ValueError, match=r"aux_hidden_states of width 128; .* tap_layers=\(low, middle, high\)"):
        build_eagle3_head(tmp_path / "head", two_taps)
