"""The encoder's output and the cross-attention KV depend on the source alone: they are computed once per source
and outlive every rewind of the decoder, a rewind to 0 included (speculative decoding's verifier and draft rewind
to 0 at the start of each generation). A forward from an empty cache after such a rewind runs the with-past decoder
with an empty self-attention past and gives what the first pass gave."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from decoctl_speculative import plugin as speculative_plugin

from decoctl import Generator
from decoctl.host import Sequence
from decoctl.model._decoder_runner import DecoderRunner
from decoctl.model._loader import load_model
from decoctl.plugins import PluginRegistry

PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, item):", "for x in range(10):")
NEW = 24


def _runner(sequence: Sequence) -> DecoderRunner:
    runner = sequence._runner
    assert isinstance(runner, DecoderRunner)
    return runner


@pytest.mark.parametrize("variant", ["pair", "merged"])
@pytest.mark.parametrize("name", ["t5", "bart", "marian"])
def test_a_forward_after_a_rewind_to_zero_reuses_the_cross_kv(seq2seq: Any, name: str, variant: str) -> None:
    model = load_model(seq2seq.folder(name, variant), threads=1)
    start = model.encoder.parts.decoder_start_token_id if model.encoder else 0
    sequence = Sequence("target", model)
    sequence.encode([40, 41, 42, 43, 1])
    expected = np.array(sequence.forward([start, 7, 9, 11]))
    for fed in ([start, 7, 9, 11], [start], [start, 7]):
        sequence.rewind(0)
        np.testing.assert_allclose(sequence.forward(fed), expected[: len(fed)], atol=1e-5)
    sequence.rewind(0)
    sequence.forward([start])
    np.testing.assert_allclose(sequence.forward([7, 9, 11]), expected[1:], atol=1e-5)
    runner = _runner(sequence)
    assert (runner.encoder_runs, runner.cross_passes) == (1, 1)


def test_a_new_source_computes_its_own_cross_kv(seq2seq: Any) -> None:
    model = load_model(seq2seq.folder("bart"), threads=1)
    start = model.encoder.parts.decoder_start_token_id if model.encoder else 0
    fresh = Sequence("target", model)
    fresh.encode([50, 51, 52])
    expected = np.array(fresh.forward([start, 7]))
    sequence = Sequence("target", model)
    sequence.encode([40, 41, 42, 43, 1])
    sequence.forward([start, 7])
    sequence.rewind(0)
    sequence.encode([50, 51, 52])
    np.testing.assert_allclose(sequence.forward([start, 7]), expected, atol=1e-5)
    runner = _runner(sequence)
    assert (runner.encoder_runs, runner.cross_passes) == (2, 2)


@pytest.mark.parametrize(
    ("name", "drafter"),
    [
        ("t5", "prompt-lookup"),
        ("t5", "draft-model"),
        ("bart", "prompt-lookup"),
        ("bart", "draft-model"),
        ("marian", "prompt-lookup"),
    ],
)
def test_speculative_decoding_encodes_and_computes_the_cross_kv_once_per_generation(
    seq2seq: Any, name: str, drafter: str
) -> None:
    """The verifier rewinds the target to 0 after the prompt's prefill, the draft model rewinds its decoder to 0
    at the start: neither runs the encoder or the first-pass decoder again, and the tokens are transformers'."""
    registry = PluginRegistry(autoload=False)
    registry.register(speculative_plugin, "speculative")
    models = {"target": str(seq2seq.folder(name))}
    if drafter == "draft-model":
        models["draft"] = str(seq2seq.folder(f"{name}-draft", "merged"))
    options = {"drafter": drafter, "k": 3, "adaptive": False}
    generator = Generator(models, "speculative", options=options, registry=registry, threads=1)
    for prompt in PROMPTS:
        result = generator.generate(prompt, max_new_tokens=NEW)
        assert list(result.tokens) == seq2seq.greedy(name, generator.tokenizer.encode(prompt), NEW), prompt
        assert result.stats.forwards["target"] > 1
    for role in models:
        runner = _runner(generator._sequences[role])
        assert (runner.encoder_runs, runner.cross_passes) == (len(PROMPTS), len(PROMPTS)), role
