"""Whisper's timestamps and language detection: the timestamp rules process logits as transformers'
WhisperTimeStampLogitsProcessor does, greedy with timestamps gives transformers' generate(return_timestamps=True)
tokens, segments come out of transcribe(); a multilingual model given no language detects it as transformers'
detect_language does."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from whisper_exports import ENGLISH, FRENCH, NO_TIMESTAMPS, START, TRANSCRIBE, VOCAB

from decoctl import ConfigError, Generator
from decoctl.generation import detect_language, transcribe
from decoctl.generation._timestamps import TimestampRules, segment_spans
from decoctl.processing import ProcessContext

NEW = 24
#: the timestamped variant's <|notimestamps|>: the ids after it (301 to 383) are timestamps
STAMPED = 300


def _audio(seed: int, seconds: float) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


def _sound(kind: str) -> np.ndarray:
    """Three seconds of noise ("noise1"...) or a tone: the tests' random Whisper hears French in the noise and
    English in the tones."""
    if kind.startswith("noise"):
        return _audio(int(kind[5:]), 3)
    t = np.arange(16000 * 3) / 16000
    phase = 3000 * t if kind == "tone" else (100 + 1000 * t) * t
    return (0.3 * np.sin(2 * np.pi * phase)).astype(np.float32)


SOUNDS = ("noise1", "noise2", "noise3", "tone", "chirp")


@pytest.fixture(scope="module")
def stamped(whisper: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' Whisper with timestamp tokens: its generation_config.json's no_timestamps_token_id moved down."""
    folder = tmp_path_factory.mktemp("stamped") / "whisper"
    shutil.copytree(whisper.folder("whisper"), folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "no_timestamps_token_id": STAMPED}))
    return folder


def _hf_generate(whisper: Any, audio: np.ndarray, **settings: Any) -> list[int]:
    """transformers' greedy generate() over ``audio`` with the timestamped variant's settings: the tokens after the
    decoder's prompt."""
    import torch
    import transformers

    torch.set_num_threads(1)
    model = whisper.model("whisper")
    config = copy.deepcopy(model.generation_config)
    config.no_timestamps_token_id = STAMPED
    features = transformers.WhisperFeatureExtractor()(audio, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            features["input_features"], generation_config=config, max_new_tokens=NEW, do_sample=False, **settings
        )
    tokens = [int(t) for t in out[0]]
    if tokens and tokens[0] == START:  # the prompt, where generate gives it back
        tokens = tokens[4 if STAMPED in tokens[:4] else 3 :]
    return tokens


def test_the_rules_process_logits_as_transformers_processor(whisper: Any) -> None:
    import torch
    from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

    config = copy.deepcopy(whisper.model("whisper").generation_config)
    config.no_timestamps_token_id = STAMPED
    rng = np.random.default_rng(0)
    begin = STAMPED + 1
    histories = [
        [],
        [begin + 3],
        [begin, 40, 41],
        [begin, 40, begin + 9],
        [begin, 40, begin + 9, begin + 9],
        [begin, 40, begin + 9, begin + 9, 50, 51, begin + 20],
        [70, 71],
    ]
    prompt = [START, ENGLISH, TRANSCRIBE]
    for initial in (None, 4):
        config.max_initial_timestamp_index = initial
        reference = WhisperTimeStampLogitsProcessor(config, begin_index=len(prompt))
        rules = TimestampRules(no_timestamps=STAMPED, eos=1, max_initial=initial)
        for history in histories:
            for scale in (1.0, 6.0):  # flat rows, and rows where the timestamps' sum wins or loses
                logits = (rng.standard_normal(VOCAB) * scale).astype(np.float32)
                ids = torch.tensor([prompt + history])
                expected = reference(ids, torch.tensor(logits[None])).numpy()[0]
                context = ProcessContext(np.array(prompt, np.int64), np.array(history, np.int64), [[]])
                got = rules(logits[None].copy(), context)[0]
                np.testing.assert_array_equal(got, expected, err_msg=f"history {history}, max_initial {initial}")


def test_a_prompt_without_timestamps_is_left_as_it_is() -> None:
    rules = TimestampRules(no_timestamps=STAMPED, eos=1)
    rows = np.arange(VOCAB, dtype=np.float32)[None]
    context = ProcessContext(np.array([START, ENGLISH, TRANSCRIBE, STAMPED]), np.array([], np.int64), [[]])
    np.testing.assert_array_equal(rules(rows.copy(), context), rows)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_greedy_with_timestamps_equals_transformers_generate(whisper: Any, stamped: Path, seed: int) -> None:
    audio = _audio(seed, seed + 2)
    generator = Generator({"target": str(stamped)}, "greedy", threads=1)
    result = generator.generate("", audio=audio, language="en", max_new_tokens=NEW, timestamps=True)
    expected = _hf_generate(whisper, audio, language="en", task="transcribe", return_timestamps=True)
    assert list(result.tokens) == expected
    assert any(t > STAMPED for t in expected)  # the model writes timestamps


def test_transcribe_reads_segments_from_the_timestamps(stamped: Path) -> None:
    generator = Generator({"target": str(stamped)}, "greedy", threads=1)
    audio = np.concatenate([_audio(1, 30), _audio(2, 5)])
    result = transcribe(generator, audio, language="en", max_new_tokens=NEW, timestamps=True)
    assert result.segments
    assert result.text == "".join(s.text for s in result.segments)
    for segment in result.segments:
        assert segment.start <= segment.end
        assert all(t <= STAMPED for t in segment.tokens)
    assert {s.seek for s in result.segments} <= {0.0, 30.0}


def test_segment_spans_pair_timestamps_around_text() -> None:
    begin = STAMPED + 1
    tokens = [begin, 10, 11, begin + 60, begin + 60, 12, begin + 100, 13]
    spans = segment_spans(tokens, no_timestamps=STAMPED, precision=0.02, end=5.0)
    assert spans == [(0.0, 1.2, [10, 11]), (1.2, 2.0, [12]), (2.0, 5.0, [13])]


def test_timestamps_on_a_model_without_timestamp_tokens_are_refused(whisper: Any) -> None:
    generator = Generator({"target": str(whisper.folder("whisper"))}, "greedy", threads=1)
    assert NO_TIMESTAMPS == VOCAB - 1
    with pytest.raises(ConfigError, match="has no timestamp tokens"):
        generator.generate("", audio=_audio(1, 1), language="en", timestamps=True)


@pytest.mark.parametrize("kind", SOUNDS)
def test_the_language_detected_is_transformers(whisper: Any, kind: str) -> None:
    import torch
    import transformers

    audio = _sound(kind)
    features = transformers.WhisperFeatureExtractor()(audio, sampling_rate=16000, return_tensors="pt")
    model = whisper.model("whisper")
    with torch.no_grad():
        expected = int(model.detect_language(input_features=features["input_features"])[0])
    generator = Generator({"target": str(whisper.folder("whisper"))}, "greedy", threads=1)
    found = detect_language(generator.models["target"], audio)
    assert {"en": ENGLISH, "fr": FRENCH}[found] == expected


def test_both_languages_are_detected_among_the_sounds(whisper: Any) -> None:
    generator = Generator({"target": str(whisper.folder("whisper"))}, "greedy", threads=1)
    assert {detect_language(generator.models["target"], _sound(kind)) for kind in SOUNDS} == {"en", "fr"}


@pytest.mark.parametrize("kind", ["noise1", "noise2", "tone", "chirp"])
def test_without_a_language_greedy_equals_transformers_detecting_it(whisper: Any, kind: str) -> None:
    audio = _sound(kind)
    generator = Generator({"target": str(whisper.folder("whisper"))}, "greedy", threads=1)
    result = generator.generate("", audio=audio, max_new_tokens=NEW)
    assert list(result.tokens) == whisper.greedy("whisper", audio, NEW, task="transcribe")


def test_long_audio_detects_the_language_once_from_its_first_window(whisper: Any) -> None:
    generator = Generator({"target": str(whisper.folder("whisper"))}, "greedy", threads=1)
    audio = np.concatenate([_sound("tone"), np.zeros(16000 * 27, np.float32), _sound("noise1")])
    result = transcribe(generator, audio, max_new_tokens=8)
    assert result.language == "en" == detect_language(generator.models["target"], audio[: 16000 * 30])
    assert detect_language(generator.models["target"], audio[16000 * 30 :]) == "fr"
    expected = transcribe(generator, audio, language="en", max_new_tokens=8)
    assert result.text == expected.text
