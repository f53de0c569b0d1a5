"""decoctl.processing.top2 (the bridge's one-pass argmax and runner-up) gives numpy's answers, and gives them without
the compiled bridge too (its numpy twin), so the logits chain never needs the bridge."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from decoctl import ProcessContext, ProcessorChain
from decoctl.processing import _native as native
from decoctl.processing import top2


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


# -- without the compiled bridge -------------------------------------------------------------------------------


@pytest.fixture
def without_bridge(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """decoctl.processing as it loads where decoctl._abi was never built (importing the bridge raises ImportError)."""
    monkeypatch.setitem(sys.modules, "decoctl._abi", None)
    yield importlib.reload(native)
    monkeypatch.undo()
    importlib.reload(native)


def rows_with_ties_masks_and_nans() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    rows = []
    for _ in range(60):
        row = rng.integers(-4, 5, int(rng.integers(1, 300))).astype(np.float32)
        row[rng.random(row.size) < 0.3] = -np.inf
        rows.append(row)
    rows += [
        np.array([1.0, 7.0, np.nan, 9.0, np.nan], np.float32),
        np.array([np.nan, 2.0], np.float32),
        np.full(5, -np.inf, np.float32),
        np.array([3.0], np.float32),
        rng.standard_normal(32_000).astype(np.float32),
    ]
    return rows


def same(a: tuple[int, float, float], b: tuple[int, float, float]) -> bool:
    return a[0] == b[0] and all(x == y or (np.isnan(x) and np.isnan(y)) for x, y in zip(a[1:], b[1:], strict=True))


@pytest.mark.skipif(not native.COMPILED, reason="the compiled bridge is not built here")
def test_top2_gives_the_bridges_numbers_without_the_bridge(without_bridge: ModuleType) -> None:
    rows = rows_with_ties_masks_and_nans()
    compiled = [top2(row) for row in rows]
    assert not without_bridge.COMPILED
    assert all(same(without_bridge.top2(row), expected) for row, expected in zip(rows, compiled, strict=True))


def test_top2_without_the_bridge_follows_numpy(without_bridge: ModuleType) -> None:
    for row in rows_with_ties_masks_and_nans():
        if not np.isnan(row).any():
            assert without_bridge.top2(row) == _numpy(row)
    with pytest.raises(ValueError, match="float32"):
        without_bridge.top2(np.zeros(4, np.float64))


class Lower:
    """A prefix step that lowers every third logit a little (the chain bounds it on the unprocessed rows, with top2)."""

    stateless = True

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        rows[:, ::3] -= np.float32(0.01)
        return rows

    def bound_argmax_at(self, context: ProcessContext, row: int, token: int, top: float, second: float) -> Any:
        return (np.float32(top) - np.float32(0.01) if token % 3 == 0 else np.float32(top)), np.float32(second)


class Halve:
    stateless = True

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        rows *= np.float32(0.5)
        return rows

    def bound_argmax(self, top: Any, second: Any) -> tuple[Any, Any]:
        return np.float32(top) * np.float32(0.5), np.float32(second) * np.float32(0.5)


@pytest.mark.parametrize("tied", [False, True])
def test_the_logits_chain_picks_the_same_tokens_without_the_bridge(
    without_bridge: ModuleType, monkeypatch: pytest.MonkeyPatch, tied: bool
) -> None:
    rows = np.random.default_rng(3).standard_normal((6, 500)).astype(np.float32)
    if tied:
        rows[5, 10] = rows[5, 11] = rows[5].max() + 1  # the chain has to run in full
    seen: list[int] = []
    twin = without_bridge.top2
    monkeypatch.setattr(without_bridge, "top2", lambda row: seen.append(row.size) or twin(row))
    context = ProcessContext(np.zeros(1, np.int64), np.zeros(0, np.int64), [()] * len(rows))
    chain = ProcessorChain([Lower(), Halve()])
    assert list(chain.argmax(rows, context)) == list(chain(rows, context).argmax(axis=1))
    assert len(seen) == len(rows)
