"""A token tree fed in one forward: parent array in, position ids and additive attention bias out.

A tree of n tokens is fed after a cached prefix of P tokens. ``parents[i]`` is -1 when token i hangs directly
off the prefix (several roots are allowed: they are alternative next tokens) or the index of an earlier token
(``parents[i] < i``: parents come before their children, so the feed order is topological). Token i sees the
whole prefix, its ancestors and itself, and sits at position P + depth(i), exactly where it would sit in a
plain sequence made of the prefix and its root-to-node path. Because every ancestor has a smaller index, the
tree mask lies inside the causal one, so attention kernels that always apply a causal mask
(GroupQueryAttention does) compute the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from decoctl.errors import SequenceError

__all__ = ["Tree"]


@attrs.frozen(eq=False)
class Tree:
    """A validated parent array. ``parents`` and ``depths`` are int64[n] (a root has depth 0)."""

    parents: np.ndarray
    depths: np.ndarray

    @classmethod
    def from_parents(cls, parents: Sequence[int] | np.ndarray, n: int) -> Tree:
        """Check that ``parents`` describes n tokens in topological order; raise SequenceError if not."""
        array = np.asarray(parents, dtype=np.int64).reshape(-1)
        if array.size != n:
            raise SequenceError(f"forward(tree=...) got {n} tokens but {array.size} parents: give one per token")
        bad = [i for i in range(n) if not -1 <= array[i] < i]
        if bad:
            i = bad[0]
            raise SequenceError(
                f"forward(tree=...): parent {int(array[i])} of token {i} must be -1 (a root, attached to the "
                f"cached prefix) or the index of an earlier token (0..{i - 1}); order the tree parents first"
            )
        depths = np.zeros(n, np.int64)
        for i in range(n):
            parent = array[i]
            if parent >= 0:
                depths[i] = depths[parent] + 1
        return cls(parents=array, depths=depths)

    @property
    def size(self) -> int:
        return int(self.parents.size)

    @property
    def is_chain(self) -> bool:
        """Every token's parent is the token before it: a plain sequence."""
        return bool(np.array_equal(self.parents, np.arange(-1, self.size - 1)))

    def positions(self, prefix: int) -> np.ndarray:
        """int64[n]: the position id of each token after a prefix of ``prefix`` tokens."""
        return prefix + self.depths

    def bias(self) -> np.ndarray:
        """float32[n, n] additive bias among the tree's tokens: 0 where token i may see token j (j is i or one
        of its ancestors), -inf elsewhere. The cached prefix is visible to every token and is not included."""
        n = self.size
        visible = np.zeros((n, n), dtype=bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                visible[i] = visible[parent]
            visible[i, i] = True
        return np.where(visible, np.float32(0.0), np.float32(-np.inf))

    def path(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """Check that ``indices`` is a root-to-node path (increasing, each token the child of the one before,
        the first a root) and return it as int64[k]; an empty path is valid. Raise SequenceError if not."""
        path = np.asarray(indices, dtype=np.int64).reshape(-1)
        for j, index in enumerate(path):
            expected = -1 if j == 0 else int(path[j - 1])
            if not 0 <= index < self.size or self.parents[index] != expected:
                where = "a root (parent -1)" if j == 0 else f"a child of token {expected}"
                raise SequenceError(
                    f"keep({[int(i) for i in path]}): token {int(index)} at place {j} is not {where} in the "
                    f"last forward (parents {[int(p) for p in self.parents]}); keep a root-to-node path"
                )
        return path
