"""The verification verdict: first-token logits of the converted model against its source, with a tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from decoctl.errors import ModelLoadError
from decoctl.importers._gemma3 import TOLERANCE
from decoctl.importers._verify import compare_logits, require_all

REFERENCE = np.array([1.0, 5.0, -3.0, 2.0], np.float32)


def test_logits_within_the_tolerance_pass() -> None:
    check = compare_logits("p", REFERENCE, REFERENCE + np.float32(0.004), tolerance=0.01)
    assert check.ok
    assert check.top1_match
    assert check.max_abs_diff == pytest.approx(0.004, abs=1e-6)


def test_the_largest_difference_decides() -> None:
    candidate = REFERENCE.copy()
    candidate[2] += 0.5
    check = compare_logits("p", REFERENCE, candidate, tolerance=0.1)
    assert not check.ok
    assert check.max_abs_diff == pytest.approx(0.5)


def test_a_different_top_token_is_reported() -> None:
    candidate = REFERENCE.copy()
    candidate[0] = 6.0
    assert not compare_logits("p", REFERENCE, candidate, tolerance=10.0).top1_match


def test_non_finite_logits_always_fail() -> None:
    candidate = REFERENCE.copy()
    candidate[1] = np.nan
    assert not compare_logits("p", REFERENCE, candidate, tolerance=1e9).ok


def test_logits_of_another_vocabulary_are_an_error() -> None:
    with pytest.raises(ModelLoadError, match="gives 3 logits but the source gives 4"):
        compare_logits("p", REFERENCE, REFERENCE[:3], tolerance=1.0)


def test_require_all_names_every_failing_prompt() -> None:
    good = compare_logits("good", REFERENCE, REFERENCE, tolerance=0.01)
    bad = compare_logits("bad", REFERENCE, REFERENCE + 1, tolerance=0.01)
    require_all([good], model="m")
    with pytest.raises(ModelLoadError, match=r"converted m does not match.*'bad'.*FAILED") as caught:
        require_all([good, bad], model="m")
    assert "'good'" not in str(caught.value)


def test_int8_is_allowed_more_error_than_fp32() -> None:
    assert 0 < TOLERANCE["fp32"] < TOLERANCE["int8"]
