"""The engine's cost rule: a speculating row joins the batched step when that gives the engine more tokens a second."""

from __future__ import annotations

import pytest

from decoctl.serve._join_rule import (
    JOIN_GAIN,
    KINDS_KEPT,
    MIN_CHUNK,
    MIN_STEPS,
    PREFILL_SHARE,
    SWITCH_GAIN,
    JoinRule,
)


def chunk(rule: JoinRule, span: int, remaining: int, capacity: int | None = None) -> int:
    """The tokens of a prompt's ``remaining`` that a step whose Run spans ``span`` of ``capacity`` rows feeds, the
    prompt alone spending the step's budget (all of them while there is no budget yet), as the engine does."""
    budget = rule.prefill_budget(span, capacity)
    return remaining if budget is None else rule.prefill_tokens_within(budget, remaining)


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


def test_speculating_rows_with_no_batch_join_together_when_a_run_of_them_gives_more() -> None:
    # 4 rows drafting alone: 4 steps of 2 units for 2.5 tokens each (10 / 8); joined, one Run of 4 rows: 4 / 1.6
    rule = rule_with({1: 1.0, 4: 1.6})
    for row in range(4):
        for _ in range(MIN_STEPS):
            rule.observe_step(row, 2.5, 2.0)
    assert rule.choose({row: (row, None) for row in range(4)}, 0, 0) == {0, 1, 2, 3}


def test_a_new_row_is_judged_by_the_steps_of_its_kind() -> None:
    rule = rule_with({8: 3.0, 9: 3.2})
    for _ in range(MIN_STEPS):
        rule.observe_step("old", 2, 1.5, "lookup")
    assert rule.choose({"new": (8, "lookup")}, 8, 8) == {"new"}
    assert rule.choose({"new": (8, "other")}, 8, 8) == set()  # no steps of its kind yet: it drafts


def test_the_rows_whose_drafting_pays_most_keep_drafting() -> None:
    # a batch of 2 rows (Run of 3 rows: 1.2, of 4: 1.3); row "good" commits 6 tokens a step of 1 unit, "poor" 1.2
    rule = rule_with({2: 1.1, 3: 1.2, 4: 1.3})
    for _ in range(MIN_STEPS):
        rule.observe_step("good", 6, 1.0)
        rule.observe_step("poor", 1.2, 1.0)
    assert rule.choose({"good": (2, None), "poor": (3, None)}, 2, 2) == {"poor"}


def test_runs_are_priced_by_prompt_forwards_before_any_run_was_measured() -> None:
    rule = JoinRule()
    rule.observe_prefill(8, 2.0)
    assert rule.run_seconds(4) == pytest.approx(1.0)


def test_a_prompt_is_fed_whole_until_costs_are_measured() -> None:
    assert chunk(JoinRule(), 8, 100) == 100
    rule = JoinRule()
    rule.observe_run(8, 3.0)
    assert chunk(rule, 8, 100) == 100  # no prompt forward measured yet


def test_a_prompt_chunk_fits_in_a_share_of_the_batched_run() -> None:
    rule = rule_with({8: 3.1})
    rule.observe_prefill(1, 0.5)
    rule.observe_prefill(11, 1.5)  # 0.5 + 0.1 a token
    assert chunk(rule, 8, 100) == int((PREFILL_SHARE * 3.1 - 0.5) / 0.1) + 1
    assert chunk(rule, 8, 3) == 3


def test_a_prompt_chunk_is_never_smaller_than_a_few_one_token_forwards_allow() -> None:
    rule = rule_with({1: 0.5})  # a share of this Run is less than one prompt forward
    rule.observe_prefill(1, 0.5)
    rule.observe_prefill(11, 0.9)  # 0.5 + 0.04 a token
    assert chunk(rule, 1, 100) == int((MIN_CHUNK * 0.5 - 0.5) / 0.04) + 1 > 1


def test_a_prompt_behind_a_few_rows_goes_in_chunks_a_full_batchs_step_allows() -> None:
    rule = rule_with({1: 0.5, 16: 2.0})
    rule.observe_prefill(1, 0.5)
    rule.observe_prefill(11, 0.9)  # 0.5 + 0.04 a token
    small = chunk(rule, 1, 200)  # without the capacity: one-token forwards' floor only
    assert small == int((MIN_CHUNK * 0.5 - 0.5) / 0.04) + 1
    # beside one row of 16: the step may take what a full batch's step with its share takes, less the Run's own
    assert chunk(rule, 1, 200, 16) == int(((1 + PREFILL_SHARE) * 2.0 - 0.5 - 0.5) / 0.04) + 1 > small
    # a full batch gets its share only
    assert chunk(rule, 16, 200, 16) == chunk(rule, 16, 200)


def test_chunks_before_a_prompts_last_are_priced_without_the_lm_head() -> None:
    rule = rule_with({8: 4.0})
    rule.observe_prefill(1, 0.5)
    rule.observe_prefill(11, 1.5)  # with the last row's logits: 0.5 + 0.1 a token
    assert rule.prefill_budget(8) == pytest.approx(PREFILL_SHARE * 4.0)
    # nothing measured without logits yet: priced as with them
    assert rule.prefill_tokens_within(1.0, 100, logits=False) == 6
    rule.observe_prefill(11, 1.2, logits=False)  # without logits: 0.2 + 0.1 a token
    rule.observe_prefill(1, 0.2, logits=False)
    assert rule.prefill_tokens_within(1.0, 100, logits=False) == 9
    # the chunk that ends the prompt computes its row: 9 tokens fit without it, 6 with it
    assert rule.prefill_tokens_within(1.0, 9, logits=True) == 8
    assert rule.prefill_tokens_within(1.0, 6, logits=True) == 6
    assert rule.prefill_tokens_within(0.0, 100) == 1  # at least one token


def test_one_slow_prompt_forward_does_not_keep_its_size_out_of_the_chunks() -> None:
    rule = rule_with({8: 4.0})
    for tokens in (1, 2, 4, 5, 6):
        rule.observe_prefill(tokens, 0.2 + 0.1 * tokens, logits=False)
    rule.observe_prefill(3, 5.0, logits=False)  # a stall: ten times a 3-token forward
    # priced on the line through all six, not by the slow one alone: 1.0 allows more than 3 tokens
    assert rule.prefill_tokens_within(1.0, 100, logits=False) > 3


def test_a_step_has_no_budget_until_a_run_and_a_prompt_forward_are_measured() -> None:
    rule = JoinRule()
    assert rule.prefill_budget(4, 16) is None
    rule.observe_run(4, 1.0)
    assert rule.prefill_budget(4, 16) is None
    rule.observe_prefill(1, 0.1, logits=False)
    assert rule.prefill_budget(4, 16) is not None


def test_a_joined_row_drafts_again_when_the_batch_shrinks() -> None:
    # the row commits 3 tokens a step of 1.5 units; beside 8 rows (Run of 8: 3.0, of 9: 3.2) it is batched:
    # drafting gives (8 + 3) / 4.5 = 2.4 tokens a unit against 9 / 3.2 = 2.8
    rule = rule_with({1: 1.0, 2: 1.3, 8: 3.0, 9: 3.2}, steps=(3, 1.5))
    assert rule.choose({"row": (8, None)}, 8, 8) == {"row"}
    assert rule.choose({"row": (8, None)}, 8, 8, batched={"row"}) == {"row"}
    # beside one row it drafts again: (1 + 3) / 2.5 = 1.6 against 2 / 1.3 = 1.54 ... and 1.6 / 1.54 is within the
    # hysteresis, so it stays; alone it drafts: 3 / 1.5 = 2 against 1 / 1.0
    assert rule.choose({"row": (1, None)}, 1, 1, batched={"row"}) == {"row"}
    assert rule.choose({"row": (0, None)}, 0, 0, batched={"row"}) == set()


def test_rows_keep_their_place_unless_the_other_gives_switch_gain_more() -> None:
    # joining gives 2 / 1.3 = 1.54 tokens a unit, drafting (1 + c) / (1 + 1.0)
    runs = {1: 1.0, 2: 1.3}
    slightly_better_drafting = rule_with(runs, steps=(2.2, 1.0))  # 1.6: within SWITCH_GAIN of 1.54
    assert slightly_better_drafting.choose({"row": (1, None)}, 1, 1, batched={"row"}) == {"row"}
    assert slightly_better_drafting.choose({"row": (1, None)}, 1, 1) == set()
    slightly_better_joined = rule_with(runs, steps=(1.9, 1.0))  # 1.45
    assert slightly_better_joined.choose({"row": (1, None)}, 1, 1) == set()
    much_better_drafting = rule_with(runs, steps=(2.5 * SWITCH_GAIN, 1.0))
    assert much_better_drafting.choose({"row": (1, None)}, 1, 1, batched={"row"}) == set()


def test_a_row_that_cannot_resume_joins_only_for_join_gain_more() -> None:
    # joining gives 9 / 3.2 = 2.81 tokens a unit, drafting (8 + 3.3) / 4.5 = 2.51: 1.12 times less
    rule = rule_with({8: 3.0, 9: 3.2}, steps=(3.3, 1.5))
    assert rule.choose({"row": (8, None)}, 8, 8) == {"row"}
    assert rule.choose({"row": (8, None)}, 8, 8, final={"row"}) == set()
    assert SWITCH_GAIN < 2.81 / 2.51 < JOIN_GAIN


def test_with_nothing_measured_of_their_kind_one_row_drafts_and_the_others_join_the_run() -> None:
    rule = rule_with({1: 1.0, 8: 3.0, 12: 3.6})  # a row in the Run costs far less than a one-row step
    rows = {key: (8 + key, "new") for key in range(4)}
    assert rule.choose(rows, 8, 8) == {1, 2, 3}  # row 0 drafts: its steps measure the kind
    assert rule.choose(rows, 8, 8, batched={0, 1, 2}) == {0, 1, 2}  # the one drafting already goes on
    assert rule.choose(rows, 8, 8, final={1, 2, 3}) == set()  # rows that cannot resume draft until measured
    assert rule_with({1: 1.0, 2: 2.5}).choose({0: (0, "new"), 1: (1, "new")}, 0, 0) == set()  # Runs cost more


def test_a_lone_row_with_nothing_measured_drafts() -> None:
    assert rule_with({1: 1.0}).choose({"row": (0, "new")}, 0, 0) == set()
    assert rule_with({1: 1.0, 9: 3.2}).choose({"row": (8, "new")}, 8, 8) == set()


def test_a_fresh_row_takes_the_better_place_without_the_hysteresis() -> None:
    # beside 8 rows (Run of 8: 3.0, of 9: 3.15) a row of 1.2 tokens in 0.42 units: drafting gives 9.2 / 3.42 = 2.69
    # tokens a unit, joining 9 / 3.15 = 2.86, 1.06x: more, but within the hysteresis
    rule = rule_with({8: 3.0, 9: 3.15}, steps=(1.2, 0.42))
    assert 1.0 < (9 / 3.15) / (9.2 / 3.42) < SWITCH_GAIN
    assert rule.choose({"row": (8, None)}, 8, 8) == set()  # drafting: it keeps its place
    assert rule.choose({"row": (8, None)}, 8, 8, fresh={"row"}) == {"row"}  # placed for the first time: it joins


def test_the_prefill_share_sets_a_full_batchs_budget() -> None:
    rule = JoinRule(prefill_share=1.0)
    rule.observe_run(8, 4.0)
    rule.observe_run(1, 0.5)
    rule.observe_prefill(1, 0.1)
    assert rule.prefill_budget(8, 8) == pytest.approx(4.0)
    assert JoinRule().prefill_budget(8) is None
    with pytest.raises(ValueError, match="prefill_share"):
        JoinRule(prefill_share=0)


def test_the_kinds_a_rule_keeps_are_bounded_and_the_least_recently_seen_goes_first() -> None:
    rule = JoinRule()
    for number in range(KINDS_KEPT * 20):  # as many option spellings as clients care to send
        rule.observe_step(row=number, tokens=2, seconds=0.01, kind=("speculative", f'{{"k": {number}}}'))
        rule.forget(number)
    assert len(rule._kinds) == KINDS_KEPT
    kept = ("speculative", '{"k": 0}')
    for _ in range(MIN_STEPS):
        rule.observe_step(row="a", tokens=3, seconds=0.01, kind=kept)
    for number in range(KINDS_KEPT - 1):  # every other kind is seen again after it; it was seen more recently
        rule.observe_step(row="b", tokens=1, seconds=0.01, kind=("lookahead", str(number)))
    assert rule.estimate("new row", kept) is not None
    rule.observe_step(row="b", tokens=1, seconds=0.01, kind=("lookahead", "one more"))
    assert rule.estimate("new row", kept) is None
