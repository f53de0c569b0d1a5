"""The tie-aware comparison behind every "this strategy's greedy output is greedy's" test.

A verify pass over many tokens and single steps differ by ~1e-6 in the logits, so where greedy's top two logits
nearly tie, a lossless strategy may pick the other one. Two outputs count as the same greedy output when they
agree, or when they first differ at a position where the baseline's top-2 logit gap is below ``TIE_GAP``; tests
also count how often that happens.
"""

from __future__ import annotations

from collections.abc import Sequence as Tokens
from pathlib import Path

from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.testing.models import top2_gap

__all__ = ["TIE_GAP", "first_divergence_is_a_tie"]

TIE_GAP = 1e-4


def first_divergence_is_a_tie(
    folder: Path | str, prompt_ids: Tokens[int], expected: Tokens[int], got: Tokens[int]
) -> bool:
    """True when ``got`` equals ``expected`` (the baseline's greedy tokens after ``prompt_ids`` on the model in
    ``folder``), or first differs from it where the baseline's row is a near-tie."""
    expected, got = tuple(expected), tuple(got)
    if expected == got:
        return True
    at = next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), None)
    if at is None:
        return False  # one is a prefix of the other: a length difference is no tie
    row = Sequence("target", load_model(folder, threads=1)).prefill([*prompt_ids, *expected[:at]])[0]
    return bool(top2_gap(row) < TIE_GAP)
