"""The draft-length rules: fixed, HF's schedule, and the cost-aware rule's choice, its cost curves, drafting nothing
and probing; the gate that holds drafting to measured time. Costs are given to the rule as the seconds a controller
would have measured (a one-token verify forward = 1 ms): no test here times anything."""

from __future__ import annotations

import pytest

from decoctl import ConfigError
from decoctl.draft_length import (
    JUDGE_AFTER,
    PROBE_AFTER,
    PROBE_BUDGET,
    REFRESH_EVERY,
    CostAwareLength,
    DraftGate,
    DraftLength,
    ScheduledLength,
    _Timings,  # the decayed means a run of plain steps is added to at once
    draft_length,
    remembered,
)


def seen(
    rule: CostAwareLength, costs: dict[int, float], bucket: int = 2, accepted_of: tuple[int, int] = (0, 0)
) -> None:
    """Feed the rule one observation per forward size with these relative costs (a one-token forward = 1 ms), after
    the generation's first step (cold: 1.3 ms, which the rule leaves out of its unit)."""
    rule.observe(bucket=bucket, drafted=0, accepted=0, verify_seconds=1.3e-3, draft_seconds=0.0)
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


def test_the_first_two_choices_verify_nothing_to_time_a_one_token_forward() -> None:
    rule = CostAwareLength(4, 1, 16)
    assert rule.choose(bucket=3, cap=8) == 0
    rule.observe(bucket=3, drafted=0, accepted=0, verify_seconds=1.3e-3, draft_seconds=0.0)
    assert rule.choose(bucket=3, cap=8) == 0
    rule.observe(bucket=3, drafted=0, accepted=0, verify_seconds=1e-3, draft_seconds=0.0)
    assert rule.choose(bucket=3, cap=8) > 0


def test_the_cold_first_step_is_left_out_of_the_one_token_cost() -> None:
    rule = CostAwareLength(4, 1, 16)
    seen(rule, {1: 1.0, 3: 2.0})
    assert rule.cost(3) == pytest.approx(2.0)  # priced on 1 ms, not on the first step's 1.3 ms


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


def drafting(
    rule: CostAwareLength,
    steps: int,
    *,
    drafted: int,
    accepted: int,
    verify_ms: float,
    step_ms: float,
    catch_up_ms: float,
) -> None:
    """Feed the rule ``steps`` steps of a drafter whose catch-up gives its first draft (an EAGLE head): a catch-up over
    the previous step's accepted tokens plus one, then drafted - 1 draft steps of ``step_ms`` each."""
    for _ in range(steps):
        rule.observe(
            bucket=0,
            drafted=drafted,
            accepted=accepted,
            verify_seconds=verify_ms / 1000,
            draft_seconds=(drafted - 1) * step_ms / 1000,
            catch_up_rows=accepted + 1,
            catch_up_seconds=catch_up_ms / 1000,
        )


def head_rule() -> CostAwareLength:
    rule = CostAwareLength(2, 0, 8, controller="eagle", first_from_catch_up=True)
    seen(rule, {1: 1.0}, bucket=0)
    return rule


def expensive_and_rejected() -> CostAwareLength:
    """A head whose every forward costs 0.8 of a target forward, and whose drafts are almost never accepted."""
    rule = head_rule()
    drafting(rule, 30, drafted=2, accepted=0, verify_ms=1.3, step_ms=0.8, catch_up_ms=0.8)
    return rule


def test_an_expensive_rejected_drafter_drafts_nothing_when_k_min_is_0() -> None:
    assert expensive_and_rejected().choose(bucket=0, cap=8, backlog=1) == 0


def test_a_cheap_accepted_drafter_drafts_several() -> None:
    rule = head_rule()
    drafting(rule, 30, drafted=3, accepted=3, verify_ms=1.2, step_ms=0.05, catch_up_ms=0.05)
    assert rule.choose(bucket=0, cap=8, backlog=4) >= 3


def test_a_rule_whose_lower_bound_is_1_never_drafts_nothing_after_its_first_step() -> None:
    rule = CostAwareLength(2, 1, 8, first_from_catch_up=True)
    seen(rule, {1: 1.0}, bucket=0)
    drafting(rule, 30, drafted=2, accepted=0, verify_ms=1.3, step_ms=0.8, catch_up_ms=0.8)
    assert [rule.choose(bucket=0, cap=8, backlog=1) for _ in range(3 * PROBE_AFTER)] == [1] * (3 * PROBE_AFTER)


def paying_unless_far_behind() -> CostAwareLength:
    """A head that pays while it keeps up (catch-ups of 2 rows: 0.1 ms) but costs 4 ms to catch up on 200 rows."""
    rule = head_rule()
    drafting(rule, 20, drafted=2, accepted=2, verify_ms=1.1, step_ms=0.1, catch_up_ms=0.1)
    drafting(rule, 5, drafted=2, accepted=0, verify_ms=1.1, step_ms=0.1, catch_up_ms=0.1)
    rule.observe(
        bucket=0,
        drafted=0,
        accepted=0,
        verify_seconds=1e-3,
        draft_seconds=0.0,
        catch_up_rows=200,
        catch_up_seconds=4e-3,
    )
    return rule


def test_the_catch_up_a_backlog_needs_is_priced_by_its_rows() -> None:
    rule = paying_unless_far_behind()
    assert rule.choose(bucket=0, cap=8, backlog=2) >= 1
    assert rule.choose(bucket=0, cap=8, backlog=400) == 0


def test_a_draft_that_comes_with_the_catch_up_costs_no_draft_step() -> None:
    shared, own = head_rule(), CostAwareLength(2, 0, 8)
    seen(own, {1: 1.0}, bucket=0)
    for rule in (shared, own):
        rule.observe(bucket=0, drafted=2, accepted=1, verify_seconds=1.2e-3, draft_seconds=0.8e-3)
    assert shared.stats()["draft_step_cost"] == pytest.approx(0.8)  # one head forward for two drafts
    assert own.stats()["draft_step_cost"] == pytest.approx(0.4)


def test_the_schedule_keeps_drafting_with_a_lower_bound_of_0() -> None:
    rule = ScheduledLength(1, 0, 8)
    for _ in range(5):
        rule.observe(bucket=0, drafted=2, accepted=0, verify_seconds=0.0, draft_seconds=0.0)
    assert rule.choose(bucket=0, cap=8) == 1


@pytest.mark.parametrize(
    ("adaptive", "rule", "kind"),
    [(False, "cost", DraftLength), (True, "schedule", ScheduledLength), (True, "cost", CostAwareLength)],
)
def test_the_options_pick_the_rule(adaptive: bool, rule: str, kind: type) -> None:
    options = {"k": 2, "k_min": 0, "k_max": 8, "adaptive": adaptive, "length_rule": rule}
    assert type(draft_length(options, controller="eagle")) is kind


def test_bounds_in_the_wrong_order_name_the_controller_whose_options_they_are() -> None:
    options = {"k": 2, "k_min": 5, "k_max": 3, "adaptive": True, "length_rule": "cost"}
    with pytest.raises(ConfigError, match="eagle option k_min=5 is above k_max=3"):
        draft_length(options, controller="eagle")


# -- the gate: drafting held to measured time -----------------------------------------------------------------------
def timed_gate(first_ms: float = 1.3, plain_ms: float = 1.0) -> DraftGate:
    """A gate after a generation's first two plain steps (the first cold)."""
    gate = DraftGate()
    for ms in (first_ms, plain_ms):
        assert not gate.drafts()
        gate.observe(drafted=False, committed=1, seconds=ms / 1000)
    return gate


def run(gate: DraftGate, steps: int, *, draft_ms: float, committed: int, plain_ms: float = 1.0) -> list[bool]:
    """``steps`` steps that draft when the gate says so (``draft_ms`` for ``committed`` tokens) and take a plain
    step of ``plain_ms`` otherwise; which of them drafted."""
    drafted = []
    for _ in range(steps):
        drafts = gate.drafts(wanted=True)
        if drafts:
            gate.observe(drafted=True, committed=committed, seconds=draft_ms / 1000)
        else:
            gate.observe(drafted=False, committed=1, seconds=plain_ms / 1000)
        drafted.append(drafts)
    return drafted


def test_the_gate_times_two_plain_steps_before_drafting_and_leaves_the_cold_first_out() -> None:
    gate = timed_gate(first_ms=1.3, plain_ms=1.0)
    assert gate.unit == pytest.approx(1e-3)
    assert gate.drafts(wanted=True)


def test_drafting_slower_per_token_than_a_plain_step_is_stopped_after_the_steps_it_is_judged_by() -> None:
    # a forward over two tokens costs 1.48 plain steps (AVX-512, one thread) and the drafts are accepted a third of
    # the time: 1.33 tokens for 1.48 ms
    gate = timed_gate()
    drafted = run(gate, 3 * JUDGE_AFTER, draft_ms=1.48 * 3, committed=4)  # 3 steps' worth: 4 tokens for 4.44 ms
    assert drafted[:JUDGE_AFTER] == [True] * JUDGE_AFTER
    assert gate.stopped and gate.stops == 1
    assert not any(drafted[JUDGE_AFTER : JUDGE_AFTER + PROBE_AFTER])


def test_drafting_that_pays_goes_on() -> None:
    gate = timed_gate()
    assert all(run(gate, 3 * JUDGE_AFTER, draft_ms=1.5, committed=2))
    assert not gate.stopped


def test_a_stopped_gate_probes_after_a_run_of_plain_steps_and_then_waits_twice_as_long() -> None:
    gate = timed_gate()
    run(gate, JUDGE_AFTER, draft_ms=1.01, committed=1)  # loses 1%: stopped, at a loss well within the budget
    assert gate.stopped
    drafted = run(gate, 1 + PROBE_AFTER + 2 * PROBE_AFTER + 1, draft_ms=1.01, committed=1)
    probes = [i for i, d in enumerate(drafted) if d]
    assert probes == [PROBE_AFTER, PROBE_AFTER + 1 + 2 * PROBE_AFTER]
    assert gate.probes == 2 and gate.stopped


def test_probes_wait_while_what_drafting_lost_is_above_the_budget() -> None:
    gate = timed_gate()
    run(gate, JUDGE_AFTER, draft_ms=3.0, committed=1)  # lost 2 ms a step: 16 ms
    drafted = run(gate, 2000, draft_ms=3.0, committed=1)
    first = drafted.index(True)
    # plain steps of 1 ms until the generation's time (2.3 + 8 * 3 + first ms) is 1 / PROBE_BUDGET of 16 ms
    assert first >= 16 / PROBE_BUDGET - 2.3 - 8 * 3 - 1
    assert first > PROBE_AFTER


def test_a_probe_that_pays_resumes_drafting() -> None:
    gate = timed_gate()
    run(gate, JUDGE_AFTER, draft_ms=1.5, committed=1)
    assert gate.stopped
    drafted = run(gate, 1000, draft_ms=1.2, committed=3)  # the text changed: drafts are accepted now
    first = drafted.index(True)
    assert all(drafted[first : first + 4 * JUDGE_AFTER])
    assert not gate.stopped


def test_a_long_run_of_drafting_steps_is_broken_by_one_plain_step_that_times_the_unit_again() -> None:
    gate = timed_gate()
    drafted = run(gate, REFRESH_EVERY + 2, draft_ms=1.2, committed=3)
    assert drafted == [True] * REFRESH_EVERY + [False, True]


def test_the_unit_follows_the_refreshing_plain_steps() -> None:
    gate = timed_gate(plain_ms=1.0)
    run(gate, REFRESH_EVERY + 1, draft_ms=1.2, committed=3, plain_ms=2.0)
    assert gate.unit == pytest.approx(1.5e-3)


def test_the_cost_rule_stops_drafting_that_stopped_paying_before_its_means_catch_up() -> None:
    rule = head_rule()
    drafting(rule, 40, drafted=2, accepted=2, verify_ms=1.2, step_ms=0.1, catch_up_ms=0.1)  # pays: 3 tokens, 1.4 ms
    choices = []
    for _ in range(3 * JUDGE_AFTER):  # the machine gets busy: a forward over 3 tokens costs 4 ms, the head 1 ms
        k = rule.choose(bucket=0, cap=8, backlog=3)
        choices.append(k)
        if k:
            rule.observe(
                bucket=0,
                drafted=k,
                accepted=k,
                verify_seconds=4e-3,
                draft_seconds=(k - 1) * 1e-3,
                catch_up_rows=3,
                catch_up_seconds=1e-3,
            )
        else:
            rule.observe(bucket=0, drafted=0, accepted=0, verify_seconds=1e-3, draft_seconds=0.0)
    assert 0 in choices[: 2 * JUDGE_AFTER]
    assert rule.stats()["drafting_stopped"]
    assert choices[-PROBE_AFTER:] == [0] * PROBE_AFTER


def test_a_rule_with_k_min_1_is_not_gated() -> None:
    rule = CostAwareLength(2, 1, 8)
    seen(rule, {1: 1.0}, bucket=0)
    for _ in range(3 * JUDGE_AFTER):
        assert rule.choose(bucket=0, cap=8) >= 1
        rule.observe(bucket=0, drafted=1, accepted=0, verify_seconds=3e-3, draft_seconds=0.0)


# -- what a Generator's generations share ----------------------------------------------------------------------------
class Model:
    """Stands for a LoadedModel: compared by identity, its fields unhashable."""

    __hash__ = None  # type: ignore[assignment]


def test_a_cost_rule_given_the_same_model_and_options_is_the_one_measured_before_restarted() -> None:
    model = Model()
    options = {"k": 2, "k_min": 0, "k_max": 8, "adaptive": True, "length_rule": "cost"}
    first = draft_length(options, controller="eagle", model=model, drafter="head")
    seen(first, {1: 1.0, 3: 1.5}, bucket=0)
    again = draft_length(options, controller="eagle", model=model, drafter="head")
    assert again is first
    assert again.cost(3) == pytest.approx(1.5)
    assert again.choose(bucket=0, cap=8) == 0  # a new generation's first step runs cold: plain
    assert draft_length(options, controller="eagle", model=model, drafter="other head") is not first
    assert draft_length({**options, "k_max": 4}, controller="eagle", model=model, drafter="head") is not first
    assert draft_length(options, controller="eagle", model=Model(), drafter="head") is not first


def test_fixed_and_scheduled_lengths_start_afresh_each_generation() -> None:
    model = Model()
    for adaptive, rule in ((False, "cost"), (True, "schedule")):
        options = {"k": 2, "k_min": 0, "k_max": 8, "adaptive": adaptive, "length_rule": rule}
        one = draft_length(options, controller="eagle", model=model)
        assert draft_length(options, controller="eagle", model=model) is not one


def test_another_thread_never_gets_this_threads_rule() -> None:
    import threading

    model = Model()
    mine = remembered(model, "key", DraftGate)
    theirs: list[DraftGate] = []
    thread = threading.Thread(target=lambda: theirs.append(remembered(model, "key", DraftGate)))
    thread.start()
    thread.join()
    assert theirs[0] is not mine
    assert remembered(model, "key", DraftGate) is mine


def test_a_stopped_gate_stays_stopped_in_the_next_generation_and_times_its_cold_step_apart() -> None:
    gate = timed_gate()
    run(gate, JUDGE_AFTER, draft_ms=1.5, committed=1)
    assert gate.stopped
    gate.restart()
    assert not gate.drafts(wanted=True)  # the cold first step
    gate.observe(drafted=False, committed=1, seconds=5e-3)
    assert gate.unit == pytest.approx(1e-3)  # its time left out
    assert gate.stopped and gate.probes == 0 and gate.stats()["drafting_loss"] == 0.0


def test_a_later_generations_first_steps_do_not_time_the_unit() -> None:
    gate = timed_gate(plain_ms=1.0)
    gate.restart()
    for ms in (2.1, 1.8, 1.8, 1.7):  # cold, then warming up
        gate.drafts(wanted=False)
        gate.observe(drafted=False, committed=1, seconds=ms / 1000)
    assert gate.unit == pytest.approx(1e-3)
    gate.observe(drafted=False, committed=1, seconds=1.2e-3)
    assert gate.unit == pytest.approx(1.1e-3)


def test_a_single_draft_after_a_catch_up_adds_no_draft_step_cost() -> None:
    rule = head_rule()
    drafting(rule, 10, drafted=1, accepted=1, verify_ms=1.2, step_ms=0.3, catch_up_ms=0.1)
    assert rule.stats()["draft_step_cost"] == 0.0


def test_plain_now_skips_exactly_the_steps_drafts_would_make_plain() -> None:
    """A controller that takes the plain steps plain_now() grants without asking (PlainRun), and asks drafts() only
    when none is granted, probes on the same steps as one that asks drafts() every step, and leaves the gate as
    it: the same unit, wait and stats."""
    schedules, gates = [], []
    for ask_first in (False, True):
        gate = timed_gate()
        run(gate, JUDGE_AFTER, draft_ms=1.01, committed=1)  # stopped
        assert gate.stopped
        drafted, granted = [], gate.run
        for _ in range(8 * PROBE_AFTER):
            if ask_first and (granted.left or gate.plain_now()):
                granted.left -= 1
                granted.seconds += 1e-3
                drafted.append(False)
                continue
            drafts = gate.drafts(wanted=True)
            gate.observe(drafted=drafts, committed=1, seconds=1.01e-3 if drafts else 1e-3)
            drafted.append(drafts)
        schedules.append([i for i, d in enumerate(drafted) if d])
        gates.append(gate)
    assert schedules[0] == schedules[1] == [PROBE_AFTER, 3 * PROBE_AFTER + 1, 7 * PROBE_AFTER + 2]
    asked, granted_gate = gates
    assert granted_gate.stats() == asked.stats()
    assert granted_gate.unit == pytest.approx(asked.unit)
    assert granted_gate._wait == asked._wait and granted_gate._zeros == asked._zeros


def test_plain_now_grants_the_steps_until_a_probe_could_be_due() -> None:
    gate = timed_gate()
    run(gate, JUDGE_AFTER, draft_ms=1.01, committed=1)  # stopped
    assert gate.plain_now()
    assert gate.run.left == PROBE_AFTER  # the probe waits PROBE_AFTER plain steps; none taken yet
    gate.run.left -= 3
    gate.run.seconds += 3e-3
    assert gate.stats()["probes"] == 0  # reading the gate counts the three steps taken, the rest stays granted
    assert gate.run.left == PROBE_AFTER - 3 and gate._zeros == 3


def test_a_run_granted_at_a_generations_end_is_dropped_by_the_next() -> None:
    gate = timed_gate()
    run(gate, JUDGE_AFTER, draft_ms=1.01, committed=1)
    assert gate.plain_now()
    gate.run.left -= 1
    gate.run.seconds += 1e-3
    gate.restart()
    assert gate.run.left == 0 and gate._zeros == 1  # the step taken counts; the new generation starts cold
    assert not gate.plain_now()


def test_timings_add_many_equals_adding_one_at_a_time() -> None:
    one, many = _Timings(), _Timings()
    for seconds in (2e-3, 1e-3):
        one.add(1, seconds)
        many.add(1, seconds)
    for _ in range(37):
        one.add(1, 1.5e-3)
    many.add_many(1, 1.5e-3, 37)
    assert many.mean(1) == pytest.approx(one.mean(1), rel=1e-12)


def test_a_gate_that_has_not_stopped_never_skips_the_rule() -> None:
    gate = timed_gate()
    assert not gate.plain_now()
    rule = CostAwareLength(1, 0, 8)
    assert not rule.plain_now()  # not timed yet: the rule itself says plain
