"""A speech-to-text request (Whisper): audio becomes the encoder's source and the decoder's prompt its task tokens.

``speech_request(model, audio, language=, task=)`` gives what a generation starts from: one 30-second window's
log-mel features (decoctl.model._audio_features) for every role's encoder, and the decoder's prompt as transformers'
WhisperForConditionalGeneration.generate builds it from generation_config.json without timestamps: the start token
(``decoder_start_token_id``), then for a multilingual model the language's token (``lang_to_id["<|en|>"]``) and the
task's (``task_to_id["transcribe"]``), then ``no_timestamps_token_id``. Longer audio goes through
:func:`transcribe`, one window after another.

generation_config.json's ``suppress_tokens`` (never generated) and ``begin_suppress_tokens`` (not as the first
generated token) are a logits processor (:class:`SuppressRules`) that the Generator puts first in a speech model's
chain, as transformers' Whisper generate puts its SuppressTokens processors first.

What transformers would do and decoctl does not is refused by name: language detection (a multilingual model
without ``language``), timestamps, and ``forced_decoder_ids`` where no language or task is given (transformers
ignores them otherwise).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl.errors import ConfigError
from decoctl.model._audio_features import AudioFeatures, read_wav
from decoctl.model._loader import LoadedModel
from decoctl.model._spec import GENERATION_CONFIG

__all__ = [
    "Segment",
    "SpeechRequest",
    "SuppressRules",
    "Transcription",
    "audio_windows",
    "read_audio",
    "speech_request",
    "suppress_rules",
    "transcribe",
]


@attrs.frozen(kw_only=True)
class SuppressRules:
    """Whisper's token rules as one logits processor: ``always`` (int64[k]) never generated, ``first`` (int64[m])
    not as the first generated token (transformers' SuppressTokensLogitsProcessor and
    SuppressTokensAtBeginLogitsProcessor: the logits set to -inf)."""

    always: np.ndarray = attrs.field(eq=False)
    first: np.ndarray = attrs.field(eq=False)
    name: str = "whisper_suppress_tokens"
    stateless: bool = True

    def __call__(self, rows: np.ndarray, context: Any) -> np.ndarray:
        if self.always.size:
            rows[:, self.always] = -np.inf
        if self.first.size:
            for row in range(rows.shape[0]):
                if context.new_tokens(row) == 0:
                    rows[row, self.first] = -np.inf
        return rows


def _generation_config(model: LoadedModel) -> tuple[Path, dict[str, Any]]:
    path = model.spec.path / GENERATION_CONFIG
    return path, (json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {})


def suppress_rules(model: LoadedModel) -> SuppressRules | None:
    """A speech model's SuppressRules from generation_config.json, None where it sets neither list (or the model
    is not a speech model)."""
    if model.encoder is None or model.encoder.audio is None:
        return None
    _, config = _generation_config(model)
    always, first = config.get("suppress_tokens") or [], config.get("begin_suppress_tokens") or []
    if not always and not first:
        return None
    return SuppressRules(always=np.asarray(always, np.int64), first=np.asarray(first, np.int64))


@attrs.frozen(kw_only=True)
class SpeechRequest:
    """``source``: one window's features, float32[1, mel, frames]. ``ids``: the decoder's prompt, int64[k]."""

    source: np.ndarray
    ids: np.ndarray


def read_audio(audio: Any, features: AudioFeatures) -> np.ndarray:
    """``audio`` as float32[samples]: a path to a PCM WAV file, its bytes, or samples at the model's rate."""
    if isinstance(audio, str | Path):
        return read_wav(Path(audio), sampling_rate=features.sampling_rate)
    if isinstance(audio, bytes | bytearray):
        return read_wav(io.BytesIO(bytes(audio)), sampling_rate=features.sampling_rate)
    samples = np.asarray(audio, dtype=np.float32)
    if samples.ndim != 1:
        raise ConfigError(
            f"audio must be mono samples at {features.sampling_rate} Hz, float32[samples]; got shape {samples.shape}"
        )
    return samples


def _speech_features(model: LoadedModel) -> AudioFeatures:
    encoder = model.encoder
    if encoder is None or encoder.audio is None:
        raise ConfigError(
            f"model {model.name} does not take audio (its encoder, if any, reads text): give audio to a speech "
            "model such as an Optimum export of Whisper"
        )
    return encoder.audio


def decoder_prompt(model: LoadedModel, *, language: str | None, task: str | None) -> np.ndarray:
    """The decoder's prompt for ``language`` ("en" or "<|en|>") and ``task`` ("transcribe", "translate"), as
    transformers' Whisper generate builds it without timestamps; ConfigError naming what the model lacks."""
    encoder = model.encoder
    assert encoder is not None
    path, config = _generation_config(model)
    if config.get("forced_decoder_ids") and language is None and task is None:
        raise ConfigError(
            f"{path}: forced_decoder_ids is set and decoctl does not apply it (transformers' Whisper generate does "
            "where no language or task is given): pass the language (and task), or remove forced_decoder_ids"
        )
    ids = [encoder.parts.decoder_start_token_id]
    if config.get("is_multilingual"):
        languages, tasks = config.get("lang_to_id") or {}, config.get("task_to_id") or {}
        if language is None:
            raise ConfigError(
                f"model {model.name} is multilingual and language detection is not implemented: pass the language "
                f"(one of {sorted(k.strip('<|>') for k in languages)})"
            )
        key = language if language.startswith("<|") else f"<|{language}|>"
        if key not in languages:
            raise ConfigError(f"model {model.name} has no language {language!r}: it has {sorted(languages)}")
        chosen = task or "transcribe"
        if chosen not in tasks:
            raise ConfigError(f"model {model.name} has no task {chosen!r}: it has {sorted(tasks)}")
        ids += [int(languages[key]), int(tasks[chosen])]
    elif language is not None or task not in (None, "transcribe"):
        raise ConfigError(
            f"model {model.name} is English-only (generation_config.json says no is_multilingual): it transcribes "
            "English; leave language and task out"
        )
    no_timestamps = config.get("no_timestamps_token_id")
    if no_timestamps is not None:
        ids.append(int(no_timestamps))
    return np.asarray(ids, np.int64)


def speech_request(
    model: LoadedModel, prompt: str, audio: Any, *, language: str | None = None, task: str | None = None
) -> SpeechRequest:
    """What a generation over ``audio`` (at most one window) starts from; ConfigError where ``prompt`` is not empty
    (Whisper's previous-text prompt is not implemented) or the audio is longer than a window."""
    features = _speech_features(model)
    if audio is None:
        raise ConfigError(f"model {model.name} transcribes audio: pass audio= (a WAV file's path or bytes, or samples)")
    if prompt:
        raise ConfigError(
            f"model {model.name} transcribes audio and conditioning on a text prompt (<|startofprev|>) is not "
            'implemented: pass an empty prompt ("")'
        )
    samples = read_audio(audio, features)
    if samples.size > features.n_samples:
        raise ConfigError(
            f"the audio lasts {samples.size / features.sampling_rate:.1f} s, longer than the model's "
            f"{features.chunk_length} s window: transcribe it with decoctl.generation.transcribe, which goes window "
            "by window"
        )
    return SpeechRequest(source=features.features(samples), ids=decoder_prompt(model, language=language, task=task))


def audio_windows(model: LoadedModel, audio: Any) -> list[np.ndarray]:
    """``audio`` (as :func:`read_audio` takes it) cut into the model's windows (30 s), each float32[samples]."""
    features = _speech_features(model)
    return list(features.windows(read_audio(audio, features)))


@attrs.frozen(kw_only=True)
class Segment:
    """A stretch of speech between two timestamp tokens: ``start`` and ``end`` in seconds from the audio's start,
    ``text`` and ``tokens`` (the text's token ids, without the timestamps), ``seek`` the start of its window in
    seconds."""

    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    seek: float


@attrs.frozen(kw_only=True)
class Transcription:
    """Long audio's text: ``text`` the windows' texts joined, ``windows`` each window's GenerationResult,
    ``language`` the language transcribed (as given, or detected: "en"; None for an English-only model),
    ``segments`` the timestamped stretches (with ``timestamps=True``; empty otherwise)."""

    text: str
    windows: tuple[Any, ...]
    language: str | None = None
    segments: tuple[Segment, ...] = ()


def transcribe(
    generator: Any,
    audio: Any,
    *,
    language: str | None = None,
    task: str | None = None,
    max_new_tokens: int = 128,
    seed: int | None = 0,
    timestamps: bool = False,
) -> Transcription:
    """Transcribe ``audio`` (a PCM WAV path or its bytes, or float32 samples) of any length with ``generator`` (a
    decoctl.Generator over a speech model) in the model's windows (30 s), one generation each, in order. ``seed``:
    each window's (a sampling controller's draws)."""
    if timestamps:
        raise ConfigError("timestamps are not implemented: leave timestamps out")
    results = tuple(
        generator.generate("", audio=window, language=language, task=task, max_new_tokens=max_new_tokens, seed=seed)
        for window in audio_windows(generator.models["target"], audio)
    )
    return Transcription(text="".join(r.text for r in results), windows=results, language=language)
