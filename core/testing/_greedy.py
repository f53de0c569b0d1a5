"""The tie-aware comparison behind every "this strategy's greedy output is greedy's" test, and the loop that runs it
over prompts (assert_greedys_tokens).

A verify pass over many tokens and single steps differ by ~1e-6 in the logits, so where greedy's top two logits
nearly tie, a lossless strategy may pick the other one. Two outputs count as the same greedy output when they
agree, or when they first differ at a position where the baseline's top-2 logit gap is below ``TIE_GAP``; tests
also count how often that happens.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Tokens
from pathlib import Path
from typing import TYPE_CHECKING

from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.testing._models import top2_gap

if TYPE_CHECKING:  # the helpers run Generators they are given; importing them here would load every layer
    from decoctl.generation import GenerationResult, Generator

__all__ = ["TIE_GAP", "assert_greedys_tokens", "first_divergence_is_a_tie"]

TIE_GAP = 1e-4
"""Logits closer than this are a tie: where two runs' greedy tokens first differ, a tie is no error (rounding may
pick either)."""


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


def assert_greedys_tokens(
    baseline: Generator,
    generator: Generator,
    prompts: Iterable[str],
    *,
    max_new_tokens: int,
    ties: int = 1,
) -> list[GenerationResult]:
    """Assert that ``generator`` gives ``baseline``'s (greedy) tokens for every prompt, as first_divergence_is_a_tie
    judges (the same tokens, or a first difference where greedy's top two logits nearly tie), with at most ``ties``
    prompts differing at all; return ``generator``'s results, for checks of its stats (drafts made and accepted)."""
    folder = baseline.models["target"].spec.path
    results = []
    differing = 0
    for prompt in prompts:
        expected = baseline.generate(prompt, max_new_tokens=max_new_tokens).tokens
        result = generator.generate(prompt, max_new_tokens=max_new_tokens)
        ids = baseline.tokenizer.encode(prompt)
        assert first_divergence_is_a_tie(folder, ids, expected, result.tokens), (
            f"{prompt!r}: greedy gave {list(expected)}, the generator {list(result.tokens)}, first apart where "
            "greedy's choice is no tie"
        )
        differing += expected != result.tokens
        results.append(result)
    assert differing <= ties, f"{differing} prompts differ from greedy at near-ties; at most {ties} may"
    return results
