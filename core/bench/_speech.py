"""Speech prompts in `decoctl bench`: a prompts-file line ``{"audio": "FILE.wav"}`` (the path relative to the prompts
file; ``"language"`` and ``"task"`` optional, as ``decoctl generate --audio`` takes them) runs every contender on that
recording.

decoctl's contenders transcribe it through ``Generator.generate("", audio=PATH, language=..., task=...)``, the path
``decoctl generate --audio`` takes; transformers' (decoctl.bench._transformers) read the same samples, compute
WhisperFeatureExtractor's features with the model's preprocessor_config.json and call
WhisperForConditionalGeneration.generate. A speech prompt's ids (what the bench hands each contender beside it, and
what the verify-cost calibration's decoder is filled from) are the decoder's prompt decoctl builds for it: start,
language and task tokens, ``<|notimestamps|>``; the calibration's encoder reads the recording's features.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from decoctl.errors import ConfigError
from decoctl.generation._speech import SpeechRequest, speech_request
from decoctl.model._loader import LoadedModel

__all__ = ["Prompt", "SpeechPrompt", "check_prompts", "is_speech_model", "prompt_ids", "speech_prompt", "speech_source"]

#: the keys a speech prompt's line may hold
SPEECH_KEYS = ("audio", "language", "task")


@attrs.frozen(kw_only=True)
class SpeechPrompt:
    """One recording to transcribe: ``audio`` the WAV file (resolved against the prompts file's folder),
    ``language`` and ``task`` the decoder's prompt tokens (None: the model's default, a multilingual model detecting
    the language), ``where`` the prompts file's line it came from."""

    audio: Path
    language: str | None = None
    task: str | None = None
    where: str = ""

    def __str__(self) -> str:
        return f"audio {self.audio.name}"

    @property
    def shown(self) -> str:
        """Where an error names it: its prompts file's line, else its audio file."""
        return self.where or str(self.audio)


#: what the bench runs: a text prompt, or a recording for a speech model
Prompt = str | SpeechPrompt


def speech_prompt(where: str, record: Mapping[str, Any], folder: Path) -> SpeechPrompt:
    """The speech prompt of a prompts-file line ``record`` (at ``where``, "FILE:LINE"), its audio path relative to
    ``folder``; ConfigError naming the line for a key it does not take, a value that is not a string, or a file that
    is not there."""
    unknown = sorted(set(record) - set(SPEECH_KEYS))
    if unknown:
        extra = " (a speech model's prompt is its audio: leave 'prompt' out)" if "prompt" in unknown else ""
        raise ConfigError(f"{where}: an audio prompt takes {list(SPEECH_KEYS)}, not {unknown}{extra}")
    for key in SPEECH_KEYS:
        if key in record and not isinstance(record[key], str):
            raise ConfigError(f"{where}: {key!r} must be a JSON string, not {json.dumps(record[key])[:40]}")
    path = folder / record["audio"]
    if not path.is_file():
        raise ConfigError(
            f"{where}: audio file {path} is not there (an audio path is relative to the prompts file): give a PCM "
            "WAV file"
        )
    return SpeechPrompt(audio=path, language=record.get("language"), task=record.get("task"), where=where)


def is_speech_model(model: LoadedModel) -> bool:
    return model.encoder is not None and model.encoder.audio is not None


def check_prompts(model: LoadedModel, prompts: Sequence[Prompt]) -> None:
    """ConfigError where the prompts do not fit the model: audio for a model that does not take it, text for a
    speech model (naming the model and the first prompt that does not fit)."""
    speech = is_speech_model(model)
    for prompt in prompts:
        if isinstance(prompt, SpeechPrompt) and not speech:
            raise ConfigError(
                f"{prompt.shown}: an audio prompt, and model {model.name} is not a speech model (its encoder, if any, "
                "reads text): bench audio on a speech model such as an Optimum export of Whisper, or give text "
                'prompts {"prompt": ...}'
            )
        if isinstance(prompt, str) and speech:
            raise ConfigError(
                f"model {model.name} is a speech model and the prompt {prompt[:30]!r} is text: give --prompts a JSONL "
                'file of recordings, one {"audio": "FILE.wav"} per line'
            )


def prompt_ids(model: LoadedModel, prompt: Prompt) -> list[int]:
    """A text prompt's tokens, or a speech prompt's decoder prompt as decoctl builds it (the language detected
    where a multilingual model is given none)."""
    if isinstance(prompt, SpeechPrompt):
        return [int(t) for t in _request(model, prompt).ids]
    ids: list[int] = model.tokenizer.encode(prompt)
    return ids


def speech_source(model: LoadedModel, prompt: SpeechPrompt) -> np.ndarray:
    """The recording's first window as the speech encoder reads it: float32[1, mel, frames]."""
    return _request(model, prompt).source


def _request(model: LoadedModel, prompt: SpeechPrompt) -> SpeechRequest:
    """decoctl's speech request for the recording; ConfigError naming the prompt where its file cannot be read as
    the model's audio (not PCM WAV, another sampling rate)."""
    try:
        return speech_request(model, "", str(prompt.audio), language=prompt.language, task=prompt.task)
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"{prompt.shown}: {exc}") from exc
