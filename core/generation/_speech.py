"""A speech-to-text request (Whisper): audio becomes the encoder's source and the decoder's prompt its task tokens.

``speech_request(model, audio, language=, task=, timestamps=)`` gives what a generation starts from: one 30-second
window's log-mel features (decoctl.model._audio_features) for every role's encoder, and the decoder's prompt as
transformers' WhisperForConditionalGeneration.generate builds it from generation_config.json: the start token
(``decoder_start_token_id``), then for a multilingual model the language's token (``lang_to_id["<|en|>"]``) and the
task's (``task_to_id["transcribe"]``), then, without timestamps, ``no_timestamps_token_id``. Longer audio goes
through :func:`transcribe`, one window after another.

A multilingual model given no language detects it (:func:`detect_language`) as transformers' ``detect_language``
does: the decoder's first step after the start token, over the language tokens only, the likeliest one; long audio
detects it once, from its first window, as transformers' long-form generate does. The task is then "transcribe"
unless given (transformers' generate leaves the task token out where neither language nor task is given; OpenAI's
whisper and decoctl put "transcribe").

generation_config.json's ``suppress_tokens`` (never generated) and ``begin_suppress_tokens`` (not as the first
generated token), then Whisper's timestamp rules (decoctl.generation._timestamps, for a prompt without
``<|notimestamps|>``) are one logits processor (:class:`SuppressRules`) that the Generator puts first in a speech
model's chain, in the order transformers' Whisper generate puts its processors first.

What transformers would do and decoctl does not is refused by name: ``forced_decoder_ids`` where no language or task
is given (transformers ignores them otherwise), timestamps on a model whose vocabulary has no timestamp tokens.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl.errors import ConfigError
from decoctl.generation._timestamps import TimestampRules, segment_spans
from decoctl.host import Sequence
from decoctl.model._audio_features import AudioFeatures, read_wav
from decoctl.model._loader import LoadedModel
from decoctl.model._spec import GENERATION_CONFIG

__all__ = [
    "Segment",
    "SpeechRequest",
    "SuppressRules",
    "Transcription",
    "audio_windows",
    "detect_language",
    "has_timestamps",
    "read_audio",
    "speech_request",
    "suppress_rules",
    "transcribe",
]


@attrs.frozen(kw_only=True)
class SuppressRules:
    """Whisper's token rules as one logits processor: ``always`` (int64[k]) never generated, ``first`` (int64[m])
    not as the first generated token (transformers' SuppressTokensLogitsProcessor and
    SuppressTokensAtBeginLogitsProcessor: the logits set to -inf), then ``timestamps`` (the timestamp rules, for a
    prompt that asks for timestamps; None for a model without timestamp tokens)."""

    always: np.ndarray = attrs.field(eq=False)
    first: np.ndarray = attrs.field(eq=False)
    timestamps: TimestampRules | None = None
    name: str = "whisper_suppress_tokens"
    stateless: bool = True

    def __call__(self, rows: np.ndarray, context: Any) -> np.ndarray:
        if self.always.size:
            rows[:, self.always] = -np.inf
        if self.first.size:
            for row in range(rows.shape[0]):
                if context.new_tokens(row) == 0:
                    rows[row, self.first] = -np.inf
        if self.timestamps is not None:
            rows = self.timestamps(rows, context)
        return rows


def _generation_config(model: LoadedModel) -> tuple[Path, dict[str, Any]]:
    path = model.spec.path / GENERATION_CONFIG
    return path, (json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {})


def _timestamp_rules(model: LoadedModel, config: dict[str, Any]) -> TimestampRules | None:
    """The model's timestamp rules, None where its vocabulary has no timestamp tokens (none after
    ``no_timestamps_token_id``)."""
    no_timestamps = config.get("no_timestamps_token_id")
    if no_timestamps is None or int(no_timestamps) + 1 >= model.spec.vocab_size:
        return None
    eos = config.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    if eos is None:
        eos = config.get("bos_token_id")
    initial = config.get("max_initial_timestamp_index")
    return TimestampRules(
        no_timestamps=int(no_timestamps), eos=int(eos or 0), max_initial=None if initial is None else int(initial)
    )


def has_timestamps(model: LoadedModel) -> bool:
    """Whether the speech model's vocabulary has timestamp tokens (ids after ``no_timestamps_token_id``)."""
    return _timestamp_rules(model, _generation_config(model)[1]) is not None


def suppress_rules(model: LoadedModel) -> SuppressRules | None:
    """A speech model's SuppressRules from generation_config.json, None where it sets neither list and has no
    timestamp tokens (or the model is not a speech model)."""
    if model.encoder is None or model.encoder.audio is None:
        return None
    _, config = _generation_config(model)
    always, first = config.get("suppress_tokens") or [], config.get("begin_suppress_tokens") or []
    timestamps = _timestamp_rules(model, config)
    if not always and not first and timestamps is None:
        return None
    return SuppressRules(always=np.asarray(always, np.int64), first=np.asarray(first, np.int64), timestamps=timestamps)


@attrs.frozen(kw_only=True)
class SpeechRequest:
    """``source``: one window's features, float32[1, mel, frames]. ``ids``: the decoder's prompt, int64[k]."""

    source: np.ndarray
    ids: np.ndarray


def read_audio(audio: Any, features: AudioFeatures) -> np.ndarray:
    """``audio`` as float32[samples]: a path to a PCM WAV file, its bytes, or samples at the model's rate.
    ConfigError naming the file where it cannot be read as the model's audio (not PCM WAV, another rate)."""
    try:
        if isinstance(audio, str | Path):
            return read_wav(Path(audio), sampling_rate=features.sampling_rate)
        if isinstance(audio, bytes | bytearray):
            return read_wav(io.BytesIO(bytes(audio)), sampling_rate=features.sampling_rate)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
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


def decoder_prompt(
    model: LoadedModel, *, language: str | None, task: str | None, timestamps: bool = False
) -> np.ndarray:
    """The decoder's prompt for ``language`` ("en" or "<|en|>") and ``task`` ("transcribe", "translate"), as
    transformers' Whisper generate builds it, with ``timestamps`` or without; ConfigError naming what the model lacks
    (a multilingual model needs a language here: :func:`detect_language` finds one)."""
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
                f"model {model.name} is multilingual: pass the language (one of "
                f"{sorted(k.strip('<|>') for k in languages)}), or detect it with decoctl.generation.detect_language"
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
    if timestamps:
        if _timestamp_rules(model, config) is None:
            raise ConfigError(
                f"model {model.name} has no timestamp tokens (none after no_timestamps_token_id in "
                f"{path.name}): transcribe without timestamps"
            )
        return np.asarray(ids, np.int64)
    no_timestamps = config.get("no_timestamps_token_id")
    if no_timestamps is not None:
        ids.append(int(no_timestamps))
    return np.asarray(ids, np.int64)


def _multilingual(model: LoadedModel) -> bool:
    return bool(_generation_config(model)[1].get("is_multilingual"))


def detect_language(model: LoadedModel, audio: Any) -> str:
    """The language (its code, "en") a multilingual speech model hears in ``audio``'s first window (a PCM WAV path or
    its bytes, samples, or one window's features float32[1, mel, frames]), as transformers' ``detect_language``
    finds it: the decoder's first step after the start token, the likeliest of the language tokens. The encoder
    runs once here (a generation over the same window runs it again, unless a prefix cache keeps it)."""
    features = _speech_features(model)
    path, config = _generation_config(model)
    languages = config.get("lang_to_id") or {}
    if not languages:
        raise ConfigError(f"{path} has no lang_to_id: model {model.name} has no language tokens to detect")
    if isinstance(audio, np.ndarray) and audio.ndim == 3:
        window = audio
    else:
        samples = read_audio(audio, features)
        window = features.features(samples[: features.n_samples])
    encoder = model.encoder
    assert encoder is not None
    sequence = Sequence("detect", model, max_length=1)
    sequence.encode(window)
    logits = np.array(sequence.forward([encoder.parts.decoder_start_token_id])[-1])
    ids = np.array(sorted(int(i) for i in languages.values()), np.int64)  # the vocabulary's order: ties go first
    chosen = int(ids[int(np.argmax(logits[ids]))])
    return next(k for k, v in languages.items() if int(v) == chosen).strip("<|>")


def speech_request(
    model: LoadedModel,
    prompt: str,
    audio: Any,
    *,
    language: str | None = None,
    task: str | None = None,
    timestamps: bool = False,
) -> SpeechRequest:
    """What a generation over ``audio`` (at most one window) starts from, the language detected where a multilingual
    model is given none; ConfigError where ``prompt`` is not empty (Whisper's previous-text prompt is not
    implemented) or the audio is longer than a window."""
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
    source = features.features(samples)
    if language is None and _multilingual(model):
        language = detect_language(model, source)
    ids = decoder_prompt(model, language=language, task=task, timestamps=timestamps)
    return SpeechRequest(source=source, ids=ids)


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
    each window's (a sampling controller's draws). ``timestamps``: the model writes timestamp tokens, read into the
    Transcription's segments (its text then the segments' text, without the timestamps). A multilingual model given
    no ``language`` detects it from the first window (:func:`detect_language`)."""
    model = generator.models["target"]
    windows = audio_windows(model, audio)
    if language is None and _multilingual(model):  # once, from the first window, as transformers' long-form does
        language = detect_language(model, windows[0])
    results = tuple(
        generator.generate(
            "",
            audio=window,
            language=language,
            task=task,
            max_new_tokens=max_new_tokens,
            seed=seed,
            timestamps=timestamps,
        )
        for window in windows
    )
    if not timestamps:
        return Transcription(text="".join(r.text for r in results), windows=results, language=language)
    segments = _segments(generator, results, [w.size / _speech_features(model).sampling_rate for w in windows])
    text = "".join(s.text for s in segments)
    return Transcription(text=text, windows=results, language=language, segments=tuple(segments))


def _segments(generator: Any, results: tuple[Any, ...], lengths: list[float]) -> list[Segment]:
    """The windows' timestamped stretches, in seconds from the audio's start."""
    model = generator.models["target"]
    config = _generation_config(model)[1]
    encoder = model.encoder
    assert encoder is not None and encoder.audio is not None
    precision = encoder.audio.chunk_length / encoder.parts.source_length
    no_timestamps = int(config["no_timestamps_token_id"])
    eos = frozenset(model.spec.eos_token_ids)
    decode = generator.tokenizer.decode
    segments, seek = [], 0.0
    for result, length in zip(results, lengths, strict=True):
        tokens = [int(t) for t in result.tokens if int(t) not in eos]
        for start, end, words in segment_spans(tokens, no_timestamps=no_timestamps, precision=precision, end=length):
            segments.append(
                Segment(
                    start=round(seek + start, 3),
                    end=round(seek + end, 3),
                    text=decode(words),
                    tokens=tuple(words),
                    seek=seek,
                )
            )
        seek += encoder.audio.chunk_length
    return segments
