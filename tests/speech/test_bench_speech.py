"""`decoctl bench` on recordings (decoctl.bench._speech): a prompts-file line {"audio": "FILE.wav"} runs decoctl's
contenders through ``generate(audio=...)`` and transformers' through WhisperForConditionalGeneration.generate on the
weights the tiny Whisper export came from, and decoctl greedy's tokens equal transformers'; audio where the model
does not take it, text where it takes audio, and a malformed audio line are refused by name."""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decoctl import ConfigError
from decoctl.bench import load_prompts
from decoctl.bench._speech import SpeechPrompt
from decoctl.cli import main

NEW = 16


def _write_wav(path: Path, seed: int, seconds: float) -> None:
    audio = np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def _prompts(folder: Path, records: list[dict[str, Any]]) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def recordings(tmp_path: Path) -> Path:
    """A prompts file of two recordings (the tests' seeds 1 and 3, 2 s and 7 s), one with its language, one whose
    language the model detects, their paths relative to the file."""
    _write_wav(tmp_path / "audio" / "one.wav", 1, 2)
    _write_wav(tmp_path / "audio" / "two.wav", 3, 7)
    return _prompts(tmp_path, [{"audio": "audio/one.wav", "language": "en"}, {"audio": "audio/two.wav"}])


def test_the_bench_on_recordings_gives_transformers_generate_decoctl_greedy_s_tokens(
    whisper: Any, recordings: Path, tmp_path: Path
) -> None:
    weights = tmp_path / "hf"
    whisper.model("whisper").save_pretrained(weights)
    contenders = f"greedy,lookup=speculative(drafter=prompt-lookup),hf=hf(model={weights})"
    report = tmp_path / "bench.json"
    args = ["bench", "-m", str(whisper.folder("whisper")), "--contenders", contenders, "--prompts", str(recordings)]
    args += ["-n", str(NEW), "--repeats", "1", "--threads", "1", "--calibration-pairs", "1", "--no-huge-pages"]
    assert main([*args, "--require-identical", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    rows = {c["name"]: c for c in data["contenders"]}
    assert data["prompts"] == 2
    assert all(row["identical_to_baseline"] for row in rows.values())
    assert rows["hf"]["tokens"] == rows["greedy"]["tokens"] == 2 * NEW
    # one forward a token after the decoder prompt's, counted alike on both sides
    assert rows["hf"]["target_forwards"] == rows["greedy"]["target_forwards"]


def test_an_audio_prompt_on_a_model_that_is_not_a_speech_model_is_refused_naming_both(
    genai_model: Path, recordings: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "-m", str(genai_model), "--contenders", "greedy", "--prompts", str(recordings), "-n", "2"]
    assert main([*args, "--repeats", "1", "--no-huge-pages"]) == 2
    error = capsys.readouterr().err
    assert f"{recordings}:1: an audio prompt, and model {genai_model.name} is not a speech model" in error


def test_text_prompts_on_a_speech_model_are_refused_naming_the_model(
    whisper: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "-m", str(whisper.folder("whisper")), "--contenders", "greedy", "-n", "2", "--repeats", "1"]
    assert main([*args, "--no-huge-pages"]) == 2
    assert "model whisper is a speech model and the prompt 'def fibonacci(n):\\n' is text" in capsys.readouterr().err


def test_a_recording_at_another_sampling_rate_is_refused_naming_its_line(
    whisper: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with wave.open(str(tmp_path / "low.wav"), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(8000)
        writer.writeframes(np.zeros(8000, "<i2").tobytes())
    prompts = _prompts(tmp_path, [{"audio": "low.wav", "language": "en"}])
    args = ["bench", "-m", str(whisper.folder("whisper")), "--contenders", "greedy", "--prompts", str(prompts)]
    assert main([*args, "-n", "2", "--repeats", "1", "--no-huge-pages"]) == 2
    assert f"{prompts}:1: {tmp_path / 'low.wav'} is sampled at 8000 Hz" in capsys.readouterr().err


def test_an_audio_path_is_read_relative_to_the_prompts_file(recordings: Path) -> None:
    prompts = load_prompts(str(recordings))
    assert prompts == [
        SpeechPrompt(audio=recordings.parent / "audio/one.wav", language="en", where=f"{recordings}:1"),
        SpeechPrompt(audio=recordings.parent / "audio/two.wav", where=f"{recordings}:2"),
    ]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"audio": "missing.wav"}, "audio file {folder}/missing.wav is not there"),
        ({"audio": "a.wav", "prompt": "hello"}, "an audio prompt takes ['audio', 'language', 'task'], not ['prompt']"),
        ({"audio": "a.wav", "language": 3}, "'language' must be a JSON string, not 3"),
    ],
    ids=["missing-file", "with-text", "language-not-a-string"],
)
def test_a_malformed_audio_line_is_refused_naming_it(tmp_path: Path, record: dict[str, Any], expected: str) -> None:
    _write_wav(tmp_path / "a.wav", 1, 1)
    path = _prompts(tmp_path, [record])
    with pytest.raises(ConfigError) as refused:
        load_prompts(str(path))
    assert str(refused.value).startswith(f"{path}:1: ")
    assert expected.format(folder=tmp_path) in str(refused.value)


def test_audio_prompts_are_refused_with_batch(recordings: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--batch", "1", "--prompts", str(recordings)]) == 2
    assert f"{recordings}:1: an audio prompt, and --batch benches text prompts" in capsys.readouterr().err
