"""What each processor does, shown on small hand-made rows (the transformers oracle covers the rest)."""

from __future__ import annotations

from typing import Any

import numpy as np
from chain_cases import EOS

from decoctl import ProcessContext


def context(prompt: list[int], output: list[int], paths: list[list[int]] | None = None) -> ProcessContext:
    return ProcessContext(
        np.asarray(prompt, np.int64), np.asarray(output, np.int64), paths or [[]], eos_token_ids=frozenset(EOS)
    )


def ones(n: int = 1, vocab: int = 10) -> np.ndarray:
    return np.ones((n, vocab), np.float32)


def test_presence_penalty_subtracts_once_per_generated_token(build: Any) -> None:
    out = build("presence_penalty=0.5")(ones(), context([2], [3, 3, 4]))
    np.testing.assert_allclose(out[0], [1, 1, 1, 0.5, 0.5, 1, 1, 1, 1, 1])


def test_presence_penalty_can_count_the_prompt(build: Any) -> None:
    out = build([{"name": "presence_penalty", "penalty": 0.5, "include_prompt": True}])(ones(), context([2], [3]))
    np.testing.assert_allclose(out[0, [2, 3, 4]], [0.5, 0.5, 1])


def test_frequency_penalty_subtracts_per_occurrence(build: Any) -> None:
    out = build("frequency_penalty=0.25")(ones(), context([2, 2], [3, 3, 3, 4]))
    np.testing.assert_allclose(out[0, [2, 3, 4, 5]], [1, 0.25, 0.75, 1])


def test_penalties_count_each_rows_drafted_tokens(build: Any) -> None:
    out = build("frequency_penalty=1")(ones(3), context([], [6], [[], [6], [6, 7]]))
    np.testing.assert_allclose(out[:, [6, 7]], [[0, 1], [-1, 1], [-1, 0]])


def test_greedy_keeps_only_the_argmax(build: Any) -> None:
    rows = np.array([[0.1, 3.0, -1.0, 3.0], [5.0, 1.0, 0.0, 2.0]], np.float32)
    out = build("greedy")(rows.copy(), context([], [], [[], []]))
    expected = np.full_like(rows, -np.inf)
    expected[0, 1], expected[1, 0] = 3.0, 5.0
    np.testing.assert_array_equal(out, expected)


def test_sample_is_the_identity(build: Any) -> None:
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(build("sample")(rows.copy(), context([], [], [[], []])), rows)


def test_min_new_tokens_masks_every_eos_id_until_enough_tokens(build: Any) -> None:
    out = build("min_new_tokens=2")(ones(3), context([9, 9, 9], [4], [[], [4], [4, 4]]))
    assert out[0, list(EOS)].tolist() == [-np.inf, -np.inf]
    assert out[1, list(EOS)].tolist() == [1, 1] and out[2, list(EOS)].tolist() == [1, 1]


def test_bad_words_bans_the_last_token_only_after_the_rest_of_the_sequence(build: Any) -> None:
    processor = build("bad_words=3 4 | 8")
    after_three = processor(ones(), context([], [3]))[0]
    assert after_three[4] == -np.inf and after_three[8] == -np.inf
    elsewhere = processor(ones(), context([], [2]))[0]
    assert elsewhere[4] == 1 and elsewhere[8] == -np.inf


def test_processors_apply_in_the_order_given(build: Any) -> None:
    """A bias that lifts token 9 into the top 2 only counts if it comes before top_k."""
    rows = np.array([[3.0, 2.0, 1.0, 0, 0, 0, 0, 0, 0, 0]], np.float32)
    bias_first = build("logit_bias=9:5,top_k=2")(rows.copy(), context([], []))
    top_k_first = build("top_k=2,logit_bias=9:5")(rows.copy(), context([], []))
    assert np.flatnonzero(bias_first[0] > -np.inf).tolist() == [0, 9]
    assert np.flatnonzero(top_k_first[0] > -np.inf).tolist() == [0, 1]
