"""decoctl.native.top2 (the bridge's one-pass argmax and runner-up) gives numpy's answers."""

from __future__ import annotations

import numpy as np
import pytest

from decoctl.native import top2


def _numpy(row: np.ndarray) -> tuple[int, float, float]:
    index = int(row.argmax())
    others = np.delete(row, index)
    return index, float(row[index]), float(others.max()) if others.size else -np.inf


@pytest.mark.parametrize("seed", range(20))
def test_top2_equals_numpy_on_random_rows_with_ties_and_masks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    row = rng.integers(-4, 5, int(rng.integers(1, 300))).astype(np.float32)  # small integers: many ties
    row[rng.random(row.size) < 0.3] = -np.inf
    assert top2(row) == _numpy(row)


def test_top2_follows_numpy_on_nan_and_fully_masked_rows() -> None:
    with_nan = np.array([1.0, 7.0, np.nan, 9.0, np.nan], np.float32)
    index, top, _ = top2(with_nan)
    assert index == int(with_nan.argmax()) == 2 and np.isnan(top)
    assert top2(np.full(5, -np.inf, np.float32)) == (0, -np.inf, -np.inf)
    assert top2(np.array([3.0], np.float32)) == (0, 3.0, -np.inf)


def test_top2_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="float32"):
        top2(np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="float32"):
        top2(np.zeros((2, 4), np.float32)[:, 1])
