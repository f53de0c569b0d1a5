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

The window's nodes are fed for their rows only; the root and the trie are verified by decoctl.verify's tree walk:
the longest path whose tokens the target would have produced is accepted, plus the target's own next token. The
last level's rows give a new level: each column yields the n-gram (level 0, ..., level n-2, new) for the pool, and
the window shifts up by one level.

Never slower than greedy (``adaptive``, the default): a step costs a forward over every node of its tree, which on a
CPU is far from free. A DraftGate (decoctl.draft_length) times the steps, the tree steps against plain one-token
steps, and where the trees' committed tokens do not pay for their forwards the controller takes plain steps (the
window waits, the pool and the copies keep learning from the committed text) and probes with a tree now and then,
resuming when one pays.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from decoctl import CapabilityError, Host, Option
from decoctl.draft_length import DraftGate, PlainRun, remembered
from decoctl.verify import DraftTree, LookupIndex, Verdict, Verifier
from decoctl_lookahead.pool import NGramPool

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
    Option(
        name="adaptive",
        type="bool",
        default=True,
        help="take plain one-token steps where the measured cost of the trees says they do not pay (probing again "
        "later); false: a tree every step",
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


class Lookahead:
    """Jacobi lookahead window and n-gram verification in one target forward per step; lossless. ``clock``: what
    the gate's costs are measured with (seconds; tests give one that does not depend on the machine)."""

    def __init__(self, options: dict[str, Any], *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.window = options["window"]
        self.levels = options["ngram"] - 1
        self.guesses = options["guesses"]
        self.pool_per_key = options["pool_per_key"]
        self.allow_degraded = options["allow_degraded"]
        self.verifier = Verifier(sampling=options["sampling"], temperature=options["temperature"])
        self.seed_window = options["seed_window"]
        self.copy_length = options["copy_length"]
        self.adaptive = bool(options["adaptive"])
        self.clock = clock
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
        # an encoder-decoder target's source comes first: its n-grams and copies are the output's likeliest
        prompt = np.concatenate([host.source_tokens, host.prompt_tokens])
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
        self._lookup = LookupIndex(2, 2)  # the copies follow the final two tokens; its tokens are the context
        self._lookup.extend(prompt.tolist())
        self._pooled_until = max(0, len(prompt) - self.levels)
        rng = np.random.default_rng(self.seed_window)
        self._grid = rng.choice(prompt, size=(self.levels, self.window)).astype(np.int64)
        self.verifier.start(host)
        #: whether a step drafts at all, from measured time (kept for the Generator's later generations on this
        #: model and shape); None: a tree every step
        shape = (self.window, self.levels, self.guesses, self.copy_length)
        self.gate = remembered(target.model, ("lookahead", shape), DraftGate) if self.adaptive else None
        self._run = self.gate.run if self.gate is not None else PlainRun()  # plain steps the gate granted
        self.hits = self.verified = self.trimmed = self.copied = self.copy_accepted = self.plain = 0
        host.trace["lookahead"] = {
            "window": self.window,
            "ngram": self.levels + 1,
            "guesses": self.guesses,
            "copy_length": self.copy_length,
        }

    # -- one step -----------------------------------------------------------------------------------------
    def step(self, host: Host) -> None:
        run = self._run
        if run.left or (self.gate is not None and self.gate.plain_now()):
            # the trees do not pay here and no probe is due: a plain step the gate granted, greedy's host calls and a
            # timing (the token is indexed, and the pool catches up on it, when drafting resumes)
            run.left -= 1
            began = self.clock()
            token = self.verifier.plain(host)
            run.seconds += self.clock() - began
            self.plain += 1
            self._lookup.append(token)
            return
        began = self.clock()
        context = self._lookup.tokens
        if self.gate is not None and not self.gate.drafts():
            # the trees do not pay here: a plain one-token step, as lean as greedy's (the pool catches up on the
            # context when drafting resumes)
            token = self.verifier.plain(host)
            self.plain += 1
            self.gate.observe(drafted=False, committed=1, seconds=self.clock() - began)
            if not host.done:
                self._lookup.extend((token,))
            return
        n = self.levels + 1
        self.pool.add_sequence(context, n, start=self._pooled_until)
        self._pooled_until = max(self._pooled_until, len(context) - n + 1)
        verdict, fed = self._draft_and_verify(host, context)
        if self.gate is not None:
            self.gate.observe(drafted=fed > 1, committed=len(verdict.tokens), seconds=self.clock() - began)
        self.verifier.commit(host, verdict)
        if not host.done:
            self._lookup.extend(verdict.tokens)

    def _draft_and_verify(self, host: Host, context: list[int]) -> tuple[Verdict, int]:
        """One lookahead step's verdict and the tokens its forward fed."""
        self.verifier.settle(host)  # the cache's length below must not count the pending token
        target = host.target
        room = target.max_length - target.length - 1
        longest = min(self.levels, host.remaining - 1)
        before = context[-2] if len(context) > 1 else None
        copy = tuple(self._lookup.find(min(self.copy_length, host.remaining - 1))[0])
        found = self.pool.candidates(self.verifier.pending, self.guesses + bool(copy), before) if longest > 0 else []
        cut = [g[:longest] for g in found]
        grams = [g for g in cut if copy[: len(g)] != g][: self.guesses]
        if copy:  # pool n-grams that are a prefix of the copy add nothing to the trie: others take their place
            grams.insert(0, copy)
            self.copied += 1
        if self.degraded or target.length == 0:
            # a tree must follow a cached token (GroupQueryAttention reads a pass with no past as a prompt): when
            # the pending token is the whole context (a one-token prompt) the first step verifies as a chain
            chain = grams[0] if grams else ()
            verdict = self.verifier.chain(host, chain)
            fed = 1 + len(chain)
            self.verified += bool(grams)
        else:
            verdict, fed = self._verify_tree(host, grams, room)
            self.verified += len(grams)
        self.hits += verdict.accepted > 0
        if copy:
            self.copy_accepted += _common_prefix(copy, verdict.tokens[:-1])  # drafts only, not the target's token
        return verdict, fed

    def _verify_tree(self, host: Host, grams: list[tuple[int, ...]], room: int) -> tuple[Verdict, int]:
        """The window (when it fits) and the grams merged into a trie, in one tree forward; the window shifts.
        Returns the verdict and the tree's size."""
        width = self.window if room >= self.levels * self.window + sum(len(g) for g in grams) else 0
        self.trimmed += width == 0
        tree = DraftTree(self.verifier.pending)
        if width:  # the window's guesses are fed for their rows: the walk never enters them
            for parent, token in zip(self._parents, self._grid.reshape(-1).tolist(), strict=True):
                tree.add(parent, token, verify=False)
        for gram in grams:
            if tree.size + len(gram) <= room + 1:
                tree.insert(gram)
        verdict = self.verifier.tree(host, tree)
        if width:
            last_level = host.target.logits()[1 + (self.levels - 1) * width : 1 + self.levels * width]
            self._shift_window(last_level.argmax(axis=-1))
        return verdict, tree.size

    def _shift_window(self, new_level: np.ndarray) -> None:
        grid = self._grid
        width = len(new_level)
        for column in range(width):
            self.pool.add(int(grid[0, column]), [*grid[1:, column].tolist(), int(new_level[column])])
        grid[:-1, :width] = grid[1:, :width]
        grid[-1, :width] = new_level

    def stats(self) -> dict[str, Any]:
        if not hasattr(self, "pool"):  # the generation failed before start() finished
            return {}
        return {
            **self.verifier.stats(),
            "hits": self.hits,
            "verified_ngrams": self.verified,
            "pool_size": self.pool.size,
            "window_skipped_steps": self.trimmed,
            "copies_verified": self.copied,
            "copied_tokens_accepted": self.copy_accepted,
            "degraded": self.degraded,
            "plain_steps": self.plain,
            **(self.gate.stats() if self.gate is not None else {}),
        }
