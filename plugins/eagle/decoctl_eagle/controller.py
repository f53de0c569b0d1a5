"""EAGLE decoding (Li, Wei, Zhang, Zhang: EAGLE, ICML 2024; EAGLE-2, EMNLP 2024) over host primitives only.

Roles: "target" (with a hidden_states output) and "eagle", a draft head whose graph takes the target's features as
its extra input ``target_hidden_states`` (decoctl.testing.build_eagle_head; ``decoctl eagle train`` trains one).

Two kinds of head, told apart by that input's width. An EAGLE-1 head takes the target's final hidden states (width
H) and predicts the next one, which is fed back while drafting. An EAGLE-3 head (Li et al., EAGLE-3, 2025) takes
``[taps | own]`` (width T + H): the target's taps (its aux_hidden_states, the residual stream entering a low, a
middle and a high layer) with zeros, or zeros with the head's own output (its hidden_states) while drafting; the
head applies its fc to the taps itself (decoctl.testing.eagle). Everything below holds for both, "feature" meaning
the row the head is fed.

Alignment. Head position i holds the pair (f_i, x_{i+1}): the target's feature at position i (its final hidden
state, the lm_head's input) and the token after it. From it the head predicts the next feature f_{i+1}' (its
hidden_states output) and, through the target's final norm and lm_head, the token x_{i+2}.

Invariant between steps, for a context c_0..c_{L-1} (prompt plus committed tokens): the target's KV cache holds
c_0..c_{L-2}; the last token, the *pending* one, is fed with the next drafts. The head holds the pairs of positions
0..L-2, every one built from the target's own features, never from the head's guesses; its last row (the *root*)
predicts c_L, and its predicted feature f_{L-1}' is where drafting starts.

One step:
1. Draft from the root. Chain: K tokens, each further one from the head fed (the predicted feature, the drafted
   token) at the next position. Tree (EAGLE-2): the root's top-k tokens are depth 1; at each further depth the head
   is fed the k best candidates of the newest depth (by the cumulative log-probability of their paths) as an
   extension of its own token tree, each with its parent's predicted feature, and the top-k children of each
   become candidates; after D depths the N best candidates form the draft tree.
2. Verify with ONE target forward over the pending token and the drafts (a chain, or the tree with tree=parents):
   decoctl.verify's Verifier processes the rows with each node's own prefix and accepts a path and one more token.
3. Commit; keep the target's accepted path (rewind after a chain, keep(path) after a tree); rewind the head to its
   synced length and feed it the accepted pairs: the target's true features at the pending token and at each
   accepted draft, each with the token after it. That is m + 1 rows in one head forward, whose last row is the
   next root: whatever the head guessed while drafting is dropped.

Acceptance (lossless): greedy takes the target's argmax wherever it is. Sampling a chain, the drafts are drawn from
the head's q: speculative sampling (accept with min(1, p/q), residual norm(max(0, p - q))). Sampling a tree, the
tree is chosen deterministically (top-k, no randomness), so each child is a point-mass proposal: the children are
tried in turn with the point-mass rule (decoctl.verify.choose_child). Every committed token is distributed as the
target's (processed) distribution.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from decoctl import CapabilityError, ConfigError, Host, Option
from decoctl.verify import DraftTree, Verdict, Verifier, draw, log_probabilities, probabilities
from decoctl_eagle.drafts import Candidates

__all__ = ["HEAD", "OPTIONS", "Eagle", "capabilities_for", "check_options", "scratch_for"]

#: the role of the draft head
HEAD = "eagle"
DRAFTING = ("tree", "chain")

OPTIONS = (
    # defaults sized for a CPU, where a tree forward over 17 nodes costs ~2.4 one-token forwards: on the finished demo
    # target (build/tuning_prompts.jsonl, the head trained for 13.5 M tokens) a chain of 2 gave 1.12x greedy, k=1
    # 1.08x, k=3 1.07x, EAGLE-2's tree of depth 5, top-k 4, 16 nodes 0.62x (docs/BENCHMARKS.md)
    Option(
        name="drafting",
        type="str",
        default="chain",
        choices=DRAFTING,
        help="tree: EAGLE-2 dynamic tree verified in one tree forward (needs tree inputs); chain: K tokens",
    ),
    Option(name="k", type="int", default=2, minimum=1, maximum=64, help="chain: tokens drafted per step"),
    Option(
        name="confidence",
        type="float",
        default=0.0,
        minimum=0.0,
        maximum=1.0,
        help="chain: stop drafting before a token the head gives a lower probability (0: always draft k)",
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
        return options["k"] + 1
    return max(options["nodes"], (options["depth"] - 1) * options["topk"]) + 1


def _taps_width(target: Any, head: Any, hidden: int) -> int:
    """0 for a head fed the target's final hidden states (EAGLE-1), the taps' width T for one fed ``[taps | own]``
    (EAGLE-3); a head of another width was trained for another target."""
    width = head.feature_size
    if width == hidden:
        return 0
    has_taps = "aux_hidden_states" in target.capabilities
    taps = target.hidden_states(kind="aux").shape[1] if has_taps else 0
    if has_taps and width == taps + hidden:
        return taps
    if not has_taps and width > hidden and width % hidden == 0:
        raise CapabilityError(
            f"the eagle head (model {head.model.name}) takes features of width {width}: an EAGLE-3 head, which reads "
            f"the target's aux_hidden_states, but the target (model {target.model.name}) has none: run it on the copy "
            "`decoctl models enable-taps` made (the one the head was trained on), or export the target with the "
            "builder options include_hidden_states=1 aux_hidden_state_layers=..."
        )
    also = f" and taps of width {taps}" if has_taps else ""
    raise ConfigError(
        f"the eagle head (model {head.model.name}) takes features of width {width}, but the target (model "
        f"{target.model.name}) has hidden states of width {hidden}{also}: the head was trained for another target; "
        "train one for this target (decoctl eagle train; tools/train_eagle.py for the demo models)"
    )


def _top_probability(row: np.ndarray, top: int) -> float:
    """softmax(row)[top] for the row's argmax ``top`` (masked entries -inf), in float32: a draft-side heuristic."""
    return float(1.0 / np.exp(row - row[top]).sum())


def _tree_capacity(depth: int, topk: int) -> int:
    """Candidates a tree drafts: topk at depth 1, topk * topk at every further depth."""
    return topk + (depth - 1) * topk * topk


class Eagle:
    """Draft with the EAGLE head (a chain, or an EAGLE-2 dynamic tree), verify in one target forward; lossless."""

    def __init__(self, options: dict[str, Any]) -> None:
        check_options(options)
        self.tree = options["drafting"] == "tree"
        self.k = int(options["k"])
        self.confidence = float(options["confidence"])
        self.depth = int(options["depth"])
        self.topk = int(options["topk"])
        self.nodes = int(options["nodes"])
        self.sampling = bool(options["sampling"])
        self.temperature = float(options["temperature"])
        self.verifier = Verifier(sampling=self.sampling, temperature=self.temperature)
        self._reset()

    def _reset(self) -> None:
        self._root: tuple[np.ndarray, np.ndarray] | None = None
        #: the width of the target's taps an EAGLE-3 head reads first in its features (0: an EAGLE-1 head)
        self._taps = 0
        self._hidden = 0
        self._synced = 0
        self.committed = self.largest_tree = self.stopped_unsure = 0
        self.draft_seconds = self.verify_seconds = self.prompt_head_seconds = 0.0

    # -- set-up -----------------------------------------------------------------------------------------------
    def start(self, host: Host) -> None:
        self._reset()
        target, head = host.target, host[HEAD]
        prompt = host.prompt_tokens
        self._hidden = target.hidden_states().shape[1]
        self._taps = _taps_width(target, head, self._hidden)
        features = self._features(target)
        if len(features) < len(prompt):
            # a chunked prefill keeps the last chunk's hidden states only: run the prompt again for the rest
            features = self._prompt_features(host)
            host.trace["eagle_prompt_refed"] = True
        self.verifier.start(host)
        head.rewind(0)
        before = head.stats.seconds
        if len(prompt) > 1:
            self._sync_head(host, prompt[1:], features[:-1], chunk=host.prefill_chunk)
        # the generation's per-role stats cover decoding: the prompt's head work is counted here
        self.prompt_head_seconds = head.stats.seconds - before
        host.trace["drafting"] = "eagle-2 dynamic tree" if self.tree else "eagle chain"
        host.trace["acceptance"] = self._mode()

    def _prompt_features(self, host: Host) -> np.ndarray:
        target = host.target
        prompt = host.prompt_tokens
        chunk = host.prefill_chunk or len(prompt)
        target.rewind(0)
        rows = []
        for begin in range(0, len(prompt), chunk):
            target.forward(prompt[begin : begin + chunk])
            rows.append(self._features(target))
        return np.concatenate(rows)

    def _features(self, target: Any, rows: Any = slice(None)) -> np.ndarray:
        """The head's feature rows from the target's last forward (its rows ``rows``): the final hidden states for
        an EAGLE-1 head, ``[taps | 0]`` for an EAGLE-3 head. A copy: the target's outputs move on."""
        if not self._taps:
            return np.array(target.hidden_states()[rows])
        taps = target.hidden_states(kind="aux")[rows]
        features = np.zeros((len(taps), self._taps + self._hidden), np.float32)
        features[:, : self._taps] = taps
        return features

    def _own(self, predicted: np.ndarray) -> np.ndarray:
        """The head's feature rows from its own outputs float32[n, H] while drafting: as they are for an EAGLE-1
        head, ``[0 | own]`` for an EAGLE-3 head."""
        if not self._taps:
            return predicted
        features = np.zeros((len(predicted), self._taps + self._hidden), np.float32)
        features[:, self._taps :] = predicted
        return features

    def _mode(self) -> str:
        if not self.sampling:
            return "greedy-exact-match"
        return "point-mass-rejection over tree children" if self.tree else "speculative-sampling (min(1, p/q))"

    # -- one step -----------------------------------------------------------------------------------------------
    def step(self, host: Host) -> None:
        room = self.verifier.room(host)
        began = time.perf_counter()
        if self.tree:
            tree = self._draft_tree(host, room)
        else:
            drafts, q = self._draft_chain(host, room)
        verifying = time.perf_counter()
        self.draft_seconds += verifying - began
        verdict: Verdict
        if self.tree:
            self.largest_tree = max(self.largest_tree, tree.size)
            verdict = self.verifier.tree(host, tree)
        else:
            verdict = self.verifier.chain(host, drafts, q)
        # copied before the target moves on: the true features at the pending token and every accepted draft
        features = self._features(host.target, verdict.nodes)
        self.verify_seconds += time.perf_counter() - verifying
        self.committed += self.verifier.commit(host, verdict)
        if not host.done:
            self._sync_head(host, verdict.tokens, features)

    # -- drafting -------------------------------------------------------------------------------------------------
    def _draft_chain(self, host: Host, room: int) -> tuple[list[int], np.ndarray | None]:
        """Up to k tokens and, when sampling, the float64[k, vocab] distributions they were drawn from."""
        head = host[HEAD]
        k = min(self.k, room, head.max_length - head.length + 1)
        if self._root is None or k < 1:
            return [], None
        row, feature = self._root
        drafts: list[int] = []
        qs: list[np.ndarray] = []
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
            if index + 1 < k:
                row = head.forward([token], features=self._own(feature[None, :]))[-1]
                feature = head.hidden_states()[-1]
        return drafts, (np.stack(qs) if self.sampling and qs else None)

    def _draft_tree(self, host: Host, room: int) -> DraftTree:
        head = host[HEAD]
        pending = self.verifier.pending
        nodes = min(self.nodes, room)
        if self._root is None or nodes < 1:
            return Candidates().tree(pending, 0)
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
            features = self._own(np.stack([root_feature if p < 0 else predicted[p] for p in parents]))
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
    def _sync_head(self, host: Host, tokens: Any, features: np.ndarray, chunk: int | None = None) -> None:
        """Drop what the head guessed since its last sync and feed it pairs of true features and the tokens after
        them; its last row becomes the next root."""
        head = host[HEAD]
        head.rewind(self._synced)
        step = chunk or len(tokens)
        for begin in range(0, len(tokens), step):
            head.forward(list(tokens[begin : begin + step]), features=features[begin : begin + step])
        self._synced = head.length
        predicted = head.hidden_states()[-1]
        if predicted.shape[0] != self._hidden:
            raise ConfigError(
                f"the eagle head (model {head.model.name}) predicts features of width {predicted.shape[0]} but the "
                f"target's hidden size is {self._hidden}: its hidden_states output must be what it is fed back while "
                "drafting; re-export the head (decoctl eagle train)"
            )
        self._root = (np.array(head.logits()[-1]), np.array(predicted))

    def stats(self) -> dict[str, Any]:
        steps, drafted = self.verifier.steps, self.verifier.drafted
        return {
            "drafting": "tree" if self.tree else "chain",
            **self.verifier.stats(),
            "tau": self.committed / steps if steps else 0.0,
            "mean_drafted_per_step": drafted / steps if steps else 0.0,
            "largest_tree": self.largest_tree,
            "stopped_unsure": self.stopped_unsure,
            "prompt_head_seconds": self.prompt_head_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
        }
