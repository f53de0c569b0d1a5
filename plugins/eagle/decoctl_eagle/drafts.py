"""EAGLE-2's dynamic draft tree: candidates scored by the cumulative log-probability of their path.

The head proposes the top-k children of a node from its row; a child's score is its parent's score plus the log of
the head's probability for it, so scores only fall along a path. Growing the tree, the k best candidates of the
newest depth are expanded next; at the end the N best candidates overall form the tree that is verified. Since a
child never scores above its parent (ties go to the earlier, shallower candidate), the N best always include every
ancestor of each one: the selection is a tree without any repair, which decoctl.verify's DraftTree holds.
"""

from __future__ import annotations

import numpy as np

from decoctl.verify import DraftTree

__all__ = ["Candidates"]


class Candidates:
    """The drafted tokens of one step while the tree grows. Candidate c: ``tokens[c]``, ``parents[c]`` (another
    candidate, or -1 for a child of the pending token), ``scores[c]`` (cumulative log-probability) and
    ``paths[c]`` (the drafted tokens from depth 1 down to c)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.scores: list[float] = []
        self.paths: list[tuple[int, ...]] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def expand(self, parent: int, log_probs: np.ndarray, k: int) -> list[int]:
        """Add the k most probable children of ``parent`` (-1: the pending token) from the head's float64[vocab]
        log-probabilities; tokens of probability 0 are never drafted. Returns the new candidates."""
        return self.expand_rows([parent], log_probs[None, :], k)

    def expand_rows(self, parents: list[int], log_probs: np.ndarray, k: int) -> list[int]:
        """``expand`` for several parents at once, row i of float64[n, vocab] ``log_probs`` belonging to
        ``parents[i]``: one partition and one sort over all rows instead of a pair per row. Returns the new
        candidates, parent by parent, each parent's most probable first."""
        k = min(k, log_probs.shape[1])
        top = np.argpartition(-log_probs, k - 1, axis=1)[:, :k]
        values = np.take_along_axis(log_probs, top, axis=1)
        order = np.argsort(-values, axis=1, kind="stable")
        top, values = np.take_along_axis(top, order, axis=1).tolist(), np.take_along_axis(values, order, axis=1)
        added = []
        for parent, tokens, logs in zip(parents, top, values.tolist(), strict=True):
            base = 0.0 if parent < 0 else self.scores[parent]
            prefix = () if parent < 0 else self.paths[parent]
            for token, log_p in zip(tokens, logs, strict=True):
                if log_p == -np.inf:
                    break
                added.append(len(self.tokens))
                self.tokens.append(token)
                self.parents.append(parent)
                self.scores.append(base + log_p)
                self.paths.append((*prefix, token))
        return added

    def best(self, among: list[int], k: int) -> list[int]:
        """The k best of ``among`` by score, earlier candidates first on ties."""
        return sorted(among, key=lambda c: (-self.scores[c], c))[:k]

    def tree(self, pending: int, size: int) -> DraftTree:
        """The ``size`` best candidates under the pending token, as a tree ordered by depth. Siblings come out of
        one ``expand`` most probable first, so they are added best first: the order the point-mass rule tries
        them in (any order is exact; this one accepts most)."""
        chosen = sorted(self.best(list(range(len(self))), size), key=lambda c: (len(self.paths[c]), c))
        tree = DraftTree(pending)
        node: dict[int, int] = {}
        for c in chosen:
            parent = self.parents[c]
            node[c] = tree.add(0 if parent < 0 else node[parent], self.tokens[c])
        return tree
