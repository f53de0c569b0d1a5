"""What a generation gives back: its completions' text and tokens, and what it did (GenerationStats)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from decoctl.generation._tool_answers import ToolCall
from decoctl.host import ForwardSizes, Host

__all__ = ["Completion", "GenerationResult", "GenerationStats"]


@attrs.frozen(kw_only=True)
class GenerationStats:
    """What one generation did.

    ``stop_reason``: "eos", "max_new_tokens", "max_length" or "stop_string" when the generation ended by its stop
    rules; "error" (a GenerationError), "interrupted" (KeyboardInterrupt or SystemExit), "closed" (its stream was
    closed or let go of before its end) or "superseded" (a newer generation took its unfinished stream's models)
    when it did not. ``tokens_per_second`` counts new tokens over decode time (after the prompt). ``forwards`` /
    ``tokens_fed`` / ``onnx_seconds`` are per role, decode only; ``tokens_per_target_forward`` is new tokens
    over decode-time target forwards. ``forward_sizes``: per role, its decode-time forwards by the tokens each fed,
    with their onnxruntime seconds, plain and tree forwards apart (``ForwardSizes``). ``trace``: controller, plugin,
    roles, processors, degraded modes and whatever the controller recorded in ``host.trace``.
    """

    prompt_tokens: int
    new_tokens: int
    stop_reason: str | None
    prefill_seconds: float
    decode_seconds: float
    tokens_per_second: float
    forwards: Mapping[str, int]
    tokens_fed: Mapping[str, int]
    onnx_seconds: Mapping[str, float]
    tokens_per_target_forward: float
    controller: Mapping[str, Any]
    trace: Mapping[str, Any]
    forward_sizes: Mapping[str, ForwardSizes] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Completion:
    """One completion of the prompt: its text, tokens, why it stopped, and its score where the controller gave one
    (a beam's length-normalised log-probability, a parallel sample's mean log-probability)."""

    text: str
    tokens: tuple[int, ...]
    stop_reason: str | None
    score: float | None = None


@attrs.frozen(kw_only=True)
class GenerationResult:
    """``text`` and ``tokens`` are the first completion's; ``completions`` holds every completion (one, or the
    beams / samples a controller returns, best first where it ranks them). ``tool_calls``: the calls a chat with
    tools (Generator.chat(..., tools=...)) read from the answer; ``tool_call_error``: why output that started a
    call did not parse (its text stays in ``text``)."""

    text: str
    tokens: tuple[int, ...]
    stats: GenerationStats
    completions: tuple[Completion, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_error: str | None = None

    @classmethod
    def of(cls, host: Host, stats: GenerationStats) -> GenerationResult:
        """The result of the generation ``host`` ran: each of its outputs a completion, first the first."""
        completions = tuple(
            Completion(text=o.text, tokens=tuple(o.tokens), stop_reason=o.stop_reason, score=score)
            for o, score in host.completions()
        )
        first = completions[0]
        return cls(text=first.text, tokens=first.tokens, stats=stats, completions=completions)
