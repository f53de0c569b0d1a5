"""Streaming text: UTF-8 is never cut, stop strings are never streamed."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from decoctl.host import Output, StopRules
from decoctl.model._tokenizer import Tokenizer
from decoctl.testing import build_tokenizer

_TOKENIZER: Tokenizer | None = None


def tokenizer(tmp: Path | None = None) -> Tokenizer:
    global _TOKENIZER
    if _TOKENIZER is None:
        import tempfile

        path = build_tokenizer(Path(tempfile.mkdtemp()) / "tok")
        _TOKENIZER = Tokenizer.from_file(path, bos_token_id=0, add_bos=False)
    return _TOKENIZER


def make_output(stop: tuple[str, ...] = (), max_new: int = 1000) -> tuple[Output, list[str]]:
    pieces: list[str] = []
    rules = StopRules(eos_token_ids={1}, max_new_tokens=max_new, stop_strings=stop, capacity=10_000)
    return Output(rules, tokenizer().detokenizer(), lambda _t, text: pieces.append(text)), pieces


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="aé天😀 \n(x)", min_size=1, max_size=40), split=st.integers(1, 4))
def test_streamed_pieces_are_valid_utf8_and_join_to_the_decoded_text(text: str, split: int) -> None:
    ids = tokenizer().encode(text)
    output, pieces = make_output()
    for start in range(0, len(ids), split):
        output.commit(ids[start : start + split])
    output.commit([1])
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_text_that_may_become_a_stop_string_is_held_back() -> None:
    output, pieces = make_output(stop=("END",))
    for char in "abc EN":
        output.commit(tokenizer().encode(char))
    assert "".join(pieces) == "abc "
    output.commit(tokenizer().encode("D tail"))
    assert output.stop_reason == "stop_string"
    assert "".join(pieces) == output.text == "abc "


def test_held_back_text_is_released_when_it_is_not_a_stop_string() -> None:
    output, pieces = make_output(stop=("END",))
    output.commit(tokenizer().encode("x EN"))
    output.commit(tokenizer().encode("Z"))
    assert "".join(pieces) == "x ENZ"


def test_commit_after_done_takes_nothing() -> None:
    output, _ = make_output(max_new=2)
    assert output.commit([50, 51, 52]) == 2
    assert output.commit([53]) == 0
    assert output.stop_reason == "max_new_tokens"


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(alphabet="aé天😀 \n(x)", min_size=1, max_size=40),
    split=st.integers(1, 4),
    cut=st.integers(0, 3),
    end=st.sampled_from(["eos", "limit", "open"]),
)
def test_text_decoded_once_at_the_end_equals_the_streamed_text(text: str, split: int, cut: int, end: str) -> None:
    """With no sink and no stop strings the text is decoded when read: the same text, read at any point
    (mid-character too), as the streamed pieces give."""
    ids = tokenizer().encode(text)
    ids = ids[: max(1, len(ids) - cut)] if end != "eos" else ids
    rules = StopRules(
        eos_token_ids={1}, max_new_tokens=len(ids) if end == "limit" else 1000, stop_strings=(), capacity=10_000
    )
    lazy = Output(rules, tokenizer().detokenizer(), None)
    streamed, pieces = make_output(max_new=rules.max_new_tokens)
    for start in range(0, len(ids), split):
        lazy.commit(ids[start : start + split])
        streamed.commit(ids[start : start + split])
        assert lazy.text == streamed.text
    if end == "eos":
        lazy.commit([1])
        streamed.commit([1])
    assert lazy.text == streamed.text == ("".join(pieces) if streamed.done else streamed.text)
    assert lazy.done == (end != "open")
