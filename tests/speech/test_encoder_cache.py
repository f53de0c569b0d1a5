"""The prefix cache of a speech model keeps each audio window's encoder output by the window's features: the same
audio again runs no encoder, and every output equals the output without the cache."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from decoctl_speculative import plugin as speculative_plugin

from decoctl import ConfigError, Generator
from decoctl.generation import transcribe
from decoctl.plugins import PluginRegistry

NEW = 24


def _audio(seed: int, seconds: float) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


def _generator(whisper: Any, cache_mb: float | None, **settings: Any) -> Generator:
    return Generator(
        {"target": str(whisper.folder("whisper"))}, "greedy", threads=1, prefix_cache_mb=cache_mb, **settings
    )


def _encoder_runs(generator: Generator, role: str = "target") -> int:
    return int(generator._sequences[role]._runner.encoder_runs)


def test_the_same_audio_twice_runs_the_encoder_once(whisper: Any) -> None:
    audio = _audio(1, 3)
    plain = _generator(whisper, None).generate("", audio=audio, language="en", max_new_tokens=NEW)
    cached = _generator(whisper, 64)
    first = cached.generate("", audio=audio, language="en", max_new_tokens=NEW)
    second = cached.generate("", audio=audio, language="en", max_new_tokens=NEW)
    assert list(first.tokens) == list(second.tokens) == list(plain.tokens)
    assert _encoder_runs(cached) == 1
    assert cached._sequences["target"]._runner.cross_passes == 2  # the cross-attention KV computed from the kept output
    assert cached.generate("", audio=_audio(2, 3), language="en", max_new_tokens=NEW).tokens is not None
    assert _encoder_runs(cached) == 2  # other audio: encoded
    stats = cached.prefix_cache.stats() if cached.prefix_cache else None
    assert stats is not None and stats.source_hits == 1 and stats.sources == 2
    assert 0 < stats.bytes <= stats.budget


@pytest.mark.parametrize("seed", [2, 3])
def test_a_kept_source_gives_the_uncached_tokens_with_another_prompt(whisper: Any, seed: int) -> None:
    audio = _audio(seed, 5)
    cached = _generator(whisper, 64)
    cached.generate("", audio=audio, language="en", max_new_tokens=NEW)
    french = cached.generate("", audio=audio, language="fr", task="translate", max_new_tokens=NEW)
    plain = _generator(whisper, None).generate("", audio=audio, language="fr", task="translate", max_new_tokens=NEW)
    assert list(french.tokens) == list(plain.tokens)
    assert _encoder_runs(cached) == 1


def test_long_audio_transcribed_twice_encodes_each_window_once(whisper: Any) -> None:
    audio = np.concatenate([_audio(1, 30), _audio(2, 6)])
    cached = _generator(whisper, 64)
    first = transcribe(cached, audio, language="en", max_new_tokens=12)
    second = transcribe(cached, audio, language="en", max_new_tokens=12)
    plain = transcribe(_generator(whisper, None), audio, language="en", max_new_tokens=12)
    assert first.text == second.text == plain.text
    assert _encoder_runs(cached) == 2


def test_sources_are_evicted_by_recency_within_the_budget(whisper: Any) -> None:
    from decoctl.generation._prefix_cache import source_bytes

    one = source_bytes(_generator(whisper, None).models["target"])
    cached = _generator(whisper, 1.5 * one / 2**20)  # room for one source
    for seed in (1, 2, 1):
        cached.generate("", audio=_audio(seed, 2), language="en", max_new_tokens=4)
    assert _encoder_runs(cached) == 3  # the second audio evicted the first
    stats = cached.prefix_cache.stats() if cached.prefix_cache else None
    assert stats is not None and stats.sources == 1 and stats.bytes <= stats.budget and stats.evicted == 2


def test_speculative_decoding_with_the_cache_gives_greedy_s_tokens(whisper: Any) -> None:
    registry = PluginRegistry(autoload=False)
    registry.register(speculative_plugin, "speculative")
    models = {"target": str(whisper.folder("whisper")), "draft": str(whisper.folder("whisper-draft"))}
    generator = Generator(
        models, "speculative", options={"k": 3, "adaptive": False}, registry=registry, threads=1, prefix_cache_mb=64
    )
    audio = _audio(1, 2)
    plain = _generator(whisper, None).generate("", audio=audio, language="en", max_new_tokens=NEW)
    for _ in range(2):
        assert list(generator.generate("", audio=audio, language="en", max_new_tokens=NEW).tokens) == list(plain.tokens)
    assert _encoder_runs(generator) == 1


def test_a_budget_below_one_source_is_refused_naming_it(whisper: Any) -> None:
    with pytest.raises(ConfigError, match="holds no source of model"):
        _generator(whisper, 0.01)
