"""The per-role primitives: forward, prefill, logits, hidden states, rewind and their refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoctl import CapabilityError, SequenceError
from decoctl.host import Sequence
from decoctl.model import load_model
from decoctl.testing import reference_logits

ATOL = 1e-4


def make_sequence(folder: Path, **kwargs: object) -> Sequence:
    return Sequence("target", load_model(folder, threads=1), **kwargs)  # type: ignore[arg-type]


def test_forward_returns_one_row_per_token_equal_to_a_single_pass(any_model: Path) -> None:
    sequence = make_sequence(any_model)
    tokens = [0, 17, 42, 99, 5]
    rows = sequence.forward(tokens[:3])
    np.testing.assert_allclose(rows, reference_logits(any_model, tokens[:3]), atol=ATOL)
    rows = sequence.forward(tokens[3:])
    np.testing.assert_allclose(rows, reference_logits(any_model, tokens)[3:], atol=ATOL)
    assert sequence.length == 5
    assert list(sequence.tokens) == tokens


def test_rewind_then_forward_equals_recompute(any_model: Path) -> None:
    sequence = make_sequence(any_model)
    sequence.forward([0, 10, 20, 30, 40, 50])
    sequence.rewind(2)
    rows = sequence.forward([7, 8])
    np.testing.assert_allclose(rows, reference_logits(any_model, [0, 10, 7, 8])[2:], atol=ATOL)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_forward_and_rewind_sequences_match_a_from_scratch_recompute(
    any_model: Path, data: st.DataObject
) -> None:
    sequence = make_sequence(any_model, max_length=64)
    vocab = sequence.vocab_size
    expected: list[int] = []
    for _ in range(data.draw(st.integers(1, 6), label="operations")):
        if expected and data.draw(st.booleans(), label="rewind?"):
            length = data.draw(st.integers(0, len(expected)), label="rewind to")
            sequence.rewind(length)
            expected = expected[:length]
            continue
        room = sequence.max_length - len(expected)
        if room == 0:
            continue
        fed = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=min(6, room)), label="tokens")
        rows = np.array(sequence.forward(fed))
        expected += fed
        np.testing.assert_allclose(rows, reference_logits(any_model, expected)[-len(fed) :], atol=ATOL)
    assert list(sequence.tokens) == expected


def test_chunked_prefill_gives_the_single_pass_last_row(any_model: Path) -> None:
    prompt = list(range(3, 40))
    whole = make_sequence(any_model).prefill(prompt)
    chunked = make_sequence(any_model).prefill(prompt, chunk=5)
    np.testing.assert_allclose(chunked, whole, atol=ATOL)
    assert chunked.shape == (1, whole.shape[1])


def test_last_position_model_prefills_but_refuses_multi_row_forward(last_logits_model: Path) -> None:
    sequence = make_sequence(last_logits_model)
    row = sequence.prefill([0, 5, 6, 7])
    np.testing.assert_allclose(row[0], reference_logits(last_logits_model, [0, 5, 6, 7])[-1], atol=ATOL)
    with pytest.raises(CapabilityError, match="last position only"):
        sequence.forward([8, 9])
    assert sequence.forward([8]).shape == (1, sequence.vocab_size)


def test_hidden_states_have_one_row_per_token(genai_model: Path) -> None:
    sequence = make_sequence(genai_model)
    sequence.forward([0, 1, 2])
    assert sequence.hidden_states().shape == (3, 64)


def test_hidden_states_on_a_model_without_them_raise_capability_error(optimum_model: Path) -> None:
    sequence = make_sequence(optimum_model)
    sequence.forward([0, 1])
    with pytest.raises(CapabilityError, match="include_hidden_states"):
        sequence.hidden_states()
    with pytest.raises(CapabilityError, match="aux_hidden_states"):
        sequence.hidden_states("aux")


@pytest.mark.parametrize("length", [-1, 4])
def test_rewind_outside_the_sequence_raises(genai_model: Path, length: int) -> None:
    sequence = make_sequence(genai_model)
    sequence.forward([0, 1, 2])
    with pytest.raises(SequenceError, match=r"between 0 and 3"):
        sequence.rewind(length)


def test_forward_beyond_max_length_raises_and_leaves_the_sequence_intact(genai_model: Path) -> None:
    sequence = make_sequence(genai_model, max_length=8)
    sequence.forward([0, 1, 2, 3, 4, 5])
    with pytest.raises(SequenceError, match="max_length 8"):
        sequence.forward([6, 7, 8])
    assert sequence.length == 6


def test_token_ids_outside_the_vocabulary_raise(genai_model: Path) -> None:
    sequence = make_sequence(genai_model)
    with pytest.raises(SequenceError, match="outside"):
        sequence.forward([0, sequence.vocab_size])


def test_tree_forward_without_tree_inputs_names_the_transform(genai_model: Path) -> None:
    sequence = make_sequence(genai_model)
    with pytest.raises(CapabilityError, match="enable-tree"):
        sequence.forward([1, 2, 3], tree=[-1, 0, 0])


def test_stale_views_raise_in_debug_mode(genai_model: Path) -> None:
    sequence = make_sequence(genai_model, debug=True)
    old = sequence.forward([0, 1])
    assert int(np.argmax(old[-1])) >= 0
    sequence.forward([2])
    with pytest.raises(SequenceError, match="after that role's next forward"):
        np.argmax(old[-1])
    with pytest.raises(SequenceError):
        old + 1.0
    fresh = sequence.logits()
    sequence.rewind(1)
    with pytest.raises(SequenceError):
        fresh.max()


def test_views_are_plain_arrays_outside_debug_mode(genai_model: Path) -> None:
    sequence = make_sequence(genai_model, debug=False)
    rows = sequence.forward([0, 1])
    assert type(rows) is np.ndarray


@pytest.mark.parametrize("feed_lengths", [True, False])
def test_one_token_tuples_take_the_decode_path_and_match_a_recompute(any_model: Path, feed_lengths: bool) -> None:
    sequence = Sequence("target", load_model(any_model, threads=1, feed_lengths=feed_lengths), max_length=32)
    expected = [3, 14, 15]
    sequence.forward(expected)
    for token in (9, 2, 6, 5):
        row = sequence.forward((token,))
        expected.append(token)
        np.testing.assert_allclose(row, reference_logits(any_model, expected)[-1:], atol=ATOL)
    sequence.rewind(4)
    expected = expected[:4]
    sequence.forward([8, 7])  # a two-token run between one-token ones rebinds the outputs
    expected += [8, 7]
    for token in (1, 1):
        row = sequence.forward((np.int64(token),))
        expected.append(token)
        np.testing.assert_allclose(row, reference_logits(any_model, expected)[-1:], atol=ATOL)
    assert list(sequence.tokens) == expected
    assert sequence.stats.forwards == 8 and sequence.stats.tokens_fed == len(expected) + 3  # 3 rewound
    np.testing.assert_array_equal(sequence.logits(), row)


def test_the_decode_path_refuses_what_forward_refuses(genai_model: Path) -> None:
    sequence = make_sequence(genai_model, max_length=4)
    sequence.forward([0, 1, 2])
    with pytest.raises(SequenceError, match="outside"):
        sequence.forward((sequence.vocab_size,))
    sequence.forward((3,))
    with pytest.raises(SequenceError, match="max_length 4"):
        sequence.forward((4,))
    assert sequence.length == 4


def test_stale_views_of_the_decode_path_raise_in_debug_mode(genai_model: Path) -> None:
    sequence = make_sequence(genai_model, debug=True)
    sequence.forward([0, 1])
    old = sequence.forward((2,))
    sequence.forward((3,))
    with pytest.raises(SequenceError, match="after that role's next forward"):
        old.max()
