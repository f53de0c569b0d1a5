"""A request's states and the moves between them: the table is the one check."""

from __future__ import annotations

import pytest

from decoctl.serve._states import ENDED, LIVE, MOVES, IllegalMoveError, RequestState, move


def test_a_request_goes_from_waiting_through_its_prompt_to_decoding_and_finishes() -> None:
    state = RequestState.WAITING
    for new in (RequestState.PREFILLING, RequestState.DECODING, RequestState.FINISHED):
        state = move(state, new)
    assert state is RequestState.FINISHED


def test_a_drafting_row_joins_the_run_and_drafts_again() -> None:
    state = move(RequestState.DRAFTING, RequestState.JOINED)
    assert move(state, RequestState.DRAFTING) is RequestState.DRAFTING


@pytest.mark.parametrize("ended", sorted(ENDED, key=lambda s: s.value))
def test_no_move_leaves_an_ended_request(ended: RequestState) -> None:
    with pytest.raises(IllegalMoveError, match=f"from {ended.value} to prefilling .*it has ended"):
        move(ended, RequestState.PREFILLING)


def test_a_waiting_request_cannot_decode_before_its_prompt_is_in() -> None:
    with pytest.raises(IllegalMoveError, match="from waiting to decoding"):
        move(RequestState.WAITING, RequestState.DECODING)


def test_a_decoding_row_never_drafts() -> None:
    with pytest.raises(IllegalMoveError, match="from decoding to drafting"):
        move(RequestState.DECODING, RequestState.DRAFTING)


def test_every_live_state_can_be_cancelled_failed_or_finished() -> None:
    for state in LIVE:
        assert {RequestState.CANCELLED, RequestState.FAILED, RequestState.FINISHED} <= MOVES[state]
    assert set(MOVES) == set(RequestState)
