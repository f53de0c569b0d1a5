"""Lookahead decoding (Fu, Bailis, Stoica, Zhang; ICML 2024) as one tree forward per step.

Between steps the target holds the context except its last token, the *pending* one. One step feeds a token
tree rooted at the pending token:

- the lookahead branch, a Jacobi window of ``ngram - 1`` levels by ``window`` columns: level 0 is a chain
  (column c guesses the token c + 1 places after the pending one, seeing the columns before it), and the token
  at level l of column c hangs below level l - 1 of the same column, so it sees its column's lower levels and
  level 0 up to c: positions and visibility exactly as in the paper's attention mask;
- the verification branch, up to ``guesses`` pool n-grams that start with the pending token (those that
  followed the same two tokens first, then the most recent), merged into a trie below the root (shared prefixes
  are fed once); with ``copy_length`` L > 0, first a copy: the up to L tokens that followed the last earlier
  occurrence of the context's final two tokens (the pool's n-grams stop at N - 1 tokens, while text that repeats
  often repeats for longer; the copy is prompt lookup's draft, verified in the same forward).

The root's row and the trie's rows verify the guesses: the longest path whose tokens the target would have
produced is accepted, plus the target's own next token. The last level's rows give a new level: each column
yields the n-gram (level 0, ..., level n-2, new) for the pool, and the window shifts up by one level.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from decoctl import CapabilityError, Host, Option
from decoctl.acceptance import choose_child, probabilities
from decoctl_lookahead.pool import NGramPool, PairIndex

__all__ = ["OPTIONS", "Lookahead"]

OPTIONS = (
    # defaults sized for a CPU, where a forward over n tokens costs far more than one (docs/BENCHMARKS.md). On the
    # finished demo target (tuned on build/tuning_prompts.jsonl) one Jacobi column of 2 levels and 1 guess (trees of
    # ~4 nodes) gave 1.054x greedy where W=1, N=4, G=2 gave 0.91x and wider shapes less. A copy of up to 8 tokens
    # (copy_length) raised that to ~1.25x, best with a one-level window (N=2): the copy finds the long repeats, and
    # the window's extra level costs more than its n-grams bring. On Gemma 3 270M (edit prompts) W=2, N=3, G=3 beat
    # the paper's W=4, N=4, G=4 (1.35x vs 0.96x): a bigger model's verification curve is flatter, so it takes wider
    # trees.
    Option(name="window", type="int", default=1, minimum=1, help="W: Jacobi window columns"),
    Option(name="ngram", type="int", default=2, minimum=2, help="N: n-gram size (the window has N-1 levels)"),
    Option(name="guesses", type="int", default=1, minimum=1, help="G: pool n-grams verified per step"),
    Option(name="pool_per_key", type="int", default=16, minimum=1, help="n-grams kept per first token"),
    Option(
        name="copy_length",
        type="int",
        default=8,
        minimum=0,
        help="L: also verify up to L tokens copied from after the last earlier occurrence of the final two tokens",
    ),
    Option(
        name="allow_degraded",
        type="bool",
        default=False,
        help="on a model without tree inputs, verify one pool n-gram per step with no Jacobi window",
    ),
    Option(name="sampling", type="bool", default=False, help="sample (lossless) instead of greedy"),
    Option(name="temperature", type="float", default=1.0, minimum=1e-6, help="sampling temperature"),
    Option(name="seed_window", type="int", default=0, help="seed of the window's initial guesses (prompt tokens)"),
)

DEGRADED = "lookahead: verification branch only (model has no tree inputs; allow_degraded=true)"


def scratch_for(options: dict[str, Any]) -> int:
    """Tree nodes beyond the pending token: the window plus a full verification trie (and the copy)."""
    return 1 + (options["ngram"] - 1) * (options["window"] + options["guesses"]) + options["copy_length"]


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


class _Trie:
    """Verification n-grams merged below the root (node 0). ``children[node]`` maps token -> node index."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.paths: list[list[int]] = []
        self.children: dict[int, dict[int, int]] = {0: {}}

    def insert(self, gram: tuple[int, ...], base: int) -> None:
        """Insert a continuation of the root; new nodes get indices from ``base`` on, in feed order."""
        node, path = 0, []
        for token in gram:
            path = [*path, token]
            child = self.children[node].get(token)
            if child is None:
                child = base + len(self.tokens)
                self.tokens.append(token)
                self.parents.append(node)
                self.paths.append(path)
                self.children[node][token] = child
                self.children[child] = {}
            node = child


class Lookahead:
    """Jacobi lookahead window and n-gram verification in one target forward per step; lossless."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.window = options["window"]
        self.levels = options["ngram"] - 1
        self.guesses = options["guesses"]
        self.pool_per_key = options["pool_per_key"]
        self.allow_degraded = options["allow_degraded"]
        self.sampling = options["sampling"]
        self.temperature = options["temperature"]
        self.seed_window = options["seed_window"]
        self.copy_length = options["copy_length"]
        self._parents = self._window_parents()

    def _window_parents(self) -> list[int]:
        """Parent indices of the window's nodes (node 0 is the pending token); node (l, c) is 1 + l*W + c."""
        width = self.window
        parents = []
        for level in range(self.levels):
            for column in range(width):
                if level == 0:
                    parents.append(column)  # column 0's parent is the root (0), column c's is (0, c - 1)
                else:
                    parents.append(1 + (level - 1) * width + column)
        return parents

    # -- set-up -----------------------------------------------------------------------------------------
    def start(self, host: Host) -> None:
        target = host.target
        prompt = host.prompt_tokens
        self.degraded = "tree" not in target.capabilities
        if self.degraded and not self.allow_degraded:
            raise CapabilityError(
                f"lookahead needs tree verification, which model {target.model.name} lacks: run `decoctl models "
                "enable-tree SRC DST` to add position_ids and attention_bias, or pass -o allow_degraded=true for "
                "verification without the Jacobi window"
            )
        if self.degraded:
            host.trace.setdefault("degraded", []).append(DEGRADED)
        self.pool = NGramPool(self.pool_per_key)
        self.pool.add_sequence(prompt.tolist(), self.levels + 1)
        self._pairs = PairIndex()  # holds the context (prompt and committed output) the copies come from
        self._pairs.extend(prompt.tolist())
        self._context = self._pairs.tokens
        self._pooled_until = max(0, len(self._context) - self.levels)
        rng = np.random.default_rng(self.seed_window)
        self._grid = rng.choice(prompt, size=(self.levels, self.window)).astype(np.int64)
        target.rewind(target.length - 1)
        self._pending = int(prompt[-1])
        self.steps = self.accepted = self.hits = self.verified = self.trimmed = 0
        self.copied = self.copy_accepted = 0
        #: target forwards by tokens fed -> count, tree and chain apart (the bench prices them on its cost curve)
        self.tree_sizes: dict[int, int] = {}
        self.chain_sizes: dict[int, int] = {}
        host.trace["lookahead"] = {
            "window": self.window,
            "ngram": self.levels + 1,
            "guesses": self.guesses,
            "copy_length": self.copy_length,
        }

    # -- one step -----------------------------------------------------------------------------------------
    def step(self, host: Host) -> None:
        target = host.target
        base = target.length
        room = target.max_length - base - 1
        longest = min(self.levels, host.remaining - 1)
        before = self._context[-2] if len(self._context) > 1 else None
        copy = tuple(self._pairs.copy(min(self.copy_length, host.remaining - 1)))
        found = self.pool.candidates(self._pending, self.guesses + bool(copy), before) if longest > 0 else []
        cut = [g[:longest] for g in found]
        grams = [g for g in cut if copy[: len(g)] != g][: self.guesses]
        if copy:  # pool n-grams that are a prefix of the copy add nothing to the trie: others take their place
            grams.insert(0, copy)
            self.copied += 1
        if self.degraded or base == 0:
            # a tree must follow a cached token (GroupQueryAttention reads a pass with no past as a prompt): when
            # the pending token is the whole context (a one-token prompt) the first step verifies as a chain
            self._verify_chain(host, base, grams[:1])
            return
        width = self.window if room >= self.levels * self.window + sum(len(g) for g in grams) else 0
        self.trimmed += width == 0
        window_nodes = self.levels * width
        trie = _Trie()
        for gram in grams:
            if 1 + window_nodes + len(trie.tokens) + len(gram) <= room + 1:
                trie.insert(gram, 1 + window_nodes)
        tokens = [self._pending, *self._grid[:, :width].reshape(-1).tolist(), *trie.tokens]
        parents = [-1, *(self._parents if width else []), *trie.parents]
        rows = target.forward(tokens, tree=parents)
        self.tree_sizes[len(tokens)] = self.tree_sizes.get(len(tokens), 0) + 1
        verify_nodes = [0, *range(1 + window_nodes, len(tokens))]
        row_of = {node: i for i, node in enumerate(verify_nodes)}
        path, following = self._walk(host, self._verdicts(host, rows[verify_nodes], [[], *trie.paths]), row_of, trie)
        if width:
            last_level = rows[1 + (self.levels - 1) * width : 1 + self.levels * width]
            self._shift_window(last_level.argmax(axis=-1))
        self.steps += 1
        self.verified += len(grams)
        self.hits += bool(path)
        self.accepted += len(path)
        new = [tokens[node] for node in path] + [following]
        if copy:
            self.copy_accepted += _common_prefix(copy, new[:-1])  # accepted drafts only, not the target's token
        self._finish_step(host, new, keep=[0, *path])

    def _verdicts(self, host: Host, rows: np.ndarray, paths: list[list[int]]) -> np.ndarray:
        """What the walk reads for each verified row: its processed logits when sampling, else its argmax."""
        return host.process(rows, paths=paths) if self.sampling else host.argmax(rows, paths=paths)

    def _walk(self, host: Host, verdicts: np.ndarray, row_of: dict[int, int], trie: _Trie) -> tuple[list[int], int]:
        """Follow the trie from the root while the target agrees; return (accepted nodes, next token).
        ``verdicts``: per row, the processed logits (sampling) or the processed argmax (greedy)."""
        node, path = 0, []
        while True:
            row = verdicts[row_of[node]]
            children = trie.children.get(node, {})
            if not self.sampling:
                token = int(row)
                child = children.get(token)
                if child is None:
                    return path, token
            else:
                token, child = self._sample_child(row, children, host.rng)
                if child is None:
                    return path, token
            path.append(child)
            node = child

    def _sample_child(
        self, row: np.ndarray, children: dict[int, int], rng: np.random.Generator
    ) -> tuple[int, int | None]:
        """Point-mass rejection over distinct candidate tokens (decoctl.acceptance.choose_child): exactly p overall.
        Returns the token taken and its child node, or None when no candidate was taken."""
        place, token = choose_child(probabilities(row, self.temperature), list(children), rng)
        return token, (None if place is None else children[token])

    def _shift_window(self, new_level: np.ndarray) -> None:
        grid = self._grid
        width = len(new_level)
        for column in range(width):
            self.pool.add(int(grid[0, column]), [*grid[1:, column].tolist(), int(new_level[column])])
        grid[:-1, :width] = grid[1:, :width]
        grid[-1, :width] = new_level

    def _verify_chain(self, host: Host, base: int, grams: list[tuple[int, ...]]) -> None:
        """Degraded mode: one candidate as a chain [pending, g1..gm]; no window."""
        target = host.target
        gram = list(grams[0]) if grams else []
        rows = self._verdicts(host, target.forward([self._pending, *gram]), [gram[:i] for i in range(len(gram) + 1)])
        self.chain_sizes[len(gram) + 1] = self.chain_sizes.get(len(gram) + 1, 0) + 1
        trie = _Trie()
        if gram:
            trie.insert(tuple(gram), 1)
        path, following = self._walk(host, rows, {i: i for i in range(len(rows))}, trie)
        self.steps += 1
        self.verified += bool(gram)
        self.hits += bool(path)
        self.accepted += len(path)
        new = [gram[node - 1] for node in path] + [following]
        self._finish_step(host, new, rewind_to=base + 1 + len(path))

    def _finish_step(
        self, host: Host, new: list[int], *, keep: list[int] | None = None, rewind_to: int | None = None
    ) -> None:
        host.commit(new)
        if host.done:
            return
        if keep is not None:
            host.target.keep(keep)
        else:
            assert rewind_to is not None
            host.target.rewind(rewind_to)
        self._pending = new[-1]
        self._pairs.extend(new)  # self._context is its token list
        context = self._context
        n = self.levels + 1
        self.pool.add_sequence(context, n, start=self._pooled_until)
        self._pooled_until = max(self._pooled_until, len(context) - n + 1)

    def stats(self) -> dict[str, Any]:
        if not hasattr(self, "pool"):  # the generation failed before start() finished
            return {}
        return {
            "steps": self.steps,
            "accepted_guess_tokens": self.accepted,
            "hits": self.hits,
            "verified_ngrams": self.verified,
            "pool_size": self.pool.size,
            "window_skipped_steps": self.trimmed,
            "copies_verified": self.copied,
            "copied_tokens_accepted": self.copy_accepted,
            "degraded": self.degraded,
            "verify_sizes": dict(self.chain_sizes),
            "tree_verify_sizes": dict(self.tree_sizes),
        }
