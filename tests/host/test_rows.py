"""Rows of one role: a batched one-token step, fork, reorder and release against onnxruntime's single pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoctl import SequenceError
from decoctl.host import Rows
from decoctl.model import load_model
from decoctl.testing import build_genai_model, reference_logits

ATOL = 1e-4
EXAMPLES = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", params=["plain", "tree-windowed"])
def batch_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A builder-layout model, and one with tree inputs and a sliding window (its bias rows are per row)."""
    extra = {} if request.param == "plain" else {"tree_inputs": True, "local_window_size": 3}
    return build_genai_model(tmp_path_factory.mktemp(request.param), seed=5, num_layers=2, **extra)


def expected_last(folder: Path, tokens: list[int]) -> np.ndarray:
    return reference_logits(folder, tokens)[-1]


@EXAMPLES
@given(data=st.data())
def test_a_batched_step_gives_every_row_the_logits_of_its_own_sequence(batch_model: Path, data: st.DataObject) -> None:
    rows = Rows("target", load_model(batch_model, threads=1), capacity=4, max_length=48)
    vocab = rows[0].vocab_size
    token = st.integers(0, vocab - 1)
    expected = {0: data.draw(st.lists(token, min_size=1, max_size=6), label="prompt")}
    rows[0].forward(expected[0])
    for _ in range(data.draw(st.integers(1, 3), label="forks")):
        parent = data.draw(st.sampled_from(rows.ids), label="fork of")
        child = rows.fork(parent)
        expected[child] = list(expected[parent])
        extra = data.draw(st.lists(token, max_size=4), label="row's own tokens")  # rows of different lengths
        if extra:
            rows[child].forward(extra)
            expected[child] += extra
    for _ in range(data.draw(st.integers(1, 4), label="steps")):
        fed = data.draw(st.lists(token, min_size=len(rows), max_size=len(rows)), label="step tokens")

        logits = np.array(rows.step(fed))

        for i, row in enumerate(rows.ids):
            expected[row].append(fed[i])
            assert rows[row].tokens.tolist() == expected[row]
            np.testing.assert_allclose(logits[i], expected_last(batch_model, expected[row]), atol=ATOL)
            np.testing.assert_allclose(np.array(rows[row].logits())[-1], logits[i], atol=0)


def test_a_step_over_some_rows_leaves_the_others_as_they_were(batch_model: Path) -> None:
    rows = Rows("target", load_model(batch_model, threads=1), capacity=3, max_length=32)
    rows[0].forward([5, 6, 7])
    other = rows.fork(0)
    third = rows.fork(0)

    logits = np.array(rows.step([9], rows=[third]))

    assert rows[0].tokens.tolist() == [5, 6, 7] == rows[other].tokens.tolist()
    assert rows[third].tokens.tolist() == [5, 6, 7, 9]
    np.testing.assert_allclose(logits[0], expected_last(batch_model, [5, 6, 7, 9]), atol=ATOL)
    after = np.array(rows.step([1, 2], rows=[0, other]))
    np.testing.assert_allclose(after[0], expected_last(batch_model, [5, 6, 7, 1]), atol=ATOL)
    np.testing.assert_allclose(after[1], expected_last(batch_model, [5, 6, 7, 2]), atol=ATOL)


def test_reorder_makes_each_row_continue_its_parent(batch_model: Path) -> None:
    rows = Rows("target", load_model(batch_model, threads=1), capacity=3, max_length=32)
    rows[0].forward([3, 4])
    rows.fork(0)
    rows.fork(0)
    rows.step([10, 11, 12])

    rows.reorder([2, 2, 0])

    assert [rows[r].tokens.tolist() for r in rows.ids] == [[3, 4, 12], [3, 4, 12], [3, 4, 10]]
    logits = np.array(rows.step([1, 2, 3]))
    for i, prefix in enumerate(([3, 4, 12, 1], [3, 4, 12, 2], [3, 4, 10, 3])):
        np.testing.assert_allclose(logits[i], expected_last(batch_model, prefix), atol=ATOL)


def test_a_released_row_is_gone_and_its_id_is_reused(batch_model: Path) -> None:
    rows = Rows("target", load_model(batch_model, threads=1), capacity=2, max_length=16)
    rows[0].forward([1])
    row = rows.fork(0)
    rows.release(row)
    with pytest.raises(SequenceError, match="no row 1"):
        rows[row]
    assert rows.ids == (0,) and rows.fork(0) == row


def test_fork_beyond_the_capacity_names_the_limit(batch_model: Path) -> None:
    rows = Rows("target", load_model(batch_model, threads=1), capacity=2, max_length=16)
    rows[0].forward([1])
    rows.fork(0)
    with pytest.raises(SequenceError, match="all 2 rows are live"):
        rows.fork(0)


def test_row_zero_cannot_be_released(batch_model: Path) -> None:
    rows = Rows("target", load_model(batch_model, threads=1), capacity=2, max_length=16)
    with pytest.raises(SequenceError, match="row 0"):
        rows.release(0)


def test_a_row_holding_a_tree_is_neither_forked_nor_stepped(tmp_path: Path) -> None:
    folder = build_genai_model(tmp_path, seed=2, tree_inputs=True)
    rows = Rows("target", load_model(folder, threads=1), capacity=2, max_length=16)
    rows[0].forward([1, 2])
    rows[0].forward([3, 4], tree=[-1, -1])
    with pytest.raises(SequenceError, match="keep"):
        rows.fork(0)
    with pytest.raises(SequenceError, match="keep"):
        rows.step([5])


def test_a_row_passed_over_by_a_step_keeps_the_logits_of_its_own_last_step(batch_model: Path) -> None:
    rows = Rows("target", load_model(batch_model, threads=1), capacity=2, max_length=16)
    rows[0].forward([4, 5])
    rows.fork(0)
    rows.step([6, 7])
    before = np.array(rows[0].logits())

    rows.step([8], rows=[1])

    np.testing.assert_array_equal(np.array(rows[0].logits()), before)
    np.testing.assert_allclose(before[-1], expected_last(batch_model, [4, 5, 6]), atol=ATOL)


def test_copy_makes_a_live_row_continue_another_and_leaves_the_source_as_it_was(batch_model: Path) -> None:
    rows = Rows("target", load_model(batch_model, threads=1), capacity=3, max_length=16)
    rows.fork(0)
    rows.fork(0)
    rows[0].forward([5, 9, 2])
    rows[2].forward([7])  # a row with tokens of its own, replaced by the copy
    rows.copy(0, 2)
    assert rows[2].tokens.tolist() == [5, 9, 2]
    logits = rows.step([4, 4], rows=[0, 2])
    np.testing.assert_allclose(logits[0], expected_last(batch_model, [5, 9, 2, 4]), atol=1e-4)
    np.testing.assert_allclose(logits[1], logits[0], atol=1e-6)
    assert rows[1].length == 0
