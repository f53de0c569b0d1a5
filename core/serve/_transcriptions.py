"""OpenAI's ``POST /v1/audio/transcriptions`` over the transcription worker (decoctl.serve._transcriber).

The request is a multipart form, as OpenAI's API takes it: ``file`` (the audio), ``model``, and optionally
``language`` (ISO-639-1, "en"), ``prompt``, ``response_format`` (json, text or verbose_json), ``temperature`` (0 to 1)
and ``timestamp_granularities[]`` (segment). The answer is ``{"text": ...}``, the text alone, or verbose_json's
``task``, ``language``, ``duration``, ``text`` and ``segments`` (each with ``id``, ``seek``, ``start``, ``end``,
``text``, ``tokens`` and ``temperature``; their times come from the model's timestamp tokens: none for a model
without them). ``language`` is the code given or detected ("en"; OpenAI's API says "english").

Limits, each refused naming itself: the upload at most ``max_audio_bytes`` (413), the audio at most
``max_audio_seconds`` (400); the file must be PCM WAV at the model's sampling rate (decoctl does not decode other
formats or resample: 400 naming the format and the ffmpeg command that converts it). The audio is decoded on a worker
thread, never the event loop; a form field OpenAI has and decoctl does not implement (``prompt``, the srt and vtt
formats, word timestamps) is a 400 naming it, and an unknown one too.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncGenerator
from typing import Any

import anyio
import numpy as np
from prometheus_client import Counter, Histogram
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from decoctl.errors import ConfigError
from decoctl.generation._speech import Transcription, decoder_prompt, has_timestamps
from decoctl.model._audio_features import read_wav
from decoctl.serve._edge import Edge, Refusal
from decoctl.serve._metrics import Metrics
from decoctl.serve._requests import EngineClosedError, QueueFullError
from decoctl.serve._transcriber import Transcriber, TranscriptionJob

__all__ = ["MAX_AUDIO_BYTES", "MAX_AUDIO_SECONDS", "Transcriptions", "audio_only", "no_audio"]

#: the largest audio file taken (OpenAI's limit): more is refused before it is kept
MAX_AUDIO_BYTES = 25 << 20
#: the longest audio taken, in seconds (20 windows of 30 s)
MAX_AUDIO_SECONDS = 600.0
#: room for the form's other fields and the multipart framing beside the file
_FORM_BYTES = 64 << 10
#: audio files decoded at once, on worker threads
AUDIO_WORKERS = 2
_FORMATS = ("json", "text", "verbose_json")
_FIELDS = frozenset(
    {"file", "model", "language", "prompt", "response_format", "temperature", "timestamp_granularities[]"}
)
#: what a client waits before retrying a request the full queue refused (Retry-After)
RETRY_AFTER_SECONDS = 1


def audio_only(model_name: str) -> Refusal:
    """The answer of /v1/completions and /v1/chat/completions on a server of a speech model."""
    return Refusal(
        400,
        f"model {model_name!r} is a speech model: it transcribes audio; send the audio to POST "
        "/v1/audio/transcriptions (a multipart form with file and model)",
    )


def no_audio(model_name: str) -> Refusal:
    """The answer of /v1/audio/transcriptions on a server of a text model."""
    return Refusal(
        400,
        f"model {model_name!r} does not take audio: it generates text from text; send prompts to "
        "/v1/completions or /v1/chat/completions, or serve a speech model (Whisper) for transcriptions",
    )


class Transcriptions:
    """The endpoint (see the module docstring) over ``transcriber``; its answers counted in ``metrics``."""

    def __init__(
        self,
        transcriber: Transcriber,
        *,
        edge: Edge,
        metrics: Metrics,
        max_audio_bytes: int = MAX_AUDIO_BYTES,
        max_audio_seconds: float = MAX_AUDIO_SECONDS,
        body_seconds: float,
        audio_workers: int = AUDIO_WORKERS,
    ) -> None:
        if max_audio_bytes < 1 or max_audio_seconds <= 0:
            raise ConfigError(
                f"max_audio_bytes={max_audio_bytes} and max_audio_seconds={max_audio_seconds} must be positive"
            )
        self.transcriber = transcriber
        self.edge = edge
        self.max_audio_bytes = max_audio_bytes
        self.max_audio_seconds = max_audio_seconds
        self._body_seconds = body_seconds
        self._audio_work = anyio.CapacityLimiter(audio_workers)
        self._rate = transcriber.sampling_rate
        registry = metrics.registry
        self.audio_seconds = Counter(
            "decoctl_transcription_audio_seconds", "seconds of audio transcribed", registry=registry
        )
        self.request_seconds = Histogram(
            "decoctl_transcription_seconds",
            "from a transcription request's arrival to its answer",
            registry=registry,
            buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
        )

    async def transcriptions(self, request: Request) -> Response:
        started = time.perf_counter()
        self.edge.authorise(request)
        parsed = await self._parse(request)
        try:  # the upload's spooled file closed (and deleted) whatever the answer
            return await self._transcribe(request, self._validated(parsed), started)
        finally:
            await parsed.close()

    async def _transcribe(self, request: Request, form: dict[str, Any], started: float) -> Response:
        fields = {k: v for k, v in form.items() if k != "file"}
        model = fields.get("model")
        if not model:
            raise Refusal(400, "the form has no model field: name the model this server serves", param="model")
        if model != self.edge.model_name:
            raise Refusal(
                404,
                f"model {model!r} is not served here: this server serves {self.edge.model_name!r}",
                code="model_not_found",
            )
        job_fields = self._checked(fields)
        upload = form.get("file")
        if upload is None:
            raise Refusal(400, "the form has no file field: send the audio as the file part", param="file")
        samples = await anyio.to_thread.run_sync(self._decode, upload, limiter=self._audio_work)
        job = TranscriptionJob(samples=samples, **job_fields)
        result = await self._run(job, request)
        seconds = samples.size / self._rate
        self.audio_seconds.inc(seconds)
        self.request_seconds.observe(time.perf_counter() - started)
        return self._answer(fields.get("response_format") or "json", result, job, seconds)

    async def _parse(self, request: Request) -> FormData:
        """The multipart form, read within the byte and time limits."""
        kind = request.headers.get("content-type", "")
        if not kind.startswith("multipart/form-data"):
            raise Refusal(
                400,
                f"the request is {kind or 'without a content type'}: /v1/audio/transcriptions takes a "
                "multipart/form-data form (file, model, ...)",
            )
        chunks, size, limit = [], 0, self.max_audio_bytes + _FORM_BYTES
        try:
            async with asyncio.timeout(self._body_seconds):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise Refusal(
                            413,
                            f"the upload is over the server's limit of {self.max_audio_bytes / (1 << 20):g} MiB of "
                            "audio (decoctl serve --max-audio-mb): send shorter audio",
                            param="file",
                        )
                    chunks.append(chunk)
        except TimeoutError:
            raise Refusal(408, f"the upload took over {self._body_seconds:g} s to arrive: send it at once") from None

        async def body() -> AsyncGenerator[bytes, None]:
            yield b"".join(chunks)
            yield b""

        parser = MultiPartParser(
            request.headers, body(), max_files=1, max_fields=len(_FIELDS), max_part_size=_FORM_BYTES
        )
        try:
            return await parser.parse()
        except MultiPartException as exc:
            raise Refusal(400, f"the multipart form does not parse ({exc.message})") from None

    def _validated(self, parsed: FormData) -> dict[str, Any]:
        """The form's fields, each known and given once, the file a file and the rest text; Refusal otherwise."""
        form: dict[str, Any] = {}
        for key, value in parsed.multi_items():
            if key not in _FIELDS:
                raise Refusal(
                    400, f"form field {key!r} is not implemented: the fields are {sorted(_FIELDS)}", param=key
                )
            if key in form and key != "timestamp_granularities[]":
                raise Refusal(400, f"form field {key!r} is given twice: give it once", param=key)
            form[key] = value
        if "file" in form and not isinstance(form["file"], UploadFile):
            raise Refusal(400, "the file field must be a file part (the audio's bytes), not text", param="file")
        text = [k for k, v in form.items() if k != "file" and not isinstance(v, str)]
        if text:
            raise Refusal(400, f"form field {text[0]!r} must be text, not a file", param=text[0])
        return form

    def _checked(self, fields: dict[str, str]) -> dict[str, Any]:
        """The job's settings from the form's text fields; Refusal naming what is out of range or not implemented."""
        if fields.get("prompt"):
            raise Refusal(
                400,
                "prompt (Whisper's previous-text conditioning, <|startofprev|>) is not implemented: leave it out",
                param="prompt",
            )
        answer = fields.get("response_format") or "json"
        if answer not in _FORMATS:
            raise Refusal(
                400,
                f"response_format {answer!r} is not implemented: use one of {list(_FORMATS)}",
                param="response_format",
            )
        granularity = fields.get("timestamp_granularities[]")
        if granularity not in (None, "segment"):
            raise Refusal(
                400,
                f"timestamp_granularities {granularity!r} is not implemented: decoctl gives segment timestamps "
                "(response_format verbose_json)",
                param="timestamp_granularities[]",
            )
        try:
            temperature = float(fields.get("temperature") or 0.0)
        except ValueError:
            raise Refusal(400, "temperature must be a number from 0 to 1", param="temperature") from None
        if not 0.0 <= temperature <= 1.0:
            raise Refusal(400, f"temperature {temperature:g} is out of range: give 0 to 1", param="temperature")
        language = fields.get("language") or None
        model = self.transcriber.models["target"]
        if language is not None:  # none: a multilingual model detects it
            try:
                decoder_prompt(model, language=language, task=None)
            except ConfigError as exc:
                raise Refusal(400, str(exc), param="language") from None
        timestamps = answer == "verbose_json" and has_timestamps(model)
        return {"language": language, "temperature": temperature, "timestamps": timestamps}

    def _decode(self, upload: UploadFile) -> np.ndarray:
        """The upload's samples (a worker thread's work): PCM WAV at the model's rate, within the limits."""
        data = upload.file.read()
        name = upload.filename or "the file"
        if len(data) > self.max_audio_bytes:
            raise Refusal(
                413,
                f"{name} is {len(data) / (1 << 20):.1f} MiB, over the server's limit of "
                f"{self.max_audio_bytes / (1 << 20):g} MiB of audio (decoctl serve --max-audio-mb): send shorter audio",
                param="file",
            )
        try:
            samples = read_wav(io.BytesIO(data), sampling_rate=self._rate, name=name)
        except ValueError as exc:
            raise Refusal(
                400,
                f"{exc} (the server reads PCM WAV files at {self._rate} Hz only: no other format, no resampling)",
                param="file",
            ) from None
        seconds = samples.size / self._rate
        if seconds > self.max_audio_seconds:
            raise Refusal(
                400,
                f"{name} lasts {seconds:.1f} s, over the server's limit of {self.max_audio_seconds:g} s of audio "
                "(decoctl serve --max-audio-seconds): send shorter audio",
                param="file",
            )
        return samples

    async def _run(self, job: TranscriptionJob, request: Request) -> Transcription:
        """The job's transcription from the worker; the job dropped if its client leaves before its turn."""
        try:
            future = self.transcriber.submit(job)
        except QueueFullError as exc:
            raise Refusal(
                429, str(exc), "rate_limit_error", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
            ) from None
        except EngineClosedError as exc:
            raise Refusal(503, str(exc), "server_error") from None

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            future.cancel()

        watcher = asyncio.create_task(watch())
        try:
            return await asyncio.wrap_future(future)
        except EngineClosedError as exc:
            raise Refusal(503, str(exc), "server_error") from None
        except ConfigError as exc:
            raise Refusal(400, str(exc)) from None
        finally:
            watcher.cancel()
            future.cancel()

    def _answer(self, kind: str, result: Transcription, job: TranscriptionJob, seconds: float) -> Response:
        if kind == "text":
            return PlainTextResponse(result.text)
        if kind == "json":
            return JSONResponse({"text": result.text})
        segments = [
            {
                "id": number,
                "seek": round(segment.seek * 100),
                "start": segment.start,
                "end": segment.end,
                "text": segment.text,
                "tokens": list(segment.tokens),
                "temperature": job.temperature,
            }
            for number, segment in enumerate(result.segments)
        ]
        return JSONResponse(
            {
                "task": "transcribe",
                "language": result.language,
                "duration": round(seconds, 3),
                "text": result.text,
                "segments": segments,
            }
        )
