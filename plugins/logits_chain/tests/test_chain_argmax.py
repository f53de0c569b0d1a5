"""ProcessorChain.argmax (what greedy decoding and greedy verification call) equals the processed rows' argmax.

It may skip the chain's trailing steps that promise to keep a unique maximum (``bound_argmax``); these tests
hold it to the full chain's answer on random rows, on tied maxima, on maxima that a temperature's rounding
would tie, and check that the skip really happens where it may (so the fast path is not dead code).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from chain_cases import random_case

from decoctl import ProcessorChain

STEPS = (
    "temperature=0.7",
    "temperature=1.3",
    "top_k=7",
    "top_p=0.8",
    "min_p=0.05",
    "typical_p=0.9",
    "epsilon=0.002",
    "eta=0.01",
    "repetition_penalty=1.3",
    "presence_penalty=0.4",
    "frequency_penalty=0.3",
    "no_repeat_ngram=2",
    "min_new_tokens=50",
)


def random_chains(count: int) -> list[str]:
    rng = np.random.default_rng(11)
    chains = []
    for _ in range(count):
        picked = rng.choice(len(STEPS), size=int(rng.integers(1, 6)), replace=False)
        steps = [STEPS[i] for i in picked]
        if rng.random() < 0.4:
            steps.append(str(rng.choice(["greedy", "sample"])))
        chains.append(",".join(steps))
    return chains


def counting(chain: ProcessorChain) -> dict[int, int]:
    """Wrap every step of ``chain`` so each call is counted (by step index)."""
    calls: dict[int, int] = {}
    wrapped = []
    for index, step in enumerate(chain.steps):

        class Counted:
            def __init__(self, inner: Any, at: int) -> None:
                self.inner, self.at = inner, at
                self.bound_argmax = getattr(inner, "bound_argmax", None)

            def __call__(self, rows: np.ndarray, context: Any) -> np.ndarray:
                calls[self.at] = calls.get(self.at, 0) + 1
                return self.inner(rows, context)

        wrapped.append(Counted(step, index))
    chain.steps = tuple(wrapped)
    return calls


@pytest.mark.parametrize("text", random_chains(60))
@pytest.mark.parametrize("masked", [False, True])
def test_argmax_equals_the_processed_rows_argmax(build: Any, text: str, masked: bool) -> None:
    chain = build(text)
    for seed in range(8):
        rows, context = random_case(seed, vocab=96, masked=masked)
        expected = chain(rows, context).argmax(axis=1)
        before = rows.copy()
        np.testing.assert_array_equal(chain.argmax(rows, context), expected, err_msg=text)
        np.testing.assert_array_equal(rows, before, err_msg="argmax must not write to the caller's rows")


@pytest.mark.parametrize("text", ["top_k=3,top_p=0.5,temperature=0.5", "min_p=0.2,greedy", "temperature=2.0,sample"])
def test_tied_maxima_run_the_whole_chain(build: Any, text: str) -> None:
    chain = build(text)
    rows, context = random_case(3, vocab=32)
    rows[:, 5] = rows[:, 9] = rows.max() + 1.0  # every row's maximum held by tokens 5 and 9
    calls = counting(chain)
    np.testing.assert_array_equal(chain.argmax(rows, context), build(text)(rows, context).argmax(axis=1))
    assert calls, "a tie must let the trailing steps decide"


def test_a_temperature_that_would_round_two_logits_together_runs(build: Any) -> None:
    chain = build("temperature=0.3")
    rows, context = random_case(1, vocab=16)
    top = np.float32(11.440831)
    rows[:] = -5.0
    rows[:, 4] = top
    rows[:, 2] = np.nextafter(top, np.float32(0))  # one ulp below: after / 0.3 in float32 the two are equal
    assert not rows[0, 2] / np.float32(0.3) < rows[0, 4] / np.float32(0.3)
    calls = counting(chain)
    np.testing.assert_array_equal(chain.argmax(rows, context), [2, 2, 2])  # the tie goes to the first id
    assert calls


def test_trailing_steps_that_keep_the_argmax_are_skipped(build: Any) -> None:
    chain = build("repetition_penalty=1.3,top_k=40,top_p=0.95,temperature=0.8")
    calls = counting(chain)
    rows, context = random_case(2, vocab=96)
    expected = build("repetition_penalty=1.3,top_k=40,top_p=0.95,temperature=0.8")(rows, context).argmax(axis=1)
    np.testing.assert_array_equal(chain.argmax(rows, context), expected)
    assert calls == {0: 1}, calls  # the penalty ran; the fused top_k/top_p/temperature run did not


def test_a_step_without_bounds_after_the_truncations_keeps_them_running(build: Any) -> None:
    chain = build("top_k=40,temperature=0.8,typical_p=0.5")  # typical_p may drop the most probable token
    calls = counting(chain)
    rows, context = random_case(4, vocab=96)
    expected = build("top_k=40,temperature=0.8,typical_p=0.5")(rows, context).argmax(axis=1)
    np.testing.assert_array_equal(chain.argmax(rows, context), expected)
    assert len(calls) == len(chain.steps)
