"""Whisper through decoctl: an Optimum-layout export of a tiny random WhisperForConditionalGeneration transcribes
as transformers does (greedy), speculative decoding with a smaller Whisper draft and prompt lookup give greedy's
tokens, long audio goes window by window, and what is not implemented is refused by name."""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from decoctl_speculative import plugin as speculative_plugin
from whisper_exports import ENGLISH, FRENCH, NO_TIMESTAMPS, START, TRANSCRIBE, TRANSLATE

from decoctl import ConfigError, Generator
from decoctl.generation import transcribe
from decoctl.plugins import PluginRegistry

NEW = 24
SECONDS = (2, 3, 7)


def _audio(seed: int, seconds: float) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


@pytest.fixture
def plugins() -> PluginRegistry:
    registry = PluginRegistry(autoload=False)
    registry.register(speculative_plugin, "speculative")
    return registry


def _greedy(whisper: Any) -> Generator:
    return Generator({"target": str(whisper.folder("whisper"))}, "greedy", threads=1)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_greedy_equals_the_transformers_model(whisper: Any, seed: int) -> None:
    audio = _audio(seed, SECONDS[seed - 1])
    result = _greedy(whisper).generate("", audio=audio, language="en", max_new_tokens=NEW)
    expected = whisper.reference("whisper", audio, NEW, [START, ENGLISH, TRANSCRIBE, NO_TIMESTAMPS])
    assert list(result.tokens) == expected
    assert len(set(expected)) > 3  # the model says more than one repeated token


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_greedy_equals_transformers_generate(whisper: Any, seed: int) -> None:
    audio = _audio(seed, SECONDS[seed - 1])
    result = _greedy(whisper).generate("", audio=audio, language="en", task="transcribe", max_new_tokens=NEW)
    assert list(result.tokens) == whisper.greedy("whisper", audio, NEW, language="en", task="transcribe")


def test_language_and_task_choose_the_prompt_tokens(whisper: Any) -> None:
    audio = _audio(2, 3)
    result = _greedy(whisper).generate("", audio=audio, language="fr", task="translate", max_new_tokens=NEW)
    expected = whisper.reference("whisper", audio, NEW, [START, FRENCH, TRANSLATE, NO_TIMESTAMPS])
    assert list(result.tokens) == expected
    english = whisper.reference("whisper", audio, NEW, [START, ENGLISH, TRANSCRIBE, NO_TIMESTAMPS])
    assert expected != english  # the prompt tokens matter to this model


def _write_wav(path: Path, audio: np.ndarray) -> None:
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def test_a_wav_file_and_its_bytes_give_the_samples_tokens(whisper: Any, tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    _write_wav(path, _audio(3, 7))
    with wave.open(str(path), "rb") as reader:
        samples = np.frombuffer(reader.readframes(reader.getnframes()), "<i2").astype(np.float32) / 32768.0
    generator = _greedy(whisper)
    expected = list(generator.generate("", audio=samples, language="en", max_new_tokens=NEW).tokens)
    assert list(generator.generate("", audio=str(path), language="en", max_new_tokens=NEW).tokens) == expected
    assert list(generator.generate("", audio=path.read_bytes(), language="en", max_new_tokens=NEW).tokens) == expected


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_speculative_with_a_smaller_whisper_draft_gives_greedy_s_tokens(
    whisper: Any, plugins: PluginRegistry, seed: int
) -> None:
    audio = _audio(seed, SECONDS[seed - 1])
    models = {"target": str(whisper.folder("whisper")), "draft": str(whisper.folder("whisper-draft"))}
    generator = Generator(models, "speculative", options={"k": 3, "adaptive": False}, registry=plugins, threads=1)
    result = generator.generate("", audio=audio, language="en", max_new_tokens=NEW)
    assert list(result.tokens) == whisper.reference("whisper", audio, NEW, [START, ENGLISH, TRANSCRIBE, NO_TIMESTAMPS])
    assert result.stats.forwards["draft"] > 0


def test_the_target_as_its_own_draft_accepts_every_draft(whisper: Any, plugins: PluginRegistry) -> None:
    target = str(whisper.folder("whisper"))
    generator = Generator(
        {"target": target, "draft": target}, "speculative", options={"k": 4, "adaptive": False}, registry=plugins
    )
    audio = _audio(1, 2)
    result = generator.generate("", audio=audio, language="en", max_new_tokens=NEW)
    assert list(result.tokens) == whisper.reference("whisper", audio, NEW, [START, ENGLISH, TRANSCRIBE, NO_TIMESTAMPS])
    assert result.stats.tokens_per_target_forward > 4


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_prompt_lookup_gives_greedy_s_tokens(whisper: Any, plugins: PluginRegistry, seed: int) -> None:
    audio = _audio(seed, SECONDS[seed - 1])
    generator = Generator(
        {"target": str(whisper.folder("whisper"))},
        "speculative",
        options={"drafter": "prompt-lookup"},
        registry=plugins,
        threads=1,
    )
    result = generator.generate("", audio=audio, language="en", max_new_tokens=NEW)
    assert list(result.tokens) == whisper.reference("whisper", audio, NEW, [START, ENGLISH, TRANSCRIBE, NO_TIMESTAMPS])


def test_long_audio_goes_in_30_second_windows(whisper: Any) -> None:
    audio = np.concatenate([_audio(1, 30), _audio(2, 30), _audio(3, 5)])
    generator = _greedy(whisper)
    result = transcribe(generator, audio, language="en", max_new_tokens=8)
    assert len(result.windows) == 3
    prompt = [START, ENGLISH, TRANSCRIBE, NO_TIMESTAMPS]
    for window, start in zip(result.windows, (0, 480000, 960000), strict=True):
        assert list(window.tokens) == whisper.reference("whisper", audio[start : start + 480000], 8, prompt)
    assert result.text == "".join(w.text for w in result.windows)


def test_audio_longer_than_a_window_is_refused_naming_transcribe(whisper: Any) -> None:
    with pytest.raises(ConfigError, match="transcribe"):
        _greedy(whisper).generate("", audio=_audio(1, 31), language="en")


def test_a_text_prompt_is_refused_by_name(whisper: Any) -> None:
    with pytest.raises(ConfigError, match="startofprev"):
        _greedy(whisper).generate("hello", audio=_audio(1, 1), language="en")


def test_no_audio_is_refused_naming_audio(whisper: Any) -> None:
    with pytest.raises(ConfigError, match="audio="):
        _greedy(whisper).generate("", language="en")


def _with_generation_config(whisper: Any, folder: Path, **settings: Any) -> Path:
    import json
    import shutil

    shutil.copytree(whisper.folder("whisper"), folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, **settings}))
    return folder


def test_suppress_tokens_and_begin_suppress_tokens_are_applied(
    whisper: Any, plugins: PluginRegistry, tmp_path: Path
) -> None:
    audio = _audio(1, 2)
    prompt = [START, ENGLISH, TRANSCRIBE, NO_TIMESTAMPS]
    plain = whisper.reference("whisper", audio, NEW, prompt)
    suppress, begin = (plain[1], plain[2]), (plain[0],)  # tokens greedy would choose
    folder = _with_generation_config(
        whisper, tmp_path / "suppressing", suppress_tokens=list(suppress), begin_suppress_tokens=list(begin)
    )
    expected = whisper.reference("whisper", audio, NEW, prompt, suppress=suppress, begin_suppress=begin)
    assert expected != plain
    assert not set(expected) & set(suppress)
    assert expected[0] not in begin
    greedy = Generator({"target": str(folder)}, "greedy", threads=1)
    assert list(greedy.generate("", audio=audio, language="en", max_new_tokens=NEW).tokens) == expected
    lookup = Generator(
        {"target": str(folder)}, "speculative", options={"drafter": "prompt-lookup"}, registry=plugins, threads=1
    )
    assert list(lookup.generate("", audio=audio, language="en", max_new_tokens=NEW).tokens) == expected


def test_forced_decoder_ids_without_a_language_are_refused_by_name(whisper: Any, tmp_path: Path) -> None:
    folder = _with_generation_config(
        whisper, tmp_path / "forced", is_multilingual=False, forced_decoder_ids=[[1, TRANSCRIBE]]
    )
    generator = Generator({"target": str(folder)}, "greedy", threads=1)
    with pytest.raises(ConfigError, match="forced_decoder_ids"):
        generator.generate("", audio=_audio(1, 1))


def test_the_encoder_runs_once_per_window(whisper: Any, plugins: PluginRegistry) -> None:
    target = str(whisper.folder("whisper"))
    generator = Generator(
        {"target": target, "draft": target}, "speculative", options={"k": 4, "adaptive": False}, registry=plugins
    )
    generator.generate("", audio=_audio(1, 2), language="en", max_new_tokens=NEW)
    for role in ("target", "draft"):
        runner = generator._sequences[role]._runner
        assert runner.encoder_runs == 1
        assert runner.cross_passes == 1


def test_the_command_line_transcribes_a_wav_file_window_by_window(
    whisper: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from decoctl.cli import main

    audio = np.concatenate([_audio(1, 30), _audio(2, 4)])
    path = tmp_path / "long.wav"
    _write_wav(path, audio)
    generator = _greedy(whisper)
    folder = str(whisper.folder("whisper"))
    expected = transcribe(generator, path, language="en", max_new_tokens=8)
    code = main(["generate", "-m", folder, "--audio", str(path), "--language", "en", "-n", "8", "--stats", "none"])
    assert code == 0
    assert capsys.readouterr().out == expected.text + "\n"


def test_the_command_line_refuses_a_wav_file_at_another_rate_naming_it(
    whisper: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from decoctl.cli import main

    path = tmp_path / "low.wav"
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(8000)
        writer.writeframes(np.zeros(8000, "<i2").tobytes())
    code = main(["generate", "-m", str(whisper.folder("whisper")), "--audio", str(path), "--stats", "none"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path} is sampled at 8000 Hz" in err and "ffmpeg" in err
    assert "unexpected" not in err and "Traceback" not in err
    with pytest.raises(ConfigError, match="8000 Hz"):
        _greedy(whisper).generate("", audio=path, max_new_tokens=2)


def test_the_command_line_refuses_language_without_audio(whisper: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from decoctl.cli import main

    assert main(["generate", "-m", str(whisper.folder("whisper")), "hi", "--language", "en", "--stats", "none"]) != 0
    assert "--language and --task go with --audio" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [2, 3])
def test_beam_search_equals_transformers_beam_search(whisper: Any, seed: int) -> None:
    audio = _audio(seed, SECONDS[seed - 1])
    generator = Generator({"target": str(whisper.folder("whisper"))}, "beam", options={"num_beams": 3}, threads=1)
    result = generator.generate("", audio=audio, language="en", max_new_tokens=12)
    assert list(result.tokens) == whisper.greedy("whisper", audio, 12, language="en", task="transcribe", num_beams=3)


def test_models_info_describes_the_speech_encoder(whisper: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from decoctl.cli import main

    assert main(["models", "info", str(whisper.folder("whisper"))]) == 0
    out = capsys.readouterr().out
    assert "input_features [80, 3000] -> last_hidden_state [1500, 32]), run once per 30 s of audio" in out
    assert "dry forward ok: the encoder over a window of silence" in out
