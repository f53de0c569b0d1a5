"""A tree forward right after a tree forward extends that tree: how a drafter grows a tree level by level."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tree_strategies import ancestors, parent_arrays

from decoctl import SequenceError
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.testing import reference_logits

ATOL = 1e-4
EXAMPLES = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def make_sequence(folder: Path) -> Sequence:
    return Sequence("target", load_model(folder, threads=1), max_length=64)


def draw_tokens(data: st.DataObject, vocab: int, size: int, label: str) -> list[int]:
    return data.draw(st.lists(st.integers(0, vocab - 1), min_size=size, max_size=size), label=label)


@EXAMPLES
@given(data=st.data())
def test_a_tree_fed_in_parts_gives_every_node_the_logits_of_its_path_and_keep_spans_all_parts(
    tree_model: Path, data: st.DataObject
) -> None:
    sequence = make_sequence(tree_model)
    vocab = sequence.vocab_size
    prefix = draw_tokens(data, vocab, data.draw(st.integers(1, 6), label="prefix length"), "prefix")
    sequence.forward(prefix)
    parents = data.draw(parent_arrays(max_nodes=12), label="whole tree")
    nodes = draw_tokens(data, vocab, len(parents), "tree tokens")
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(parents)), max_size=3), label="cuts")) | {len(parents)})
    begin = 0
    for end in cuts:
        rows = np.array(sequence.forward(nodes[begin:end], tree=parents[begin:end]))
        for node in range(begin, end):
            path = ancestors(parents, node)
            expected = reference_logits(tree_model, prefix + [nodes[i] for i in path])[-1]
            np.testing.assert_allclose(rows[node - begin], expected, atol=ATOL)
        begin = end
    assert sequence.length == len(prefix) + len(parents)

    path = ancestors(parents, data.draw(st.integers(-1, len(parents) - 1), label="accepted node"))
    sequence.keep(path)
    kept = prefix + [nodes[i] for i in path]
    rows = np.array(sequence.forward([3]))
    np.testing.assert_allclose(rows[0], reference_logits(tree_model, [*kept, 3])[-1], atol=ATOL)


def test_a_plain_forward_between_two_trees_starts_a_new_tree(built_tree_model: Path) -> None:
    sequence = make_sequence(built_tree_model)
    sequence.forward([0, 5])
    sequence.forward([1, 2], tree=[-1, 0])  # chain-shaped: continued directly by a plain forward
    sequence.forward([3])
    rows = np.array(sequence.forward([4, 6], tree=[-1, -1]))
    np.testing.assert_allclose(rows[1], reference_logits(built_tree_model, [0, 5, 1, 2, 3, 6])[-1], atol=ATOL)
    with pytest.raises(SequenceError, match="not a root"):
        sequence.keep([2])  # the new tree has two tokens only


def test_an_extension_whose_parent_is_not_an_earlier_token_is_refused(built_tree_model: Path) -> None:
    sequence = make_sequence(built_tree_model)
    sequence.forward([0, 5])
    sequence.forward([1, 2], tree=[-1, -1])
    with pytest.raises(SequenceError, match=r"parent 4 of token 3 .* \(0\.\.2\)"):
        sequence.forward([3, 4], tree=[0, 4])
    with pytest.raises(SequenceError, match="got 2 tokens but 1 parents"):
        sequence.forward([3, 4], tree=[0])
