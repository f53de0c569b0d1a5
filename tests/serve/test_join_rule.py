"""The engine's cost rule: a speculating row joins the batched step when that gives the engine more tokens a second."""

from __future__ import annotations

import pytest

from decoctl.serve.join_rule import MIN_STEPS, JoinRule


def rule_with(runs: dict[int, float], steps: tuple[int, float] | None = None, count: int = MIN_STEPS) -> JoinRule:
    rule = JoinRule()
    for rows, seconds in runs.items():
        rule.observe_run(rows, seconds)
    for _ in range(count if steps else 0):
        assert steps is not None
        rule.observe_step("row", *steps)
    return rule


def test_a_row_is_not_judged_before_it_took_enough_steps() -> None:
    rule = rule_with({1: 1.0, 4: 2.0, 5: 2.2}, steps=(1, 10.0), count=MIN_STEPS - 1)
    assert not rule.joins("row", 4)


def test_a_lone_row_keeps_drafting_until_a_one_row_run_was_measured() -> None:
    assert not rule_with({4: 2.0}, steps=(1, 10.0)).joins("row", 0)
    assert rule_with({1: 1.0}, steps=(1, 10.0)).joins("row", 0)  # drafting slower than plain steps: join


def test_a_lone_row_whose_drafting_pays_keeps_drafting() -> None:
    assert not rule_with({1: 1.0}, steps=(3, 1.5)).joins("row", 0)  # 2 tokens a unit against 1


def test_under_load_a_row_joins_when_its_step_stalls_the_batch_more_than_it_gains() -> None:
    # a Run of 8 rows costs 3 units and 9 rows 3.2; the row's step takes 1.5 units for 2.5 tokens:
    # staying gives (8 + 2.5) / (3 + 1.5) = 2.33 tokens a unit, joining 9 / 3.2 = 2.81
    runs = {8: 3.0, 9: 3.2}
    assert rule_with(runs, steps=(2, 1.5)).joins("row", 8)
    # with few rows the same row pays: (1 + 2.5) / (1 + 1.5) = 1.4 against 2 / 1.3 = 1.54 ... and 4 tokens a step
    assert not rule_with({1: 1.0, 2: 1.3}, steps=(4, 1.5)).joins("row", 1)


def test_run_seconds_of_an_unmeasured_size_lie_on_the_line_through_the_nearest_two() -> None:
    rule = rule_with({2: 1.0, 4: 2.0})
    assert rule.run_seconds(3) == pytest.approx(1.5)
    assert rule.run_seconds(6) == pytest.approx(3.0)
    assert rule_with({4: 2.0}).run_seconds(8) == pytest.approx(4.0)  # one size: proportionally
    assert JoinRule().run_seconds(3) is None


def test_a_run_is_priced_by_the_rows_it_computes_not_the_rows_it_steps() -> None:
    # the batch steps rows 0 and 1 (span 2); the speculating row is row 7: joining makes the Run compute 8 rows
    rule = rule_with({2: 1.0, 8: 3.0}, steps=(1, 1.2))
    assert rule.joins("row", 2, span=2, joined_span=3)  # next to the batch: (2 + 1) / 1.33 against 3 / 2.2
    assert not rule.joins("row", 2, span=2, joined_span=8)  # far above it: 3 / 3.0 against 3 / 2.2
