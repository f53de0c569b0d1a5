"""Tree: parent arrays to position ids and the additive bias, and root-to-node paths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from tree_strategies import ancestors, parent_arrays

from decoctl import SequenceError
from decoctl.model._tree import Tree

NEG = -np.inf


def test_positions_continue_the_prefix_at_each_tokens_depth() -> None:
    tree = Tree.from_parents([-1, 0, 0, 1, -1], 5)
    assert tree.positions(10).tolist() == [10, 11, 11, 12, 10]


def test_bias_lets_each_token_see_itself_and_its_ancestors_only() -> None:
    bias = Tree.from_parents([-1, 0, 0, 1], 4).bias()
    expected = np.array(
        [
            [0, NEG, NEG, NEG],
            [0, 0, NEG, NEG],
            [0, NEG, 0, NEG],
            [0, 0, NEG, 0],
        ],
        dtype=np.float32,
    )
    np.testing.assert_array_equal(bias, expected)
    assert bias.dtype == np.float32


@given(parent_arrays())
def test_bias_and_positions_match_root_to_node_paths(parents: list[int]) -> None:
    tree = Tree.from_parents(parents, len(parents))
    bias = tree.bias()
    for node in range(len(parents)):
        path = ancestors(parents, node)
        assert np.flatnonzero(bias[node] == 0).tolist() == path
        assert tree.positions(3)[node] == 3 + len(path) - 1
        assert tree.path(path).tolist() == path


def test_a_chain_is_recognised() -> None:
    assert Tree.from_parents([-1, 0, 1], 3).is_chain
    assert not Tree.from_parents([-1, 0, 0], 3).is_chain


@pytest.mark.parametrize(("parents", "match"), [([-1, 1], "parent 1 of token 1"), ([-2], "parent -2"), ([0], "0")])
def test_parents_must_point_to_earlier_tokens(parents: list[int], match: str) -> None:
    with pytest.raises(SequenceError, match=match):
        Tree.from_parents(parents, len(parents))


def test_one_parent_per_token() -> None:
    with pytest.raises(SequenceError, match="3 tokens but 2 parents"):
        Tree.from_parents([-1, 0], 3)


@pytest.mark.parametrize("path", [[1], [0, 3], [0, 1, 4], [5], [-1], [1, 0], [0, 0]])
def test_a_path_must_run_from_a_root_through_children(path: list[int]) -> None:
    tree = Tree.from_parents([-1, 0, 0, 1, 3], 5)
    with pytest.raises(SequenceError, match="root-to-node path"):
        tree.path(path)


def test_the_empty_path_is_valid() -> None:
    assert Tree.from_parents([-1], 1).path([]).tolist() == []
