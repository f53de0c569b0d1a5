"""forward(tokens, features=...): a draft head's extra input takes the target's features, row per token."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from decoctl import CapabilityError, ModelLoadError, SequenceError
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.testing import build_eagle_head, build_genai_model, reference_outputs

ATOL = 1e-4
HIDDEN = 64


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("target"), seed=31, hidden_states=True, tree_inputs=True)


@pytest.fixture(scope="module")
def head(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_eagle_head(tmp_path_factory.mktemp("head"), target, seed=32, tree_inputs=True)


def make_sequence(folder: Path, role: str = "eagle") -> Sequence:
    return Sequence(role, load_model(folder, threads=1), max_length=64)


def features(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, HIDDEN)).astype(np.float32)


def test_the_feature_input_is_a_capability_with_its_width(head: Path, target: Path) -> None:
    assert "features" in make_sequence(head).capabilities
    assert make_sequence(head).feature_size == HIDDEN
    assert "features" not in make_sequence(target, "target").capabilities
    assert make_sequence(target, "target").feature_size is None


def test_forwards_with_features_equal_one_pass_over_everything(head: Path) -> None:
    sequence = make_sequence(head)
    tokens, rows_in = [4, 9, 33, 12, 7, 80], features(6)
    first = np.array(sequence.forward(tokens[:4], features=rows_in[:4]))
    second = np.array(sequence.forward(tokens[4:], features=rows_in[4:]))
    hidden = np.array(sequence.hidden_states())
    expected = reference_outputs(head, tokens, features=rows_in)
    np.testing.assert_allclose(np.concatenate([first, second]), expected["logits"], atol=ATOL)
    np.testing.assert_allclose(hidden, expected["hidden_states"][4:], atol=ATOL)


def test_the_features_change_the_outputs(head: Path) -> None:
    """Guards the test above: a head that ignored its features would pass it with any rows."""
    one = np.array(make_sequence(head).forward([4, 9], features=features(2, seed=1)))
    other = np.array(make_sequence(head).forward([4, 9], features=features(2, seed=2)))
    assert np.abs(one - other).max() > 0.1


def test_chunked_prefill_with_features_equals_one_pass(head: Path) -> None:
    tokens, rows_in = list(range(3, 20)), features(17, seed=3)
    whole = make_sequence(head).prefill(tokens, features=rows_in)
    chunked = make_sequence(head).prefill(tokens, chunk=5, features=rows_in)
    np.testing.assert_allclose(chunked, whole, atol=ATOL)


def test_a_tree_forward_takes_one_feature_row_per_node(head: Path) -> None:
    sequence = make_sequence(head)
    prefix, prefix_features = [4, 9, 33], features(3, seed=4)
    sequence.forward(prefix, features=prefix_features)
    nodes, parents, node_features = [5, 6, 7, 8], [-1, 0, -1, 2], features(4, seed=5)
    rows = np.array(sequence.forward(nodes, tree=parents, features=node_features))
    for path in ([0, 1], [2, 3]):  # the root-to-leaf paths
        expected = reference_outputs(
            head, prefix + [nodes[i] for i in path], features=np.concatenate([prefix_features, node_features[path]])
        )
        np.testing.assert_allclose(rows[path], expected["logits"][len(prefix) :], atol=ATOL)


def test_features_for_a_model_without_the_input_are_a_capability_error(target: Path) -> None:
    with pytest.raises(CapabilityError, match=r"has no target_hidden_states input.*tools/export_eagle\.py"):
        make_sequence(target, "target").forward([1, 2], features=features(2))


def test_a_head_fed_without_features_says_how_to_pass_them(head: Path) -> None:
    with pytest.raises(SequenceError, match=r"forward\(tokens, features=rows\), rows float32\[2, 64\]"):
        make_sequence(head).forward([1, 2])
    with pytest.raises(SequenceError, match="features="):
        make_sequence(head).prefill([1, 2])


@pytest.mark.parametrize("shape", [(3, HIDDEN), (2, HIDDEN + 1), (2 * HIDDEN,)])
def test_features_of_the_wrong_shape_are_refused_naming_the_expected_one(head: Path, shape: tuple[int, ...]) -> None:
    sequence = make_sequence(head)
    with pytest.raises(SequenceError, match=re.escape(f"features of shape {shape}") + r".*float32\[2, 64\]"):
        sequence.forward([1, 2], features=np.zeros(shape, np.float32))
    assert sequence.length == 0


def test_a_feature_input_without_a_fixed_width_is_refused_at_load(head: Path, tmp_path: Path) -> None:
    model = onnx.load_model(str(head / "model.onnx"))
    feature_input = next(value for value in model.graph.input if value.name == "target_hidden_states")
    feature_input.type.tensor_type.shape.dim[2].dim_param = "width"
    for name in ("genai_config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((head / name).read_bytes())
    onnx.save_model(model, str(tmp_path / "model.onnx"))
    with pytest.raises(ModelLoadError, match=r"target_hidden_states as tensor\(float\).*fixed width"):
        load_model(tmp_path, threads=1)
