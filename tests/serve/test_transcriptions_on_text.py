"""A server of a text model answers /v1/audio/transcriptions with a 400 naming the endpoints it serves."""

from __future__ import annotations

import pytest

from .conftest import MODEL, openai

pytest.importorskip("multipart", reason="the transcriptions endpoint parses forms with python-multipart")


def test_transcriptions_on_a_text_model_name_the_text_endpoints(client: object) -> None:
    with pytest.raises(openai.BadRequestError, match=r"does not take audio.*/v1/chat/completions"):
        client.audio.transcriptions.create(model=MODEL, file=("a.wav", b"RIFF"))  # type: ignore[attr-defined]
