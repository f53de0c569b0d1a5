"""Beam search takes the processors transformers applies to beams (penalties, masks) and refuses the sample-only
ones (transformers' warpers, which it leaves out of beam search with a warning) before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoctl import ConfigError, Generator
from decoctl.plugins import PluginRegistry

SAMPLE_ONLY = {
    "temperature=0.7": "temperature",
    "top_k=5": "top-k",
    "top_p=0.9": "top-p",
    "min_p=0.1": "min-p",
    "typical_p=0.9": "typical-p",
    "repetition_penalty=1.2,top_k=5,temperature=0.7": "top-k, temperature",
    "sample": "sample",
}


@pytest.mark.parametrize(("chain", "named"), SAMPLE_ONLY.items())
def test_beam_search_refuses_sample_only_processors_before_loading(
    chain: str, named: str, registry: PluginRegistry, tmp_path: Path
) -> None:
    missing_model = tmp_path / "no-such-model"  # a ConfigError, not a ModelLoadError: nothing was loaded
    with pytest.raises(ConfigError, match=rf"controller 'beam' .* sample-only processors \({named}\)"):
        Generator({"target": missing_model}, "beam", options={"num_beams": 2}, processors=chain, registry=registry)


def test_beam_search_takes_the_processors_transformers_applies_to_beams(
    tiny_model: Path, registry: PluginRegistry
) -> None:
    chain = "repetition_penalty=1.2,no_repeat_ngram=2"
    generator = Generator({"target": tiny_model}, "beam", options={"num_beams": 2}, processors=chain, registry=registry)
    assert len(generator.generate("def f(x):", max_new_tokens=4).tokens) >= 1


def test_sampling_still_takes_them(tiny_model: Path, registry: PluginRegistry) -> None:
    generator = Generator({"target": tiny_model}, "sample", processors="top_k=5,temperature=0.7", registry=registry)
    assert len(generator.generate("def f(x):", max_new_tokens=4).tokens) >= 1
