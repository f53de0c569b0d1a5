"""forward(tokens, tree=parents) and keep(path): one pass over a token tree equals plain passes over its paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tree_strategies import ancestors, parent_arrays

from decoctl import CapabilityError, SequenceError
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.testing import reference_logits

ATOL = 1e-4
EXAMPLES = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def make_sequence(folder: Path, **kwargs: object) -> Sequence:
    return Sequence("target", load_model(folder, threads=1), **kwargs)  # type: ignore[arg-type]


def draw_tokens(data: st.DataObject, vocab: int, size: int, label: str) -> list[int]:
    return data.draw(st.lists(st.integers(0, vocab - 1), min_size=size, max_size=size), label=label)


@EXAMPLES
@given(data=st.data())
def test_every_tree_node_gets_the_logits_of_a_plain_forward_of_its_path(tree_model: Path, data: st.DataObject) -> None:
    sequence = make_sequence(tree_model, max_length=64)
    vocab = sequence.vocab_size
    prefix = draw_tokens(data, vocab, data.draw(st.integers(1, 8), label="prefix length"), "prefix")
    parents = data.draw(parent_arrays(max_nodes=12), label="parents")
    nodes = draw_tokens(data, vocab, len(parents), "tree tokens")
    sequence.forward(prefix)

    rows = np.array(sequence.forward(nodes, tree=parents))

    assert rows.shape == (len(nodes), vocab)
    for leaf in set(range(len(parents))) - set(parents):
        path = ancestors(parents, leaf)
        expected = reference_logits(tree_model, prefix + [nodes[i] for i in path])[len(prefix) :]
        np.testing.assert_allclose(rows[path], expected, atol=ATOL)


@EXAMPLES
@given(data=st.data())
def test_after_keep_the_next_forward_equals_a_recompute_of_what_was_kept(tree_model: Path, data: st.DataObject) -> None:
    sequence = make_sequence(tree_model, max_length=64)
    vocab = sequence.vocab_size
    expected = draw_tokens(data, vocab, data.draw(st.integers(1, 6), label="prefix length"), "prefix")
    sequence.forward(expected)
    for _ in range(data.draw(st.integers(1, 3), label="rounds")):
        parents = data.draw(parent_arrays(max_nodes=10), label="parents")
        nodes = draw_tokens(data, vocab, len(parents), "tree tokens")
        sequence.forward(nodes, tree=parents)
        accepted = data.draw(st.integers(-1, len(parents) - 1), label="deepest accepted node (-1: none)")
        path = ancestors(parents, accepted)

        sequence.keep(path)

        expected += [nodes[i] for i in path]
        assert sequence.length == len(expected)
        assert sequence.tokens.tolist() == expected
    following = draw_tokens(data, vocab, data.draw(st.integers(1, 4), label="next length"), "next tokens")
    rows = np.array(sequence.forward(following))
    recomputed = reference_logits(tree_model, expected + following)[-len(following) :]
    np.testing.assert_allclose(rows, recomputed, atol=ATOL)


def test_a_model_without_tree_inputs_names_the_transform(plain_model: Path) -> None:
    sequence = make_sequence(plain_model)
    sequence.forward([0, 5])
    with pytest.raises(CapabilityError, match="decoctl models enable-tree"):
        sequence.forward([1, 2], tree=[-1, -1])


def test_a_tree_forward_on_an_empty_sequence_is_refused(built_tree_model: Path) -> None:
    sequence = make_sequence(built_tree_model)
    with pytest.raises(SequenceError, match=r"at length 0: .* prefill the prompt"):
        sequence.forward([1, 2, 3], tree=[-1, 0, 0])
    assert sequence.length == 0


def test_feeding_more_after_a_tree_forward_needs_keep_or_rewind(built_tree_model: Path) -> None:
    sequence = make_sequence(built_tree_model)
    sequence.forward([0, 5])
    sequence.forward([1, 2, 3], tree=[-1, 0, 0])
    with pytest.raises(SequenceError, match=r"keep\(path\)"):
        sequence.forward([4])
    sequence.rewind(2)
    rows = sequence.forward([4])
    np.testing.assert_allclose(rows, reference_logits(built_tree_model, [0, 5, 4])[-1:], atol=ATOL)


def test_a_chain_shaped_tree_can_be_continued_directly(built_tree_model: Path) -> None:
    sequence = make_sequence(built_tree_model)
    sequence.forward([0, 5])
    sequence.forward([1, 2], tree=[-1, 0])
    rows = sequence.forward([3])
    np.testing.assert_allclose(rows, reference_logits(built_tree_model, [0, 5, 1, 2, 3])[-1:], atol=ATOL)


def test_keep_after_a_plain_forward_keeps_a_prefix_of_it(built_tree_model: Path) -> None:
    sequence = make_sequence(built_tree_model)
    sequence.forward([0, 5])
    sequence.forward([1, 2, 3])
    with pytest.raises(SequenceError, match="root-to-node path"):
        sequence.keep([1])
    sequence.keep([0, 1])
    assert sequence.tokens.tolist() == [0, 5, 1, 2]


def test_keep_refuses_a_non_path_and_leaves_the_tree_in_place(built_tree_model: Path) -> None:
    sequence = make_sequence(built_tree_model)
    sequence.forward([0, 5])
    sequence.forward([1, 2, 3, 4], tree=[-1, 0, 0, 2])
    with pytest.raises(SequenceError, match="token 3 at place 1 is not a child of token 0"):
        sequence.keep([0, 3])
    assert sequence.length == 6
    sequence.keep([0, 2, 3])
    assert sequence.tokens.tolist() == [0, 5, 1, 3, 4]


def test_an_empty_keep_drops_the_whole_tree(built_tree_model: Path) -> None:
    sequence = make_sequence(built_tree_model)
    sequence.forward([0, 5])
    sequence.forward([1, 2], tree=[-1, -1])
    sequence.keep([])
    assert sequence.tokens.tolist() == [0, 5]


@pytest.mark.parametrize("before", ["nothing", "prefill", "rewind", "keep"])
def test_keep_needs_a_forward_right_before_it(built_tree_model: Path, before: str) -> None:
    sequence = make_sequence(built_tree_model)
    if before == "prefill":
        sequence.prefill([0, 5, 6])
    elif before == "rewind":
        sequence.forward([0, 5, 6])
        sequence.rewind(2)
    elif before == "keep":
        sequence.forward([0, 5])
        sequence.forward([1, 2], tree=[-1, -1])
        sequence.keep([1])
    with pytest.raises(SequenceError, match="no forward to keep from"):
        sequence.keep([0])


def test_tree_forwards_are_counted(built_tree_model: Path) -> None:
    sequence = make_sequence(built_tree_model)
    sequence.forward([0, 5])
    sequence.forward([1, 2, 3], tree=[-1, 0, -1])
    assert (sequence.stats.forwards, sequence.stats.tree_forwards, sequence.stats.tokens_fed) == (2, 1, 5)


def test_keep_invalidates_the_tree_forwards_views(built_tree_model: Path) -> None:
    sequence = make_sequence(built_tree_model, debug=True)
    sequence.forward([0, 5])
    rows = sequence.forward([1, 2], tree=[-1, -1])
    sequence.keep([1])
    with pytest.raises(SequenceError, match="after that role's next forward or rewind"):
        rows.max()
    with pytest.raises(SequenceError, match="no logits yet"):
        sequence.logits()
