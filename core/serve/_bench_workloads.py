"""``decoctl bench-serve --workload``: loads that share prompt prefixes, for servers that cache them.

- ``prompts`` (the default): each request is one prompt of the file.
- ``shared-system``: every request is one system prompt (the file's prompts joined up to ``--system-chars``
  characters, by default ``SYSTEM_CHARS``: about 1,000 tokens with a code-trained BPE tokenizer) followed by a
  short question (the first line of one of the file's prompts). A server that keeps the system prompt's KV computes
  only the question.
- ``chat``: each client holds four-turn conversations over /v1/chat/completions: each turn sends the conversation so
  far (questions and the server's own answers) and one new question, so turn t's prompt starts with turn t-1's
  prompt and answer. The level reports each turn's time to first token (p50) beside the usual figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from decoctl.errors import ConfigError
from decoctl.serve._bench import Level, Timing, _percentiles, run_clients, stream_timed

__all__ = ["SYSTEM_CHARS", "TURNS", "chat_questions", "measure_conversations", "shared_system_prompts"]

#: the shared system prompt's length in characters (about 1,000 tokens of code)
SYSTEM_CHARS = 4000
#: turns of each conversation of the chat workload
TURNS = 4


def _questions(prompts: Sequence[str]) -> list[str]:
    """A short question from each prompt: its first non-empty line."""
    return [next((line for line in p.splitlines() if line.strip()), p)[:120] for p in prompts]


def shared_system_prompts(prompts: Sequence[str], count: int, chars: int = SYSTEM_CHARS) -> list[str]:
    """``count`` prompts that share one system prompt (``prompts`` joined up to ``chars`` characters), each
    followed by a short question drawn from ``prompts`` in turn."""
    if not prompts:
        raise ConfigError("--workload shared-system needs prompts to build its system prompt from: give --prompts")
    system = ""
    while len(system) < chars:
        system += "\n\n".join(prompts) + "\n\n"
    system = "You answer questions about this code.\n\n" + system[:chars]
    questions = _questions(prompts)
    return [f"{system}\n\nQuestion: complete `{questions[i % len(questions)]}`\n" for i in range(count)]


def chat_questions(prompts: Sequence[str], count: int) -> list[list[str]]:
    """``count`` conversations of TURNS questions each, drawn from ``prompts`` in turn."""
    if not prompts:
        raise ConfigError("--workload chat needs prompts to draw its questions from: give --prompts")
    questions = _questions(prompts)
    return [
        [f"Complete this line: {questions[(c * TURNS + t) % len(questions)]}" for t in range(TURNS)]
        for c in range(count)
    ]


def stream_chat(url: str, body: Mapping[str, Any], api_key: str | None = None) -> tuple[Timing, str]:
    """Send one streamed chat completion to ``url`` and time its tokens; return the timing and the answer's text."""
    return stream_timed(url, "/v1/chat/completions", body, api_key, _delta_content)


def _delta_content(chunk: Mapping[str, Any]) -> str | None:
    choices = chunk.get("choices") or []
    return (choices[0].get("delta") or {}).get("content") if choices else None


def measure_conversations(
    url: str,
    conversations: Sequence[Sequence[str]],
    concurrency: int,
    *,
    model: str,
    max_tokens: int,
    extra: Mapping[str, Any] | None = None,
    api_key: str | None = None,
    server: str = "",
    controller: str = "greedy",
) -> Level:
    """Hold ``conversations`` (each a list of questions) from ``concurrency`` clients, each taking the next
    conversation when its last ends; every turn is greedy (temperature 0) with ``extra`` in its body."""

    def converse(questions: Sequence[str]) -> list[Timing]:
        messages: list[dict[str, str]] = []
        turns = []
        for question in questions:
            messages.append({"role": "user", "content": question})
            body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **(extra or {})}
            timing, answer = stream_chat(url, body, api_key)
            messages.append({"role": "assistant", "content": answer})
            turns.append(timing)
        return turns

    timings, seconds = run_clients(concurrency, len(conversations), lambda index: converse(conversations[index]))
    every = [t for turns in timings for t in turns]
    by_turn = tuple(
        _percentiles([turns[t].first_token for turns in timings if len(turns) > t])[0]
        for t in range(max((len(turns) for turns in timings), default=0))
    )
    return Level(
        server=server or url,
        controller=controller,
        concurrency=concurrency,
        requests=len(every),
        tokens=sum(t.tokens for t in every),
        seconds=round(seconds, 6),
        ttft=_percentiles([t.first_token for t in every]),
        itl=_percentiles([gap for t in every for gap in t.gaps]),
        ttft_by_turn=by_turn,
    )
