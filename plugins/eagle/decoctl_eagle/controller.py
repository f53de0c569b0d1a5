"""EAGLE decoding (Li, Wei, Zhang, Zhang: EAGLE, ICML 2024; EAGLE-2, EMNLP 2024) over host primitives only.

Roles: "target" (with a hidden_states output) and "eagle", a draft head whose graph takes the target's features as
its extra input ``target_hidden_states`` (decoctl.testing.build_eagle_head; ``decoctl eagle train`` trains one).

Two kinds of head, told apart by that input's width. An EAGLE-1 head takes the target's final hidden states (width
H) and predicts the next one, which is fed back while drafting. An EAGLE-3 head (Li et al., EAGLE-3, 2025) takes
``[taps | own]`` (width T + H): the target's taps (its aux_hidden_states, the residual stream entering a low, a
middle and a high layer) with zeros, or zeros with the head's own output (its hidden_states) while drafting; the
head applies its fc to the taps itself (decoctl.model.eagle_graph). decoctl_eagle.fit says which a head is, whether it
fits the target, and lays out its rows. Everything below holds for both, "feature" meaning the row the head is fed.

Alignment. Head position i holds the pair (f_i, x_{i+1}): the target's feature at position i (its final hidden
state, the lm_head's input) and the token after it. From it the head predicts the next feature f_{i+1}' (its
hidden_states output) and, through the target's final norm and lm_head, the token x_{i+2}.

Invariant between steps, for a context c_0..c_{L-1} (prompt plus committed tokens): the target's KV cache holds
c_0..c_{L-2}; the last token, the *pending* one, is fed with the next drafts. The head is fed lazily: it holds the
pairs of positions 0..S-1 (S <= L-1), every one built from the target's own features, never from the head's guesses,
and the controller keeps the target's features of positions S..L-2 with their tokens (the *backlog*) for it. Before
the head drafts it *catches up*: it drops what it guessed since S and is fed the backlog in one forward (in chunks of
the host's prefill_chunk); its last row (the *root*) predicts c_L, and its predicted feature f_{L-1}' is where
drafting starts. A backlog longer than ``catch_up_most`` (32) is fed its latest pairs only, after the ones the head
holds: the target's features carry the context before them, and so resuming after a long run of plain steps (or
drafting first after a long prompt) costs a bounded head forward. A step that drafts nothing leaves the head alone, so
a run that never drafts never runs it.

One step:
1. Choose how much to draft. Chain: the draft-length rule (decoctl.draft_length, options adaptive, length_rule,
   k_min, k_max) picks k before each verify; by default the cost rule, which may pick k = 0 (then the step is a plain
   target step), prices the head's catch-up by the backlog's rows, and probes drafting again after a run of zeros.
   With adaptive=false every step drafts k. Tree: every step drafts a tree of the fixed shape (depth, topk, nodes).
2. Draft from the root, after the catch-up. Chain: up to k tokens, each further one from the head fed (the
   predicted feature, the drafted token) at the next position. Tree (EAGLE-2): the root's top-k tokens are depth 1;
   at each further depth the head is fed the k best candidates of the newest depth (by the cumulative
   log-probability of their paths) as an extension of its own token tree, each with its parent's predicted feature,
   and the top-k children of each become candidates; after D depths the N best candidates form the draft tree.
3. Verify with ONE target forward over the pending token and the drafts (a chain, or the tree with tree=parents):
   decoctl.verify's Verifier processes the rows with each node's own prefix and accepts a path and one more token.
4. Commit; keep the target's accepted path (rewind after a chain, keep(path) after a tree); add to the backlog the
   accepted pairs: the target's true features at the pending token and at each accepted draft, each with the token
   after it. Whatever the head guessed while drafting is dropped at its next catch-up.

Acceptance (lossless): greedy takes the target's argmax wherever it is. Sampling a chain, the drafts are drawn from
the head's q: speculative sampling (accept with min(1, p/q), residual norm(max(0, p - q))). Sampling a tree, the
tree is chosen deterministically (top-k, no randomness), so each child is a point-mass proposal: the children are
tried in turn with the point-mass rule (decoctl.verify.choose_child). Every committed token is distributed as the
target's (processed) distribution. The draft-length rule changes only what is drafted; since the cost rule follows
measured time, a sampled generation's exact tokens for a seed can differ between runs (adaptive=false repeats them).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from decoctl import ConfigError, Host, Option, Sequence
from decoctl.draft_length import DraftLength, PlainRun, draft_length
from decoctl.logs import get_logger
from decoctl.model.eagle_graph import EAGLE1
from decoctl.verify import DraftTree, Verdict, Verifier, draw, log_probabilities, probabilities
from decoctl_eagle.backlog import Backlog
from decoctl_eagle.drafts import Candidates
from decoctl_eagle.fit import HeadShape, TargetShape, check_fits

__all__ = ["HEAD", "OPTIONS", "Eagle", "capabilities_for", "check_options", "scratch_for"]

log = get_logger(__name__)

#: the role of the draft head
HEAD = "eagle"
DRAFTING = ("tree", "chain")

OPTIONS = (
    # sized for a CPU, where a tree forward over 17 nodes costs ~2.4 one-token forwards: on the finished demo target
    # (build/tuning_prompts.jsonl, the head trained for 13.5 M tokens) fixed chains of 2 gave 1.12x greedy, k=1 1.08x,
    # k=3 1.07x, EAGLE-2's tree of depth 5, top-k 4, 16 nodes 0.62x (docs/BENCHMARKS.md); how much a chain pays
    # depends on the prompt, so by default the cost rule chooses its length per step, down to drafting nothing
    Option(
        name="drafting",
        type="str",
        default="chain",
        choices=DRAFTING,
        help="tree: EAGLE-2 dynamic tree verified in one tree forward (needs tree inputs); chain: K tokens",
    ),
    Option(
        name="k",
        type="int",
        default=2,
        minimum=1,
        maximum=64,
        help="chain: tokens drafted per step when adaptive=false; where the adaptive rule starts",
    ),
    Option(
        name="adaptive",
        type="bool",
        default=True,
        help="chain: choose k before each step by length_rule within [k_min, k_max]; false: always k (a tree keeps "
        "its fixed shape: depth, topk, nodes)",
    ),
    Option(
        name="length_rule",
        type="str",
        default="cost",
        choices=("cost", "schedule"),
        help="adaptive chain: the length with most expected tokens per measured cost (head and verify time, the "
        "head's catch-up included; 0 drafts a plain target step), or HF's grow/shrink schedule",
    ),
    Option(
        name="k_min",
        type="int",
        default=0,
        minimum=0,
        maximum=64,
        help="adaptive chain: the fewest tokens drafted per step (0: the cost rule may draft nothing; the schedule "
        "drafts at least 1)",
    ),
    Option(name="k_max", type="int", default=8, minimum=1, maximum=64, help="adaptive chain: the most drafted"),
    Option(
        name="catch_up_most",
        type="int",
        default=32,
        minimum=0,
        help="feed the head at most this many of the pairs it missed when it catches up (the latest; the target's "
        "features carry the context before them), so resuming after a long pause, the prompt included, costs a "
        "bounded head forward; 0: every pair",
    ),
    Option(
        name="confidence",
        type="float",
        default=0.0,
        minimum=0.0,
        maximum=1.0,
        help="chain: stop drafting before a token the head gives a lower probability (0: always draft the chosen k)",
    ),
    Option(name="depth", type="int", default=5, minimum=1, maximum=32, help="tree: draft depth D"),
    Option(
        name="topk",
        type="int",
        default=4,
        minimum=1,
        maximum=32,
        help="tree: children proposed per expanded node, and nodes expanded per depth",
    ),
    Option(
        name="nodes", type="int", default=16, minimum=1, maximum=256, help="tree: N, the best drafted tokens verified"
    ),
    Option(name="sampling", type="bool", default=False, help="sample (lossless) instead of greedy"),
    Option(name="temperature", type="float", default=1.0, minimum=1e-6, help="sampling temperature"),
)


def capabilities_for(options: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """Both roles need their hidden states (the target's are the features, the head's the predicted ones) and a
    row per fed token; tree drafting needs tree inputs on both (the head grows its own tree)."""
    tree = ("tree",) if options["drafting"] == "tree" else ()
    return {
        "target": ("hidden_states", "logits_all_positions", *tree),
        HEAD: ("features", "hidden_states", "logits_all_positions", *tree),
    }


def check_options(options: dict[str, Any]) -> None:
    if options["drafting"] != "tree":
        _length_rule(options)  # bounds in the wrong order are refused here, before any model loads
        return
    most = _tree_capacity(options["depth"], options["topk"])
    if options["nodes"] > most:
        raise ConfigError(
            f"eagle option nodes={options['nodes']} is more than the {most} candidates a tree of depth="
            f"{options['depth']} and topk={options['topk']} drafts: lower nodes or raise depth or topk"
        )


def scratch_for(options: dict[str, Any]) -> int:
    """KV positions beyond the committed tokens: the verified drafts plus the pending token on the target, and
    the head's drafting positions."""
    if options["drafting"] == "chain":
        return max(options["k"], options["k_max"]) + 1
    return max(options["nodes"], (options["depth"] - 1) * options["topk"]) + 1


def _length_rule(options: dict[str, Any], host: Host | None = None) -> DraftLength:
    """The chain's draft-length rule; the head's catch-up gives its first draft, so k drafts take k - 1 head
    forwards after it. With ``host``, the cost rule keeps what the Generator's earlier generations measured."""
    if host is None:
        return draft_length(options, controller="eagle", first_from_catch_up=True)
    return draft_length(
        options, controller="eagle", first_from_catch_up=True, model=host.target.model, drafter=host[HEAD].model.name
    )


def _head_shape(target: Sequence, head: Sequence) -> HeadShape:
    """The head's shape, which says how its feature rows are laid out; refused, naming the fix, when the head does
    not fit the target."""
    shape = HeadShape.of_model(head.model)
    what = f"the eagle head (model {head.model.name})"
    check_fits(shape, TargetShape.of_model(target.model), what=what, also=" (tools/train_eagle.py for the demo models)")
    return shape


def _top_probability(row: np.ndarray, top: int) -> float:
    """softmax(row)[top] for the row's argmax ``top`` (masked entries -inf), in float32: a draft-side heuristic."""
    return float(1.0 / np.exp(row - row[top]).sum())


def _tree_capacity(depth: int, topk: int) -> int:
    """Candidates a tree drafts: topk at depth 1, topk * topk at every further depth."""
    return topk + (depth - 1) * topk * topk


class Eagle:
    """Draft with the EAGLE head (a chain of a chosen length, or an EAGLE-2 dynamic tree), verify in one target
    forward; lossless. ``clock``: what the draft-length rule's costs are measured with (seconds; tests give one that
    does not depend on the machine)."""

    def __init__(self, options: dict[str, Any], *, clock: Callable[[], float] = time.perf_counter) -> None:
        check_options(options)
        self._options = options
        self.tree = options["drafting"] == "tree"
        self.confidence = float(options["confidence"])
        self.depth = int(options["depth"])
        self.topk = int(options["topk"])
        self.nodes = int(options["nodes"])
        self.sampling = bool(options["sampling"])
        self.temperature = float(options["temperature"])
        self.clock = clock
        self.catch_up_most = int(options["catch_up_most"])
        #: the latest pairs a catch-up feeds (catch_up_most; 0: all of them)
        self._pairs_fed = self.catch_up_most or sys.maxsize
        self.verifier = Verifier(sampling=self.sampling, temperature=self.temperature)
        self._reset()

    def _reset(self) -> None:
        #: the chain's draft-length rule; what it learnt belongs to one generation (a tree has none: fixed shape)
        self.length: DraftLength | None = None if self.tree else _length_rule(self._options)
        #: plain steps the chain's rule granted (DraftLength.run); a tree has none
        self._run = self.length.run if self.length is not None else PlainRun()
        #: the head's last row and predicted feature after its last catch-up
        self._root: tuple[np.ndarray, np.ndarray] | None = None
        #: the head's architecture and sizes, which say how its feature rows are laid out (set in start())
        self._head = HeadShape(architecture=EAGLE1, hidden=1, vocab=1)
        #: head positions fed the target's own features; the pairs after them wait in the backlog
        self._synced = 0
        self._pairs = Backlog(1, self.catch_up_most)  # sized for the target's features in start()
        self._debug = False
        self.committed = self.largest_tree = self.stopped_unsure = 0
        self.catch_ups = self.caught_up_rows = 0
        self.draft_seconds = self.verify_seconds = self.catch_up_seconds = 0.0

    # -- set-up -----------------------------------------------------------------------------------------------
    def start(self, host: Host) -> None:
        self._reset()
        if not self.tree:
            self.length = _length_rule(self._options, host)
            self._run = self.length.run
        target, head = host.target, host[HEAD]
        prompt = host.prompt_tokens
        self._head = _head_shape(target, head)
        self._pairs = Backlog(self._head.feature_size, self.catch_up_most)
        features = self._head.target_rows(target)
        if len(features) < len(prompt):
            # a chunked prefill keeps the last chunk's hidden states only: run the prompt again for the rest
            features = self._prompt_features(host)
            host.trace["eagle_prompt_refed"] = True
        self.verifier.start(host)
        head.rewind(0)
        if len(prompt) > 1:
            self._defer(prompt[1:], features[:-1])  # the head is fed them when it first drafts
        self._debug = log.isEnabledFor(logging.DEBUG)
        host.trace["drafting"] = "eagle-2 dynamic tree" if self.tree else "eagle chain"
        host.trace["draft_length"] = self._rule_name()
        host.trace["acceptance"] = self._mode()

    def resume(self, host: Host) -> None:
        """Take the row back after other controllers stepped it (decoctl serve's batched greedy step, which leaves
        the last committed token in the target's KV cache with its logits and features ready): that token becomes
        the pending one (``Verifier.take_over``), as after ``start``. The target's features of the tokens stepped
        meanwhile were not kept, so the head drops its backlog and goes on from the context it holds, its positions
        continuing after it (as a catch-up longer than ``catch_up_most`` does): its first drafts may miss, the
        verification keeps every token the target's, and each verify or plain forward feeds it true features again.
        The draft-length rule carries on."""
        self._pairs.clear()
        self.verifier.take_over(host)

    def _prompt_features(self, host: Host) -> np.ndarray:
        target = host.target
        prompt = host.prompt_tokens
        chunk = host.prefill_chunk or len(prompt)
        target.rewind(0)
        rows = []
        for begin in range(0, len(prompt), chunk):
            target.forward(prompt[begin : begin + chunk])
            rows.append(self._head.target_rows(target))
        return np.concatenate(rows)

    def _mode(self) -> str:
        if not self.sampling:
            return "greedy-exact-match"
        return "point-mass-rejection over tree children" if self.tree else "speculative-sampling (min(1, p/q))"

    def _rule_name(self) -> str:
        if self.tree:
            return "tree (fixed shape)"
        return self._options["length_rule"] if self._options["adaptive"] else "fixed"

    # -- one step -----------------------------------------------------------------------------------------------
    def step(self, host: Host) -> None:
        if self.tree:
            self._tree_step(host)
        else:
            self._chain_step(host)

    def _chain_step(self, host: Host) -> None:
        assert self.length is not None  # every chain controller has its rule
        run = self._run
        if run.left or self.length.plain_now(0):
            # drafting stopped or not worth it, no probe due: a plain step the rule granted, greedy's host calls and a
            # timing; of the pairs for the head's next catch-up only the latest catch_up_most are fed, so only the
            # granted steps that many from the run's end keep theirs (written in place)
            run.left -= 1
            began = self.clock()
            token = self.verifier.plain(host)
            seconds = self.clock() - began
            run.seconds += seconds
            self.verify_seconds += seconds
            self.committed += 1
            if run.left < self._pairs_fed:
                self._defer_one(host.target, token)
            return
        clock = self.clock
        began = clock()
        k = self.length.choose(0, self._chain_room(host), self._catch_up_rows())
        if not k:  # a plain target step: no head, no drafting bookkeeping (it runs where drafting does not pay)
            verifying = clock()
            token = self.verifier.plain(host)
            verified = clock()
            self.length.observe(
                bucket=0, drafted=0, accepted=0, verify_seconds=verified - verifying, draft_seconds=verifying - began
            )
            self.verify_seconds += verified - verifying
            self.committed += 1
            if not host.done:  # the pair for the head's next catch-up: the pending token's features and the token
                self._defer_one(host.target, token)
            return
        rows = self.catch_up(host)
        caught = clock()
        drafts, q, first = self._draft_chain(host, k)
        verifying = clock()
        verdict = self.verifier.chain(host, drafts, q)
        # copied before the target moves on: the true features at the pending token and every accepted draft
        features = self._head.target_rows(host.target, slice(0, len(verdict.nodes)))
        verified = clock()
        # the rule prices the catch-up with the first draft, which its last row gives, and each further draft apart
        self.length.observe(
            bucket=0,
            drafted=len(drafts),
            accepted=verdict.accepted,
            verify_seconds=verified - verifying,
            draft_seconds=verifying - first,
            catch_up_rows=rows,
            catch_up_seconds=first - began,
        )
        if self._debug:
            log.debug("decoctl.eagle_step", k=k, drafted=len(drafts), accepted=verdict.accepted, caught_up=rows)
        self._account(began, caught, verifying, verified, rows)
        self._finish(host, verdict, features)

    def _tree_step(self, host: Host) -> None:
        clock = self.clock
        began = clock()
        room = self.verifier.room(host)
        drafting = min(self.nodes, room) > 0 and self._synced + len(self._pairs) > 0
        rows = self.catch_up(host) if drafting else 0
        caught = clock()
        tree = self._draft_tree(host, room) if drafting else Candidates().tree(self.verifier.pending, 0)
        verifying = clock()
        self.largest_tree = max(self.largest_tree, tree.size)
        verdict = self.verifier.tree(host, tree)
        features = self._head.target_rows(host.target, verdict.nodes)
        verified = clock()
        self._account(began, caught, verifying, verified, rows)
        self._finish(host, verdict, features)

    def _account(self, began: float, caught: float, verifying: float, verified: float, rows: int) -> None:
        if rows:
            self.catch_up_seconds += caught - began
        self.draft_seconds += verifying - caught
        self.verify_seconds += verified - verifying

    def _finish(self, host: Host, verdict: Verdict, features: np.ndarray) -> None:
        self.committed += self.verifier.commit(host, verdict)
        if not host.done:
            self._defer(verdict.tokens, features)

    # -- drafting -------------------------------------------------------------------------------------------------
    def _chain_room(self, host: Host) -> int:
        """The most tokens a chain may draft now: what the verify takes, and what the head holds after catching up
        (k drafts take k - 1 positions after its root); 0 while it has no pair to draft from."""
        fed = self._synced + self._catch_up_rows()
        if not fed:
            return 0
        return min(self.verifier.room(host), host[HEAD].max_length - fed + 1)

    def _draft_chain(self, host: Host, k: int) -> tuple[list[int], np.ndarray | None, float]:
        """Up to k tokens from the root, when sampling the float64[k, vocab] distributions they were drawn from, and
        the clock when the first was drafted (the rest took a head forward each)."""
        assert self._root is not None  # a catch-up came first
        head = host[HEAD]
        row, feature = self._root
        drafts: list[int] = []
        qs: list[np.ndarray] = []
        first: float | None = None
        for index in range(k):
            processed = host.process(row[None, :], paths=[list(drafts)])
            # the head's doubt predicts a rejection (EAGLE-2's observation): stop and verify what there is. The
            # test reads the head's row only (its top probability), never the token drawn from it, so a proposal
            # that is made is still drawn from exactly q and the min(1, p/q) rule stays exact
            if self.sampling:
                q = probabilities(processed, self.temperature)[0]
                if q.max() < self.confidence:
                    self.stopped_unsure += 1
                    break
                token = draw(q, host.rng)
                qs.append(q)
            else:
                token = int(np.argmax(processed[0]))
                if self.confidence and _top_probability(processed[0], token) < self.confidence:
                    self.stopped_unsure += 1
                    break
            drafts.append(token)
            if index == 0:
                first = self.clock()
            if index + 1 < k:
                row = head.forward([token], features=self._head.own_rows(feature[None, :]))[-1]
                feature = head.hidden_states()[-1]
        return drafts, (np.stack(qs) if self.sampling and qs else None), self.clock() if first is None else first

    def _draft_tree(self, host: Host, room: int) -> DraftTree:
        assert self._root is not None  # a catch-up came first
        head = host[HEAD]
        pending = self.verifier.pending
        nodes = min(self.nodes, room)
        depth = min(self.depth, room, (head.max_length - head.length) // self.topk + 1)
        temperature = self.temperature if self.sampling else 1.0
        row, root_feature = self._root
        candidates = Candidates()
        log_probs = log_probabilities(host.process(row[None, :], paths=[[]]), temperature)[0]
        frontier = candidates.expand(-1, log_probs, self.topk)
        predicted: dict[int, np.ndarray] = {}  # candidate -> the head's predicted feature after it
        place: dict[int, int] = {}  # candidate -> its index in the head's pending tree
        for _ in range(1, depth):
            if not frontier:
                break
            parents = [candidates.parents[c] for c in frontier]
            features = self._head.own_rows(np.stack([root_feature if p < 0 else predicted[p] for p in parents]))
            rows = head.forward(
                [candidates.tokens[c] for c in frontier],
                [-1 if p < 0 else place[p] for p in parents],
                features=features,
            )
            hidden = head.hidden_states()
            for index, c in enumerate(frontier):
                place[c] = len(place)
                predicted[c] = np.array(hidden[index])
            processed = host.process(rows, paths=[list(candidates.paths[c]) for c in frontier])
            grown = candidates.expand_rows(frontier, log_probabilities(processed, temperature), self.topk)
            frontier = candidates.best(grown, self.topk)
        return candidates.tree(pending, nodes)

    # -- the head ----------------------------------------------------------------------------------------------
    def _defer(self, tokens: Any, features: np.ndarray) -> None:
        """Keep pairs of true features and the tokens after them for the head's next catch-up."""
        self._pairs.add(np.asarray(tokens, np.int64), features)

    def _defer_one(self, target: Any, token: int) -> None:
        """_defer of a plain step's one pair, its feature row written in place from the target's last forward."""
        row = self._pairs.add_one(token)  # the last row: a plain forward's one, or the prefill's last (take_over)
        taps = self._head.taps
        if taps:
            row[:taps] = target.hidden_states(kind="aux")[-1]
            row[taps:] = 0.0
        else:
            row[:] = target.hidden_states()[-1]

    def _catch_up_rows(self) -> int:
        """The rows the next catch-up feeds: the backlog, or its latest ``catch_up_most`` pairs."""
        return self._pairs.rows

    def catch_up(self, host: Host) -> int:
        """Bring the head up to the committed context now (a step does it before it drafts): drop what it guessed
        since its last catch-up and feed it the backlog, pairs of true features and the tokens after them, in one
        forward (chunks of the host's prefill_chunk); its last row becomes the root. Of a backlog longer than
        ``catch_up_most`` only the latest pairs are fed (the head's positions go on after the ones it holds).
        Returns the rows fed."""
        rows = self._catch_up_rows()
        if not rows:
            return 0
        head = host[HEAD]
        head.rewind(self._synced)
        tokens, features = self._pairs.latest()
        head.prefill(tokens, host.prefill_chunk, features=features)
        self._pairs.clear()
        self._synced = head.length
        self.catch_ups += 1
        self.caught_up_rows += rows
        predicted = head.hidden_states()[-1]
        if predicted.shape[0] != self._head.hidden:
            raise ConfigError(
                f"the eagle head (model {head.model.name}) predicts features of width {predicted.shape[0]} but the "
                f"target's hidden size is {self._head.hidden}: its hidden_states output must be what it is fed back "
                "while drafting; re-export the head (decoctl eagle train)"
            )
        self._root = (np.array(head.logits()[-1]), np.array(predicted))
        return rows

    def stats(self) -> dict[str, Any]:
        steps, drafted = self.verifier.steps, self.verifier.drafted
        return {
            "drafting": "tree" if self.tree else "chain",
            **self.verifier.stats(),
            "tau": self.committed / steps if steps else 0.0,
            "mean_drafted_per_step": drafted / steps if steps else 0.0,
            "length_rule": self._rule_name(),
            **(self.length.stats() if self.length else {"largest_tree": self.largest_tree}),
            "stopped_unsure": self.stopped_unsure,
            "catch_ups": self.catch_ups,
            "caught_up_rows": self.caught_up_rows,
            "catch_up_seconds": self.catch_up_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
        }
