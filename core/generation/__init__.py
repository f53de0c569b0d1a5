"""The generation layer: a request becomes tokens and text.

``Generator`` owns a set of loaded models and runs one controller over them: single generations, streams, chats
(a chat template renders the messages) and batched prompts (several prompts' rows stepped in one Run, refilled as
prompts finish). ``generate``/``stream`` are its one-shot forms.

Private modules: ``_generator`` (the Generator), ``_opening`` (a choice checked and a request opened into its host
and controller, for the Generator and the server's engine), ``_results`` (what a generation gives back), ``_batch``
(batched prompts and prompt files), ``_chat_template`` (chat templates in jinja2's sandbox), ``_tool_formats``,
``_tool_answers`` and ``_tool_grammar`` (tool calls in a template family's format, read from answers, and the grammar
that constrains them), ``_speech`` (a speech model's audio request, its token rules, long audio window by window).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from decoctl._lazy import lazy_exports

if TYPE_CHECKING:
    from decoctl.generation._batch import (
        PROMPT_KEYS,
        BatchPrompt,
        BatchSlot,
        one_at_a_time,
        read_prompt_records,
        read_prompts,
        result_record,
        run_batch,
    )
    from decoctl.generation._chat_template import CHAT_TEMPLATE_FILE, ChatPrompt, ChatTemplate, encode_prompt
    from decoctl.generation._generator import Generator, generate, stream
    from decoctl.generation._results import Completion, GenerationResult, GenerationStats
    from decoctl.generation._speech import Segment, Transcription, detect_language, transcribe
    from decoctl.generation._tool_answers import ParsedAnswer, ToolCall, parse_answer
    from decoctl.generation._tool_formats import TOOL_FORMATS, ToolFormat, tool_format_for
    from decoctl.generation._tool_grammar import tool_grammar

# public name -> the module that defines it
_EXPORTS = {
    **dict.fromkeys(("Generator", "generate", "stream"), "decoctl.generation._generator"),
    **dict.fromkeys(("Completion", "GenerationResult", "GenerationStats"), "decoctl.generation._results"),
    **dict.fromkeys(
        (
            "BatchPrompt",
            "BatchSlot",
            "PROMPT_KEYS",
            "one_at_a_time",
            "read_prompt_records",
            "read_prompts",
            "result_record",
            "run_batch",
        ),
        "decoctl.generation._batch",
    ),
    **dict.fromkeys(
        ("CHAT_TEMPLATE_FILE", "ChatPrompt", "ChatTemplate", "encode_prompt"), "decoctl.generation._chat_template"
    ),
    **dict.fromkeys(("ParsedAnswer", "ToolCall", "parse_answer"), "decoctl.generation._tool_answers"),
    **dict.fromkeys(("TOOL_FORMATS", "ToolFormat", "tool_format_for"), "decoctl.generation._tool_formats"),
    "tool_grammar": "decoctl.generation._tool_grammar",
    **dict.fromkeys(("Segment", "Transcription", "detect_language", "transcribe"), "decoctl.generation._speech"),
}

__all__ = [
    "CHAT_TEMPLATE_FILE",
    "PROMPT_KEYS",
    "TOOL_FORMATS",
    "BatchPrompt",
    "BatchSlot",
    "ChatPrompt",
    "ChatTemplate",
    "Completion",
    "GenerationResult",
    "GenerationStats",
    "Generator",
    "ParsedAnswer",
    "Segment",
    "ToolCall",
    "ToolFormat",
    "Transcription",
    "detect_language",
    "encode_prompt",
    "generate",
    "one_at_a_time",
    "parse_answer",
    "read_prompt_records",
    "read_prompts",
    "result_record",
    "run_batch",
    "stream",
    "tool_format_for",
    "tool_grammar",
    "transcribe",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
