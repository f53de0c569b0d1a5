"""decoctl chat: a conversation in the terminal, streamed, with history and /reset."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from decoctl import Generator
from decoctl.cli import main


def test_chat_keeps_history_streams_answers_and_resets(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("def f(x):\nand g?\n/reset\ndef f(x):\n/quit\n"))
    assert main(["chat", "-m", str(tiny_model), "-n", "8", "--no-huge-pages"]) == 0
    lines = capsys.readouterr().out.splitlines()
    generator = Generator({"target": str(tiny_model)}, "greedy")
    first = generator.chat([{"role": "user", "content": "def f(x):"}], max_new_tokens=8).text
    second = generator.chat(
        [
            {"role": "user", "content": "def f(x):"},
            {"role": "assistant", "content": first},
            {"role": "user", "content": "and g?"},
        ],
        max_new_tokens=8,
    ).text
    transcript = "\n".join(lines[1:])
    assert transcript == "\n".join([first, second, "(conversation reset)", first])


def test_chat_without_a_template_says_how_to_give_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from decoctl.testing import build_genai_model

    folder = build_genai_model(tmp_path / "base", seed=1)
    assert main(["chat", "-m", str(folder), "--no-huge-pages"]) == 2
    assert "--chat-template FILE" in capsys.readouterr().err


def test_ctrl_c_stops_an_answer_and_the_chat_goes_on(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = Generator.stream
    interrupted = []

    def first_piece_then_ctrl_c(self: Generator, prompt: str, **kwargs: object) -> Iterator[str]:
        pieces = stream(self, prompt, **kwargs)
        yield next(pieces)
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        yield from pieces

    monkeypatch.setattr(Generator, "stream", first_piece_then_ctrl_c)
    monkeypatch.setattr("sys.stdin", io.StringIO("def f(x):\ndef f(x):\n"))
    assert main(["chat", "-m", str(tiny_model), "-n", "8", "--no-huge-pages"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith(" [stopped]") and not lines[2].endswith(" [stopped]")
