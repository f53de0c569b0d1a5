"""The edge of the HTTP side: a request authorised, its body read within limits, parsed and validated into OpenAI's
request shape, or refused with OpenAI's error body.

edge = Edge(model_name="pycode", api_key=None)
body = await edge.read(request, ChatRequest)        # or raises Refusal(status, message)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
from typing import Any, TypeVar

import pydantic
from starlette.requests import Request

from decoctl.model._adapters import split_model_name
from decoctl.serve._protocol import ChatRequest, CompletionRequest, error_body, validation_message

__all__ = ["BODY_SECONDS", "MAX_BODY_BYTES", "MAX_JSON_DEPTH", "Edge", "Refusal", "image_bytes"]

#: how deeply a request's JSON may nest (OpenAI's requests nest a few levels; JSON schemas a few more)
MAX_JSON_DEPTH = 64
#: the largest request body read (a chat of about a million words): more is refused (413) before it is kept
MAX_BODY_BYTES = 8 << 20
#: how long a client may take to send a request's body (a body trickling in holds a connection): then 408
BODY_SECONDS = 30.0

_Shape = TypeVar("_Shape", CompletionRequest, ChatRequest)


class Refusal(Exception):
    """A request refused with an HTTP status and OpenAI's error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, kind, extra.pop("param", None), extra.pop("code", None))
        self.headers: dict[str, str] = extra.pop("headers", {})


class Edge:
    """Authorises requests (``api_key``: a bearer token, None for none) and reads their bodies: at most
    ``MAX_BODY_BYTES`` within ``body_seconds``, JSON nested at most ``MAX_JSON_DEPTH`` deep, of the shape asked for
    and naming ``model_name``, or ``model_name:ADAPTER`` for one of the LoRA ``adapters`` loaded beside it."""

    def __init__(
        self,
        *,
        model_name: str,
        api_key: str | None,
        body_seconds: float = BODY_SECONDS,
        adapters: tuple[str, ...] = (),
    ) -> None:
        self.model_name = model_name
        self.adapters = adapters
        self._api_key = api_key
        self._body_seconds = body_seconds

    def authorise(self, request: Request) -> None:
        if self._api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._api_key.encode()):
            raise Refusal(401, "incorrect API key: send it as 'Authorization: Bearer KEY'", code="invalid_api_key")

    async def read(self, request: Request, shape: type[_Shape]) -> _Shape:
        """The request's body as ``shape``, once it is authorised; Refusal otherwise."""
        self.authorise(request)
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self._body_seconds):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise Refusal(
                            413, f"the request body is over {MAX_BODY_BYTES >> 20} MiB: send a shorter prompt"
                        )
                    chunks.append(chunk)
        except TimeoutError:
            raise Refusal(
                408, f"the request body took over {self._body_seconds:g} s to arrive: send it at once"
            ) from None
        body = b"".join(chunks)
        too_deep = Refusal(400, f"the request body nests JSON more than {MAX_JSON_DEPTH} levels deep: flatten it")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Refusal(400, f"the request body is not valid JSON ({exc})") from None
        except RecursionError:  # nested deeper than Python's parser goes
            raise too_deep from None
        if _depth(data) > MAX_JSON_DEPTH:
            raise too_deep
        if not isinstance(data, dict):
            raise Refusal(400, "the request body must be a JSON object")
        try:
            value = shape.model_validate(data)
        except pydantic.ValidationError as exc:
            message, param = validation_message(exc)
            raise Refusal(400, message, param=param) from None
        self.adapter_index(value.model)
        return value

    @property
    def served(self) -> list[str]:
        """The model names requests may give: the base model's, then ``base:ADAPTER`` for each adapter loaded."""
        return [self.model_name, *(f"{self.model_name}:{name}" for name in self.adapters)]

    def adapter_index(self, model: str) -> int:
        """The LoRA table a request's ``model`` names (0: the base model; decoctl.model._adapters); Refusal where it
        names another model (404) or an adapter not loaded here (400, naming those loaded)."""
        base, adapter = split_model_name(model, self.model_name)
        if base != self.model_name:
            raise Refusal(
                404,
                f"model {model!r} is not served here: this server serves "
                f"{self.served if self.adapters else repr(self.model_name)}",
                code="model_not_found",
            )
        if adapter is None:
            return 0
        if adapter not in self.adapters:
            raise Refusal(
                400,
                f"adapter {adapter!r} is not loaded here (loaded: {list(self.adapters) or 'none'}): name the model "
                f"{self.model_name!r} or one of {self.served[1:] or 'its adapters (decoctl serve --adapter)'}",
                param="model",
                code="model_not_found",
            )
        return 1 + self.adapters.index(adapter)


def _depth(value: Any) -> int:
    """How deeply JSON ``value`` nests objects and arrays (a scalar is 0), without recursion."""
    deepest = 0
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            break
        todo.extend((child, depth + 1) for child in children)
    return deepest


def image_bytes(url: str) -> bytes:
    """An image_url part's image: the bytes of a data: URL (the server fetches nothing); a 400 otherwise."""
    head, comma, data = url.partition(",")
    if not url.startswith("data:") or not comma or ";base64" not in head:
        raise Refusal(
            400,
            f"image_url {url[:40]!r}: the server takes images as data: URLs only (data:image/png;base64,...); it "
            "fetches nothing",
            param="messages",
        )
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise Refusal(400, f"image_url: its base64 data does not decode ({exc})", param="messages") from None
