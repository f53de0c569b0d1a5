"""EAGLE-2's candidate scoring: the N best candidates always form a tree, ordered so parents come first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from decoctl_eagle.drafts import Candidates
from hypothesis import given, settings
from hypothesis import strategies as st

from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.verify import DraftTree, log_probabilities


def grow(seed: int, depth: int, topk: int) -> Candidates:
    """Candidates grown as the controller grows them, from random head rows over a vocabulary of 12."""
    rng = np.random.default_rng(seed)
    candidates = Candidates()
    frontier = candidates.expand(-1, log_probabilities(rng.normal(size=(1, 12)) * 2, 1.0)[0], topk)
    for _ in range(1, depth):
        grown = [
            child
            for parent in frontier
            for child in candidates.expand(parent, log_probabilities(rng.normal(size=(1, 12)) * 2, 1.0)[0], topk)
        ]
        frontier = candidates.best(grown, topk)
    return candidates


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 5), topk=st.integers(1, 4), size=st.integers(0, 40))
def test_the_best_candidates_form_a_tree_in_feed_order(seed: int, depth: int, topk: int, size: int) -> None:
    candidates = grow(seed, depth, topk)
    tree = candidates.tree(pending=99, size=size)
    assert tree.size == 1 + min(size, len(candidates))
    assert tree.tokens[0] == 99 and tree.parents[0] == -1
    for node in range(1, tree.size):
        parent = tree.parents[node]
        assert 0 <= parent < node
        assert tree.paths[node] == (*tree.paths[parent], tree.tokens[node])
        assert tree.children[parent][tree.tokens[node]] == node
    chosen_scores = sorted(candidates.scores, reverse=True)[: tree.size - 1]
    assert sorted(_scores(candidates, tree), reverse=True) == chosen_scores


def _scores(candidates: Candidates, tree: DraftTree) -> list[float]:
    by_path = dict(zip(candidates.paths, candidates.scores, strict=True))
    return [by_path[path] for path in tree.paths[1:]]


def test_children_are_listed_best_first_and_improbable_tokens_never_drafted() -> None:
    candidates = Candidates()
    with np.errstate(divide="ignore"):
        root, below = np.log([0.1, 0.6, 0.0, 0.3]), np.log([0.7, 0.2, 0.1, 0.0])
    added = candidates.expand(-1, root, 4)
    assert [candidates.tokens[c] for c in added] == [1, 3, 0]  # token 2 has probability 0
    assert [candidates.tokens[c] for c in candidates.expand(added[0], below, 2)] == [0, 1]
    assert np.isclose(candidates.scores[3], np.log(0.6 * 0.7))
    # scores: 1 (0.6), 1->0 (0.42), 3 (0.3), 1->1 (0.12), 0 (0.1): the best three, by depth
    tree = candidates.tree(pending=7, size=3)
    assert (tree.tokens, tree.parents) == ([7, 1, 3, 0], [-1, 0, 0, 1])
    assert [list(children.values()) for children in tree.children] == [[1, 2], [3], [], []]
    assert tree.paths == [(), (1,), (3,), (1, 0)]


def test_a_draft_vocabulary_head_gives_the_full_heads_logits_on_its_ids_and_minus_infinity_elsewhere(
    mimic_head: Path, narrow_head: Path
) -> None:
    full_model, narrow_model = load_model(mimic_head, threads=1), load_model(narrow_head, threads=1)
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 60, 12)
    features = rng.normal(size=(12, full_model.capabilities.feature_size)).astype(np.float32)
    full = np.array(Sequence("eagle", full_model).forward(tokens, features=features))
    narrow = np.array(Sequence("eagle", narrow_model).forward(tokens, features=features))
    kept = np.isfinite(narrow[0])
    assert narrow.shape == full.shape and kept.sum() == full.shape[1] // 2
    assert (np.isfinite(narrow) == kept).all()  # the same draft ids in every row, -inf elsewhere
    np.testing.assert_allclose(narrow[:, kept], full[:, kept], rtol=1e-5, atol=1e-5)


@given(st.integers(0, 2**16), st.integers(1, 5))
@settings(max_examples=60, deadline=None)
def test_expanding_several_rows_at_once_equals_expanding_each(seed: int, topk: int) -> None:
    rng = np.random.default_rng(seed)
    one_by_one, batched = Candidates(), Candidates()
    root = log_probabilities(rng.normal(size=(1, 12)) * 2, 1.0)[0]
    parents = one_by_one.expand(-1, root, 3)
    assert batched.expand(-1, root, 3) == parents
    rows = log_probabilities(np.round(rng.normal(size=(len(parents), 12)), 1), 1.0)  # rounded: ties happen
    rows[rng.random(rows.shape) < 0.4] = -np.inf  # masked tokens are never drafted
    expected = [
        child for parent, row in zip(parents, rows, strict=True) for child in one_by_one.expand(parent, row, topk)
    ]
    assert batched.expand_rows(parents, rows, topk) == expected
    assert (batched.tokens, batched.parents, batched.paths) == (one_by_one.tokens, one_by_one.parents, one_by_one.paths)
    np.testing.assert_allclose(batched.scores, one_by_one.scores)
