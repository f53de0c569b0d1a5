"""decoctl.verify: chain and tree acceptance on hand-made logits, the Verifier's step on a tiny model, the lookup index.

The sampling checks are chi-square goodness-of-fit tests with fixed seeds on the first committed token, whose
distribution must be the target's row 0 whatever was drafted (tests/test_acceptance.py checks the rules' power).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from decoctl import ControllerError, Generator, ProcessContext, ProcessorChain, SequenceError
from decoctl.host import Host, Output, Sequence, StopRules
from decoctl.model import load_model
from decoctl.testing import build_genai_model
from decoctl.testing._distributions import chi_square_p
from decoctl.verify import (
    DraftTree,
    LookupIndex,
    Verifier,
    accept_chain,
    accept_tree,
    probabilities,
)

VOCAB = 8
ALPHA = 1e-3
DRAWS = 10_000


class Recorder:
    """A processor that changes nothing and records the drafted path of every row it sees."""

    def __init__(self) -> None:
        self.paths: list[tuple[int, ...]] = []

    def __call__(self, rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        self.paths.extend(tuple(int(t) for t in context.paths[i]) for i in range(len(rows)))
        return rows

    def commit(self, tokens: Any) -> None:
        del tokens

    def reset(self, prompt: np.ndarray) -> None:
        del prompt


def bare_host(chain: ProcessorChain | None = None, seed: int = 0) -> Host:
    """A host over no model: enough for the acceptance functions, which read only process, argmax and rng."""
    target: Any = SimpleNamespace(model=SimpleNamespace(tokenizer=None))
    rules = StopRules(eos_token_ids=(), max_new_tokens=100, capacity=100)
    output = Output(rules, None, None)  # type: ignore[arg-type]  # no text is read
    return Host({"target": target}, output, prompt=np.array([1, 2], np.int64), chain=chain, seed=seed)


def rows_choosing(*choices: int) -> np.ndarray:
    """float32[len(choices), VOCAB] logits whose row i has its maximum at choices[i]."""
    rows = np.zeros((len(choices), VOCAB), np.float32)
    rows[np.arange(len(choices)), choices] = 5.0
    return rows


# -- chains ---------------------------------------------------------------------------------------------------------
def test_a_greedy_chain_accepts_the_longest_prefix_matching_the_argmax() -> None:
    assert accept_chain(bare_host(), rows_choosing(3, 5, 7, 1), [3, 5, 2]) == (2, 7)


def test_a_greedy_chain_that_matches_everywhere_takes_the_bonus_row() -> None:
    assert accept_chain(bare_host(), rows_choosing(3, 5, 2, 6), [3, 5, 2]) == (3, 6)
    assert accept_chain(bare_host(), rows_choosing(4), []) == (0, 4)


@pytest.mark.parametrize("sampling", [False, True])
def test_each_chain_row_is_processed_with_the_drafts_before_it(sampling: bool) -> None:
    recorder = Recorder()
    accept_chain(bare_host(ProcessorChain([recorder])), rows_choosing(3, 5, 2), [3, 5], sampling=sampling)
    assert recorder.paths == [(), (3,), (3, 5)]


def test_a_processor_decides_what_a_greedy_chain_accepts() -> None:
    def ban_five_after_three(rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        for i in range(len(rows)):
            if tuple(context.paths[i])[-1:] == (3,):
                rows[i, 5] = -np.inf
        return rows

    rows = rows_choosing(3, 5, 2)
    rows[1, 6] = 1.0  # the runner-up once 5 is banned
    assert accept_chain(bare_host(ProcessorChain([ban_five_after_three])), rows, [3, 5]) == (1, 6)


def first_tokens(rule: Any, seed: int, rows: int = 3, temperature: float = 1.0) -> tuple[Counter[int], np.ndarray]:
    """The first committed token of DRAWS verifications by ``rule(host, logits, rng) -> (accepted, next, first
    draft)`` on random logits, and the distribution it must follow: softmax(row 0 / temperature)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(rows, VOCAB)).astype(np.float32) * 2
    host = bare_host(seed=seed)
    counts: Counter[int] = Counter()
    for _ in range(DRAWS):
        accepted, following, first_draft = rule(host, logits, rng)
        counts[first_draft if accepted else following] += 1
    return counts, probabilities(logits[0], temperature)


def test_sampling_a_chain_of_point_masses_keeps_the_targets_distribution() -> None:
    def rule(host: Host, rows: np.ndarray, rng: np.random.Generator) -> tuple[int, int, int]:
        drafts = [2, 6]
        return (*accept_chain(host, rows, drafts, sampling=True), drafts[0])

    counts, p = first_tokens(rule, seed=1)
    assert chi_square_p(counts, dict(enumerate(p)), DRAWS) > ALPHA


def test_sampling_a_chain_drawn_from_q_keeps_the_targets_distribution() -> None:
    q = probabilities(np.random.default_rng(7).normal(size=(2, VOCAB)), 1.0)

    def rule(host: Host, rows: np.ndarray, rng: np.random.Generator) -> tuple[int, int, int]:
        drafts = [int(rng.choice(VOCAB, p=q[0])), int(rng.choice(VOCAB, p=q[1]))]
        return (*accept_chain(host, rows, drafts, q, sampling=True), drafts[0])

    counts, p = first_tokens(rule, seed=2)
    assert chi_square_p(counts, dict(enumerate(p)), DRAWS) > ALPHA


# -- trees ----------------------------------------------------------------------------------------------------------
def small_tree() -> DraftTree:
    """Pending token 0; below it a window guess 6 (fed for its row only) and drafts 3 -> 5 and 4."""
    tree = DraftTree(0)
    assert tree.add(0, 6, verify=False) == 1
    assert tree.insert([3, 5]) == 3
    assert tree.add(0, 4) == 4
    return tree


def test_a_draft_tree_merges_shared_prefixes_and_keeps_window_nodes_out_of_the_walk() -> None:
    tree = small_tree()
    assert tree.insert([3, 5, 1]) == 5  # 3 and 5 are there: one node added
    assert tree.tokens == [0, 6, 3, 5, 4, 1]
    assert tree.parents == [-1, 0, 0, 2, 0, 3]
    assert tree.paths == [(), (6,), (3,), (3, 5), (4,), (3, 5, 1)]
    assert tree.verified == [0, 2, 3, 4, 5]
    assert tree.children[0] == {3: 2, 4: 4}  # in the order added: the order sampling tries them
    assert tree.add(0, 6, verify=False) == 6  # a window guess is always a node of its own


def test_a_draft_tree_refuses_a_draft_below_a_window_node() -> None:
    with pytest.raises(SequenceError, match="verify=False"):
        small_tree().add(1, 2)


def test_the_greedy_walk_follows_the_argmax_and_processes_verified_rows_only() -> None:
    recorder = Recorder()
    rows = rows_choosing(3, 2, 5, 1, 7)  # per node; node 1 (the window guess) would choose 2
    path, following = accept_tree(bare_host(ProcessorChain([recorder])), rows, small_tree())
    assert (path, following) == ([2, 3], 1)
    assert recorder.paths == [(), (3,), (3, 5), (4,)]


def test_the_greedy_walk_stops_where_no_child_is_the_argmax() -> None:
    assert accept_tree(bare_host(), rows_choosing(7, 0, 0, 0, 0), small_tree()) == ([], 7)
    assert accept_tree(bare_host(), rows_choosing(4, 0, 0, 0, 2), small_tree()) == ([4], 2)


def test_sampling_the_tree_walk_keeps_the_targets_distribution() -> None:
    tree = small_tree()

    def rule(host: Host, rows: np.ndarray, rng: np.random.Generator) -> tuple[int, int, int]:
        path, following = accept_tree(host, rows, tree, sampling=True, temperature=0.8)
        return (len(path), following, tree.tokens[path[0]] if path else -1)

    counts, p = first_tokens(rule, seed=3, rows=tree.size, temperature=0.8)
    assert chi_square_p(counts, dict(enumerate(p)), DRAWS) > ALPHA


# -- the Verifier on a model ----------------------------------------------------------------------------------------
PROMPT = "x = [i * i for i in range(10)]\nx = ["


@pytest.fixture(scope="module")
def tree_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_genai_model(tmp_path_factory.mktemp("verify-tree"), seed=3, tree_inputs=True)


@pytest.fixture(scope="module")
def greedy_tokens(tree_model: Path) -> tuple[int, ...]:
    return Generator({"target": tree_model}, "greedy").generate(PROMPT, max_new_tokens=12).tokens


def prefilled_host(folder: Path, chain: ProcessorChain | None = None, seed: int | None = None) -> Host:
    model = load_model(folder, threads=1)
    prompt = np.asarray(model.tokenizer.encode(PROMPT), np.int64)
    target = Sequence("target", model, max_length=128)
    target.prefill(prompt)
    rules = StopRules(eos_token_ids=(), max_new_tokens=12, capacity=100)
    output = Output(rules, model.tokenizer.detokenizer(), None)
    return Host({"target": target}, output, prompt=prompt, chain=chain, seed=seed)


def assert_pending_invariant(host: Host, verifier: Verifier) -> None:
    context = [*host.prompt_tokens.tolist(), *host.output_tokens]
    assert host.target.tokens.tolist() == (context if verifier.pending_cached else context[:-1])
    assert verifier.pending == context[-1]


def test_a_chain_step_commits_the_accepted_drafts_and_the_targets_token(
    tree_model: Path, greedy_tokens: tuple[int, ...]
) -> None:
    host, verifier = prefilled_host(tree_model), Verifier()
    verifier.start(host)
    assert_pending_invariant(host, verifier)
    first = verifier.chain(host, [])  # nothing drafted: the pending token's row gives the first token
    assert (first.nodes, first.tokens) == ([0], [greedy_tokens[0]])
    verifier.commit(host, first)
    wrong = (greedy_tokens[3] + 1) % host.target.vocab_size
    verdict = verifier.chain(host, [greedy_tokens[1], greedy_tokens[2], wrong])
    assert (verdict.accepted, verdict.tokens) == (2, list(greedy_tokens[1:4]))
    assert verifier.commit(host, verdict) == 3
    assert host.output_tokens == greedy_tokens[:4]
    assert_pending_invariant(host, verifier)
    assert verifier.stats() == {
        "steps": 2,
        "drafted": 3,
        "accepted": 2,
        "acceptance_rate": 2 / 3,
        "steps_without_forward": 0,
    }


def test_a_tree_step_keeps_the_accepted_path_among_wrong_branches(
    tree_model: Path, greedy_tokens: tuple[int, ...]
) -> None:
    host, verifier = prefilled_host(tree_model), Verifier()
    verifier.start(host)
    verifier.commit(host, verifier.chain(host, []))
    vocab = host.target.vocab_size
    tree = DraftTree(verifier.pending)
    tree.insert([(greedy_tokens[1] + 1) % vocab, greedy_tokens[2]])  # a wrong first token
    tree.add(0, (greedy_tokens[1] + 2) % vocab, verify=False)
    tree.insert(greedy_tokens[1:3])
    verdict = verifier.tree(host, tree)
    assert (verdict.nodes, verdict.tokens) == ([0, 4, 5], list(greedy_tokens[1:4]))
    verifier.commit(host, verdict)
    assert host.output_tokens == greedy_tokens[:4]
    assert_pending_invariant(host, verifier)


def test_plain_steps_commit_greedys_tokens_and_mix_with_chains(
    tree_model: Path, greedy_tokens: tuple[int, ...]
) -> None:
    host, verifier = prefilled_host(tree_model), Verifier()
    verifier.start(host)
    assert verifier.plain(host) == greedy_tokens[0]
    assert_pending_invariant(host, verifier)
    verdict = verifier.chain(host, list(greedy_tokens[1:3]))
    verifier.commit(host, verdict)
    assert [verifier.plain(host) for _ in range(3)] == list(greedy_tokens[4:7])
    assert host.output_tokens == greedy_tokens[:7]
    assert_pending_invariant(host, verifier)
    assert verifier.stats()["steps"] == 5


@pytest.mark.parametrize("sampling", [False, True])
def test_a_plain_step_takes_the_token_a_chain_of_no_drafts_takes(tree_model: Path, sampling: bool) -> None:
    """The same token from the same state and rng, processors and sampling included: plain() is chain(host, ())
    and commit, leaner."""
    bias = np.random.default_rng(5).normal(0.0, 2.0, 512).astype(np.float32)

    def biased(rows: np.ndarray, context: ProcessContext) -> np.ndarray:
        return rows + bias[: rows.shape[1]]

    taken: list[list[int]] = []
    for lean in (False, True):
        host = prefilled_host(tree_model, ProcessorChain([biased]), seed=7)
        verifier = Verifier(sampling=sampling, temperature=0.9)
        verifier.start(host)
        for _ in range(8):
            if lean:
                verifier.plain(host)
            else:
                verifier.commit(host, verifier.chain(host, []))
        assert_pending_invariant(host, verifier)
        taken.append(list(host.output_tokens))
    assert taken[0] == taken[1]


def test_the_first_plain_step_reads_the_prefills_logits_and_runs_no_forward(
    tree_model: Path, greedy_tokens: tuple[int, ...]
) -> None:
    host, verifier = prefilled_host(tree_model), Verifier()
    verifier.start(host)
    assert verifier.pending_cached  # the prompt's last token stays cached, its logits ready
    forwards = host.target.stats.forwards
    assert verifier.plain(host) == greedy_tokens[0]
    assert host.target.stats.forwards == forwards
    assert not verifier.pending_cached
    assert_pending_invariant(host, verifier)
    assert verifier.plain(host) == greedy_tokens[1]  # now a forward of the pending token
    assert host.target.stats.forwards == forwards + 1


def test_taking_over_a_row_greedy_stepped_keeps_its_tokens(tree_model: Path, greedy_tokens: tuple[int, ...]) -> None:
    host, verifier = prefilled_host(tree_model), Verifier()
    verifier.start(host)
    verifier.plain(host)
    for token in greedy_tokens[1:4]:  # greedy's steps: the token fed, its logits ready
        host.commit((token,))
        host.target.forward((verifier.pending,))
        verifier.pending = token
    host.target.forward((greedy_tokens[3],))
    verifier.take_over(host)
    assert verifier.pending_cached and verifier.pending == greedy_tokens[3]
    verdict = verifier.chain(host, list(greedy_tokens[4:6]))  # a verify first takes the cached token out
    verifier.commit(host, verdict)
    assert host.output_tokens == greedy_tokens[:7]
    assert_pending_invariant(host, verifier)


def test_taking_over_a_row_whose_cache_lags_is_refused(tree_model: Path) -> None:
    host, verifier = prefilled_host(tree_model), Verifier()
    host.target.rewind(host.target.length - 2)
    with pytest.raises(ControllerError, match="takes over a row"):
        verifier.start(host)


def test_a_tree_rooted_elsewhere_than_the_pending_token_is_refused(tree_model: Path) -> None:
    host, verifier = prefilled_host(tree_model), Verifier()
    verifier.start(host)
    with pytest.raises(ControllerError, match=r"DraftTree\(verifier.pending\)"):
        verifier.tree(host, DraftTree(verifier.pending + 1))


def test_room_leaves_a_place_for_the_targets_own_token(tree_model: Path) -> None:
    host, verifier = prefilled_host(tree_model), Verifier()
    verifier.start(host)
    assert verifier.room(host) == 11  # 12 new tokens, one of them the target's own


# -- prompt lookup --------------------------------------------------------------------------------------------------
def test_a_copy_follows_the_last_earlier_occurrence_of_the_final_two_tokens() -> None:
    index = LookupIndex(2, 2)
    index.extend([1, 2, 3, 4, 1, 2, 5])
    assert index.find(3) == ([], 0)  # (2, 5) never occurred before
    index.extend([9, 1, 2])
    assert index.find(3) == ([5, 9, 1], 2)  # the most recent earlier (1, 2) was followed by 5, 9, 1
    assert index.find(1) == ([5], 2)
    assert index.find(0) == ([], 0)
    index.extend([5])
    assert index.find(10) == ([9, 1, 2, 5], 2)  # what there is, up to the end of the context


def test_the_longest_matching_n_gram_wins() -> None:
    index = LookupIndex(3, 1)
    index.extend([7, 1, 2, 8, 4, 1, 2, 9, 6, 1, 2])
    assert index.find(2) == ([9, 6], 2)  # (1, 2) last seen before 9; (6, 1, 2) never, so no 3-gram
    index.extend([9])
    assert index.find(2) == ([6, 1], 3)  # (1, 2, 9) seen before


def brute_force(context: list[int], sizes: tuple[int, ...], limit: int) -> tuple[list[int], int]:
    for n in sizes:
        if n > len(context):
            continue
        suffix = context[-n:]
        for end in range(len(context) - 1, n - 1, -1):
            if context[end - n : end] == suffix:
                return context[end : end + limit], n
    return [], 0


@given(
    tokens=st.lists(st.integers(0, 3), max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    ngram=st.tuples(st.integers(1, 4), st.integers(0, 2)),
    limit=st.integers(1, 6),
)
def test_lookup_equals_a_search_of_the_context_however_it_grew(
    tokens: list[int], cuts: list[int], ngram: tuple[int, int], limit: int
) -> None:
    ngram_min, extra = ngram
    index = LookupIndex(ngram_min + extra, ngram_min)
    start = 0
    for cut in [*sorted(cuts), len(tokens)]:
        index.extend(tokens[start : max(start, cut)])
        start = max(start, cut)
        assert index.find(limit) == brute_force(index.tokens, index.sizes, limit)
    assert index.tokens == tokens
