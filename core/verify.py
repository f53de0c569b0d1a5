"""Verification of drafted tokens: the layer every drafting controller stands on, lossless by construction.

A drafting controller (speculative decoding, lookahead, EAGLE, yours) proposes tokens cheaply and lets the target
check them in one forward. What differs between them is only how they draft; the rest lives here:

- the pending-token set-up: between steps the target's KV cache holds the context (prompt and committed tokens)
  except its last token, the *pending* one, which the next verify forward feeds first (``Verifier``);
- chain verification, one forward over the pending token and k drafts (``Verifier.chain``, ``accept_chain``), and
  the tree walk over a ``DraftTree`` fed in one tree forward (``Verifier.tree``, ``accept_tree``);
- the acceptance rules on the target's processed rows, each row processed with its own prefix (``host.process`` /
  ``host.argmax`` with the drafted path before it), so the rules see what plain decoding would have seen;
- one prompt-lookup index over prompt and output (``LookupIndex``) for drafters that copy from the context.

A step, for a drafter that proposes a chain::

    verifier = Verifier(sampling=False)        # start(host): verifier.start(host)
    drafts = propose(verifier.room(host))      # up to that many tokens that follow verifier.pending
    verdict = verifier.chain(host, drafts)     # one target forward, the longest acceptable prefix plus one token
    verifier.commit(host, verdict)             # commit; the target keeps the accepted path; a new pending token

The rules, on probabilities ``p`` (the target's) and ``q`` (what a draft was drawn from):

- ``accept_greedy``: accept while the target's argmax equals the draft; the next token is the argmax.
- ``accept_deterministic``: each draft is a point mass (prompt lookup, a greedy draft model): accept d with
  probability p(d); on rejection draw from p with d removed, renormalised. This is the speculative-sampling rule
  with q = one-hot(d): min(1, p/q) = p(d) and norm(max(0, p - q)) = p without d.
- ``accept_sampled``: the drafts were sampled from q: accept with min(1, p(d)/q(d)); on rejection draw from
  norm(max(0, p - q)) (Leviathan et al. 2023; Chen et al. 2023).
- ``choose_child``: one node of a draft tree whose children are point masses (a lookahead trie, a top-k tree):
  the children are tried in turn, each accepted with the probability the residual gives it (p with the children
  refused so far removed, renormalised); when all are refused the token is drawn from that residual. The result is
  distributed as p whatever the children are.

Randomness comes from the generation's seeded ``host.rng``, one uniform per decision, so a seed reproduces a run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
import numpy as np

from decoctl.errors import ConfigError, ControllerError, SequenceError
from decoctl.host import Host

__all__ = [
    "DraftTree",
    "LookupIndex",
    "Verdict",
    "Verifier",
    "accept_chain",
    "accept_deterministic",
    "accept_greedy",
    "accept_sampled",
    "accept_tree",
    "choose_child",
    "draw",
    "log_probabilities",
    "probabilities",
]


# -- distributions ----------------------------------------------------------------------------------------------
def probabilities(rows: np.ndarray, temperature: float) -> np.ndarray:
    """float64[..., vocab] softmax(rows / temperature) over the last axis; -inf entries (masked tokens) get 0. A row
    with every entry -inf (a drafted row after a token a grammar rejected: no verifier reaches it) is all 0."""
    scaled = _shifted(rows, temperature)
    weights = np.exp(scaled)
    total = weights.sum(axis=-1, keepdims=True)
    weights /= np.where(total > 0, total, 1.0)
    return weights


def log_probabilities(rows: np.ndarray, temperature: float) -> np.ndarray:
    """float64[..., vocab] log softmax(rows / temperature) (-inf for masked tokens): every entry is <= 0. A row with
    every entry -inf stays all -inf."""
    scaled = _shifted(rows, temperature)
    total = np.exp(scaled).sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return scaled - np.where(total > 0, np.log(total), 0.0)


def _shifted(rows: np.ndarray, temperature: float) -> np.ndarray:
    """float64 ``rows / temperature`` less each row's maximum (a row whose maximum is -inf is left as it is)."""
    scaled = rows.astype(np.float64) / temperature
    top = scaled.max(axis=-1, keepdims=True)
    scaled -= np.where(np.isfinite(top), top, 0.0)
    return scaled


def draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    """One token from non-negative float64[vocab] weights (not all zero, not necessarily normalised), by
    inverting the CDF at one uniform."""
    cumulative = np.cumsum(weights)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, len(weights) - 1)


# -- the acceptance rules -----------------------------------------------------------------------------------------
def accept_greedy(choices: np.ndarray, drafts: Sequence[int]) -> tuple[int, int]:
    """choices: int64[k+1] the target's processed argmax (``host.argmax``), row i after drafts[:i].
    Returns (accepted, next)."""
    accepted = 0
    for draft, choice in zip(drafts, choices, strict=False):
        if int(choice) != draft:
            break
        accepted += 1
    return accepted, int(choices[accepted])


def accept_deterministic(p: np.ndarray, drafts: Sequence[int], rng: np.random.Generator) -> tuple[int, int]:
    """p: float64[k+1, vocab] target probabilities; the drafts were proposed with probability 1."""
    for index, draft in enumerate(drafts):
        if rng.random() < p[index, draft]:
            continue
        residual = p[index].copy()
        residual[draft] = 0.0
        return index, draw(residual, rng)
    return len(drafts), draw(p[len(drafts)], rng)


def accept_sampled(p: np.ndarray, q: np.ndarray, drafts: Sequence[int], rng: np.random.Generator) -> tuple[int, int]:
    """p: float64[k+1, vocab] target probabilities; q: float64[k, vocab] the distributions the drafts were drawn
    from. Returns (accepted, next)."""
    for index, draft in enumerate(drafts):
        target, proposal = p[index, draft], q[index, draft]
        if proposal > 0.0 and rng.random() * proposal < target:  # probability min(1, p/q)
            continue
        residual = np.maximum(p[index] - q[index], 0.0)
        if residual.sum() <= 0.0:  # p == q exactly: rejection has probability 0, so draw from p itself
            residual = p[index]
        return index, draw(residual, rng)
    return len(drafts), draw(p[len(drafts)], rng)


def choose_child(p: np.ndarray, children: Sequence[int], rng: np.random.Generator) -> tuple[int | None, int]:
    """p: float64[vocab] the target's distribution at a node; children: its children's distinct tokens, in the
    order to try them. Returns (the index in children of the accepted child, or None, and the token taken)."""
    residual = p.copy()
    for place, token in enumerate(children):
        chance = residual[token]
        rest = residual.sum() - chance
        # rest <= 0: the residual is a point mass on this token, so it is taken (exactly; 1 - chance is rounding)
        if rng.random() < chance or rest <= 0.0:
            return place, token
        residual[token] = 0.0
        residual /= rest
    return None, draw(residual, rng)


# -- draft trees --------------------------------------------------------------------------------------------------
class DraftTree:
    """A token tree under the pending token, fed in one tree forward: node 0 is the pending token, every further
    node a token below an earlier node (parents before children: the order they are fed in).

    ``tokens[i]``, ``parents[i]`` (-1 for node 0; what ``forward(tokens, tree=parents)`` takes), ``paths[i]`` (the
    drafted tokens from node 0's child down to node i: the prefix node i's row is conditioned on). Nodes are
    *verified* (the default: drafts the walk may accept) or fed for their rows only (``verify=False``: a lookahead
    window's guesses, which the walk never enters). ``children[i]`` maps the tokens of node i's verified children
    to their nodes, in the order they were added: the order the sampling rule tries them in. ``verified`` lists the
    verified nodes, node 0 first; the walk processes their rows only.
    """

    def __init__(self, pending: int) -> None:
        self.tokens: list[int] = [pending]
        self.parents: list[int] = [-1]
        self.paths: list[tuple[int, ...]] = [()]
        self.children: list[dict[int, int]] = [{}]
        self.verified: list[int] = [0]
        #: node -> its row among the verified nodes' rows (-1 for a node fed for its row only)
        self._row: list[int] = [0]

    @property
    def size(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, *, verify: bool = True) -> int:
        """Add ``token`` below node ``parent`` and return its node. A verified token that ``parent`` already has as
        a verified child is not added again: that child is returned (shared prefixes are fed once)."""
        if not 0 <= parent < len(self.tokens):
            raise SequenceError(f"DraftTree.add: parent {parent} is not a node of this tree (0..{self.size - 1})")
        siblings = self.children[parent]
        if verify:
            if self._row[parent] < 0:
                raise SequenceError(
                    f"DraftTree.add: node {parent} was added with verify=False, so the walk never reaches a verified "
                    "child below it: hang drafts below verified nodes"
                )
            found = siblings.get(token)
            if found is not None:
                return found
        node = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.paths.append((*self.paths[parent], token))
        self.children.append({})
        if verify:
            siblings[token] = node
            self._row.append(len(self.verified))
            self.verified.append(node)
        else:
            self._row.append(-1)
        return node

    def insert(self, tokens: Iterable[int], parent: int = 0) -> int:
        """Add a path of verified tokens below ``parent`` (the pending token by default), sharing the nodes it has
        in common with what is there; return the node of its last token."""
        node = parent
        for token in tokens:
            node = self.add(node, token)
        return node


def accept_chain(
    host: Host,
    rows: np.ndarray,
    drafts: Sequence[int],
    q: np.ndarray | None = None,
    *,
    sampling: bool = False,
    temperature: float = 1.0,
) -> tuple[int, int]:
    """How many of ``drafts`` the target accepts, and the token after them.

    rows: float32[k+1, vocab], the target's logits over [pending, *drafts] (row i after drafts[:i]); each is processed
    with its own prefix. Greedy: the longest prefix matching the processed argmax. Sampling: the point-mass rule when
    ``q`` is None (the drafts were proposed with certainty), else the speculative-sampling rule with q
    (float64[k, vocab], what each draft was drawn from)."""
    if not sampling:
        return accept_greedy(host.argmax(rows, drafts), drafts)
    p = probabilities(host.process(rows, drafts), temperature)
    if q is None:
        return accept_deterministic(p, drafts, host.rng)
    return accept_sampled(p, q, drafts, host.rng)


def accept_tree(
    host: Host, rows: np.ndarray, tree: DraftTree, *, sampling: bool = False, temperature: float = 1.0
) -> tuple[list[int], int]:
    """Walk ``tree`` from node 0 while the target accepts a child; return the accepted nodes (node 0 left out) and
    the token after the last of them.

    rows: float32[tree.size, vocab], the target's rows of a forward over the tree; the verified nodes' rows are
    processed, each with its node's path. Greedy: follow the child whose token is the processed argmax. Sampling: at
    each node the children are tried in order with the point-mass rule (``choose_child``)."""
    if len(tree.verified) == tree.size:
        paths: Sequence[tuple[int, ...]] = tree.paths
    else:
        rows = rows[tree.verified]
        paths = [tree.paths[node] for node in tree.verified]
    verdicts = host.process(rows, paths=paths) if sampling else host.argmax(rows, paths=paths)
    row_of, children_of = tree._row, tree.children
    node = 0
    path: list[int] = []
    while True:
        children = children_of[node]
        if sampling:
            place, token = choose_child(probabilities(verdicts[row_of[node]], temperature), list(children), host.rng)
            child = None if place is None else children[token]
        else:
            token = int(verdicts[row_of[node]])
            child = children.get(token)
        if child is None:
            return path, token
        path.append(child)
        node = child


# -- the pending-token set-up and one verify step -------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class Verdict:
    """What one verify forward accepted. ``nodes``: the indices, in what was fed, of the pending token and the
    accepted drafts (a root-to-node path: ``0..accepted`` for a chain); ``tokens``: the accepted drafts and then the
    target's own next token, what ``Verifier.commit`` commits."""

    nodes: list[int]
    tokens: list[int]

    @property
    def accepted(self) -> int:
        """How many drafts were accepted."""
        return len(self.nodes) - 1


class Verifier:
    """The target's side of draft-then-verify: the pending token, one verify forward per step, the acceptance rule,
    and the commit that keeps the accepted path in the target's KV cache.

    ``start(host)`` sets the invariant up after the prompt's prefill (the target gives back its last prompt token,
    which becomes ``pending``). Each step drafts tokens that follow ``pending``, verifies them with ``chain`` or
    ``tree`` (one target forward), may read that forward's outputs (``host.target.logits()``,
    ``hidden_states()``), then calls ``commit``. ``steps``, ``drafted`` and ``accepted`` count this generation's
    steps, the drafts they verified and the drafts accepted (``stats()``); every step is one target forward but the
    ``unforwarded`` plain steps that read cached logits (``take_over``).
    """

    def __init__(self, *, sampling: bool = False, temperature: float = 1.0) -> None:
        self.sampling = sampling
        self.temperature = temperature
        self.pending = -1
        #: whether the target's cache still holds the pending token, its logits ready (take_over)
        self._cached = False
        self.steps = self.drafted = self.accepted = 0
        #: plain steps that read cached logits instead of running a forward
        self.unforwarded = 0
        #: the target's length before the last verify forward, and whether that forward was a tree
        self._start = 0
        self._tree = False

    def start(self, host: Host) -> None:
        """After the prompt's prefill: the last prompt token becomes pending (``take_over``)."""
        self.steps = self.drafted = self.accepted = self.unforwarded = 0
        self.take_over(host)

    def take_over(self, host: Host) -> None:
        """The row's last token (the prompt's after its prefill, the last committed one after other controllers
        stepped the row) becomes ``pending``. Where the target still caches it with its logits ready, it stays
        there: a plain step then reads those logits instead of running a forward (as greedy's first token needs
        none), and a verify forward first takes it out (``settle``)."""
        target, output = host.target, host.output_tokens
        context = len(host.prompt_tokens) + len(output)
        self.pending = int(output[-1] if len(output) else host.prompt_tokens[-1])
        self._cached = target.length == context and len(target.logits()) > 0
        if not self._cached and target.length != context - 1:
            raise ControllerError(
                f"the target holds {target.length} tokens of a {context}-token context: a verifier takes over a row "
                "whose cache holds the whole context, or all of it but the last token"
            )

    @property
    def pending_cached(self) -> bool:
        """Whether the target's cache still holds the pending token, its logits ready (``take_over``)."""
        return self._cached

    def settle(self, host: Host) -> None:
        """Take the pending token out of the target's cache where ``take_over`` left it there, so that the next
        forward feeds it (chain and tree do this themselves; a controller that checks the cache's length before
        choosing how to verify calls it first)."""
        if self._cached:
            self._cached = False
            target = host.target
            target.rewind(target.length - 1)

    def room(self, host: Host) -> int:
        """How many drafts the next verify may hold: no more than the output still takes after the target's own
        token, nor than the target's KV cache holds after the pending token."""
        target = host.target
        return min(host.remaining - 1, target.max_length - target.length - 1)

    def chain(self, host: Host, drafts: Sequence[int], q: np.ndarray | None = None) -> Verdict:
        """One target forward over [pending, *drafts]; accept the longest acceptable prefix and one token more.
        ``q``: float64[k, vocab] the distributions sampled drafts were drawn from (None: point masses)."""
        self.settle(host)
        target = host.target
        self._start, self._tree = target.length, False
        rows = target.forward((self.pending, *drafts))
        accepted, following = accept_chain(host, rows, drafts, q, sampling=self.sampling, temperature=self.temperature)
        return self._count(list(range(accepted + 1)), [*drafts[:accepted], following], len(drafts))

    def tree(self, host: Host, tree: DraftTree) -> Verdict:
        """One target forward over ``tree`` (rooted at ``pending``; a plain one-token forward when it holds nothing
        else); walk it while the target accepts. Needs a target with tree inputs when the tree has drafts."""
        if tree.tokens[0] != self.pending:
            raise ControllerError(
                f"a draft tree rooted at token {tree.tokens[0]} was given to verify, but the pending token is "
                f"{self.pending}: build it as DraftTree(verifier.pending)"
            )
        self.settle(host)
        target = host.target
        self._start, self._tree = target.length, tree.size > 1
        rows = target.forward(tree.tokens, tree.parents) if self._tree else target.forward((self.pending,))
        path, following = accept_tree(host, rows, tree, sampling=self.sampling, temperature=self.temperature)
        tokens = [tree.tokens[node] for node in path]
        tokens.append(following)
        return self._count([0, *path], tokens, len(tree.verified) - 1)

    def plain(self, host: Host) -> int:
        """A step that drafts nothing, as lean as greedy's: one target forward of the pending token, the next token
        taken as ``chain(host, ())`` takes it (the processed argmax; under sampling a draw from the target's
        distribution) and committed at once. Unless that ends the generation, the token becomes the pending one.
        Returns it. The drafting controllers take this step wherever their rule drafts nothing."""
        if self._cached:  # the pending token's logits are the target's last ones: no forward
            self._cached = False
            self.unforwarded += 1
            rows = host.target.logits()[-1:]
        else:
            rows = host.target.forward((self.pending,))
        if self.sampling:
            token = accept_chain(host, rows, (), sampling=True, temperature=self.temperature)[1]
        else:
            token = int(host.argmax(rows, ())[0])
        self.steps += 1
        host.commit((token,))
        if not host.done:
            self.pending = token
        return token

    def commit(self, host: Host, verdict: Verdict) -> int:
        """Commit the verdict's tokens; unless that ends the generation, keep the accepted path on the target and
        make the target's own token the pending one. Returns how many tokens the output took."""
        taken = host.commit(verdict.tokens)
        if not host.done:
            if self._tree:
                host.target.keep(verdict.nodes)
            else:
                host.target.rewind(self._start + len(verdict.nodes))
            self.pending = verdict.tokens[-1]
        return taken

    def stats(self) -> dict[str, int | float]:
        """The verification's counters (steps, drafts tried and accepted, ...), for the controller's stats()."""
        return {
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "steps_without_forward": self.unforwarded,
        }

    def _count(self, nodes: list[int], tokens: list[int], drafted: int) -> Verdict:
        self.steps += 1
        self.drafted += drafted
        self.accepted += len(nodes) - 1
        return Verdict(nodes=nodes, tokens=tokens)


# -- prompt lookup --------------------------------------------------------------------------------------------------
class LookupIndex:
    """Prompt lookup over a growing context (prompt and output): where each n-gram last occurred, to copy what
    followed it.

    ``extend(tokens)`` appends ints to the context (``tokens``, a list) and indexes, for every n from ``ngram_max`` down
    to ``ngram_min``, the n-grams that end before the context's last token (so the context's own suffix never finds
    itself); ``append(token)`` appends one and leaves its indexing to the next ``extend`` or ``find`` (a plain step's
    token, which a controller that stopped drafting may never look up). ``find(limit)`` looks the context's last n
    tokens up, longest n first, and returns up to ``limit`` tokens that followed their most recent earlier
    occurrence, with that n (([], 0) when none occurred). Indexing costs a dict update per token and n; a lookup one
    dict lookup per n.
    """

    def __init__(self, ngram_max: int, ngram_min: int = 1) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ConfigError(
                f"LookupIndex(ngram_max={ngram_max}, ngram_min={ngram_min}): the n-gram lengths must satisfy "
                "1 <= ngram_min <= ngram_max"
            )
        self.sizes = tuple(range(ngram_max, ngram_min - 1, -1))
        self.tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> the position after its latest indexed occurrence
        self._indexed = 0  # the n-grams that end before this position are indexed

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to the context and index the n-grams they complete (see the class docstring)."""
        self.tokens.extend(tokens)
        self._index_all()

    def append(self, token: int) -> None:
        """Append one token to the context; the next ``extend`` or ``find`` indexes it."""
        self.tokens.append(token)

    def _index_all(self) -> None:
        context = self.tokens
        index, sizes = self._index, self.sizes
        for end in range(max(self._indexed, 1), len(context)):
            for size in sizes:
                if size <= end:
                    index[tuple(context[end - size : end])] = end
        self._indexed = len(context)

    def find(self, limit: int) -> tuple[list[int], int]:
        """Up to ``limit`` tokens that followed the latest earlier occurrence of the context's longest indexed
        suffix, and that suffix's length (([], 0) when none occurred)."""
        context = self.tokens
        length = len(context)
        if limit <= 0:
            return [], 0
        if self._indexed < length:
            self._index_all()
        for size in self.sizes:
            if size > length:
                continue
            end = self._index.get(tuple(context[length - size :]))
            if end is not None:
                return context[end : end + limit], size
        return [], 0
