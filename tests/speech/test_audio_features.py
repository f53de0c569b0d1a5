"""Whisper's log-mel features: decoctl's numpy extractor against transformers' WhisperFeatureExtractor."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from decoctl.errors import ConfigError, ModelLoadError
from decoctl.model._audio_features import AudioFeatures, read_wav

transformers = pytest.importorskip("transformers")

#: float32 rounding of values near 1 across a 400-point FFT and an 80- or 128-row matrix product
TOLERANCE = 2e-5


def _noise(samples: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(samples) * 0.1).astype(np.float32)


def _reference(audio: np.ndarray, *, do_normalize: bool = False, **settings: object) -> np.ndarray:
    extractor = transformers.WhisperFeatureExtractor(**settings)
    out = extractor(audio, sampling_rate=extractor.sampling_rate, return_tensors="np", do_normalize=do_normalize)
    out = out["input_features"]
    return np.asarray(out)


@pytest.mark.parametrize("samples", [1000, 3 * 16000 + 37, 30 * 16000])
def test_features_equal_transformers_for_short_and_full_windows(samples: int) -> None:
    audio = _noise(samples)
    ours = AudioFeatures().features(audio)
    assert ours.dtype == np.float32
    assert ours.shape == (1, 80, 3000)
    np.testing.assert_allclose(ours, _reference(audio), atol=TOLERANCE, rtol=0)


def test_do_normalize_equals_transformers() -> None:
    audio = _noise(5 * 16000, seed=1) + 0.3
    ours = AudioFeatures().features(audio, do_normalize=True)
    np.testing.assert_allclose(ours, _reference(audio, do_normalize=True), atol=TOLERANCE, rtol=0)


def test_128_mel_bins_equal_transformers() -> None:
    audio = _noise(2 * 16000, seed=2)
    ours = AudioFeatures(feature_size=128).features(audio)
    assert ours.shape == (1, 128, 3000)
    np.testing.assert_allclose(ours, _reference(audio, feature_size=128), atol=TOLERANCE, rtol=0)


def test_mel_filters_equal_transformers() -> None:
    np.testing.assert_allclose(AudioFeatures().filters, transformers.WhisperFeatureExtractor().mel_filters, atol=1e-12)


def test_from_folder_reads_what_save_pretrained_writes(tmp_path: Path) -> None:
    transformers.WhisperFeatureExtractor(feature_size=128, padding_value=0.5).save_pretrained(tmp_path)
    audio = _noise(4000, seed=3)
    ours = AudioFeatures.from_folder(tmp_path).features(audio)
    reference = _reference(audio, feature_size=128, padding_value=0.5)
    np.testing.assert_allclose(ours, reference, atol=TOLERANCE, rtol=0)


def test_dither_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="dither"):
        AudioFeatures.from_config({"feature_extractor_type": "WhisperFeatureExtractor", "dither": 1e-4})


def test_unknown_key_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="preemphasis"):
        AudioFeatures.from_config({"feature_extractor_type": "WhisperFeatureExtractor", "preemphasis": 0.97})


def test_left_padding_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="padding_side"):
        AudioFeatures.from_config({"feature_extractor_type": "WhisperFeatureExtractor", "padding_side": "left"})


def test_other_extractor_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="Wav2Vec2FeatureExtractor"):
        AudioFeatures.from_config({"feature_extractor_type": "Wav2Vec2FeatureExtractor"})


def test_missing_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"preprocessor_config\.json"):
        AudioFeatures.from_folder(tmp_path)


def test_windows_cut_long_audio_into_chunk_length_pieces() -> None:
    audio = _noise(65 * 16000)
    pieces = list(AudioFeatures().windows(audio))
    assert [p.size for p in pieces] == [480000, 480000, 5 * 16000]
    np.testing.assert_array_equal(np.concatenate(pieces), audio)


def test_audio_longer_than_a_window_is_refused() -> None:
    with pytest.raises(ValueError, match="windows"):
        AudioFeatures().features(_noise(480001))


def _write_wav(path: Path, samples: np.ndarray, rate: int, channels: int = 1) -> None:
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(samples.astype("<i2").tobytes())


def test_read_wav_gives_float_samples_and_averages_channels(tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    _write_wav(path, np.array([0, 16384, -16384, 32767], dtype=np.int16).repeat(2), 16000, channels=2)
    np.testing.assert_allclose(read_wav(path, sampling_rate=16000), [0.0, 0.5, -0.5, 32767 / 32768])


def test_read_wav_refuses_another_rate_naming_the_conversion(tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    _write_wav(path, np.zeros(10, dtype=np.int16), 44100)
    with pytest.raises(ValueError, match="-ar 16000"):
        read_wav(path, sampling_rate=16000)


@pytest.mark.parametrize(
    "data",
    [
        b"RIFF" + (100).to_bytes(4, "little") + b"WAVE" + b"LIST" + (10**6).to_bytes(4, "little") + bytes(8),
        b"RIFF\x00\x00",
        b"ID3\x04 an mp3 file",
    ],
    ids=["chunk-past-the-end", "cut-short", "mp3"],
)
def test_a_file_that_is_not_pcm_wav_is_a_value_error_naming_it(data: bytes) -> None:
    import io

    with pytest.raises(ValueError, match=r"upload\.bin is not a PCM WAV file"):
        read_wav(io.BytesIO(data), sampling_rate=16000, name="upload.bin")
