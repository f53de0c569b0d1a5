"""The serving scheduler's decisions, from given states and measured costs, without a model: who is admitted, which
prompt chunks go in with how many tokens, which rows decode in the batched Run, draft alone, join or resume."""

from __future__ import annotations

from typing import Any

import pytest

from decoctl.serve._join_rule import JoinRule
from decoctl.serve._scheduler import Admission, ChunkEnd, PromptChunk, RowView, Scheduler, StepPlan, WaitingView
from decoctl.serve._states import RequestState

S = RequestState


def measured() -> JoinRule:
    """Costs as if measured: a one-row Run 10.5 ms, a two-row Run 12 ms; a prompt forward without logits 2 ms and 1 ms
    a token, with its logits 4 ms and 1 ms a token. With one row decoding of two, a step's budget of prompt work is
    then 12.6 ms: the larger of 1.2 one-row Runs and 1.5 two-row Runs less the one-row Run
    (JoinRule.prefill_budget)."""
    rule = JoinRule()
    for _ in range(3):
        rule.observe_run(1, 0.0105)
        rule.observe_run(2, 0.012)
    rule.observe_prefill(10, 0.012, logits=False)
    rule.observe_prefill(20, 0.022, logits=False)
    rule.observe_prefill(10, 0.014, logits=True)
    rule.observe_prefill(20, 0.024, logits=True)
    return rule


def decoding(row: int) -> RowView:
    return RowView(key=f"decoding {row}", row=row, state=S.DECODING, prompt=5, fed=5)


def prefilling(row: int, prompt: int, fed: int = 0, **given: Any) -> RowView:
    return RowView(key=f"prompt {row}", row=row, state=S.PREFILLING, prompt=prompt, fed=fed, **given)


def test_prompts_go_in_whole_while_no_row_decodes() -> None:
    plan = Scheduler(measured(), max_rows=2).plan([prefilling(0, 100), prefilling(1, 30)], [], [])
    assert plan.budget is None
    assert plan.chunks == (
        PromptChunk(row=0, start=0, size=100, logits=True, then=ChunkEnd.START),
        PromptChunk(row=1, start=0, size=30, logits=True, then=ChunkEnd.START),
    )
    assert plan.decode == (0, 1)  # their first tokens come from the prompts' logits, in this step's Run


def test_beside_decoding_rows_a_prompt_takes_the_chunk_its_measured_price_fits_in_the_budget() -> None:
    plan = Scheduler(measured(), max_rows=2).plan([decoding(0), prefilling(1, 100)], [], [])
    assert plan.budget == pytest.approx(0.0126)
    # its last token goes in the batched Run, so no chunk computes logits: 2 ms + 1 ms a token within 12.6 ms
    assert plan.chunks == (PromptChunk(row=1, start=0, size=10, logits=False, then=ChunkEnd.MORE),)
    assert plan.decode == (0,)


def test_prefill_chunk_caps_what_the_budget_allows() -> None:
    plan = Scheduler(measured(), max_rows=2, prefill_chunk=4).plan([decoding(0), prefilling(1, 100, fed=8)], [], [])
    assert plan.chunks == (PromptChunk(row=1, start=8, size=4, logits=False, then=ChunkEnd.MORE),)


def test_the_budget_is_spent_in_turn_at_the_chunks_prices() -> None:
    rows = [decoding(0), prefilling(1, 100, fed=96), prefilling(2, 100), prefilling(3, 100)]
    plan = Scheduler(measured(), max_rows=2).plan(rows, [], [])
    first, second = plan.chunks  # the third prompt waits: nothing of the budget is left for it
    # the first prompt's last three tokens before the one the Run feeds: 5 ms of the 12.6; 7 ms for the next
    assert first == PromptChunk(row=1, start=96, size=3, logits=False, then=ChunkEnd.RUN)
    assert second == PromptChunk(row=2, start=0, size=5, logits=False, then=ChunkEnd.MORE)
    assert plan.budget == pytest.approx(0.0126)


def test_the_first_waiting_prompt_goes_in_even_when_the_budget_fits_no_token() -> None:
    rule = measured()
    rule.observe_prefill(1, 1.0, logits=False)  # prompt tokens priced far above any step's budget
    rule.observe_prefill(2, 2.0, logits=False)
    plan = Scheduler(rule, max_rows=4).plan([decoding(0), prefilling(1, 100), prefilling(2, 100)], [], [])
    assert [(c.row, c.size) for c in plan.chunks] == [(1, 1)]


def test_a_prompt_with_only_its_last_token_left_feeds_it_in_the_run() -> None:
    plan = Scheduler(measured(), max_rows=2).plan([decoding(0), prefilling(1, 40, fed=39)], [], [])
    assert plan.chunks == (PromptChunk(row=1, start=39, size=0, logits=False, then=ChunkEnd.RUN),)
    assert plan.decode == (0,)  # the row starts after the Run: its controller picks its first token next step


def test_a_prompt_with_images_computes_its_own_last_logits_and_its_last_chunk_is_priced_with_them() -> None:
    scheduler = Scheduler(measured(), max_rows=2)
    plan = scheduler.plan([decoding(0), prefilling(1, 12, fed=4, images=True)], [], [])
    # its last 8 tokens with their logits: 4 ms + 8 ms
    assert plan.chunks == (PromptChunk(row=1, start=4, size=8, logits=True, then=ChunkEnd.START),)
    assert plan.decode == (0, 1)
    plan = scheduler.plan([decoding(0), prefilling(1, 12, fed=2, images=True)], [], [])
    # 10 with logits would cost 14 ms: 9 without them (11 ms), the last token left for the next step
    assert plan.chunks == (PromptChunk(row=1, start=2, size=9, logits=False, then=ChunkEnd.MORE),)


def test_deterministic_chunks_are_generates_whatever_the_budget() -> None:
    scheduler = Scheduler(measured(), max_rows=2, prefill_chunk=32, deterministic=True)
    plan = scheduler.plan([decoding(0), prefilling(1, 70, fed=64)], [], [])
    # the prompt's last chunk, at generate's position, with its logits: its last token is not fed in the Run
    assert plan.chunks == (PromptChunk(row=1, start=64, size=6, logits=True, then=ChunkEnd.START),)
    plan = scheduler.plan([decoding(0), prefilling(1, 70, fed=32)], [], [])
    assert plan.chunks == (PromptChunk(row=1, start=32, size=32, logits=False, then=ChunkEnd.MORE),)


def test_waiting_requests_are_admitted_in_order_while_the_first_fits() -> None:
    waiting = [
        WaitingView(key="a", prompt=5),
        WaitingView(key="b", prompt=5, completions=2),
        WaitingView(key="c", prompt=5),
    ]
    plan = Scheduler(measured(), max_rows=4).plan([decoding(0), decoding(2)], waiting, [1, 3])
    # "b" needs two rows and one is left: it waits, and "c" behind it too
    assert plan.admit == (Admission(key="a", rows=(1,)),)
    # admitted and fed in the same step: its prompt but for the last token, which the Run feeds
    assert plan.chunks == (PromptChunk(row=1, start=0, size=4, logits=False, then=ChunkEnd.RUN),)


def test_a_cancelled_row_frees_its_row_for_this_steps_admission_and_a_cancelled_waiting_request_is_dropped() -> None:
    cancelled = RowView(key="left", row=0, state=S.DECODING, prompt=5, fed=5, cancelled=True)
    waiting = [WaitingView(key="gone", prompt=5, cancelled=True), WaitingView(key="next", prompt=7)]
    plan = Scheduler(measured(), max_rows=1).plan([cancelled], waiting, [])
    assert plan.cancel == (0,) and plan.drop == ("gone",)
    assert plan.admit == (Admission(key="next", rows=(0,)),)
    assert plan.chunks == (PromptChunk(row=0, start=0, size=7, logits=True, then=ChunkEnd.START),)
    assert plan.decode == (0,)


def test_n_completions_of_a_batched_controller_share_one_prefill() -> None:
    plan = Scheduler(measured(), max_rows=4).plan([], [WaitingView(key="n", prompt=20, completions=3)], [0, 1, 2, 3])
    assert plan.admit == (Admission(key="n", rows=(0, 1, 2), shared=True),)
    # completion 0's prompt but for its last token, which the Run feeds to all three once their rows copied it
    assert plan.chunks == (PromptChunk(row=0, start=0, size=19, logits=False, then=ChunkEnd.RUN),)


@pytest.mark.parametrize(
    ("batched", "images", "deterministic"), [(False, False, False), (True, True, False), (True, False, True)]
)
def test_n_completions_prefill_one_each_where_the_last_token_cannot_go_in_the_run(
    batched: bool, images: bool, deterministic: bool
) -> None:
    waiting = [WaitingView(key="n", prompt=20, completions=2, batched=batched, images=images)]
    plan = Scheduler(measured(), max_rows=2, deterministic=deterministic).plan([], waiting, [0, 1])
    assert plan.admit == (Admission(key="n", rows=(0, 1), shared=False),)
    assert [(c.row, c.size, c.then) for c in plan.chunks] == [(0, 20, ChunkEnd.START), (1, 20, ChunkEnd.START)]


class Chooses(JoinRule):
    """Measured costs, and a join rule that moves the rows it is told into the Run, recording what it was asked."""

    def __init__(self, joining: set[Any]) -> None:
        super().__init__()
        self.joining = joining
        self.asked: dict[str, Any] = {}

    def choose(self, rows: Any, batch_rows: int, span: int, **given: Any) -> set[Any]:
        self.asked = {"rows": dict(rows), "batch_rows": batch_rows, "span": span, **given}
        return self.joining & set(rows)


def test_the_join_rule_places_the_speculating_rows_and_the_others_step_as_their_controllers_do() -> None:
    rows = [
        decoding(0),
        RowView(key="joins", row=1, state=S.DRAFTING, batched=False, joinable=True, resumable=True, kind="k"),
        RowView(key="resumes", row=2, state=S.JOINED, joinable=True, resumable=True, placed=True, kind="k"),
        RowView(key="sampling", row=3, state=S.DRAFTING, batched=False),
        RowView(key="stays", row=4, state=S.JOINED, joinable=True, placed=True, kind="k"),
    ]
    rule = Chooses({"joins", "stays"})
    plan = Scheduler(rule, max_rows=5).plan(rows, [], [])
    assert (plan.decode, plan.join, plan.resume, plan.draft) == ((0, 4), (1,), (2,), (3,))
    assert plan.placed == (1, 2, 4)
    assert rule.asked == {
        "rows": {"joins": (1, "k"), "resumes": (2, "k"), "stays": (4, "k")},
        "batch_rows": 1,
        "span": 1,
        "batched": {"resumes", "stays"},
        "final": {"stays"},
        "fresh": {"joins"},
    }


def test_a_drafting_row_takes_its_first_step_in_the_step_after_its_prompt() -> None:
    row = prefilling(0, 10, batched=False)
    plan = Scheduler(measured(), max_rows=1).plan([row], [], [])
    assert plan.chunks == (PromptChunk(row=0, start=0, size=10, logits=True, then=ChunkEnd.START),)
    assert plan.draft == () and plan.decode == ()
    started = RowView(key=row.key, row=0, state=S.DRAFTING, batched=False, prompt=10, fed=10)
    assert Scheduler(measured(), max_rows=1).plan([started], [], []).draft == (0,)


def test_before_any_cost_is_measured_prompts_go_in_whole_beside_decoding_rows() -> None:
    plan = Scheduler(JoinRule(), max_rows=2).plan([decoding(0), prefilling(1, 50)], [], [])
    assert plan.budget is None
    assert plan.chunks == (PromptChunk(row=1, start=0, size=50, logits=True, then=ChunkEnd.START),)


def test_an_idle_engine_plans_nothing() -> None:
    assert Scheduler(measured(), max_rows=2).plan([], [], [0, 1]) == StepPlan()


# -- preemption: a request of a higher priority takes the rows of lower-priority ones that decode ----------------------
def ranked(row: int, priority: int, state: RequestState = S.DECODING, **given: Any) -> RowView:
    fields: dict[str, Any] = {"prompt": 5, "fed": 5, **given}
    return RowView(key=f"row {row}", row=row, state=state, request=f"request {row}", priority=priority, **fields)


def test_a_higher_priority_request_preempts_the_lowest_priority_latest_admitted_decoding_row() -> None:
    rows = [ranked(0, 5), ranked(1, 5), ranked(2, 3)]
    plan = Scheduler(measured(), max_rows=3).plan(rows, [WaitingView(key="urgent", prompt=4, priority=0)], [])
    assert plan.preempt == (1,)  # priority 5 before 3; of the two at 5, the one admitted last
    assert plan.admit == (Admission(key="urgent", rows=(1,)),)
    assert plan.decode == (0, 2)  # the preempted row decodes no more; its new request's prompt starts there
    assert [(c.row, c.start) for c in plan.chunks] == [(1, 0)]


def test_no_preemption_for_a_request_of_the_same_or_a_lower_priority() -> None:
    rows = [ranked(0, 2), ranked(1, 2)]
    for priority in (2, 7):
        plan = Scheduler(measured(), max_rows=2).plan(rows, [WaitingView(key="w", prompt=4, priority=priority)], [])
        assert plan.preempt == () and plan.admit == ()


def test_only_decoding_rows_of_batched_one_row_requests_without_images_are_preempted() -> None:
    kept = [
        ranked(0, 9, S.PREFILLING, fed=2),
        ranked(1, 9, S.DRAFTING, batched=False),
        ranked(2, 9, S.JOINED, batched=False),
        ranked(3, 9, images=True),
    ]
    # two rows of one request (n = 2): preempting one would split the request
    pair = [
        RowView(key="a", row=4, state=S.DECODING, request="pair", priority=9),
        RowView(key="b", row=5, state=S.DECODING, request="pair", priority=9),
    ]
    plan = Scheduler(measured(), max_rows=6).plan([*kept, *pair], [WaitingView(key="w", prompt=4, priority=0)], [])
    assert plan.preempt == () and plan.admit == ()


def test_preemption_frees_enough_rows_or_none() -> None:
    rows = [ranked(0, 5), ranked(1, 0), ranked(2, 0)]
    plan = Scheduler(measured(), max_rows=3).plan(
        rows, [WaitingView(key="two", prompt=4, completions=2, priority=0)], []
    )
    assert plan.preempt == () and plan.admit == ()  # one preemptible row of the two it needs: nobody is preempted
    plan = Scheduler(measured(), max_rows=3).plan(
        [ranked(0, 5), ranked(1, 0), ranked(2, 4)], [WaitingView(key="two", prompt=4, completions=2, priority=0)], []
    )
    assert plan.preempt == (0, 2)
    assert plan.admit[0].rows == (0, 2)


def test_a_free_row_is_taken_before_any_row_is_preempted() -> None:
    plan = Scheduler(measured(), max_rows=2).plan([ranked(0, 5)], [WaitingView(key="w", prompt=4, priority=0)], [1])
    assert plan.preempt == () and plan.admit == (Admission(key="w", rows=(1,)),)


def test_deterministic_never_preempts() -> None:
    plan = Scheduler(measured(), max_rows=1, deterministic=True).plan(
        [ranked(0, 5)], [WaitingView(key="w", prompt=4, priority=0)], []
    )
    assert plan.preempt == () and plan.admit == ()


def test_a_resumed_request_feeds_its_history_as_a_prompt_in_a_row_of_its_own() -> None:
    waiting = [WaitingView(key="back", prompt=40, cached=32, resumed=True, priority=3)]
    plan = Scheduler(measured(), max_rows=2).plan([], waiting, [0, 1])
    assert plan.admit == (Admission(key="back", rows=(0,)),)
    assert plan.chunks == (PromptChunk(row=0, start=32, size=8, logits=True, then=ChunkEnd.START),)
