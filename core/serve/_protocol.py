"""OpenAI's request and response shapes as decoctl takes and sends them, typed at the edge (pydantic), and its
error shape.

Every field OpenAI defines that decoctl supports is here; any other field is refused with a 400 naming it
(``extra="forbid"``), never ignored. decoctl's own choices travel in one extension object, ``"decoctl"``:
``{"controller": "speculative", "options": {"drafter": "prompt-lookup"}, "processors": "dry=0.8"}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "DecoctlChoice",
    "ResponseFormat",
    "StreamOptions",
    "error_body",
    "validation_message",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DecoctlChoice(_Strict):
    """decoctl's extension: an installed controller by name, its options, a chain of registered processors."""

    controller: str | None = None
    options: dict[str, Annotated[Any, Field()]] = Field(default_factory=dict)
    processors: str | None = None
    #: lower runs first; a decoding request of a higher value may be preempted for it (resumed later)
    priority: int = Field(default=0, ge=-(2**31), le=2**31 - 1)


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchema(_Strict):
    name: str
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageURL(_Strict):
    #: a data: URL (data:image/png;base64,...): the server fetches nothing
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL


#: the tools one request may define
MAX_TOOLS = 128
#: OpenAI's rule for a function's name
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class FunctionDef(_Strict):
    name: Annotated[str, Field(pattern=FUNCTION_NAME)]
    description: str | None = None
    #: a JSON schema of the arguments' object (decoctl.generation._tool_grammar.check_tool_schema checks it)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class CalledFunction(_Strict):
    name: str
    #: the arguments as JSON text, as the call gave them
    arguments: str


class ToolCallIn(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]] | None = None
    name: str | None = None
    #: an assistant message's calls
    tool_calls: list[ToolCallIn] | None = None
    #: a tool message: the call it answers
    tool_call_id: str | None = None


#: tokens one request's logit_bias may name (each becomes work on every step)
MAX_LOGIT_BIAS = 1024

Stop = str | Annotated[list[str], Field(max_length=4)] | None


class _Sampling(_Strict):
    model: str
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stop: Stop = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    logit_bias: (
        Annotated[dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]], Field(max_length=MAX_LOGIT_BIAS)] | None
    ) = None
    #: OpenAI's end-user id: it changes nothing in the output (as at OpenAI)
    user: str | None = None
    decoctl: DecoctlChoice | None = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: Literal[False] = False
    best_of: Literal[1] | None = None
    suffix: None = None


class ChatRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def chat(self) -> list[dict[str, Any]]:
        """The messages as a chat template takes them: a list of text parts joined into one string; a message
        with images keeps its parts, each image as ``{"type": "image"}`` (transformers' convention, which a
        vision-language model's template turns into its image token)."""
        messages = []
        for message in self.messages:
            content: Any = message.content
            if isinstance(content, list):
                if any(isinstance(part, ImagePart) for part in content):
                    content = [
                        {"type": "image"} if isinstance(part, ImagePart) else {"type": "text", "text": part.text}
                        for part in content
                    ]
                else:
                    content = "\n".join(part.text for part in content if isinstance(part, TextPart))
            item: dict[str, Any] = {"role": message.role, "content": content}
            if message.name is not None:
                item["name"] = message.name
            if message.tool_calls is not None:
                item["tool_calls"] = [call.model_dump() for call in message.tool_calls]
            if message.tool_call_id is not None:
                item["tool_call_id"] = message.tool_call_id
            messages.append(item)
        return messages

    def image_urls(self) -> list[str]:
        """The URLs of the messages' image parts, in order."""
        return [
            part.image_url.url
            for message in self.messages
            if isinstance(message.content, list)
            for part in message.content
            if isinstance(part, ImagePart)
        ]


#: the fields OpenAI defines that decoctl does not support, and why (a 400 names them with the reason)
UNSUPPORTED = {
    "functions": "the legacy functions API is not supported: send tools",
    "function_call": "the legacy functions API is not supported: send tool_choice",
    "audio": "audio is not supported",
    "modalities": "only text is supported",
    "prediction": "predicted outputs are not supported (decoctl's prompt lookup drafts from the prompt: "
    '"decoctl": {"controller": "speculative", "options": {"drafter": "prompt-lookup"}})',
    "echo": "echo=true is not supported",
    "best_of": "best_of > 1 is not supported: use n",
    "suffix": "suffix (insertion) is not supported",
    "service_tier": "service tiers are not supported",
    "store": "stored completions are not supported",
    "metadata": "stored completions are not supported",
    "reasoning_effort": "reasoning effort is not supported",
    "web_search_options": "web search is not supported",
    "logprobs": "logprobs are not supported here",
}


def validation_message(error: pydantic.ValidationError) -> tuple[str, str | None]:
    """One message naming the first invalid or unsupported field of a request, and that field (OpenAI's
    ``param``)."""
    first = error.errors()[0]
    # a union's member types appear in the location (("stop", "str")): keep the field names and list indices
    location = [str(part) for part in first["loc"] if not _is_type_name(part)]
    param = ".".join(location) or None
    kind = first["type"]
    field = location[-1] if location else ""
    if kind == "extra_forbidden":
        why = UNSUPPORTED.get(field) if len(location) == 1 else None
        if why:
            return f"unsupported field {param!r}: {why}", param
        return f'unknown field {param!r}: decoctl does not support it (decoctl\'s own choices go in "decoctl")', param
    if kind == "missing":
        return f"missing required field {param!r}", param
    if location and location[0] in UNSUPPORTED and kind in ("literal_error", "none_required"):
        return f"unsupported value for {param!r}: {UNSUPPORTED[location[0]]}", param
    return f"invalid value for {param!r}: {first['msg']}", param


def _is_type_name(part: object) -> bool:
    return isinstance(part, str) and (part in _TYPE_NAMES or "[" in part or "-" in part)


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "literal"}


def error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# -- responses: what the server sends, typed too (checked when built) ----------------------------------------------
class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


FinishReason = Literal["stop", "length", "tool_calls", "cancelled", "shutdown"]


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class DecoctlStats(_Out):
    """What decoctl did for a response (or one finished choice of a stream)."""

    controller: str
    target_forwards: int
    drafted_tokens: int
    tokens_per_target_forward: float


class DecoctlDelta(_Out):
    """What one streamed chunk carries: its tokens, how many were drafted and accepted, and how many characters of
    its text those drafted tokens wrote (they come first)."""

    tokens: int
    drafted: int
    drafted_chars: int = 0


class CompletionLogprobs(_Out):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: list[TokenLogprob]


class CompletionChoice(_Out):
    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None = None


class CalledFunctionOut(_Out):
    name: str
    arguments: str


class ToolCallOut(_Out):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunctionOut


class AssistantMessage(_Out):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class ChoiceNote(_Out):
    """decoctl's note on one choice: why output that started a tool call is returned as content."""

    tool_call_error: str


class ChatChoice(_Out):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason | None
    logprobs: ChatLogprobs | None = None
    decoctl: ChoiceNote | None = None


class FunctionDelta(_Out):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Out):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class ChatDelta(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(_Out):
    index: int
    delta: ChatDelta
    finish_reason: FinishReason | None
    logprobs: ChatLogprobs | None = None
    decoctl: ChoiceNote | None = None


class _Response(_Out):
    id: str
    created: int
    model: str


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage
    decoctl: DecoctlStats


class ChatResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    decoctl: DecoctlStats


class CompletionChunk(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None
    decoctl: DecoctlDelta | DecoctlStats | None = None


class ChatChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    decoctl: DecoctlDelta | DecoctlStats | None = None
