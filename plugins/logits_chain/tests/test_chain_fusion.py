"""Fused candidate runs give what their processors give one after another on dense rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from chain_cases import random_case
from decoctl_logits_chain.candidates import CandidateRun

from decoctl import ProcessContext, ProcessorChain

NARROWING = ("temperature=0.7", "top_k=7", "top_p=0.8", "min_p=0.05", "typical_p=0.9", "epsilon=0.002", "eta=0.01")


def sequential(chain: ProcessorChain, rows: np.ndarray, context: Any) -> np.ndarray:
    out = rows.copy()
    for processor in chain.processors:
        out = processor(out, context)
    return out


def random_chains(count: int) -> list[str]:
    rng = np.random.default_rng(7)
    chains = []
    for _ in range(count):
        picked = rng.choice(len(NARROWING), size=int(rng.integers(2, 5)), replace=False)
        steps = [NARROWING[i] for i in picked]
        if rng.random() < 0.3:
            steps.insert(0, "repetition_penalty=1.3")  # a dense step before the run
        if rng.random() < 0.5:
            steps.append(str(rng.choice(["greedy", "sample"])))
        chains.append(",".join(steps))
    return chains


@pytest.mark.parametrize("text", random_chains(40))
@pytest.mark.parametrize("masked", [False, True])
def test_a_fused_chain_equals_its_processors_in_turn(build: Any, text: str, masked: bool) -> None:
    chain = build(text)
    assert any(isinstance(step, CandidateRun) for step in chain.steps), chain.steps
    for seed in range(6):
        rows, context = random_case(seed, vocab=96, masked=masked)
        fused, plain = chain(rows, context), sequential(chain, rows, context)
        np.testing.assert_array_equal(np.isneginf(fused), np.isneginf(plain), err_msg=text)
        np.testing.assert_allclose(fused[np.isfinite(fused)], plain[np.isfinite(plain)], rtol=1e-6, err_msg=text)


def test_ties_at_the_kth_logit_all_stay_and_greedy_takes_the_first_maximum(build: Any) -> None:
    rows = np.array([[0, 3, 1, 3, 2, 3, -np.inf, 0]], np.float32)
    _, context = random_case(0, vocab=8)
    context.paths = [[]]
    chain = build("top_k=2,temperature=0.5")
    np.testing.assert_array_equal(np.isfinite(chain(rows, context))[0], [0, 1, 0, 1, 0, 1, 0, 0])
    out = build("top_k=2,greedy")(rows, context)
    np.testing.assert_array_equal(np.flatnonzero(np.isfinite(out[0])), [1])


def test_a_fully_masked_row_passes_through(build: Any) -> None:
    rows = np.full((2, 16), -np.inf, np.float32)
    rows[1, 3] = 1.0
    _, context = random_case(0, vocab=16)
    context.paths = [[], []]
    out = build("top_k=4,top_p=0.9,greedy")(rows, context)
    assert np.isneginf(out[0]).all() and out[1, 3] == 1.0 and np.isneginf(np.delete(out[1], 3)).all()


def test_only_neighbours_fuse_and_a_terminal_ends_the_run(build: Any) -> None:
    chain = build("top_k=10,repetition_penalty=1.2,top_p=0.9,temperature=0.8,greedy")
    kinds = [type(step).__name__ for step in chain.steps]
    assert kinds == ["TopK", "RepetitionPenalty", "CandidateRun"]
    assert [type(s).__name__ for s in chain.steps[-1].steps] == ["TopP", "Temperature", "GreedyTerminal"]
    assert chain.steps[-1].terminal
    assert len(chain.processors) == 5  # commit and reset still reach every processor as configured


@pytest.mark.parametrize("case", ["normal", "ties", "masked", "sorted", "few finite"])
@pytest.mark.parametrize("k", [1, 5, 40, 300, 4096, 5000])
def test_select_top_is_the_top_k_with_ties_whichever_path_it_takes(case: str, k: int) -> None:
    from decoctl_logits_chain.candidates import select_top

    rng = np.random.default_rng(k)
    row = (rng.normal(size=4096) * 3).astype(np.float32)
    if case == "ties":
        row = np.round(row).astype(np.float32)  # a handful of distinct values: large tie groups at the k-th
    elif case == "masked":
        row[rng.random(4096) < 0.7] = -np.inf
    elif case == "sorted":
        row = np.sort(row)  # the strided sample misses the largest logits: the fallback path
    elif case == "few finite":
        row[:] = -np.inf
        row[[5, 900, 3000]] = [1.0, 2.0, 1.0]
    finite = row[np.isfinite(row)]
    kth = np.sort(finite)[::-1][min(k, finite.size) - 1]
    expected = np.flatnonzero(row >= kth)
    np.testing.assert_array_equal(select_top(row, k), expected)


KEPT_UP = (
    "repetition_penalty=1.3",
    "presence_penalty=0.8",
    "frequency_penalty=0.5",
    "no_repeat_ngram=1",
    "no_repeat_ngram=3",
    [{"name": "presence_penalty", "penalty": 0.4, "include_prompt": True}],
    [{"name": "repetition_penalty", "penalty": 1.2, "include_prompt": False}],
    "repetition_penalty=1.2,frequency_penalty=0.3,no_repeat_ngram=2,top_k=9,top_p=0.9,temperature=0.7",
)


@pytest.mark.parametrize("text", KEPT_UP, ids=str)
def test_counts_kept_through_reset_and_commit_equal_a_recount(build: Any, text: Any) -> None:
    """A generation: the chain follows the prompt and every commit; each call (rows with drafted paths, as a
    verifier sends) must equal a chain that saw no reset and so recounts the context."""
    rng = np.random.default_rng(11)
    vocab = 24  # small, so tokens and n-grams repeat
    kept, fresh = build(text), build(text)
    prompt = rng.integers(0, vocab, 9)
    kept.reset(prompt)
    output: list[int] = []
    for _ in range(25):
        drafted = [int(t) for t in rng.integers(0, vocab, int(rng.integers(0, 4)))]
        paths = [drafted[:i] for i in range(len(drafted) + 1)]
        rows = (rng.normal(size=(len(paths), vocab)) * 2).astype(np.float32)
        context = ProcessContext(prompt, np.asarray(output, np.int64), paths)
        np.testing.assert_allclose(kept(rows, context), fresh(rows, context), rtol=1e-6)
        accepted = [int(t) for t in rng.integers(0, vocab, int(rng.integers(1, 3)))]
        output += accepted
        kept.commit(accepted)
