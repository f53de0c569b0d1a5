"""Audio -> log-mel features, as transformers' WhisperFeatureExtractor makes them from the same
preprocessor_config.json, with numpy only.

The steps, in transformers' order:

- the waveform (float32, mono, at the extractor's ``sampling_rate``) is cut or padded with ``padding_value`` to
  ``chunk_length`` seconds (``n_samples``);
- where asked (``features(audio, do_normalize=True)``, transformers' call argument: its ``__call__`` ignores a
  ``do_normalize`` saved in the config, and so does decoctl): zero mean and unit variance over the samples given
  (``+ 1e-7`` under the root), the padding set back to ``padding_value``;
- a short-time Fourier transform: frames of ``n_fft`` samples every ``hop_length``, centred (the waveform padded by
  ``n_fft // 2`` on each side by reflection), each times the periodic Hann window; the power spectrum of each frame;
- the slaney-normalised mel filter bank (slaney mel scale, 0 to 8000 Hz, ``feature_size`` filters) over the power;
- the last frame dropped, ``log10`` of the mel power clamped below at 1e-10, clamped again at the maximum minus 8,
  then ``(x + 4) / 4``.

The arithmetic runs in float64 and the result is float32: transformers computes it in float32 with torch (or in
float64 with numpy where torch is not installed), so the two agree to float32 rounding.

A setting transformers would act on and decoctl does not implement (``dither`` other than 0, ``padding_side`` left,
a feature extractor that is not WhisperFeatureExtractor) is refused at load, naming its key.
"""

from __future__ import annotations

import json
import struct
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import numpy as np

from decoctl.errors import ConfigError, ModelLoadError

__all__ = ["AudioFeatures", "mel_filter_bank", "read_wav"]

#: the feature extractors whose arithmetic this module reproduces
_KNOWN = frozenset({"WhisperFeatureExtractor"})
#: keys of preprocessor_config.json that do not change the features (names, the processor's own bookkeeping)
_INERT = frozenset(
    {
        "feature_extractor_type",
        "processor_class",
        "return_attention_mask",
        "nb_max_frames",
        "n_samples",
        "mel_filters",
        "do_normalize",
    }
)
_READ = frozenset(
    {"feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft", "padding_value", "padding_side", "dither"}
)
#: Whisper's mel filters end at 8 kHz whatever the sampling rate (transformers' WhisperFeatureExtractor)
_MAX_FREQUENCY = 8000.0


def _hertz_to_mel(freq: np.ndarray) -> np.ndarray:
    """The slaney mel scale: linear below 1 kHz, logarithmic above."""
    mels = 3.0 * freq / 200.0
    log_region = freq >= 1000.0
    logstep = 27.0 / np.log(6.4)
    mels[log_region] = 15.0 + np.log(freq[log_region] / 1000.0) * logstep
    return mels


def _mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    freq = 200.0 * mels / 3.0
    log_region = mels >= 15.0
    logstep = np.log(6.4) / 27.0
    freq[log_region] = 1000.0 * np.exp(logstep * (mels[log_region] - 15.0))
    return freq


def mel_filter_bank(*, n_fft: int, feature_size: int, sampling_rate: int) -> np.ndarray:
    """Whisper's mel filters: float64[1 + n_fft // 2, feature_size], triangular on the slaney mel scale from 0 Hz
    to 8 kHz, each scaled to unit area (slaney norm), as transformers' ``mel_filter_bank`` gives them."""
    bins = 1 + n_fft // 2
    mel_edges = np.linspace(
        _hertz_to_mel(np.array([0.0]))[0], _hertz_to_mel(np.array([_MAX_FREQUENCY]))[0], feature_size + 2
    )
    edges = _mel_to_hertz(mel_edges)
    fft_freqs = np.linspace(0, sampling_rate // 2, bins)
    diff = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    filters = np.maximum(np.zeros(1), np.minimum(down, up))
    filters = filters * (2.0 / (edges[2 : feature_size + 2] - edges[:feature_size]))[None, :]
    return np.asarray(filters, dtype=np.float64)


def _periodic_hann(length: int) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(length) / length)


@attrs.frozen(kw_only=True)
class AudioFeatures:
    """A Whisper feature extractor (``AudioFeatures.from_folder(path)``): ``features(waveform)`` gives one 30-second
    window's log-mel features, ``windows(waveform)`` cuts long audio into such windows.

    ``feature_size``: mel bins. ``sampling_rate``: Hz the waveform must be at. ``hop_length`` / ``n_fft``: the STFT's
    stride and frame length. ``chunk_length``: seconds per window. ``padding_value``: what pads a short window.
    """

    feature_size: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    chunk_length: int = 30
    n_fft: int = 400
    padding_value: float = 0.0
    filters: np.ndarray = attrs.field(eq=False, repr=False)

    @filters.default
    def _filters(self) -> np.ndarray:
        return mel_filter_bank(n_fft=self.n_fft, feature_size=self.feature_size, sampling_rate=self.sampling_rate)

    @property
    def n_samples(self) -> int:
        """Samples in one window: ``chunk_length`` seconds."""
        return self.chunk_length * self.sampling_rate

    @property
    def frames(self) -> int:
        """Feature frames in one window (3000 for Whisper's defaults)."""
        return self.n_samples // self.hop_length

    @classmethod
    def from_folder(cls, folder: Path) -> AudioFeatures:
        """Read ``folder/preprocessor_config.json``; ModelLoadError where it is missing, ConfigError naming a key
        whose setting decoctl does not implement."""
        path = Path(folder) / "preprocessor_config.json"
        if not path.is_file():
            raise ModelLoadError(
                f"{folder} has no preprocessor_config.json: a speech model needs its feature extractor's settings "
                "(save it with transformers' WhisperFeatureExtractor.save_pretrained into the model's folder)"
            )
        return cls.from_config(json.loads(path.read_text(encoding="utf-8")), source=path)

    @classmethod
    def from_config(cls, config: dict[str, Any], *, source: Path | str = "preprocessor_config.json") -> AudioFeatures:
        """The extractor that ``config`` (preprocessor_config.json's contents) describes."""
        kind = config.get("feature_extractor_type", "WhisperFeatureExtractor")
        if kind not in _KNOWN:
            raise ConfigError(
                f"{source}: feature_extractor_type {kind!r} is not implemented; decoctl reproduces "
                f"{sorted(_KNOWN)} (a Whisper export)"
            )
        unknown = sorted(set(config) - _READ - _INERT)
        if unknown:
            raise ConfigError(
                f"{source}: {unknown} not implemented; decoctl's Whisper features read {sorted(_READ)}: remove the "
                "keys if transformers ignores them for this model"
            )
        if float(config.get("dither", 0.0)) != 0.0:
            raise ConfigError(
                f"{source}: dither {config['dither']} is not implemented (random noise makes features unrepeatable); "
                "set dither to 0.0"
            )
        if config.get("padding_side", "right") != "right":
            raise ConfigError(
                f"{source}: padding_side {config['padding_side']!r} is not implemented; Whisper pads on the right: "
                "set padding_side to 'right'"
            )
        return cls(
            feature_size=int(config.get("feature_size", 80)),
            sampling_rate=int(config.get("sampling_rate", 16000)),
            hop_length=int(config.get("hop_length", 160)),
            chunk_length=int(config.get("chunk_length", 30)),
            n_fft=int(config.get("n_fft", 400)),
            padding_value=float(config.get("padding_value", 0.0)),
        )

    def windows(self, waveform: np.ndarray) -> Iterator[np.ndarray]:
        """``waveform`` (float32[samples]) in ``chunk_length``-second pieces, the last one shorter; one empty window
        for empty audio."""
        audio = np.asarray(waveform, dtype=np.float32)
        if audio.size == 0:
            yield audio
            return
        for start in range(0, audio.size, self.n_samples):
            yield audio[start : start + self.n_samples]

    def features(self, waveform: np.ndarray, *, do_normalize: bool = False) -> np.ndarray:
        """One window's features: float32[1, feature_size, frames] from ``waveform`` (float32[samples], at most one
        window; longer audio goes through ``windows`` first). ``do_normalize``: zero mean, unit variance over the
        real samples first (transformers' call argument of that name)."""
        audio = np.asarray(waveform, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"audio must be mono samples, float32[samples]; got shape {audio.shape}")
        if audio.size > self.n_samples:
            raise ValueError(
                f"{audio.size} samples is longer than one {self.chunk_length} s window ({self.n_samples} samples): "
                "cut it with windows() first"
            )
        padded = np.full(self.n_samples, self.padding_value, dtype=np.float32)
        padded[: audio.size] = audio
        if do_normalize:
            real = padded[: audio.size]
            padded[: audio.size] = (real - real.mean()) / np.sqrt(real.var() + 1e-7)
        return self._log_mel(padded.astype(np.float64))[None].astype(np.float32)

    def _log_mel(self, samples: np.ndarray) -> np.ndarray:
        half = self.n_fft // 2
        signal = np.pad(samples, (half, half), mode="reflect")
        count = 1 + (signal.size - self.n_fft) // self.hop_length
        starts = np.arange(count) * self.hop_length
        frames = signal[starts[:, None] + np.arange(self.n_fft)[None, :]] * _periodic_hann(self.n_fft)[None, :]
        power = np.abs(np.fft.rfft(frames, n=self.n_fft, axis=1)) ** 2
        mel = self.filters.T @ power[:-1].T
        log_spec = np.log10(np.maximum(mel, 1e-10))
        log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0


def read_wav(path: Path | BinaryIO, *, sampling_rate: int, name: str | None = None) -> np.ndarray:
    """A PCM WAV file's samples (a path, or an open binary file) as float32[samples] in [-1, 1]; channels averaged
    to mono. ValueError where the file is not PCM WAV or its rate is not ``sampling_rate`` (decoctl does not
    resample: convert it first), naming the file as ``name`` (default: the path)."""
    shown = name if name is not None else path
    try:
        with wave.open(str(path) if isinstance(path, Path) else path, "rb") as reader:
            rate, channels, width = reader.getframerate(), reader.getnchannels(), reader.getsampwidth()
            raw = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError, RuntimeError, struct.error) as err:  # wave raises RuntimeError on a bad chunk size
        raise ValueError(
            f"{shown} is not a PCM WAV file ({str(err) or type(err).__name__}): convert it with ffmpeg -i IN -ac 1 -ar "
            f"{sampling_rate} OUT.wav"
        ) from err
    if rate != sampling_rate:
        raise ValueError(
            f"{shown} is sampled at {rate} Hz; the model's feature extractor takes {sampling_rate} Hz and decoctl does "
            f"not resample: convert it with ffmpeg -i {shown} -ac 1 -ar {sampling_rate} OUT.wav"
        )
    if width == 1:
        data = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        data = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 4:
        data = np.frombuffer(raw, dtype="<i4").astype(np.float32) / 2147483648.0
    else:
        raise ValueError(f"{shown} has {8 * width}-bit samples; decoctl reads 8-, 16- and 32-bit PCM WAV")
    if data.size % channels:
        raise ValueError(f"{shown} ends inside a frame of its {channels} channels: the file is cut short")
    return np.asarray(data.reshape(-1, channels).mean(axis=1), dtype=np.float32)
