"""The EAGLE head's backlog keeps the pairs a catch-up feeds, in order, whatever mix of row-by-row and bulk adds."""

from __future__ import annotations

import numpy as np
import pytest
from decoctl_eagle.backlog import Backlog


def reference(pairs: list[tuple[int, np.ndarray]], most: int) -> tuple[list[int], np.ndarray]:
    kept = pairs[-most:] if most else pairs
    return [t for t, _ in kept], np.array([f for _, f in kept], np.float32).reshape(len(kept), -1)


@pytest.mark.parametrize("most", [0, 1, 4, 32])
def test_the_latest_pairs_come_back_in_order(most: int) -> None:
    rng = np.random.default_rng(most)
    backlog, pairs = Backlog(3, most), []
    for step in range(300):
        if rng.random() < 0.7:
            token, feature = int(rng.integers(1000)), rng.normal(size=3).astype(np.float32)
            backlog.add_one(token)[:] = feature
            pairs.append((token, feature))
        else:
            count = int(rng.integers(1, 80))
            tokens, features = rng.integers(1000, size=count), rng.normal(size=(count, 3)).astype(np.float32)
            backlog.add(tokens, features)
            pairs.extend(zip(tokens.tolist(), features, strict=True))
        if step % 37 == 36:  # a catch-up
            tokens, features = backlog.latest()
            expected_tokens, expected_features = reference(pairs, most)
            assert tokens.tolist() == expected_tokens
            np.testing.assert_array_equal(features, expected_features)
            assert backlog.rows == len(expected_tokens)
            backlog.clear()
            pairs = []
    assert len(backlog) == len(pairs) if not most else backlog.rows == min(len(pairs), most)


def test_a_bounded_backlog_never_grows_past_twice_its_bound() -> None:
    backlog = Backlog(640, 32)
    backlog.add(np.arange(5000), np.zeros((5000, 640), np.float32))  # a long prompt: only its last 32 are kept
    for token in range(1000):
        backlog.add_one(token)[:] = 1.0
    assert backlog.capacity <= 64
    tokens, _ = backlog.latest()
    assert tokens.tolist() == list(range(968, 1000))
