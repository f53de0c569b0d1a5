"""Tree forwards on sliding-window layers: every row equals a plain forward of its path, past the window.

GroupQueryAttention's window counts KV slots, and a tree token's slot runs ahead of its position by the number
of siblings fed before it; the loader moves those layers' window into a bias counted in positions
(decoctl.model.graph._window_bias). The oracle is onnxruntime's own single pass over the path on the unmodified graph.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tree_strategies import ancestors, parent_arrays

from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.model.graph import enable_tree
from decoctl.testing import build_genai_model, reference_logits

ATOL = 1e-4
WINDOWS = (2, 5, 9)
EXAMPLES = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="session")
def windowed_models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Three-layer models with a window on the first two layers (the last attends to everything), per size."""
    return {
        window: build_genai_model(
            tmp_path_factory.mktemp(f"window{window}"),
            seed=window,
            num_layers=3,
            tree_inputs=True,
            local_window_size=window,
        )
        for window in WINDOWS
    }


@pytest.fixture(scope="session")
def transformed_windowed_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A windowed model without tree inputs, given them by enable_tree (the way a builder export gets them)."""
    plain = build_genai_model(tmp_path_factory.mktemp("window-plain"), seed=11, num_layers=3, local_window_size=4)
    return enable_tree(plain, tmp_path_factory.mktemp("window-transformed") / "model")


def draw_tokens(data: st.DataObject, vocab: int, size: int, label: str) -> list[int]:
    return data.draw(st.lists(st.integers(0, vocab - 1), min_size=size, max_size=size), label=label)


def assert_rows_are_plain_forwards(folder: Path, data: st.DataObject, max_prefix: int) -> None:
    sequence = Sequence("target", load_model(folder, threads=1), max_length=96)
    vocab = sequence.vocab_size
    prefix = draw_tokens(data, vocab, data.draw(st.integers(1, max_prefix), label="prefix length"), "prefix")
    parents = data.draw(parent_arrays(max_nodes=14), label="parents")
    nodes = draw_tokens(data, vocab, len(parents), "tree tokens")
    sequence.forward(prefix)

    rows = np.array(sequence.forward(nodes, tree=parents))

    for leaf in set(range(len(parents))) - set(parents):
        path = ancestors(parents, leaf)
        expected = reference_logits(folder, prefix + [nodes[i] for i in path])[len(prefix) :]
        np.testing.assert_allclose(rows[path], expected, atol=ATOL)


@EXAMPLES
@given(data=st.data(), window=st.sampled_from(WINDOWS))
def test_every_tree_row_equals_a_plain_forward_of_its_path_past_the_window(
    windowed_models: dict[int, Path], window: int, data: st.DataObject
) -> None:
    assert_rows_are_plain_forwards(windowed_models[window], data, max_prefix=4 * window + 8)


@EXAMPLES
@given(data=st.data())
def test_a_model_given_tree_inputs_by_enable_tree_is_exact_past_the_window(
    transformed_windowed_model: Path, data: st.DataObject
) -> None:
    assert_rows_are_plain_forwards(transformed_windowed_model, data, max_prefix=24)


@EXAMPLES
@given(data=st.data(), window=st.sampled_from(WINDOWS))
def test_after_keep_plain_steps_equal_a_recompute_past_the_window(
    windowed_models: dict[int, Path], window: int, data: st.DataObject
) -> None:
    folder = windowed_models[window]
    sequence = Sequence("target", load_model(folder, threads=1), max_length=128)
    vocab = sequence.vocab_size
    expected = draw_tokens(data, vocab, data.draw(st.integers(1, 3 * window), label="prefix length"), "prefix")
    sequence.forward(expected)
    for _ in range(data.draw(st.integers(1, 3), label="rounds")):
        parents = data.draw(parent_arrays(max_nodes=10), label="parents")
        nodes = draw_tokens(data, vocab, len(parents), "tree tokens")
        sequence.forward(nodes, tree=parents)
        path = ancestors(parents, data.draw(st.integers(-1, len(parents) - 1), label="deepest accepted node"))
        sequence.keep(path)
        expected += [nodes[i] for i in path]
    steps = draw_tokens(data, vocab, data.draw(st.integers(1, 2 * window), label="steps"), "steps")
    rows = np.array([np.array(sequence.forward([token])[0]) for token in steps])  # each view lives one forward
    recomputed = reference_logits(folder, expected + steps)[-len(steps) :]
    np.testing.assert_allclose(rows, recomputed, atol=ATOL)


def test_the_loader_moves_each_window_into_its_own_bias_input(windowed_models: dict[int, Path]) -> None:
    for window, folder in windowed_models.items():
        capabilities = load_model(folder, threads=1).capabilities
        assert [(w.name, w.window) for w in capabilities.windows] == [(f"attention_bias_window_{window}", window)]


def test_a_model_without_windows_keeps_one_bias(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path, seed=1, tree_inputs=True)
    assert load_model(folder, threads=1).capabilities.windows == ()
