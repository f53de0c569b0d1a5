"""Hypothesis strategies and helpers for token trees, shared by the tree tests."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def parent_arrays(draw: st.DrawFn, max_nodes: int = 16) -> list[int]:
    """Topologically ordered parent arrays: each token's parent is -1 (a root) or an earlier token."""
    n = draw(st.integers(1, max_nodes))
    return [draw(st.integers(-1, i - 1)) for i in range(n)]


def ancestors(parents: list[int], node: int) -> list[int]:
    """node's root-to-node path, node included; [] for node -1."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
