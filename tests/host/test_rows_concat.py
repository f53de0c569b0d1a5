"""Rows of a model with a concatenated KV cache (Optimum's layout): every row keeps a cache of its own, fork copies
it, reorder hands the caches round, a step is one Run per row, and every row's logits equal a from-scratch pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from decoctl import ConfigError, SequenceError
from decoctl.host import ONE_RUN_PER_ROW, Rows
from decoctl.model import load_model
from decoctl.model._kv_cache import ConcatKVCache
from decoctl.model._loader import LoadedModel
from decoctl.testing import reference_logits

ATOL = 1e-4


@pytest.fixture
def model(optimum_model: Path) -> LoadedModel:
    return load_model(optimum_model, threads=1)


def expected_last(model: LoadedModel, tokens: list[int]) -> np.ndarray:
    return reference_logits(model.spec.path, tokens)[-1]


def test_rows_of_a_concatenated_cache_model_say_they_step_one_run_per_row(model: LoadedModel) -> None:
    rows = Rows("target", model, capacity=3, max_length=16)
    assert not rows.batched
    assert rows.stepping == ONE_RUN_PER_ROW == "one Run per row (concatenated KV cache)"


def test_a_step_gives_every_row_the_logits_of_its_own_sequence(model: LoadedModel) -> None:
    rows = Rows("target", model, capacity=3, max_length=16)
    rows[0].forward([5, 6])
    rows.fork(0)
    third = rows.fork(0)
    rows[third].forward([7, 8])  # rows of different lengths step together

    logits = np.array(rows.step([9, 10, 11]))

    assert logits.shape == (3, model.spec.vocab_size) and logits.dtype == np.float32
    for i, prefix in enumerate(([5, 6, 9], [5, 6, 10], [5, 6, 7, 8, 11])):
        assert rows[i].tokens.tolist() == prefix
        np.testing.assert_allclose(logits[i], expected_last(model, prefix), atol=ATOL)
        np.testing.assert_array_equal(np.array(rows[i].logits())[-1], logits[i])


def test_a_fork_copies_the_cache_and_leaves_its_source_as_it_was(model: LoadedModel) -> None:
    rows = Rows("target", model, capacity=2, max_length=16)
    rows[0].forward([3, 4, 5])
    child = rows.fork(0)

    rows[child].forward([6])
    rows[child].rewind(2)
    np.testing.assert_allclose(np.array(rows[child].forward([9]))[-1], expected_last(model, [3, 4, 9]), atol=ATOL)

    assert rows[0].tokens.tolist() == [3, 4, 5]
    np.testing.assert_allclose(np.array(rows[0].forward([7]))[-1], expected_last(model, [3, 4, 5, 7]), atol=ATOL)


@pytest.mark.parametrize(
    "parents",
    [
        [2, 2, 0],  # row 2 continued twice, row 1 by none
        [1, 0, 2],  # a swap
        [3, 3],  # rows beyond those reordered are parents, copied and left as they were
        [0, 0, 0, 0],
        [3, 2, 1, 0],
    ],
)
def test_reorder_makes_each_row_continue_its_parent_as_it_was_before(model: LoadedModel, parents: list[int]) -> None:
    rows = Rows("target", model, capacity=4, max_length=16)
    rows[0].forward([3, 4])
    for _ in range(3):
        rows.fork(0)
    rows.step([10, 11, 12, 13])
    before = [rows[r].tokens.tolist() for r in rows.ids]

    rows.reorder(parents)

    after = [before[p] for p in parents] + before[len(parents) :]
    assert [rows[r].tokens.tolist() for r in rows.ids] == after
    fed = [20, 21, 22, 23]
    logits = np.array(rows.step(fed))
    for i, prefix in enumerate(after):
        np.testing.assert_allclose(logits[i], expected_last(model, [*prefix, fed[i]]), atol=ATOL)


def test_a_step_over_some_rows_leaves_the_others_as_they_were(model: LoadedModel) -> None:
    rows = Rows("target", model, capacity=3, max_length=16)
    rows[0].forward([5, 6, 7])
    other = rows.fork(0)
    third = rows.fork(0)
    kept = np.array(rows[0].logits())

    logits = np.array(rows.step([9], rows=[third]))

    np.testing.assert_allclose(logits[0], expected_last(model, [5, 6, 7, 9]), atol=ATOL)
    assert rows[0].tokens.tolist() == rows[other].tokens.tolist() == [5, 6, 7]
    np.testing.assert_array_equal(np.array(rows[0].logits()), kept)
    after = np.array(rows.step([1, 2], rows=[other, 0]))  # in the order given
    np.testing.assert_allclose(after[0], expected_last(model, [5, 6, 7, 1]), atol=ATOL)
    np.testing.assert_allclose(after[1], expected_last(model, [5, 6, 7, 2]), atol=ATOL)


def test_a_released_row_is_gone_and_its_id_takes_a_fresh_copy(model: LoadedModel) -> None:
    rows = Rows("target", model, capacity=2, max_length=16)
    rows[0].forward([1, 2])
    row = rows.fork(0)
    rows[row].forward([3, 4, 5])
    rows.release(row)
    with pytest.raises(SequenceError, match="no row 1"):
        rows[row]
    assert rows.fork(0) == row
    assert rows[row].tokens.tolist() == [1, 2]
    np.testing.assert_allclose(np.array(rows.step([6], rows=[row]))[0], expected_last(model, [1, 2, 6]), atol=ATOL)


def test_rows_beyond_the_available_memory_are_refused_naming_how_many_fit(
    monkeypatch: pytest.MonkeyPatch, model: LoadedModel
) -> None:
    row = ConcatKVCache.row_bytes(model.spec, np.dtype(np.float32), 256)
    monkeypatch.setattr("decoctl.model._kv_rows.available_memory", lambda: 3 * row + 100)
    with pytest.raises(ConfigError, match=r"needs 8 rows of 256 positions.*use at most 3 rows"):
        Rows("target", model, capacity=8, max_length=256)
    assert Rows("target", model, capacity=3, max_length=256).capacity == 3


def test_copy_makes_a_live_row_continue_another(model: LoadedModel) -> None:
    rows = Rows("target", model, capacity=2, max_length=16)
    other = rows.fork(0)
    rows[0].forward([3, 4, 5])
    rows[other].forward([8])
    rows.copy(0, other)
    assert rows[other].tokens.tolist() == [3, 4, 5]
    np.testing.assert_allclose(np.array(rows[other].forward([7]))[-1], expected_last(model, [3, 4, 5, 7]), atol=ATOL)
    np.testing.assert_allclose(np.array(rows[0].forward([6]))[-1], expected_last(model, [3, 4, 5, 6]), atol=ATOL)
