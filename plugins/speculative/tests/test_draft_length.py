"""The draft-length rules: fixed, HF's schedule, and the cost-aware rule's choice and its cost curve."""

from __future__ import annotations

import pytest
from decoctl_speculative import CostAwareLength, DraftLength, ScheduledLength

from decoctl import ConfigError


def seen(
    rule: CostAwareLength, costs: dict[int, float], bucket: int = 2, accepted_of: tuple[int, int] = (0, 0)
) -> None:
    """Feed the rule one observation per forward size with these relative costs (a one-token forward = 1 ms)."""
    for size, cost in costs.items():
        drafted = size - 1
        accepted = min(drafted, accepted_of[0]) if drafted else 0
        rule.observe(bucket=bucket, drafted=drafted, accepted=accepted, verify_seconds=cost / 1000, draft_seconds=0.0)


def test_a_fixed_length_verifies_k_or_what_is_available() -> None:
    rule = DraftLength(4, 1, 16)
    assert rule.choose(bucket=0, cap=10) == 4
    assert rule.choose(bucket=0, cap=2) == 2


def test_the_schedule_grows_by_two_on_full_acceptance_and_shrinks_by_one_below_half() -> None:
    rule = ScheduledLength(4, 1, 16)
    rule.observe(bucket=0, drafted=4, accepted=4, verify_seconds=0.0, draft_seconds=0.0)
    assert rule.value == 6
    rule.observe(bucket=0, drafted=6, accepted=2, verify_seconds=0.0, draft_seconds=0.0)
    assert rule.value == 5


def test_bounds_in_the_wrong_order_are_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match="k_min=5 is above k_max=3"):
        CostAwareLength(4, 5, 3)


def test_the_first_choice_verifies_nothing_to_time_a_one_token_forward() -> None:
    rule = CostAwareLength(4, 1, 16)
    assert rule.choose(bucket=3, cap=8) == 0


def test_measured_costs_are_used_as_measured_and_interpolated_between() -> None:
    rule = CostAwareLength(4, 1, 16)
    seen(rule, {1: 1.0, 3: 2.0, 5: 3.0})
    assert rule.cost(3) == pytest.approx(2.0)
    assert rule.cost(4) == pytest.approx(2.5)
    assert rule.cost(2) == pytest.approx(1.5)  # between the one-token forward and size 3


def test_beyond_the_largest_measured_size_the_last_slope_continues() -> None:
    rule = CostAwareLength(4, 1, 16)
    seen(rule, {1: 1.0, 3: 2.0, 5: 3.0})
    assert rule.cost(9) == pytest.approx(5.0)


def test_near_certain_acceptance_on_flat_cost_verifies_every_available_draft() -> None:
    rule = CostAwareLength(4, 1, 16)
    seen(rule, {1: 1.0, 9: 1.1}, accepted_of=(8, 8))
    for _ in range(30):
        rule.observe(bucket=2, drafted=8, accepted=8, verify_seconds=1.1e-3, draft_seconds=0.0)
    assert rule.choose(bucket=2, cap=8) == 8


def test_poor_acceptance_on_steep_cost_verifies_the_fewest_allowed() -> None:
    rule = CostAwareLength(4, 1, 16)
    seen(rule, {1: 1.0, 2: 1.6, 5: 3.4})
    for _ in range(30):
        rule.observe(bucket=1, drafted=4, accepted=0, verify_seconds=3.4e-3, draft_seconds=0.0)
    assert rule.choose(bucket=1, cap=8) == 1


def test_buckets_keep_their_own_acceptance() -> None:
    rule = CostAwareLength(4, 1, 16)
    seen(rule, {1: 1.0, 3: 1.5, 9: 2.5})
    for _ in range(30):
        rule.observe(bucket=3, drafted=8, accepted=8, verify_seconds=2.5e-3, draft_seconds=0.0)
        rule.observe(bucket=1, drafted=2, accepted=0, verify_seconds=1.5e-3, draft_seconds=0.0)
    assert rule.choose(bucket=3, cap=8) > rule.choose(bucket=1, cap=8)


def test_draft_model_steps_count_against_longer_drafts() -> None:
    free, costly = CostAwareLength(4, 1, 16), CostAwareLength(4, 1, 16)
    for rule, draft_ms in ((free, 0.0), (costly, 0.8)):
        seen(rule, {1: 1.0, 3: 1.3, 9: 1.9})
        for _ in range(20):
            rule.observe(bucket=0, drafted=8, accepted=6, verify_seconds=1.9e-3, draft_seconds=8 * draft_ms / 1000)
    assert costly.choose(bucket=0, cap=8) < free.choose(bucket=0, cap=8)
